"""Test tiers (README.md, Tests): pure logic, the autotuner end to end on TileLang's C target,
CUDA compile-only with nvcc for sm_90a (marker ``nvcc``), and real GPU runs (marker ``gpu``)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests/kernels: kernels TileLang can read via inspect


def _has_cuda_gpu() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.device_count() > 0  # NVML: this process does not start CUDA (autotuner/forking.py)


@pytest.fixture
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process sees no CUDA GPU, whatever the machine has: torch says so, and so does the driver query
    that ``target="auto"`` and ``devices="all"`` use (:func:`autotuner.forking.local_gpus`)."""
    import torch

    from autotuner import forking

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(forking, "local_gpus", lambda prefetch_tilelang=False: [])


#: Test modules that start Ray in the pytest process.
RAY_MODULES = {"test_ray.py"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu = _has_cuda_gpu()
    nvcc = shutil.which("nvcc") is not None or os.path.exists("/usr/local/cuda/bin/nvcc")
    skip_gpu = pytest.mark.skip(
        reason="needs a CUDA GPU; run on the GPU machine: . .gpu/setup.sh && python3 -m pytest -m gpu")
    skip_nvcc = pytest.mark.skip(reason="needs nvcc (CUDA toolkit) to compile sm_90a code; none found on PATH")
    # Once a process has been a Ray driver it forks no compile worker or measuring process again
    # (autotuner.forking.fork_safe), so the modules that start Ray here run last and the rest of the suite
    # keeps the forked ones.
    items.sort(key=lambda item: item.path.name in RAY_MODULES)  # stable: each part keeps its order
    for item in items:
        if "gpu" in item.keywords and not gpu:
            item.add_marker(skip_gpu)
        if "nvcc" in item.keywords and not nvcc:
            item.add_marker(skip_nvcc)


@pytest.fixture(autouse=True)
def _no_ray_before(request: pytest.FixtureRequest) -> None:
    """Outside Ray's modules, this process must not have run Ray yet: it would fork nothing, and the tests
    that count on forked workers would fail for a reason they do not name (``--ff``, ``--nf`` or a random
    order can put Ray's tests first, after pytest_collection_modifyitems has put them last)."""
    from autotuner import forking

    if forking._RAY_SEEN and request.node.path.name not in RAY_MODULES:
        pytest.fail("this pytest process has run Ray already (autotuner.forking.fork_safe is False), so it forks "
                    f"no worker; run {', '.join(sorted(RAY_MODULES))} last or in its own pytest run")


@pytest.fixture(autouse=True)
def _isolated_caches(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test gets its own tuning database; TileLang's kernel cache is shared per session
    (it is keyed by the kernel's full text, so sharing it is safe and saves compile time)."""
    monkeypatch.setenv("TILECARVE_CACHE_DIR", str(tmp_path_factory.mktemp("tilecarve-cache")))
    if "TILELANG_CACHE_DIR" not in os.environ:
        os.environ["TILELANG_CACHE_DIR"] = str(tmp_path_factory.getbasetemp() / "tilelang-cache")

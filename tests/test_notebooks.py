"""The example notebooks: stored without outputs, and each runs top to bottom on a CPU-only machine.

They run with nbclient in a fresh kernel whose working directory is an empty temp dir (nothing may be
written there) and which imports this checkout (PYTHONPATH), with the tuning cache in another temp dir."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "examples" / "notebooks").glob("*.ipynb"))
#: What each notebook must print when it worked (beyond raising nothing).
EXPECT = {"hint_quality.ipynb": "measured grids under", "tune_your_kernel.ipynb": "best {"}


def test_every_notebook_is_checked():
    assert {p.name for p in NOTEBOOKS} == set(EXPECT)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_stored_without_outputs(path):
    nb = json.loads(path.read_text())
    dirty = [i for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code"
             and (c.get("outputs") or c.get("execution_count") is not None)]
    assert not dirty, f"{path.name}: cells {dirty} keep outputs; strip them (jupyter nbconvert --clear-output)"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs(path, tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat", reason="pip install -e '.[test]' for nbformat")
    nbclient = pytest.importorskip("nbclient", reason="pip install -e '.[test]' for nbclient and ipykernel")
    cwd, cache = tmp_path / "cwd", tmp_path / "cache"
    cwd.mkdir()
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("TILECARVE_CACHE_DIR", str(cache))
    monkeypatch.delenv("TILECARVE_DATA", raising=False)
    nb = nbformat.read(path, as_version=4)
    t0 = time.perf_counter()
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",  # seconds per cell
                                     resources={"metadata": {"path": str(cwd)}})
    client.execute()
    print(f"{path.name}: {time.perf_counter() - t0:.1f} s")
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert EXPECT[path.name] in text, text[-2000:]
    images = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if "image/png" in o.get("data", {})]
    assert images, f"{path.name} showed no figure"
    assert not list(cwd.iterdir()), f"{path.name} wrote into its working directory: {list(cwd.iterdir())}"

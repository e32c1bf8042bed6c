"""Resolve the user's ``target`` once, in the parent, into an explicit TVM target.

Compile workers must never touch the GPU, so they cannot ask the driver which architecture to
build for. The parent resolves ``"auto"``/``"cuda"`` to an explicit ``{"kind": "cuda", "arch":
"sm_XY"}`` (``sm_90a`` on Hopper, where wgmma needs it) and ships that to the workers. The same
explicit target goes into the cache key, together with the device name, so an H100 and an H200
never share a tuning result.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Any

__all__ = ["ResolvedTarget", "cuda_arch", "default_target", "resolve_target"]

#: TileLang's environment variable for the target a ``None`` target means (a name, or a JSON dict).
DEFAULT_TARGET_ENV = "TILELANG_DEFAULT_TARGET"


def default_target() -> Any:
    """What ``target=None`` means, as in TileLang: ``$TILELANG_DEFAULT_TARGET`` (a name such as ``"cuda"``, or
    a JSON dict such as ``{"kind": "cuda", "arch": "sm_90a"}``) if set, else ``"auto"``. Read without
    importing TileLang."""
    value = os.environ.get(DEFAULT_TARGET_ENV, "").strip()
    if not value:
        return "auto"
    if not value.startswith("{"):
        return value
    try:
        parsed = json.loads(value)
    except ValueError as e:
        raise ValueError(f"{DEFAULT_TARGET_ENV}={value!r} looks like a dict but is not JSON ({e}); write it as "
                         '{"kind": "cuda", "arch": "sm_90a"}') from None
    if not isinstance(parsed, dict):
        raise ValueError(f"{DEFAULT_TARGET_ENV}={value!r} must be a target name or a JSON dict")
    return parsed


@dataclass(frozen=True)
class ResolvedTarget:
    """An explicit compile target plus what the parent needs to run and time on it."""

    spec: Any  # str ("c") or a dict for tvm.target.Target: picklable, so it ships to workers
    kind: str  # "cuda" or "c"
    arch: str | None  # e.g. "sm_90a"; None for the CPU
    device_name: str | None  # e.g. "NVIDIA H200"; None when compile-only or CPU
    runnable: bool  # can this process run kernels for it (a GPU of that arch is present)?

    @property
    def device(self) -> str:
        """Where its kernels run, as torch names it: ``"cuda"`` or ``"cpu"``."""
        return "cuda" if self.kind == "cuda" else "cpu"

    def tvm(self):
        """The ``tvm.target.Target`` (imported lazily: tvm is heavy)."""
        import tilelang  # noqa: F401 - puts its TVM on the path
        from tvm.target import Target

        return Target(self.spec)

    def key(self) -> str:
        """Everything about the target that changes a tuning answer."""
        return f"{self.tvm()}|device={self.device_name}"


def _local_cuda_arch(prefetch_tilelang: bool = True) -> tuple[str, str] | None:
    """``(arch, device name)`` of local GPU 0, or ``None`` when there is none. A caller that compiles or
    tunes next (``prefetch_tilelang``) has TileLang imported while the driver is asked
    (:func:`.forking.local_gpus`)."""
    from .forking import local_gpus

    try:
        gpus = local_gpus(prefetch_tilelang=prefetch_tilelang)
    except ImportError:  # no torch, and no driver to ask
        return None
    if not gpus:
        return None
    return cuda_arch(*gpus[0]["capability"]), gpus[0]["name"]


def cuda_arch(major: int, minor: int) -> str:
    """The target arch a GPU of compute capability ``major.minor`` is built for: ``sm_XY``, with ``a`` on
    Hopper (``sm_90a``: wgmma needs it)."""
    return f"sm_{major}{minor}" + ("a" if major == 9 else "")


_ARCH = re.compile(r"^sm_\d{2,3}[af]?$")


def _check_with_tvm(spec: dict[str, Any]) -> None:
    """TVM refuses keys it does not know ('bogus') and values of the wrong type; say so as a ValueError."""
    import tilelang  # noqa: F401 - puts its TVM on the path
    from tvm.target import Target

    try:
        Target(spec)
    except Exception as e:  # noqa: BLE001 - TVM raises its own error types; the message is what matters
        first = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        raise ValueError(f"target {spec!r} is not a valid TVM target: {first}; use e.g. "
                         "{'kind': 'cuda', 'arch': 'sm_90a'}") from None


def resolve_target(target: Any, prefetch_tilelang: bool = True) -> ResolvedTarget:
    """Turn ``"auto"``, ``"cuda"``, ``"c"``, a dict or a ``tvm.target.Target`` into a ResolvedTarget.

    ``"auto"`` means the local CUDA GPU when there is one, otherwise TileLang's C target on the CPU.
    A CUDA target with an explicit ``arch`` that differs from the local GPU (or with no local GPU)
    is compile-only: candidates compile, nothing runs. A ResolvedTarget is returned as it is (a
    template resolves its target once and hands the result on). ``prefetch_tilelang=False``: TileLang is
    not imported while the local GPU is asked about (a tune whose measuring processes should start first).
    """
    if isinstance(target, ResolvedTarget):
        return target
    if target is None:
        target = default_target()
    local = _local_cuda_arch(prefetch_tilelang)
    if isinstance(target, str) and target == "auto":
        target = "cuda" if local else "c"
    if isinstance(target, str):
        if target == "c":
            return ResolvedTarget(spec="c", kind="c", arch=None, device_name=None, runnable=True)
        if target == "cuda":
            if local is None:
                raise ValueError(
                    "target='cuda' needs a CUDA GPU to pick the architecture, and none is visible; "
                    "use target='c' to tune on the CPU, or an explicit "
                    "{'kind': 'cuda', 'arch': 'sm_90a'} to compile without running"
                )
            arch, name = local
            return ResolvedTarget({"kind": "cuda", "arch": arch}, "cuda", arch, name, True)
        raise ValueError(
            f"unknown target {target!r}: use 'auto', 'cuda', 'c', a dict such as "
            "{'kind': 'cuda', 'arch': 'sm_90a'}, or a tvm.target.Target"
        )
    if isinstance(target, dict):
        spec = dict(target)
        if "kind" not in spec:
            raise ValueError(f"target {target!r} has no 'kind'; add 'kind': 'cuda' (or use 'c' for the CPU)")
        _check_with_tvm(spec)
    elif hasattr(target, "export"):  # tvm.target.Target
        spec = {k: v for k, v in dict(target.export()).items() if k in ("kind", "arch", "keys", "tag") and v}
        spec.pop("keys", None)
        spec.pop("tag", None)
    else:
        raise TypeError(f"target must be 'auto', 'cuda', 'c', a dict such as {{'kind': 'cuda', 'arch': 'sm_90a'}} "
                        f"or a tvm.target.Target, got {target!r} ({type(target).__name__})")
    kind = str(spec.get("kind", ""))
    if kind == "c":
        return ResolvedTarget(spec="c", kind="c", arch=None, device_name=None, runnable=True)
    if kind != "cuda":
        raise ValueError(f"target kind {kind!r} is not supported; tilecarve tunes for 'cuda' and 'c'")
    if "arch" not in spec:
        if local is None:
            raise ValueError(f"target {spec!r} has no 'arch' and no GPU is visible; add e.g. 'arch': 'sm_90a'")
        spec["arch"] = local[0]
    arch = str(spec["arch"])
    if not _ARCH.match(arch):
        raise ValueError(f"target arch {arch!r} is not a CUDA architecture; write it as 'sm_90a', 'sm_80', 'sm_89'...")
    runnable = local is not None and local[0].rstrip("a") == arch.rstrip("a")
    return ResolvedTarget(spec, "cuda", arch, local[1] if runnable else None, runnable)

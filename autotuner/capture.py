"""TileLang's ``set_autotune_inputs``: tune on the caller's own input tensors.

    with set_autotune_inputs(a, b):          # or set_autotune_inputs([a, b])
        kernel = matmul(M, N, K)             # the decorator form, or
        result = AutoTuner.from_kernel(...).set_profile_args(...).run()

The inputs in effect when :meth:`AutoTuner.set_profile_args` or :meth:`AutoTuner.run` is called
(TileLang reads them in ``set_profile_args`` only) replace the generated ones, as a ``supply_prog``
returning them would, and are checked the same way: one tensor per input (every argument but the
outputs at ``out_idx``), of the kernel's shape, dtype and device type, or a ``TuningInputError``
naming the input. A ``supply_prog`` given alongside is ignored with a warning, as in TileLang. The
caller's tensors are never written: every run works on copies. The tuning database keys them by
content (a SHA-256 of their bytes), so other inputs tune again.

The contexts nest per thread (a stack, as in TileLang); :func:`get_autotune_inputs` is the
innermost one's tensors, or ``None``.
"""

from __future__ import annotations

import hashlib
import threading
from typing import Any

__all__ = ["AutotuneInputs", "active_inputs", "get_autotune_inputs", "set_autotune_inputs"]

_local = threading.local()


def _stack() -> list[AutotuneInputs]:
    if not hasattr(_local, "stack"):
        _local.stack = []
    return _local.stack


class AutotuneInputs:
    """The inputs of one ``with set_autotune_inputs(...)``: a context manager, and the ``supply_prog``
    the tuner uses while it is active (``inputs(params)`` returns copies, on the current GPU)."""

    source = "set_autotune_inputs got"  # how check.supplied_inputs names these inputs in its errors

    def __init__(self, tensors: list[Any]) -> None:
        self.tensors = tensors
        self._digest: str | None = None

    def __enter__(self) -> AutotuneInputs:
        _stack().append(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        _stack().pop()

    def __call__(self, params: Any = None) -> list[Any]:
        import torch

        out = []
        for t in self.tensors:
            if isinstance(t, torch.Tensor):
                t = t.detach()
                if t.device.type == "cuda":  # the GPU this process measures on, as TileLang moves them
                    t = t.to(torch.cuda.current_device())
                t = t.clone()
            out.append(t)
        return out

    def digest(self) -> str:
        """SHA-256 over every input's shape, dtype, device type and bytes: what the tuning key holds."""
        if self._digest is None:
            import torch

            h = hashlib.sha256()
            for t in self.tensors:
                if isinstance(t, torch.Tensor):
                    flat = t.detach().reshape(-1).contiguous()
                    h.update(f"{tuple(t.shape)}|{t.dtype}|{t.device.type}|".encode())
                    if flat.numel() and t.device.type != "meta":  # a meta tensor has no bytes (and fails later)
                        h.update(flat.view(torch.uint8).cpu().numpy().tobytes())
                else:
                    h.update(f"{type(t).__qualname__}:{t!r}|".encode())
            self._digest = h.hexdigest()
        return self._digest

    def __repr__(self) -> str:
        return f"set_autotune_inputs(<{len(self.tensors)} values, sha256 {self.digest()}>)"

    def __getstate__(self) -> dict[str, Any]:
        """Tensors cross to the measuring process through host memory and land on its own GPU: a
        device index of this process may not exist there (one GPU per measuring process)."""
        import torch

        moved = [(t.detach().cpu(), "cuda") if isinstance(t, torch.Tensor) and t.device.type == "cuda" else (t, None)
                 for t in self.tensors]
        return {"moved": moved, "digest": self.digest()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        import torch

        def back(t: Any, kind: str | None) -> Any:
            if kind == "cuda" and torch.cuda.is_available():
                return t.to(torch.cuda.current_device())
            return t  # other tensors stay where they are

        self.tensors = [back(t, kind) for t, kind in state["moved"]]
        self._digest = state["digest"]


def set_autotune_inputs(*args: Any) -> AutotuneInputs:
    """A context manager under which autotuning uses these inputs: ``set_autotune_inputs(a, b)`` or
    ``set_autotune_inputs([a, b])`` (TileLang's signature), one per kernel input, in order."""
    if len(args) == 1 and isinstance(args[0], (list, tuple)):
        return AutotuneInputs(list(args[0]))
    return AutotuneInputs(list(args))


def get_autotune_inputs() -> list[Any] | None:
    """The tensors of the innermost active ``set_autotune_inputs``, or ``None`` (TileLang's)."""
    top = active_inputs()
    return top.tensors if top is not None else None


def active_inputs() -> AutotuneInputs | None:
    """The innermost active ``set_autotune_inputs`` context of this thread, or ``None``."""
    stack = _stack()
    return stack[-1] if stack else None

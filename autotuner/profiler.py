"""TileLang's ``Profiler`` for a tuned kernel, as ``result.kernel.get_profiler()`` returns it.

Candidates are compiled with every buffer as an argument (so the tuner can hand them poisoned
outputs), so the ``JITKernel`` underneath has no result index, and TileLang's profiler for it would
generate the outputs as inputs and pass them to the reference. This one takes its result index from
``out_idx`` and calls the :class:`~autotuner.tuner.TunedKernel`, which allocates the outputs, so it
behaves as the profiler of a kernel compiled with ``out_idx``. It also works on TileLang's C target:
comparisons synchronise only a CUDA device, and GPU timing backends fall back to wall-clock timing.
Imported on first use (it needs tilelang and torch).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from tilelang.profiler import Profiler
from tilelang.utils.tensor import TensorSupplyType

from .check import compare, manual_check

__all__ = ["TunedProfiler"]

logger = logging.getLogger(__name__)

_GPU_BACKENDS = ("event", "cupti", "cudagraph")


def _as_list(outs: Any) -> list[Any]:
    if outs is None:
        return []
    return list(outs) if isinstance(outs, (list, tuple)) else [outs]


@dataclass
class TunedProfiler(Profiler):
    """TileLang's ``Profiler`` (``do_bench``, ``assert_allclose``, ``manual_assert_close``,
    ``run_once``...) over a tuned kernel, with ``result_idx`` = its ``out_idx``."""

    device: str = "cuda"

    @classmethod
    def of(cls, kernel: Any, supply_type: Any = None) -> TunedProfiler:
        supply = TensorSupplyType.Auto if supply_type is None else supply_type
        # scratch parameters (autotuner.scratch) count as results: the profiler makes no input for them
        return cls(list(kernel.jit_kernel.params), list(kernel.out_idx) + list(kernel.scratch), supply, kernel,
                   kernel._device)

    def _get_inputs(self, *args: Any, **kwargs: Any) -> list[Any]:
        """TileLang's generated inputs, on the kernel's device: its tensor supply makes them on the current
        CUDA device whenever a GPU is present, also for a kernel compiled for the C target (whose call then
        refused them: "Buffer device mismatch")."""
        ins = super()._get_inputs(*args, **kwargs)
        return [t.to(self.device) if isinstance(t, torch.Tensor) and t.device.type != self.device else t
                for t in ins]

    def _sync(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()

    def _outputs(self, reference_program: Callable[..., Any], ins: list[Any]) -> tuple[list[Any], list[Any]]:
        ref_outs = _as_list(reference_program(*ins))
        self._sync()
        lib_outs = _as_list(self.func(*ins))
        self._sync()
        if len(lib_outs) != len(ref_outs):
            raise AssertionError(f"the kernel returned {len(lib_outs)} outputs, the reference {len(ref_outs)}")
        return lib_outs, ref_outs

    def assert_allclose(self, reference_program: Callable[..., Any], input_tensors: list[Any] | None = None,
                        atol: float = 1e-2, rtol: float = 1e-2, max_mismatched_ratio: float = 0.01) -> None:
        """Raise ``AssertionError`` unless ``|out - ref| <= atol + rtol*|ref|`` holds on all but
        ``max_mismatched_ratio`` of the elements (TileLang's rule; NaN never passes)."""
        ins = self._get_inputs() if input_tensors is None else input_tensors
        lib_outs, ref_outs = self._outputs(reference_program, ins)
        pairs = [(o, r) for o, r in zip(lib_outs, ref_outs) if o is not None and r is not None]
        wide = [(o.float(), r.float()) if o.element_size() == 1 else (o, r) for o, r in pairs]  # float8
        res = compare([o for o, _ in wide], [r for _, r in wide], atol, rtol, max_mismatched_ratio)
        if not res.ok:
            raise AssertionError(f"tuned kernel and reference differ: {res.detail}")

    def manual_assert_close(self, reference_program: Callable[..., Any], input_tensors: list[Any] | None = None,
                            manual_check_prog: Callable[..., Any] | None = None) -> None:
        """TileLang's: ``manual_check_prog(outputs, refs)`` decides (it raises or returns False)."""
        if manual_check_prog is None:
            raise TypeError("manual_assert_close needs manual_check_prog(outputs, refs)")
        ins = self._get_inputs() if input_tensors is None else input_tensors
        why = manual_check(manual_check_prog, *self._outputs(reference_program, ins))
        if why is not None:
            raise AssertionError(why)

    def do_bench(self, func: Callable[..., Any] | None = None, *args: Any, backend: str = "event",
                 **kwargs: Any) -> float:
        """TileLang's ``do_bench``; on the C target a GPU backend (``event``, ``cupti``, ``cudagraph``)
        becomes ``wall``, since there are no CUDA events to time a CPU kernel with."""
        if self.device != "cuda" and backend in _GPU_BACKENDS:
            logger.debug("do_bench(backend=%r) on a CPU kernel: timing with backend='wall'", backend)
            backend = "wall"
        return super().do_bench(func, *args, backend=backend, **kwargs)

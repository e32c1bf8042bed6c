"""Scratch buffers: kernel parameters a program uses as working memory, allocated by the caller.

A kernel that needs device memory of its own between two of its launches (the split-K matmul's fp32
partials, summed by a second kernel) must not take it from TVM's workspace pool (``T.alloc_global``):
TileLang's host code takes that block from a per-thread pool and gives it back as soon as the kernels
are launched, before they run, so a call on a second CUDA stream of the same thread writes the block
the first call's kernels are still reading, and a CUDA graph that captured the block replays into
memory the pool frees when it next grows. torch's caching allocator orders the reuse of a block by the
stream it was used on, and gives a graph being captured blocks of its own.

So such a buffer is a parameter of the program, marked with :func:`mark` (a PrimFunc attribute: it
travels with the PrimFunc through pickling and TileLang's disk cache). Everything that calls a kernel
allocates it per call with torch, on the current stream:

* the tuner (:mod:`.bench`) gives it a poisoned buffer, passes it to no reference and compares nothing
  in it; it may be written;
* :class:`~autotuner.tuner.TunedKernel` allocates it like an output and does not return it;
* a kernel compiled with ``out_idx`` (:func:`.compile.tl_compile`) has TileLang allocate it as one
  more output, which the :class:`.served.ServedKernel` it returns drops from the result.

A scratch parameter is never one of the outputs, and the kernel's inputs (what a caller passes) are
every parameter that is neither (:func:`input_positions`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["ATTR", "input_positions", "mark", "positions"]

#: The PrimFunc attribute listing the scratch parameters' positions.
ATTR = "tilecarve_scratch"


def mark(func: Any, *names: str) -> Any:
    """``func`` (a PrimFunc) with the parameters whose buffers are named ``names`` marked as scratch."""
    params = [str(func.buffer_map[p].name) if p in func.buffer_map else str(p.name) for p in func.params]
    missing = [n for n in names if n not in params]
    if missing:
        raise ValueError(f"scratch buffers {missing} are not parameters of the PrimFunc (its parameters: {params})")
    return func.with_attr(ATTR, sorted(set(positions(func)) | {params.index(n) for n in names}))  # adds to a mark


def positions(obj: Any, outputs: Iterable[int] = ()) -> list[int]:
    """The scratch parameters' positions of ``obj``: a PrimFunc, a TileLang ``JITKernel`` (its
    ``prim_func``), or a wrapper with a non-empty ``scratch`` list (the hidden ones of a
    :class:`.served.ServedKernel`) or a ``jit_kernel``.
    A marked parameter among ``outputs`` (non-negative positions) is an output, not scratch."""
    own = getattr(obj, "scratch", None)
    if isinstance(own, list) and own:
        marked = own
    elif (inner := getattr(obj, "jit_kernel", None)) is not None:
        marked = positions(inner)
    else:
        attrs = getattr(getattr(obj, "prim_func", obj), "attrs", None)
        marked = [] if attrs is None or ATTR not in attrs else [int(i) for i in attrs[ATTR]]
    skip = set(outputs)
    return sorted(i for i in marked if i not in skip)


def input_positions(n_params: int, out_idx: Iterable[int], scratch: Iterable[int]) -> list[int]:
    """The parameters a caller passes: every one that is neither an output nor scratch."""
    if not n_params:
        return []
    skip = {int(i) % n_params for i in out_idx} | set(scratch)
    return [i for i in range(n_params) if i not in skip]

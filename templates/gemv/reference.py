"""The GEMV family's reference: an fp32 product, cast once (the kernel accumulates in fp32)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from .config import GemvProblem, torch_dtype

__all__ = ["ref_program", "reference"]


def ref_program(x: Any, W: Any, out_dtype: str | None = None) -> Any:
    """``x @ W.T`` in fp32 from the upcast inputs, cast to ``out_dtype`` (default: x's dtype)."""
    out = x.dtype if out_dtype is None else torch_dtype(out_dtype)
    return (x.float() @ W.float().T).to(out)


def reference(problem: GemvProblem) -> Callable[..., Any]:
    return functools.partial(ref_program, out_dtype=problem.out_dtype)

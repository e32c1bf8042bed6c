"""The matmul family's reference: the answer every candidate is checked against."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .config import IN_DTYPES, OUT_DTYPES, MatmulProblem, check_dtype, default_out, torch_dtype

if TYPE_CHECKING:
    import torch

__all__ = ["ref_program", "reference"]


def ref_program(
    A: torch.Tensor, B: torch.Tensor, trans_A: bool = False, trans_B: bool = True,
    out_dtype: str | None = None,
) -> torch.Tensor:
    """The torch answer for the same layouts, in ``out_dtype`` (default: the kernel's default for A).

    Always an fp32 product of the (upcast) inputs, cast once, as the kernel accumulates: the
    reference must be at least as precise as the kernel it judges. A half-precision ``torch.matmul``
    is not: on 4097x4097x4097 (H200, 2026-11-21) cuBLAS differed from every tuned kernel by up to 2
    in bf16 (1.2M elements over atol=rtol=1e-2) while agreeing on 4096^3. The autotuner's
    ``ref_latency`` is therefore the fp32 product's time; benchmarks time cuBLAS separately.
    """
    a = A.T if trans_A else A
    b = B.T if trans_B else B
    in_name = str(A.dtype).removeprefix("torch.")
    out_name = check_dtype(out_dtype, OUT_DTYPES, "out_dtype") if out_dtype is not None else (
        default_out(check_dtype(in_name, IN_DTYPES, "A.dtype")))
    return (a.float() @ b.float()).to(torch_dtype(out_name))


def reference(problem: MatmulProblem) -> Callable[..., Any]:
    """:func:`ref_program` for ``problem``'s layouts and output dtype: ``ref(A, B) -> C``."""
    return functools.partial(ref_program, trans_A=problem.trans_A, trans_B=problem.trans_B,
                             out_dtype=problem.out_dtype)

"""The GEMV family's types: its problem (:class:`GemvProblem`, ``y = x @ W.T`` for 1 to 16 rows of x) and
its config (:class:`GemvConfig`: which program, ``path``, and its keys, the carver's GEMV keys plus the
SIMT path's vector width).

The rules are the carver's (``carver.problem`` for shapes and bytes, ``carver.templates.GEMVTemplate``
for configs), so the carver never ranks what this kernel refuses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from carver.problem import canonical_dtype, check_device_bytes, dtype_bytes, int_in_range, shape_dim
from carver.templates import GEMV_MAX_M, GEMV_PATHS, gemv_vec
from templates.protocol import TemplateConfig

__all__ = ["IN_DTYPES", "OUT_DTYPES", "GemvConfig", "GemvProblem", "check_dtype", "make_problem", "resolved_vec",
           "torch_dtype"]

IN_DTYPES: tuple[str, ...] = ("float16", "bfloat16")
OUT_DTYPES: tuple[str, ...] = ("float16", "bfloat16", "float32")


def check_dtype(value: object, allowed: tuple[str, ...], what: str) -> str:
    """A dtype name in ``allowed`` (the carver's aliases: ``"fp16"``, ``torch.float16``)."""
    try:
        name = canonical_dtype(value, what)
    except ValueError:
        name = None
    if name not in allowed:
        raise ValueError(f"{what} must be one of {list(allowed)}, got {value!r}")
    return name


def torch_dtype(name: str) -> Any:
    import torch

    return getattr(torch, name)


@dataclass(frozen=True)
class GemvProblem:
    """``y[M, N] = x[M, K] @ W[N, K].T`` with fp32 accumulation, for decoding: M (tokens) 1 to 16.

    ``out_dtype`` None is ``dtype``. Beyond 16 rows the weights are no longer the only cost and a
    tensor-core GEMM wins: use ``templates.matmul`` (the message says so).
    """

    M: int
    N: int
    K: int
    dtype: str = "float16"
    out_dtype: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "M", int_in_range(
            self.M, "M", 1, GEMV_MAX_M, meaning="rows of x, tokens decoded together",
            too_big=f"for M > {GEMV_MAX_M} use the GEMM: templates.matmul.tune(M, N, K, trans_B=True)"))
        for name in ("N", "K"):
            object.__setattr__(self, name, shape_dim(getattr(self, name), name))
        dtype = check_dtype(self.dtype, IN_DTYPES, "dtype")
        object.__setattr__(self, "dtype", dtype)
        out = dtype if self.out_dtype is None else check_dtype(self.out_dtype, OUT_DTYPES, "out_dtype")
        object.__setattr__(self, "out_dtype", out)
        check_device_bytes(self.operand_bytes, f"the GEMV {self.describe()}")

    @property
    def weight_bytes(self) -> int:
        """Bytes of W: what the kernel must stream from memory, the numerator of its bandwidth."""
        return self.N * self.K * dtype_bytes(self.dtype)

    @property
    def operand_bytes(self) -> int:
        b = dtype_bytes(self.dtype)
        return self.weight_bytes + self.M * self.K * b + self.M * self.N * dtype_bytes(self.out_dtype)

    def describe(self) -> str:
        return f"{self.M}x{self.N}x{self.K} {self.dtype}->{self.out_dtype}"


def make_problem(M: object, N: object, K: object, dtype: object = "float16", out_dtype: object = None) -> GemvProblem:
    return GemvProblem(M, N, K, dtype, out_dtype)


@dataclass(frozen=True, kw_only=True)
class GemvConfig(TemplateConfig):
    """One GEMV kernel, by one of two programs (``path``).

    ``"simt"`` (the default): ``block_N`` rows of W per CTA, ``thread_num`` threads (``thread_num /
    block_N`` of them reduce one row, a power of two up to 32), ``block_K`` elements of each row per step
    (each thread loads ``unroll = block_K / (thread_num / block_N * vec)`` vectors before it uses any: the
    loads in flight). ``vec`` is the vector width in elements; 0 picks the widest load K allows.

    ``"mma"``: tensor cores. x padded to 16 rows (zero-filled, never loaded or stored past M), W in
    ``block_N x block_K`` tiles through a ``num_stages`` pipeline into shared memory, ``T.gemm`` into a
    ``16 x block_N`` fp32 accumulator over ``thread_num`` threads; ``split_k`` CTAs share a tile's K and a
    second kernel sums their fp32 partials (no atomics). ``tma`` (default True) loads the tiles as
    TileLang lowers them (TMA with a producer warpgroup on Hopper); ``tma=False`` loads them with cp.async
    in a plain pipeline (no producer, no TMA set-up: less fixed cost, which small weights feel; no split).
    ``vec`` is the SIMT path's and stays 0.
    """

    block_N: int
    block_K: int
    thread_num: int
    vec: int = 0
    path: str = "simt"
    num_stages: int = 0
    split_k: int = 1
    tma: bool = True

    @classmethod
    def normalize(cls, values: Any) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in values.items():
            if k == "tma":  # the check every config's bool keys get, by annotation
                out[k] = super().normalize({k: v})[k]
                continue
            if k == "path":
                if v not in GEMV_PATHS:
                    raise ValueError(f"path must be one of {list(GEMV_PATHS)}, got {v!r}; use 'simt' (CUDA cores) "
                                     f"or 'mma' (tensor cores)")
                out[k] = v
                continue
            lo = 0 if k in ("vec", "num_stages") else 1
            fix = "0 (the widest K allows), 1, 2, 4 or 8" if k == "vec" else "a positive int"
            out[k] = int_in_range(v, k, lo, 1024 if k in ("thread_num", "block_N") else 2**31 - 1, fix=f"use {fix}")
        if out.get("vec", 0) not in (0, 1, 2, 4, 8):
            raise ValueError(f"vec must be 0 (auto), 1, 2, 4 or 8 elements, got {out['vec']!r}; use vec=0")
        return out

    @property
    def reduce_threads(self) -> int:
        return self.thread_num // self.block_N

    def carver_dict(self) -> dict[str, Any]:
        """The carver's form (``carver.templates.GEMVTemplate``): three keys for SIMT, six for mma (a SIMT
        config that sets an mma key keeps it, so the carver's rules name it)."""
        out = {"path": "mma"} if self.path == "mma" else {}
        out |= {k: getattr(self, k) for k in ("block_N", "block_K", "thread_num")}
        for k in ("num_stages", "split_k"):
            if self.path == "mma" or getattr(self, k) != type(self).defaults()[k]:
                out[k] = getattr(self, k)
        if not self.tma:  # the default (TMA) stays out, so the dicts of the grid's TMA configs do not change
            out["tma"] = False
        return out


def resolved_vec(problem: GemvProblem, config: GemvConfig) -> int:
    """The vector width the kernel uses: ``config.vec``, or the widest K allows when it is 0."""
    return config.vec or gemv_vec(problem.K, problem.dtype)

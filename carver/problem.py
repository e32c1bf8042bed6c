"""The problem a template describes (shapes, dtypes, layouts), checked once at the API edge.

Every shape that enters the carver or a template goes through :func:`shape_dim` and
:func:`check_device_bytes`, so a size no GPU can hold is refused here, with the value and the fix,
instead of overflowing int64 deep inside the model (a 2**40 cube used to rank with negative latencies).
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

__all__ = [
    "DTYPE_BYTES",
    "INT32_MAX",
    "MAX_DEVICE_BYTES",
    "MatmulProblem",
    "canonical_dtype",
    "check_device_bytes",
    "default_out_dtype",
    "dtype_bytes",
    "flag",
    "int_in_range",
    "is_bool",
    "positive_int",
    "shape_dim",
]

#: TileLang indexes tensors with int32: a dimension above this does not compile.
INT32_MAX = 2**31 - 1
#: The bound on a problem's bytes when no GPU is named: 1 TiB, several times the memory of the largest GPU
#: there is (288 GB in 2026). With an arch, its ``memory_bytes`` is the bound instead. It also keeps every
#: product the model forms (M*N*K <= 2**60) inside int64.
MAX_DEVICE_BYTES = 2**40

#: Bytes per element of every dtype the carver knows.
DTYPE_BYTES: dict[str, int] = {
    "float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3": 1, "float8_e5m2": 1, "int8": 1, "int32": 4,
}
_ALIASES = {
    "float": "float32", "fp32": "float32", "f32": "float32",
    "half": "float16", "fp16": "float16", "f16": "float16",
    "bf16": "bfloat16",
    "fp8": "float8_e4m3", "e4m3": "float8_e4m3", "fp8_e4m3": "float8_e4m3", "float8_e4m3fn": "float8_e4m3",
    "e5m2": "float8_e5m2", "fp8_e5m2": "float8_e5m2",
}


def canonical_dtype(dtype: object, what: str = "dtype") -> str:
    """"fp16", "half", torch.float16 and "float16" are one dtype; unknown names are an error."""
    name = str(dtype).removeprefix("torch.")
    name = _ALIASES.get(name, name)
    if name not in DTYPE_BYTES:
        raise ValueError(f"{what} must be one of {sorted(DTYPE_BYTES)}, got {dtype!r}")
    return name


def default_out_dtype(in_dtype: str) -> str:
    """The output dtype of a GEMM when none is given (the one rule, for the carver and the templates):
    fp16/bf16/fp32 GEMMs return their input dtype (a bf16 GEMM's answer can exceed fp16's 65504); fp8
    returns fp16 (an fp8 C loses most of the answer); int8 returns int32 (its accumulator)."""
    in_dtype = canonical_dtype(in_dtype, "in_dtype")
    if in_dtype.startswith("float8"):
        return "float16"
    return "int32" if in_dtype == "int8" else in_dtype


def dtype_bytes(dtype: str) -> int:
    return DTYPE_BYTES[canonical_dtype(dtype)]


def is_bool(value: object) -> bool:
    """A Python or numpy bool (numpy 2 names its type ``numpy.bool``, numpy 1 ``numpy.bool_``)."""
    return isinstance(value, bool) or (type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_"))


def _is_int(value: object) -> bool:
    """A Python or numpy integer, but not a bool (``True`` is an int to Python, never a size here)."""
    return isinstance(value, numbers.Integral) and not is_bool(value)


def int_in_range(value: object, what: str, lo: int, hi: int, *, meaning: str = "", too_big: str = "",
                 fix: str = "", kind: str | None = None) -> int:
    """``int(value)`` if it is an integer (numpy ints too, never a bool) in ``[lo, hi]``, else a ValueError
    that names ``what`` and the value: ``kind`` says what is wanted ("a positive int"), ``meaning``
    explains the key, ``too_big`` why ``hi`` is the limit, ``fix`` what to pass instead."""
    kind = kind or ("a positive int" if lo == 1 else f"an int >= {lo}")
    meaning = f" ({meaning})" if meaning else ""
    fix = f"; {fix}" if fix else ""
    if not _is_int(value):
        raise ValueError(f"{what} must be {kind}, got {value!r}: it must be an int, not a "
                         f"{type(value).__name__}{meaning}{fix}")
    if value < lo:
        raise ValueError(f"{what} must be {kind}, got {value!r}{meaning}{fix}")
    if value > hi:
        too_big = f" ({too_big})" if too_big else ""
        raise ValueError(f"{what} must be at most {hi}, got {value!r}{too_big}{fix}")
    return int(value)


def positive_int(value: object, what: str, hi: int | None = None) -> int:
    """``int(value)`` if it is a positive integer (numpy ints too, not a bool) and at most ``hi``,
    else a ValueError that names ``what``."""
    return int_in_range(value, what, 1, hi if hi is not None else 2**63 - 1)


def shape_dim(value: object, what: str) -> int:
    """One tensor dimension: a positive integer TileLang can index (at most 2**31 - 1)."""
    return int_in_range(value, what, 1, INT32_MAX,
                        too_big="2**31 - 1: TileLang indexes tensors with int32; split the problem along "
                                f"{what} into pieces of at most that size")


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def check_device_bytes(needed: int, what: str, arch: object = None) -> None:
    """Refuse a problem whose tensors need more bytes than the GPU has (``arch.memory_bytes`` when the
    arch says, else :data:`MAX_DEVICE_BYTES`, more than any GPU has)."""
    limit = getattr(arch, "memory_bytes", None)
    if limit:
        if needed > limit:
            raise ValueError(f"{what} needs {needed} bytes ({_gib(needed)}), over the {_gib(limit)} of device "
                             f"memory of {getattr(arch, 'name', 'this GPU')}; use a GPU with more memory or "
                             f"split the problem into smaller ones")
    elif needed > MAX_DEVICE_BYTES:
        raise ValueError(f"{what} needs {needed} bytes ({_gib(needed)}), more than any GPU holds (the carver's "
                         f"bound is {_gib(MAX_DEVICE_BYTES)}); split the problem into smaller ones")


def flag(value: object, what: str) -> bool:
    """``value`` as a bool if it is one (numpy bools too), else a TypeError that names ``what``."""
    # A string "False" is truthy and would silently flip a layout.
    if not is_bool(value):
        raise TypeError(f"{what} must be a bool, got {value!r} of type {type(value).__name__}")
    return bool(value)


@dataclass(frozen=True)
class MatmulProblem:
    """``C[M, N] = op(A) @ op(B)``: A is (M, K), or (K, M) with ``trans_A``; B is (K, N), or (N, K) with
    ``trans_B`` (the default, the ``x @ W.T`` layout of the measured grids). ``out_dtype`` None (the
    default) is :func:`default_out_dtype` of ``in_dtype``: fp16 -> fp16, bf16 -> bf16, fp8 -> fp16."""

    M: int
    N: int
    K: int
    in_dtype: str = "float16"
    out_dtype: str | None = None
    accum_dtype: str = "float32"
    trans_A: bool = False
    trans_B: bool = True

    def __post_init__(self) -> None:
        for name in ("M", "N", "K"):
            object.__setattr__(self, name, shape_dim(getattr(self, name), name))
        object.__setattr__(self, "in_dtype", canonical_dtype(self.in_dtype, "in_dtype"))
        out_dtype = default_out_dtype(self.in_dtype) if self.out_dtype is None else self.out_dtype
        object.__setattr__(self, "out_dtype", canonical_dtype(out_dtype, "out_dtype"))
        object.__setattr__(self, "accum_dtype", canonical_dtype(self.accum_dtype, "accum_dtype"))
        object.__setattr__(self, "trans_A", flag(self.trans_A, "trans_A"))
        object.__setattr__(self, "trans_B", flag(self.trans_B, "trans_B"))
        if self.accum_dtype not in ("float32", "float16", "int32"):
            raise ValueError(f"accum_dtype must be float32 (or float16 / int32), got {self.accum_dtype!r}")
        check_device_bytes(self.operand_bytes, f"the GEMM {self.describe()}")

    @property
    def operand_bytes(self) -> int:
        """Bytes of A, B and C together: what the GPU must hold to run it."""
        return (self.M * self.K + self.N * self.K) * self.in_bytes + self.M * self.N * self.out_bytes

    @property
    def in_bytes(self) -> int:
        return DTYPE_BYTES[self.in_dtype]

    @property
    def out_bytes(self) -> int:
        return DTYPE_BYTES[self.out_dtype]

    @property
    def accum_bytes(self) -> int:
        return DTYPE_BYTES[self.accum_dtype]

    @property
    def flops(self) -> int:
        return 2 * self.M * self.N * self.K

    @property
    def tma_aligned(self) -> bool:
        """Whether every global row stride is a multiple of 16 bytes, which TMA requires.

        When it is not (K=4097 in fp16), TileLang 0.1.15 falls back from TMA + warp specialization to
        cp.async software pipelining, a different and slower kernel.
        """
        a_stride = (self.M if self.trans_A else self.K) * self.in_bytes
        b_stride = (self.K if self.trans_B else self.N) * self.in_bytes
        return a_stride % 16 == 0 and b_stride % 16 == 0

    def describe(self) -> str:
        layout = ("T" if self.trans_A else "N") + ("T" if self.trans_B else "N")
        return f"{self.M}x{self.N}x{self.K} {self.in_dtype}->{self.out_dtype} ({layout})"

"""The problem a template describes (shapes, dtypes, layouts), checked once at the API edge."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "DTYPE_BYTES",
    "MatmulProblem",
    "canonical_dtype",
    "dtype_bytes",
    "flag",
    "positive_int",
]

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


def dtype_bytes(dtype: str) -> int:
    return DTYPE_BYTES[canonical_dtype(dtype)]


def positive_int(value: object, what: str) -> int:
    """``value`` if it is a positive int (not a bool), else a ValueError that names ``what``."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{what} must be a positive int, got {value!r}")
    return value


def flag(value: object, what: str) -> bool:
    """``value`` as a bool if it is one (numpy bools too), else a TypeError that names ``what``."""
    # A string "False" is truthy and would silently flip a layout.
    if not isinstance(value, bool) and type(value).__name__ != "bool_":
        raise TypeError(f"{what} must be a bool, got {value!r} of type {type(value).__name__}")
    return bool(value)


@dataclass(frozen=True)
class MatmulProblem:
    """``C[M, N] = op(A) @ op(B)``: A is (M, K), or (K, M) with ``trans_A``; B is (K, N), or (N, K) with
    ``trans_B`` (the default, the ``x @ W.T`` layout of the measured grids)."""

    M: int
    N: int
    K: int
    in_dtype: str = "float16"
    out_dtype: str = "float16"
    accum_dtype: str = "float32"
    trans_A: bool = False
    trans_B: bool = True

    def __post_init__(self) -> None:
        for name in ("M", "N", "K"):
            positive_int(getattr(self, name), name)
        object.__setattr__(self, "in_dtype", canonical_dtype(self.in_dtype, "in_dtype"))
        object.__setattr__(self, "out_dtype", canonical_dtype(self.out_dtype, "out_dtype"))
        object.__setattr__(self, "accum_dtype", canonical_dtype(self.accum_dtype, "accum_dtype"))
        object.__setattr__(self, "trans_A", flag(self.trans_A, "trans_A"))
        object.__setattr__(self, "trans_B", flag(self.trans_B, "trans_B"))
        if self.accum_dtype not in ("float32", "float16", "int32"):
            raise ValueError(f"accum_dtype must be float32 (or float16 / int32), got {self.accum_dtype!r}")

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

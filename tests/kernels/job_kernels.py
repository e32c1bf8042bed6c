"""Kernels for the tuning-job tests (tests/test_job.py) on TileLang's C target. TileLang reads kernels
through inspect, so they live in files; the program itself is keyed_kernels.scale_add."""

from kernels.keyed_kernels import key_of, ref_scale_add, scale_add

CONFIGS = [{"block_M": 8, "block_N": 32}, {"block_M": 16, "block_N": 32}, {"block_M": 64, "block_N": 32}]
KEYS = [{"M": 8, "N": 64, "dtype": "float32"}, {"M": 64, "N": 64, "dtype": "float32"},
        {"M": 64, "N": 32, "dtype": "float32"}]


def picky_scale_add(M, N, block_M: int = 32, block_N: int = 32, dtype: str = "float32"):
    """scale_add, but a block more than four times taller than the problem is refused while elaborating:
    with CONFIGS, one config (block_M=64) fails for one key (M=8) only."""
    if block_M > 4 * M:
        raise ValueError(f"block_M={block_M} is more than four times M={M}")
    return scale_add(M, N, block_M, block_N, dtype)


def ref_none(A, B):
    """A wrong reference: returns nothing (the problem's fault, a TuningInputError)."""
    return None


def make_keyed(db_path, **tuning):
    """The job tests' keyed kernel: no buckets (every key is tuned as it is), two compile workers."""
    from autotuner import KeyedKernel

    return KeyedKernel(picky_scale_add, ["M", "N", "dtype"], CONFIGS, key_of=key_of,
                       compile_args={"out_idx": [-1], "ref_prog": ref_scale_add, "target": "c"},
                       tuning_args={"n_jobs": 2, "progress": False, "db_path": str(db_path), **tuning},
                       warmup=1, rep=3)

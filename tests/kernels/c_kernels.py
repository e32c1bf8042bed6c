"""Kernels for the C-target (CPU) tests of the autotuner. TileLang reads them through inspect,
so they live in a file."""

import time

import tilelang.language as T

M = 256
N = 256


def add(block_M: int = 32, block_N: int = 32, thread_num: int = 1, dtype: str = "float32"):
    """C = A + B, tiled; every config is correct."""

    @T.prim_func
    def main(A: T.Tensor((M, N), dtype), B: T.Tensor((M, N), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=thread_num) as (bx, by):
            for i, j in T.Parallel(block_M, block_N):
                C[by * block_M + i, bx * block_N + j] = A[by * block_M + i, bx * block_N + j] + B[by * block_M + i, bx * block_N + j]

    return main


def add_buggy(block_M: int = 32, block_N: int = 32, thread_num: int = 1, dtype: str = "float32"):
    """Like add, but block_N=16 writes A - B (a wrong result) and block_N=64 leaves half of C unwritten."""
    sign = -1.0 if block_N == 16 else 1.0
    cols = block_N // 2 if block_N == 64 else block_N

    @T.prim_func
    def main(A: T.Tensor((M, N), dtype), B: T.Tensor((M, N), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=thread_num) as (bx, by):
            for i, j in T.Parallel(block_M, cols):
                C[by * block_M + i, bx * block_N + j] = A[by * block_M + i, bx * block_N + j] + B[by * block_M + i, bx * block_N + j] * sign

    return main


def add_failing(block_M: int = 32, block_N: int = 32, thread_num: int = 1, hang: bool = False, dtype: str = "float32"):
    """block_M=0 fails while elaborating, block_M=48 fails in the compiler, hang=True never returns."""
    if hang:
        while True:
            time.sleep(0.1)
    if block_M == 0:
        raise ValueError("block_M must be positive, got 0")
    if block_M == 48:
        dtype = "not_a_dtype"

    @T.prim_func
    def main(A: T.Tensor((M, N), "float32"), B: T.Tensor((M, N), "float32"), C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=thread_num) as (bx, by):
            for i, j in T.Parallel(block_M, block_N):
                C[by * block_M + i, bx * block_N + j] = A[by * block_M + i, bx * block_N + j] + B[by * block_M + i, bx * block_N + j]

    return main


def ref_add(A, B):
    return A + B


def ref_add_setting_tf32(A, B):
    """``ref_add``, and a process-wide torch setting changed, as a reference may change one."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = True  # not torch's default
    return A + B


def add_crashing(block_M: int = 32, block_N: int = 32, thread_num: int = 1, mode: str = "ok", dtype: str = "float32",
                 repeat: int = 1):
    """mode="abort" kills its process (raise(SIGSEGV)), mode="spin" never finishes; repeat=n writes C n times
    over, so that a config's cost, and the winner, is known in advance."""
    spins = 1 << 40 if mode == "spin" else repeat

    @T.prim_func
    def main(A: T.Tensor((M, N), dtype), B: T.Tensor((M, N), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=thread_num) as (bx, by):
            if mode == "abort":
                T.call_extern("int32", "raise", 11)
            for s in T.serial(spins):
                for i, j in T.Parallel(block_M, block_N):
                    C[by * block_M + i, bx * block_N + j] = A[by * block_M + i, bx * block_N + j] + B[by * block_M + i, bx * block_N + j] + s * 0

    return main


def add_killing_worker(block_M: int = 32, block_N: int = 32, thread_num: int = 1, kill_worker: bool = False):
    """Like add; kill_worker=True SIGKILLs the compile worker from the compiler process (its grandchild), as
    the OOM killer or ``kill -9`` would: the worker dies while it compiles this config."""
    if kill_worker:
        import os
        import signal

        with open(f"/proc/{os.getppid()}/stat") as f:  # the compile child's parent: the worker
            worker = int(f.read().rsplit(")", 1)[1].split()[1])
        os.kill(worker, signal.SIGKILL)
        time.sleep(60)  # killed with its worker's compile group meanwhile
    return add(block_M, block_N, thread_num)


def add_killing_its_ray_host(block_M: int = 32, block_N: int = 32, thread_num: int = 1, kill_host: bool = False):
    """Like add; kill_host=True SIGKILLs the Ray compile host (autotuner/ray_cluster.py) compiling it, found up the
    compiler process's parents by its title (``ray::CompileHost``): a config that brings its host down each time."""
    if kill_host:
        import os
        import signal

        pid = os.getpid()
        while pid > 1:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"ray::CompileHost" in f.read():
                    os.kill(pid, signal.SIGKILL)
                    time.sleep(60)  # killed with its host meanwhile
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
    return add(block_M, block_N, thread_num)


def add_staged(block_M: int = 32, staged: bool = True, reads_unwritten: bool = False):
    """C = A + B in two stages through a scratch parameter W (autotuner.scratch), as the split-K matmul
    sums its partials: W[0] = A and W[1] = B, then C = W[0] + W[1]. ``staged=False`` is the plain add
    (no scratch: another signature in the same run); ``reads_unwritten`` never writes W[1], so C reads
    whatever the scratch held."""
    from autotuner import scratch

    if not staged:
        return add(block_M=block_M)

    @T.prim_func
    def main(A: T.Tensor((M, N), "float32"), B: T.Tensor((M, N), "float32"), W: T.Tensor((2, M, N), "float32"),
             C: T.Tensor((M, N), "float32")):
        with T.Kernel(T.ceildiv(M, block_M), threads=1) as by:
            for i, j in T.Parallel(block_M, N):
                W[0, by * block_M + i, j] = A[by * block_M + i, j]
                if not reads_unwritten:
                    W[1, by * block_M + i, j] = B[by * block_M + i, j]
        with T.Kernel(T.ceildiv(M, block_M), threads=1) as by:
            for i, j in T.Parallel(block_M, N):
                C[by * block_M + i, j] = W[0, by * block_M + i, j] + W[1, by * block_M + i, j]

    return scratch.mark(main, "W")


def _staged_dec_factory(block_M: int = 32):
    return add_staged(block_M=block_M)


def staged_decorated():
    """add_staged behind TileLang's decorators, as a script writes it (built on call: the decorator imports
    the autotuner)."""
    import tilelang

    from autotuner import autotune

    return autotune(configs=[dict(block_M=32), dict(block_M=64)], warmup=1, rep=2, ref_prog=ref_add)(
        tilelang.jit(out_idx=[-1], target="c")(_staged_dec_factory))


def add_hanging(block_M: int = 32, block_N: int = 32, thread_num: int = 1, pidfile: str = ""):
    """Like add; with ``pidfile`` set and no such file yet, the compiler process writes its pid there and never
    returns: a compile that a stopped run must end, or whose host is lost (compiled again, it returns)."""
    import os

    if pidfile and not os.path.exists(pidfile):
        with open(pidfile, "w") as f:
            f.write(str(os.getpid()))
        while True:
            time.sleep(0.1)
    return add(block_M, block_N, thread_num)


def copy_with_device_source(source: str = "// none"):
    """A copy whose kernel carries ``source`` through ``T.import_source`` (as the attention programs carry
    their fast exponential): only the PrimFunc's metadata holds the text."""

    @T.prim_func
    def main(A: T.Tensor((M,), "float32"), B: T.Tensor((M,), "float32")):
        with T.Kernel(1, threads=1):
            T.import_source(source)
            for i in T.serial(M):
                B[i] = A[i]

    return main

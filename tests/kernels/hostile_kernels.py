"""Kernels that misbehave while they compile, for the process-lifetime tests (tests/test_trust_procs.py).
TileLang reads them through inspect, so they live in a file."""

import os
import subprocess
import time

import tilelang.language as T

M = 256
N = 256


def add_salted(block_M: int = 32, block_N: int = 32, salt: int = 0):
    """C = A + B, with ``salt`` in an attribute: each salt is a PrimFunc of its own text, which
    TileLang's kernel cache has never seen, so it really compiles (and writes its temporary files)."""

    @T.prim_func
    def main(A: T.Tensor((M, N), "float32"), B: T.Tensor((M, N), "float32"), C: T.Tensor((M, N), "float32")):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=1) as (bx, by):
            for i, j in T.Parallel(block_M, block_N):
                C[by * block_M + i, bx * block_N + j] = A[by * block_M + i, bx * block_N + j] + B[by * block_M + i, bx * block_N + j]

    return main.with_attr("tilecarve_test_salt", salt)


def add_hang_with_grandchild(block_M: int = 32, block_N: int = 32, hang: bool = False, salt: int = 0):
    """Like add_salted; hang=True never finishes compiling, like a hung nvcc: it starts a grandchild that sleeps for
    an hour and waits for it. Both write their pids to $TILECARVE_TEST_PIDS (if set), so that a
    test knows when the hang has begun and which processes must die."""
    if hang:
        out = os.environ.get("TILECARVE_TEST_PIDS")
        sleeper = subprocess.Popen(["sleep", "3600"])
        if out:
            for name, pid in (("compiler", os.getpid()), ("sleeper", sleeper.pid)):
                with open(os.path.join(out, f"{name}-{pid}.tmp"), "w") as f:
                    f.write(str(pid))
                os.rename(os.path.join(out, f"{name}-{pid}.tmp"), os.path.join(out, f"{name}-{pid}"))
        while True:
            sleeper.wait()
            time.sleep(0.1)
    return add_salted(block_M, block_N, salt)


def add_with_a_lock(block_M: int = 32, block_N: int = 32, salt: int = 0, pid_dir: str = ""):
    """Like add_salted, but makes a multiprocessing lock while compiling (as tqdm does when TileLang
    logs) and records the pid of the process that made it in ``pid_dir``."""
    import multiprocessing

    lock = multiprocessing.RLock()
    with lock:
        if pid_dir:
            open(os.path.join(pid_dir, f"locker-{os.getpid()}"), "w").close()
    return add_salted(block_M, block_N, salt)


def add_leaving_a_process(block_M: int = 32, block_N: int = 32, salt: int = 0, pid_dir: str = ""):
    """Compiles fine, but starts a process that outlives the compile (a compiler server, a stray
    nvcc) and records its pid in ``pid_dir``."""
    sleeper = subprocess.Popen(["sleep", "3600"])
    if pid_dir:
        open(os.path.join(pid_dir, f"stray-{sleeper.pid}"), "w").close()
    return add_salted(block_M, block_N, salt)


def add_crashing_the_compiler(block_M: int = 32, block_N: int = 32, crash: bool = False):
    """crash=True kills the compiling process with SIGSEGV, as a crashing compiler would."""
    if crash:
        import signal

        os.kill(os.getpid(), signal.SIGSEGV)
    return add_salted(block_M, block_N)


def add_noting_priority(block_M: int = 32, block_N: int = 32, salt: int = 0, pid_dir: str = ""):
    """Like add_salted, but records the scheduling priority (nice value) of the process that compiles it in
    ``pid_dir``."""
    with open(os.path.join(pid_dir, f"nice-{os.getpid()}"), "w") as f:
        f.write(str(os.getpriority(os.PRIO_PROCESS, 0)))
    try:
        with open("/proc/self/autogroup") as src, open(os.path.join(pid_dir, f"autogroup-{os.getpid()}"), "w") as f:
            f.write(src.read())
    except OSError:  # no autogroups on this kernel
        pass
    return add_salted(block_M, block_N, salt)

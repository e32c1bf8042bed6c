"""A kernel that lets the next kernel on its stream start early (programmatic dependent launch) and only
then writes its output, as PDL-enabled producers (FlashInfer, TRT-LLM, TileLang's T.pdl_trigger) may.
TileLang reads kernels through inspect, so it lives in a file."""

import tilelang.language as T


def late_writer(M: int, K: int, spin: int = 20000):
    """A[i, j] = 1.0 for every element, written after a ``spin``-step busy loop that follows the trigger."""

    @T.prim_func
    def main(A: T.Tensor((M, K), "float16")):
        with T.Kernel(T.ceildiv(M * K, 256), threads=256) as bx:
            acc = T.alloc_local((1,), "float32")
            acc[0] = 2.0
            T.pdl_trigger()
            for _ in T.serial(spin):
                acc[0] = acc[0] * 1.0000001 + 0.5
            tx = T.get_thread_binding(0)
            A[(bx * 256 + tx) // K, (bx * 256 + tx) % K] = T.cast(T.min(acc[0], 1.0), "float16")

    return main

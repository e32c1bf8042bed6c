"""Hardware counters for our kernels beside the vendor's, under Nsight Compute: where a kernel's time goes
(SM clock, tensor-pipe activity, warp stalls, per-instruction stall samples), for the questions the
timings alone cannot answer (issues 9 and 14: what cuDNN's attention and cuBLAS's GEMM do per clock
that ours do not).

    . .gpu/setup.sh && ncu --profile-from-start off --clock-control none --set full --import-source yes \\
        -o $OUT/prof python3 benchmarks/ncu_profile.py --what attn,gemm --list $OUT/kernels.json
    ncu -i $OUT/prof.ncu-rep --page raw --csv > $OUT/raw.csv

Each kernel is compiled and run a few times outside the profiled range, then launched once between
``cudaProfilerStart`` and ``cudaProfilerStop``, so the report holds those launches only, in the order of
``--list`` (a JSON list of the calls' names). A call may launch several kernels (cuBLAS's GEMV: a split-K
product and its reduction) or none that ncu profiles (a device copy is a memcpy), so the names label the
kernels only where each call launched one: ``ncu_summary.py`` shows ncu's own kernel name beside each.
``--clock-control none`` leaves the GPU's clocks alone, as the timing benchmarks do.

Kernels (``--what``): ``attn``: 8 x 1k tokens, GQA 32/8, d128, fp16, not causal: the persistent ws loop
(128x128, 2 stages, one CTA per SM), its one-tile form, and cuDNN's SDPA; ``gemm``: 8192^3 fp16, A (M, K)
and B (N, K): the tuned ws form (128x256x64, 4 stages, C on the ring), TileLang's pipelined loop of the
same tile, and cuBLAS (``A @ B.T``); ``gemv``: M = 4 rows against the 4096x4096 fp16 weight (32 MB): the
tuner's cp.async, TMA and SIMT candidates there and cuBLAS (ncu flushes the caches before each profiled
launch, so each reads from HBM).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

ATTN_SHAPE = (8, 32, 8, 1024, 128, False)  # B, H, H_kv, S, D, causal
GEMM_SHAPE = (8192, 8192, 8192)
WS_ATTN = {"block_M": 128, "block_N": 128, "num_stages": 2, "threads": 256, "variant": "ws"}
GEMM_TILE = {"block_M": 128, "block_N": 256, "block_K": 64, "num_stages": 4, "thread_num": 256,
             "enable_rasterization": True}
GEMM_WS = {**GEMM_TILE, "warp_policy": "full_row", "variant": "ws",
           "pass_configs": {"tl.enable_aggressive_shared_memory_merge": True}}
GEMV_SHAPE = (4, 4096, 4096)  # M, N, K: the 32 MB weight of issue 10's missed bandwidth target
GEMV_CONFIGS = {  # the tuner's candidates there (H200): cp.async twins, the TMA mma top-1, the SIMT top-1
    "gemv_async_32x128_s8": {"block_N": 32, "block_K": 128, "thread_num": 128, "path": "mma", "num_stages": 8,
                             "tma": False},
    "gemv_async_32x256_s4": {"block_N": 32, "block_K": 256, "thread_num": 128, "path": "mma", "num_stages": 4,
                             "tma": False},
    "gemv_tma_32x512_s4": {"block_N": 32, "block_K": 512, "thread_num": 128, "path": "mma", "num_stages": 4},
    "gemv_simt_16x2048": {"block_N": 16, "block_K": 2048, "thread_num": 512},
}


def _randn(*shapes: tuple[int, ...]) -> list[Any]:
    """fp16 inputs of these shapes on the GPU, from one seeded generator."""
    import torch

    g = torch.Generator(device="cuda").manual_seed(0)
    return [torch.randn(*shape, device="cuda", generator=g).half() for shape in shapes]


def _ours(build: Callable[[dict[str, Any]], Any], configs: dict[str, dict[str, Any]],
          *inputs: Any) -> dict[str, Callable[[], Any]]:
    """name -> a call, on ``inputs``, of the kernel ``build`` compiles for that name's config."""
    kernels = {name: build(cfg) for name, cfg in configs.items()}
    return {name: (lambda kern=kern: kern(*inputs)) for name, kern in kernels.items()}


def attention_calls(sms: int) -> dict[str, Callable[[], Any]]:
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from templates import attention

    b, h, hkv, s, d, causal = ATTN_SHAPE
    q, k, v = _randn(*((b, s, n, d) for n in (h, hkv, hkv)))
    calls = _ours(lambda cfg: attention.compile(b, h, s, d, kv_heads=hkv, causal=causal, config=cfg),
                  {"attn_ws_persistent": {**WS_ATTN, "persistent": sms}, "attn_ws_one_tile": WS_ATTN}, q, k, v)
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))

    def cudnn() -> Any:
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, enable_gqa=True)

    calls["attn_cudnn"] = cudnn
    return calls


def gemm_calls() -> dict[str, Callable[[], Any]]:
    from templates import matmul

    m, n, k = GEMM_SHAPE
    a, bt = _randn((m, k), (n, k))
    calls = _ours(lambda cfg: matmul.compile(m, n, k, cfg), {"gemm_ws_ring": GEMM_WS, "gemm_pipelined": GEMM_TILE},
                  a, bt)
    calls["gemm_cublas"] = lambda: a @ bt.T
    return calls


def gemv_calls() -> dict[str, Callable[[], Any]]:
    from templates import gemv

    m, n, k = GEMV_SHAPE
    x, w = _randn((m, k), (n, k))
    calls = _ours(lambda cfg: gemv.compile(m, n, k, cfg), GEMV_CONFIGS, x, w)
    calls["gemv_cublas"] = lambda: x @ w.T  # a split-K product and its reduction: two kernels
    return calls


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--what", default="attn,gemm", help="comma-separated: attn, gemm, gemv")
    p.add_argument("--list", type=Path, required=True, help="where to write the profiled calls' names, in order")
    p.add_argument("--warmup", type=int, default=5)
    args = p.parse_args(argv)
    import torch

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    calls: dict[str, Callable[[], Any]] = {}
    for what in args.what.split(","):
        calls.update({"attn": lambda: attention_calls(sms), "gemm": gemm_calls, "gemv": gemv_calls}[what]())
    for fn in calls.values():
        for _ in range(args.warmup):
            fn()
    torch.cuda.synchronize()
    names = []
    for name, fn in calls.items():
        torch.cuda.profiler.start()
        fn()
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
        names.append(name)
        print(f"profiled {name}", flush=True)
    args.list.write_text(json.dumps({"calls": names, "device": torch.cuda.get_device_name(0)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

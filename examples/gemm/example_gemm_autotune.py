"""Tune a GEMM on the local GPU and compare it with torch (cuBLAS): tilecarve's main job.

    python examples/gemm/example_gemm_autotune.py 4096 4096 4096 --with_roller   # carver top-k: seconds
    python examples/gemm/example_gemm_autotune.py 4096 4096 4096                 # 288-config grid: minutes
    python examples/gemm/example_gemm_autotune.py --m 4096 --n 4096 --k 4096 --with_roller  # TileLang's flags

The flow is the one of TileLang's ``example_gemm_autotune.py``, with tilecarve's pieces: the carver
proposes configs (``--with_roller``; otherwise the exhaustive grid), the autotuner compiles them in
parallel, checks each against torch, times them and caches every trial, and the best kernel is timed
against ``torch.matmul``. Run it twice: the second run is served from the tuning database.

Needs a CUDA GPU: without one it says so and exits with status 2.
"""

import argparse
import functools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout without installing

from templates import matmul as mm  # noqa: E402  (after the path line above)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    for dim in "MNK":  # positional, or TileLang's --m/--n/--k (4096 each when neither is given)
        ap.add_argument(dim, type=int, nargs="?", default=None)
        ap.add_argument(f"--{dim.lower()}", type=int, default=None, help=f"matrix dimension {dim} (default 4096)")
    ap.add_argument("--with_roller", "--with-roller", action="store_true",
                    help="tune the carver's top-k hints (plus split-K variants when the tiles fill less "
                         "than one wave, and Hopper variants on Hopper) instead of the 288-config grid")
    ap.add_argument("--topk", type=int, default=8, help="hints to tune with --with_roller (default 8)")
    ap.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float8_e4m3"])
    ap.add_argument("--trans_A", action="store_true", help="A is stored (K, M)")
    ap.add_argument("--no_trans_B", action="store_true", help="B is stored (K, N) instead of (N, K)")
    ap.add_argument("--warmup", type=int, default=3, help="warmup calls per config (a count)")
    ap.add_argument("--rep", type=int, default=20, help="timed calls per config (a count)")
    args = ap.parse_args(argv)
    for dim in "MNK":
        pos, opt = getattr(args, dim), getattr(args, dim.lower())
        if pos is not None and opt is not None and pos != opt:
            ap.error(f"{dim} given twice: {pos} (positional) and --{dim.lower()} {opt}; give one")
        setattr(args, dim, pos if pos is not None else opt if opt is not None else 4096)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("example_gemm_autotune: no CUDA GPU here, and tuning a GEMM means running it. Run this on "
              "a GPU machine; without one, README.md shows the CPU-target example, and "
              "`python -m pytest -m nvcc` compiles these kernels for sm_90a.", file=sys.stderr)
        return 2

    from autotuner import AutoTuner
    from autotuner.timing import time_callable

    M, N, K = args.M, args.N, args.K
    trans_A, trans_B = args.trans_A, not args.no_trans_B
    out_dtype = "float16" if args.dtype == "float8_e4m3" else args.dtype

    # 1. the carver's model of this GEMM on this GPU: hints, and which configs are legal
    tmpl = mm.carver_template(M, N, K, in_dtype=args.dtype, out_dtype=out_dtype, trans_A=trans_A,
                              trans_B=trans_B, arch="cuda")
    if args.with_roller:
        hints = [mm.normalize_config(h.to_config()) for h in tmpl.recommend_hints(topk=args.topk)]
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        configs = hints + mm.split_k_candidates(hints, M, N, K, sms)
        if tmpl.arch.has_wgmma:  # what TileLang's grid cannot express: row-wise warps, persistent CTAs
            configs += mm.hopper_variants(hints, M, N, K, sms, tmpl.arch.smem_per_block, args.dtype, out_dtype)
    else:
        configs = mm.default_space(M, N, K)
    print(f"{M}x{N}x{K} {args.dtype} trans_A={trans_A} trans_B={trans_B} on {torch.cuda.get_device_name()}: "
          f"tuning {len(configs)} configs ({f'carver top-{args.topk}' if args.with_roller else 'grid'})")

    # 2. the autotuner: compile in parallel, check against torch, time, cache
    kernel = functools.partial(mm.kernel, M, N, K, in_dtype=args.dtype, out_dtype=out_dtype,
                               trans_A=trans_A, trans_B=trans_B)
    ref_program = functools.partial(mm.ref_program, trans_A=trans_A, trans_B=trans_B, out_dtype=out_dtype)
    result = (AutoTuner.from_kernel(kernel=kernel, configs=configs,
                                    validate=functools.partial(mm.validate, tmpl, K, args.dtype))
              .set_compile_args(out_idx=[-1], target="auto", ref_prog=ref_program, skip_check=False,
                                atol=1e-2, rtol=1e-2)
              .run(warmup=args.warmup, rep=args.rep))
    result.summary(file=sys.stdout)

    # 3. the best kernel against torch, timed the same way (CUDA events, L2 flushed, median)
    tdtype = torch.float8_e4m3fn if args.dtype == "float8_e4m3" else getattr(torch, args.dtype)
    a = torch.randn(M, K, device="cuda").to(tdtype)
    b = torch.randn(K, N, device="cuda").to(tdtype)
    A = a.T.contiguous() if trans_A else a
    B = b.T.contiguous() if trans_B else b
    out = result.kernel(A, B)
    err = (out.float() - a.float() @ b.float()).abs().max().item()
    ours = time_callable(lambda: result.kernel(A, B), 10, 100, "cuda").median_ms
    lhs, rhs = (A.T if trans_A else A), (B.T if trans_B else B)
    # torch.matmul in the input dtype is cuBLAS; fp8 has no plain matmul, so time the fp32 reference
    torch_mm = (lambda: lhs @ rhs) if args.dtype != "float8_e4m3" else (lambda: ref_program(A, B))
    ref = time_callable(torch_mm, 10, 100, "cuda").median_ms
    flops = 2 * M * N * K
    print(f"best config {result.config} ({'from cache' if result.from_cache else 'tuned'} in "
          f"{result.seconds:.1f} s)")
    print(f"tilecarve: {ours * 1e3:8.1f} us  {flops / ours / 1e9:7.1f} TFLOP/s   max |err| {err:.3g}")
    print(f"torch:     {ref * 1e3:8.1f} us  {flops / ref / 1e9:7.1f} TFLOP/s   "
          f"(tilecarve / torch speed: {ref / ours:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A Llama-3-8B-sized MLP block on tilecarve's ``Linear``: record its shapes, tune them offline, write a
tuned table, then serve the block from the table in a fresh process without tuning (docs/deploy.md).

    python examples/model/mlp.py record-tune --table /tmp/llama-mlp.json   # tunes, writes the table
    python examples/model/mlp.py serve --table /tmp/llama-mlp.json         # a fresh process: no tuning

The block is ``down(silu(gate(x)) * up(x))`` (hidden 4096, intermediate 14336, no bias, fp16, random
weights). ``record-tune`` runs it at the token counts 1, 16, 128, 512, 2048 and 8192 inside
``autotuner.record()``, tunes every key met (gate and up share their shape, so 3 projections x 6
counts are 12 distinct keys), writes the table (to ``--table``, else a new temp dir; never the working
directory), and runs the block once more so that TileLang's disk cache holds the served kernels.
``serve`` loads the table, refuses to tune (``AutoTuner.plan`` raises), runs the block at every count,
prints the config each key got and where from, asserts they all came from the table, and prints one
JSON line (first-forward seconds, configs, counters) last.

Needs a CUDA GPU: without one it says so and exits with status 2.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout without installing

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

TOKENS = (1, 16, 128, 512, 2048, 8192)
HIDDEN, INTERMEDIATE = 4096, 14336


class MLP(torch.nn.Module):
    """Llama's SiLU-gated MLP: ``down(silu(gate(x)) * up(x))``; ``linear`` is the projection class."""

    def __init__(self, hidden: int = HIDDEN, intermediate: int = INTERMEDIATE, linear: type = torch.nn.Linear,
                 device: str | None = None, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        kw = {"bias": False, "device": device, "dtype": dtype}
        self.gate_proj = linear(hidden, intermediate, **kw)
        self.up_proj = linear(hidden, intermediate, **kw)
        self.down_proj = linear(intermediate, hidden, **kw)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def make_block(hidden: int, intermediate: int, seed: int = 0) -> MLP:
    """The block with tilecarve's Linear, random weights (the same for a seed), fp16 on the GPU."""
    from templates.matmul import Linear

    torch.manual_seed(seed)
    block = MLP(hidden, intermediate, Linear, device="cuda", dtype=torch.float16)
    for p in block.parameters():
        torch.nn.init.normal_(p, std=hidden ** -0.5)
    return block.requires_grad_(False)


def used_configs(block: MLP, tokens: tuple[int, ...]) -> dict[str, list]:
    """For each projection and token count: the kernel, its bucket key, the config that serves it and where it
    came from (a table, the database, the fallback, or a refinement of one between two edges)."""
    from templates.matmul.op import get_op

    op, out = get_op(), {}
    for name, lin in (("gate_proj", block.gate_proj), ("up_proj", block.up_proj), ("down_proj", block.down_proj)):
        for t in tokens:
            kk = op.kernel(t)
            key = {"M": t, "N": lin.out_features, "K": lin.in_features, "dtype": "float16"}
            config, source = kk.served_config(key)
            out[f"{name}@{t}"] = [kk.name, kk.make_key(key), config, source]
    return out


def record_tune(args: argparse.Namespace) -> dict:
    import autotuner

    table = Path(args.table) if args.table else Path(tempfile.mkdtemp(prefix="tilecarve-mlp-")) / "mlp-table.json"
    block = make_block(args.hidden, args.intermediate)
    xs = {t: torch.randn(t, args.hidden, device="cuda", dtype=torch.float16) for t in args.tokens}
    t0 = time.perf_counter()
    with torch.inference_mode(), autotuner.record() as rec:
        for x in xs.values():
            block(x)
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    print(f"recorded {len(rec.keys)} keys in {t1 - t0:.1f} s (fallback configs compiled):", flush=True)
    for name, key in rec.keys:
        print(f"  {name} {key}")
    path = rec.tune(table)
    t2 = time.perf_counter()
    job = job_summary(rec.results)
    print(f"tuned {len(rec.keys)} keys in {t2 - t1:.1f} s ({job['candidates']} candidates in one job: "
          + ", ".join(f"{k} {v:.1f} s" for k, v in job["phases"].items()) + f"); table: {path}", flush=True)
    with torch.inference_mode():  # the served kernels (one per bucket) into TileLang's disk cache
        for x in xs.values():
            block(x)
    torch.cuda.synchronize()
    t3 = time.perf_counter()
    print(f"compiled the served kernels in {t3 - t2:.1f} s")
    return {"table": str(path), "keys": len(rec.keys), "record_s": t1 - t0, "tune_s": t2 - t1, "warm_s": t3 - t2,
            "job": job}


def job_summary(results: list) -> dict:
    """Where the tuning job spent its seconds: its own steps (shared by every key) and, summed over the
    keys, each key's finalist rounds and winner; how many candidates, how many keys were warm hits."""
    cold = [r for r in results if not r.from_cache]
    phases = dict(list(cold[0].phases.items())[:2]) if cold else {}  # the job's start, compile and measure
    for r in cold:
        for k, v in list(r.phases.items())[2:]:
            phases[k] = phases.get(k, 0.0) + v
    return {"candidates": sum(len(r.trials) for r in results), "warm_keys": len(results) - len(cold),
            "phases": phases}


def serve(args: argparse.Namespace) -> dict:
    import autotuner
    from autotuner import keyed

    def refuse(*a: object, **k: object) -> None:
        raise AssertionError("serve must not tune: AutoTuner.plan was called")

    autotuner.AutoTuner.plan = refuse  # nothing may be tuned (every run and job plans first) in this process
    compile_s = [0.0]
    original = keyed.KeyedKernel._compile

    def timed_compile(self: keyed.KeyedKernel, *a: object) -> object:  # TileLang's own (cache) load time
        t = time.perf_counter()
        try:
            return original(self, *a)
        finally:
            compile_s[0] += time.perf_counter() - t

    keyed.KeyedKernel._compile = timed_compile
    autotuner.use_table(args.table)
    block = make_block(args.hidden, args.intermediate)
    xs = {t: torch.randn(t, args.hidden, device="cuda", dtype=torch.float16) for t in args.tokens}
    first = {}
    prof = cProfile.Profile() if args.profile else None
    with torch.inference_mode():
        for t, x in xs.items():
            t0 = time.perf_counter()
            if prof:
                prof.enable()
            block(x)
            torch.cuda.synchronize()
            if prof:
                prof.disable()
            first[t] = time.perf_counter() - t0
    if prof:
        with open(args.profile, "w") as f:
            pstats.Stats(prof, stream=f).sort_stats("cumulative").print_stats(60)
    configs = used_configs(block, tuple(args.tokens))
    for name, (kernel, key, config, source) in configs.items():
        print(f"  {name:16s} {kernel} M-bucket {key['M']}: {config} ({source})")
    from templates.matmul.op import get_op

    op = get_op()
    stats = {op.gemm.name: dict(op.gemm.stats), op.gemv.name: dict(op.gemv.stats)}
    untuned = autotuner.untuned()
    assert all(c[3] == "table" for c in configs.values()), f"keys not served from the table: {untuned}"
    assert not any("tuned" in s or "database" in s for s in stats.values()), stats
    return {"first_forward_s": first, "first_forward_total_s": sum(first.values()),
            "tilelang_load_s": compile_s[0], "configs": configs, "stats": stats, "untuned": untuned}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("command", choices=["record-tune", "serve"])
    ap.add_argument("--table", help="the tuned table to write (record-tune; default: a new temp dir) or load (serve)")
    ap.add_argument("--tokens", type=int, nargs="+", default=list(TOKENS), help="token counts (default: %(default)s)")
    ap.add_argument("--hidden", type=int, default=HIDDEN)
    ap.add_argument("--intermediate", type=int, default=INTERMEDIATE)
    ap.add_argument("--profile", help="serve: write a cProfile report of the first forwards to this file")
    ap.add_argument("--topk", type=int, default=4, help="carver candidates tuned per key (default 4, plus variants)")
    args = ap.parse_args(argv)
    if args.command == "serve" and not args.table:
        ap.error("serve needs --table PATH (the file record-tune wrote)")
    if not torch.cuda.is_available():
        print("this example needs a CUDA GPU (torch.cuda.is_available() is False); the op falls back to "
              "torch.nn.functional.linear on the CPU, so there is nothing to tune here", file=sys.stderr)
        return 2
    from templates.matmul.op import configure

    configure(topk=args.topk)
    result = record_tune(args) if args.command == "record-tune" else serve(args)
    print(json.dumps(result, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())

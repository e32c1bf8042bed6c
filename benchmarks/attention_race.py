"""Named attention configs raced against torch's SDPA backends: each config checked against the fp32
reference (zero mismatches at atol = rtol = 1e-2), then every config that passed and the flash and cuDNN
backends timed in interleaved rounds in this one process. For A/B questions about one program change
(a pass config, a schedule), where ``attention_ws.py`` re-measures the whole ws space.

    . .gpu/setup.sh && python3 benchmarks/attention_race.py --out $OUT/race                 # the defaults
    python3 benchmarks/attention_race.py --shapes 8,32,8,1024,128,0 --configs my.json --out /tmp/r

``--configs``: a JSON file (or inline JSON) mapping a name to a config dict; by default the persistent and
one-tile ws configs of 128x128, 2 stages (the carver's first at 1k; at 4k and 16k it ranks 160 keys first),
the persistent one also
with ``tl.enable_fast_math`` (nvcc's ``--use_fast_math`` for the whole kernel, against the programs' own
one-instruction exp2: ``templates/attention/fastmath.py``), and the pipelined program's 128x128 2-stage
config. Shapes as in ``benchmarks/attention.py``
(``B,H,H_kv,S,D,causal``); the six Llama shapes by default.

Writes ``<out>/race.json`` after every shape: per config its check, its median ms and TFLOP/s, and its
time over each backend's (above 1: the config is faster).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from attention import TORCH, Bench, label, parse_shape  # noqa: E402
from benchlib import config_id, dump, geomean, log, measure_configs  # noqa: E402

FAST = {"tl.enable_fast_math": True}
WS = {"block_M": 128, "block_N": 128, "num_stages": 2, "threads": 256, "variant": "ws"}
PLAIN = {"block_M": 128, "block_N": 128, "num_stages": 2, "threads": 256}


def default_configs(sms: int) -> dict[str, dict[str, Any]]:
    persistent = {**WS, "persistent": sms}
    return {"persistent": persistent, "persistent_fast": {**persistent, "pass_configs": FAST}, "ws": WS,
            "plain": PLAIN}


def load_configs(text: str | None, sms: int) -> dict[str, dict[str, Any]]:
    if text is None:
        return default_configs(sms)
    path = Path(text)
    return json.loads(path.read_text() if path.exists() else text)


def race_shape(b: Bench, shape: tuple, configs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    from templates.attention import ATTENTION

    problem = b.problem(shape)
    cfgs = {}
    for name, cfg in configs.items():
        c = ATTENTION.config_type.from_dict(cfg)
        why = ATTENTION.check(problem, c, b.arch)
        if why:
            log(f"{name}: not legal here: {why}")
        else:
            cfgs[name] = c
    qkv = b.inputs(shape)
    ref = ATTENTION.reference(problem)(*qkv)
    kernels: dict[str, Any] = {}
    rows = measure_configs(ATTENTION, problem, list(cfgs.values()), qkv, ref, b.clock, b.args.jobs, kernels=kernels)
    by_name = dict(zip(cfgs, rows))
    q, k, v = qkv
    calls = {}
    for name, row in by_name.items():
        if row["correct"]:
            kern = kernels[config_id(row["config"])]
            calls[name] = (lambda kern=kern: kern(q, k, v))
    raced = b.race_with_sdpa(calls, q, k, v, shape[5])
    if b.args.profile:
        raced["profiled"] = profile_calls(b, calls, q, k, v, shape[5])
    ms = raced["ms"]
    backends = [n for n in ("cudnn", "flash") if n in ms]
    return {"shape": label(shape, b.args.dtype), "problem": list(shape), "configs": by_name, **raced,
            "tflops": {n: problem.flops / m / 1e9 for n, m in ms.items()},
            "vs": {n: {bk: ms[bk] / ms[n] for bk in backends} for n in ms if n not in backends}}


def profile_calls(b: Bench, calls: dict[str, Any], q: Any, k: Any, v: Any, causal: bool) -> list[str]:
    """Each config's kernel and each SDPA backend once more, after three warm-up calls, inside an NVTX range
    named ``prof``, for ``ncu --nvtx --nvtx-include prof/`` to profile those launches only. Returns the
    names in the order they ran (the order of ncu's report)."""
    import torch

    calls = {**calls, **b.flash_and_cudnn(q, k, v, causal)[0]}
    for fn in calls.values():
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_push("prof")
        fn()
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()
    return list(calls)


def table(rows: list[dict[str, Any]]) -> str:
    names = sorted({n for r in rows for n in r["vs"]})
    lines = ["| shape | " + " | ".join(f"{n} / cuDNN" for n in names) + " | cuDNN TFLOP/s |",
             "|---" * (len(names) + 2) + "|"]
    for r in rows:
        cells = [f"{r['vs'][n]['cudnn']:.3f}" if n in r["vs"] and "cudnn" in r["vs"][n] else "-" for n in names]
        lines.append(f"| {r['shape']} | " + " | ".join(cells) + f" | {r['tflops'].get('cudnn', 0):.0f} |")
    for n in names:
        xs = [r["vs"][n]["cudnn"] for r in rows if n in r["vs"] and "cudnn" in r["vs"][n]]
        if xs:
            lines.append(f"\n{n} / cuDNN: geomean {geomean(xs):.3f} over {len(xs)} shapes (min {min(xs):.3f})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--shapes", type=parse_shape, nargs="+", help="B,H,H_kv,S,D,causal (default: the Llama six)")
    p.add_argument("--configs", help="JSON file or inline JSON: {name: config dict}")
    p.add_argument("--dtype", default="float16", choices=("float16", "bfloat16"))
    p.add_argument("--time-limit", type=float, default=500.0, help="seconds; timing stops after it")
    p.add_argument("--jobs", type=int, default=min(16, os.cpu_count() or 1), help="compile threads")
    p.add_argument("--rep", type=int, default=50)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--profile", action="store_true",
                   help="also run each kernel once in an NVTX range 'prof' (run under ncu --nvtx --nvtx-include prof/)")
    args = p.parse_args(argv)
    import torch

    b = Bench(args)
    configs = load_configs(args.configs, torch.cuda.get_device_properties(0).multi_processor_count)
    out = Path(args.out)
    log(f"{b.device}; configs {json.dumps(configs)}")
    rows = []
    t0 = time.time()
    for shape in args.shapes or TORCH:
        if b.clock.left() < 60:
            log(f"time limit: skipping {label(shape, args.dtype)}")
            continue
        row = race_shape(b, shape, configs)
        rows.append(row)
        log(f"{row['shape']}: " + ", ".join(f"{n} {m:.4f} ms" for n, m in row["ms"].items())
            + "; bad: " + ", ".join(n for n, c in row["configs"].items() if not c["correct"]))
        dump(out / "race.json", {"device": b.device, "rows": rows})
        torch.cuda.empty_cache()
    text = table(rows)
    print(text)
    (out / "summary.md").write_text(f"{b.device}, {time.time() - t0:.0f} s\n\n{text}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

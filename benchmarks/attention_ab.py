"""A/B of the hand-scheduled attention program's module constants (``templates/attention/ws_program.py``):
each named config built under each named variant (constants set while its program is built), compiled,
checked against the fp32 reference (zero mismatches at atol = rtol = 1e-2), then every kernel that passed
and the flash and cuDNN SDPA backends timed in interleaved rounds in this one process. For a change that
a constant switches on or off, so both sides are measured side by side.

    . .gpu/setup.sh && python3 benchmarks/attention_ab.py --out $OUT/ab --shapes 8,32,8,1024,64,1 \\
        --configs '{"p128": {"block_M": 128, "block_N": 128, "num_stages": 2, "threads": 256, "variant": "ws",
                    "persistent": 132}}' \\
        --variants '{"new": {}, "old": {"PRODUCER_WARPS": 4}}'

Writes ``<out>/ab.json`` after every shape: each kernel's check, the rounds' times, their medians and cuDNN's
median time over each (above 1: faster than cuDNN). Configs are not checked against the carver's rules (a
variant may be what the rules do not know yet): an illegal one fails to compile or to launch, and is
recorded so. ``--profile`` also runs each kernel once in an NVTX range ``prof`` (as ``attention_race.py``).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from attention import Bench, label, parse_shape  # noqa: E402
from attention_race import profile_calls  # noqa: E402
from benchlib import compile_all, dump, error_text, log, mismatches, poisoned_call  # noqa: E402


@dataclass(frozen=True)
class Built:
    """A config's program built under a variant (``name``: ``config/variant``), or the error that stopped it."""

    name: str
    pass_configs: dict[str, Any]
    program: Any = None
    error: BaseException | None = None

    def get(self) -> Any:
        """The program, for ``benchlib.compile_all``'s ``build`` (which records the error raised here)."""
        if self.error is not None:
            raise self.error
        return self.program


def build(problem: Any, configs: dict[str, Any], variants: dict[str, dict[str, Any]]) -> dict[str, Built]:
    """Each config under each variant, keyed ``config/variant``, built with the variant's constants set (and the
    module's own values put back after)."""
    from templates.attention import ATTENTION
    from templates.attention import ws_program as W

    unknown = sorted({k for v in variants.values() for k in v if not hasattr(W, k)})
    if unknown:
        names = ", ".join(n for n in dir(W) if n.isupper())
        raise SystemExit(f"--variants names {unknown}, not constants of templates/attention/ws_program.py ({names})")
    defaults = {k: getattr(W, k) for v in variants.values() for k in v}
    built: dict[str, Built] = {}
    try:
        for vname, knobs in variants.items():
            for k, v in {**defaults, **knobs}.items():
                setattr(W, k, v)
            for name, c in configs.items():
                cfg, key = ATTENTION.config_type.from_dict(c), f"{name}/{vname}"
                try:
                    built[key] = Built(key, dict(cfg.pass_configs), ATTENTION.program(problem, cfg))
                except Exception as e:  # a config the program refuses is a result too
                    built[key] = Built(key, dict(cfg.pass_configs), error=e)
    finally:
        for k, v in defaults.items():
            setattr(W, k, v)
    return built


def run_shape(b: Bench, shape: tuple, configs: dict[str, Any], variants: dict[str, dict[str, Any]]) -> dict[str, Any]:
    import torch

    from templates.attention import ATTENTION

    problem = b.problem(shape)
    q, k, v = b.inputs(shape)
    ref = ATTENTION.reference(problem)(q, k, v)
    items = list(build(problem, configs, variants).values())
    calls: dict[str, Any] = {}
    checks: dict[str, Any] = {}
    for item, kern, _, err in compile_all(None, None, items, b.args.jobs, build=Built.get):
        if kern is None:
            checks[item.name] = {"correct": False, "error": err}
            continue
        try:
            bad = mismatches(poisoned_call(kern, (q, k, v)), ref)
        except Exception as e:  # e.g. more shared memory than the GPU has
            checks[item.name] = {"correct": False, "error": error_text(e)}
            torch.cuda.synchronize()
            continue
        checks[item.name] = {"correct": bad == 0, "mismatches": bad}
        if bad == 0:
            calls[item.name] = (lambda kern=kern: kern(q, k, v))
    raced = b.race_with_sdpa(calls, q, k, v, shape[5])
    if b.args.profile:
        raced["profiled"] = profile_calls(b, calls, q, k, v, shape[5])
    ms = raced["ms"]
    return {"shape": label(shape, b.args.dtype), "problem": list(shape), "checks": checks, **raced,
            "tflops": {n: problem.flops / m / 1e9 for n, m in ms.items()},
            "cudnn_over": {n: ms["cudnn"] / m for n, m in ms.items()} if "cudnn" in ms else {}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--shapes", type=parse_shape, nargs="+", required=True, help="B,H,H_kv,S,D,causal")
    p.add_argument("--configs", required=True, help="JSON: {name: config dict}")
    p.add_argument("--variants", required=True, help="JSON: {name: {ws_program constant: value}}")
    p.add_argument("--dtype", default="float16", choices=("float16", "bfloat16"))
    p.add_argument("--time-limit", type=float, default=300.0, help="seconds; timing stops after it")
    p.add_argument("--jobs", type=int, default=16, help="compile threads")
    p.add_argument("--rep", type=int, default=50)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--profile", action="store_true", help="also run each kernel once in an NVTX range 'prof'")
    args = p.parse_args(argv)
    import torch

    b = Bench(args)
    configs, variants = json.loads(args.configs), json.loads(args.variants)
    rows = []
    for shape in args.shapes:
        if b.clock.left() < 60:
            log(f"time limit: skipping {label(shape, args.dtype)}")
            continue
        row = run_shape(b, shape, configs, variants)
        rows.append(row)
        log(row["shape"] + ": " + ", ".join(f"{n} {r:.3f}" for n, r in row["cudnn_over"].items())
            + "; failed: " + ", ".join(n for n, c in row["checks"].items() if not c["correct"]))
        dump(Path(args.out) / "ab.json", {"device": b.device, "rows": rows})
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

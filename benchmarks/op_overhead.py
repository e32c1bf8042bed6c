"""Host time per call of tilecarve's matmul op against ``torch.nn.functional.linear``, and where it goes.

    python3 benchmarks/op_overhead.py --out $OUT/op_overhead

At decode sizes a forward is bound by the host: the GPU finishes a small GEMV before Python has issued
the next call. This script times each layer of the op's path on small weights (so the GPU never holds
the host back), issuing ``--calls`` calls back to back and synchronising once:

* ``F.linear``: torch's own call;
* ``matmul``: tilecarve's op (``templates.matmul.matmul``), for each ``--m`` (GEMV path up to 16 rows,
  the symbolic-M GEMM above);
* ``kernel_for``: the keyed kernel's lookup alone;
* ``jit_call``: the compiled TileLang kernel called directly (its adapter allocates the output);

and profiles ``matmul`` with cProfile (the top entries by own time go to ``profile_M*.txt``). No tuning:
the kernels use the carver's top-1 config (the fallback), which does not change the host path.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import itertools
import json
import pstats
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from benchlib import dump, log, per_call_us  # noqa: E402


def layers(x, w, kk, key, kern, calls: int) -> dict[str, float]:
    """Host microseconds per call of each layer of the op's path for one input."""
    import torch.nn.functional as F

    from templates.matmul import matmul

    return {"F.linear": per_call_us(lambda: F.linear(x, w), calls),
            "matmul": per_call_us(lambda: matmul(x, w), calls),
            "kernel_for": per_call_us(lambda: kk.kernel_for(key), calls),
            "jit_call": per_call_us(lambda: kern(x, w), calls)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="directory for op_overhead.json and the profiles")
    p.add_argument("--m", type=int, nargs="+", default=[1, 16, 64, 128], help="token counts (rows of x)")
    p.add_argument("--n", type=int, default=512, help="weight rows (small: the GPU must not bound the host)")
    p.add_argument("--k", type=int, default=512, help="weight columns")
    p.add_argument("--calls", type=int, default=2000, help="calls per timed round")
    p.add_argument("--backends", nargs="*", default=[],
                   help="also time the served config compiled with these TileLang execution backends (e.g. cython)")
    p.add_argument("--config", type=json.loads, action="append", default=[],
                   help="with --backends: also time this config (JSON, e.g. a split-K one) in each backend; "
                        "repeat it for more (labelled config0, config1, ...)")
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)

    import tilelang
    import tilelang.language as T
    import torch
    import torch.nn.functional as F

    from autotuner.scratch import positions
    from templates.matmul import matmul
    from templates.matmul.op import GEMM_NAME, gemm, get_op

    torch.manual_seed(0)
    w = torch.randn(a.n, a.k, device="cuda", dtype=torch.float16)
    res = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "n": a.n, "k": a.k, "calls": a.calls, "rows": {}}
    op = get_op()
    with torch.inference_mode():
        for m in a.m:
            x = torch.randn(m, a.k, device="cuda", dtype=torch.float16)
            key = {"M": m, "N": a.n, "K": a.k, "dtype": torch.float16}
            kk = op.kernel(m)
            kern = kk.kernel_for(key)
            err = (matmul(x, w) - F.linear(x, w)).abs().max().item()
            row = {"path": kk.name, "max_abs_err": err, **layers(x, w, kk, key, kern, a.calls)}
            cfgs = {"served": kk.served_config(key)[0], **{f"config{i}": c for i, c in enumerate(a.config)}}
            for (label, cfg), backend in itertools.product(cfgs.items(), a.backends if kk.name == GEMM_NAME else []):
                own = {k: v for k, v in cfg.items() if k != "pass_configs"}  # the same config and symbolic M
                func = gemm(T.dynamic("M"), a.n, a.k, "float16", **own)
                out = [len(func.params) - 1]  # C, then a split-K program's workspace, allocated per call
                jit = tilelang.compile(func, target="cuda", out_idx=out + positions(func, out),
                                       execution_backend=backend, pass_configs=cfg.get("pass_configs"))
                got = jit(x, w)
                got = got[0] if isinstance(got, (list, tuple)) else got
                row[f"max_abs_err[{label} {backend}]"] = (got - F.linear(x, w)).abs().max().item()
                row[f"jit_call[{label} {backend}]"] = per_call_us(lambda jit=jit, x=x: jit(x, w), a.calls)
            res["rows"][str(m)] = row
            log(f"M={m}: " + ", ".join(f"{k} {v:.1f} us" for k, v in row.items() if isinstance(v, float)))
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(a.calls):
                matmul(x, w)
            prof.disable()
            torch.cuda.synchronize()
            s = io.StringIO()
            pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(25)
            (a.out / f"profile_M{m}.txt").write_text(s.getvalue())
            dump(a.out / "op_overhead.json", res)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

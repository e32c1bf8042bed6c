"""Compile cost: tilecarve's autotuner (joblib processes) vs TileLang's own AutoTuner (threads).

Runs on the GPU machine. For one GEMM shape and N configs from TileLang's 288-config grid, each
tuner runs in its own subprocess with a fresh TileLang kernel cache and a fresh tuning database,
so every number is cold:

* compile only: our ``compile_all`` (joblib worker processes, one killable child per compile)
  vs TileLang's compile phase (a thread pool over ``tilelang.compile``, as its AutoTuner does);
  wall time and per-config seconds;
* the full tuning call, from the call to the returned kernel: ``AutoTuner.run`` of each.

    python3 benchmarks/autotuner_compile.py --shape 4096 4096 4096 --n-configs 16 --out /tmp/bench
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def pick_configs(M: int, N: int, K: int, n: int) -> list[dict]:
    """A reproducible spread over the grid: every (288 / n)-th config."""
    from templates.matmul import default_space

    grid = default_space(M, N, K)
    step = max(1, len(grid) // n)
    return grid[::step][:n]


_SHAPE: list[int] = []


def _tl_kernel(block_M, block_N, block_K, num_stages, thread_num, enable_rasterization):
    """For TileLang's AutoTuner, which maps config keys onto named parameters and serialises closure
    cells (a functools.partial has no __closure__; a closure over the kernel function fails)."""
    from templates.matmul import kernel as gemm

    return gemm(*_SHAPE, block_M=block_M, block_N=block_N, block_K=block_K, num_stages=num_stages,
                thread_num=thread_num, enable_rasterization=enable_rasterization)


def run_one(which: str, M: int, N: int, K: int, n: int) -> dict:
    import torch

    from templates.matmul import kernel as gemm
    from templates.matmul import ref_program

    fn = functools.partial(gemm, M, N, K)
    configs = pick_configs(M, N, K, n)
    out: dict = {"tuner": which, "n_configs": len(configs), "cpus": os.cpu_count(),
                 "device": torch.cuda.get_device_name() if torch.cuda.is_available() else None}
    if which in ("ours-compile", "ours-compile-loky"):
        from autotuner.compile import compile_all
        from autotuner.target import resolve_target

        spec = resolve_target("auto").spec
        t0 = time.perf_counter()
        backend = "loky" if which.endswith("loky") else None
        outs = list(compile_all(fn, configs, list(range(len(configs))), spec, timeout=600, n_jobs=None,
                                backend=backend))
        out["compile_wall_s"] = time.perf_counter() - t0
        out["per_config_s"] = [o.seconds for o in outs]
        out["failed"] = sum(o.status != "ok" for o in outs)
    elif which == "tilelang-compile":
        import tilelang

        def build(cfg):
            t = time.perf_counter()
            try:
                tilelang.compile(fn(**cfg), out_idx=[-1], target="auto")
                ok = True
            except Exception:  # noqa: BLE001 - count failures like the tuner does
                ok = False
            return time.perf_counter() - t, ok

        t0 = time.perf_counter()
        with ThreadPoolExecutor(os.cpu_count()) as ex:  # TileLang's AutoTuner: threads, all cores
            res = list(ex.map(build, configs))
        out["compile_wall_s"] = time.perf_counter() - t0
        out["per_config_s"] = [r[0] for r in res]
        out["failed"] = sum(not r[1] for r in res)
    elif which == "ours-tune":
        from autotuner import AutoTuner

        t0 = time.perf_counter()
        r = (AutoTuner.from_kernel(fn, configs).set_compile_args(out_idx=[-1], ref_prog=ref_program)
             .set_tuning(progress=False).run(warmup=3, rep=20))
        out["tune_wall_s"] = time.perf_counter() - t0
        out["best"] = r.config
        out["best_ms"] = r.latency
        t0 = time.perf_counter()
        (AutoTuner.from_kernel(fn, configs).set_compile_args(out_idx=[-1], ref_prog=ref_program)
         .set_tuning(progress=False).run(warmup=3, rep=20))
        out["warm_wall_s"] = time.perf_counter() - t0
    elif which == "tilelang-tune":
        from tilelang.autotuner import AutoTuner as TLAutoTuner

        _SHAPE[:] = [M, N, K]
        t0 = time.perf_counter()
        r = (TLAutoTuner.from_kernel(kernel=_tl_kernel, configs=configs).set_compile_args(out_idx=[-1], target="auto")
             .set_profile_args(ref_prog=ref_program).run(warmup=3, rep=20))
        out["tune_wall_s"] = time.perf_counter() - t0
        out["best"] = r.config
        out["best_ms"] = r.latency
    else:
        raise ValueError(f"unknown tuner {which!r}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", nargs=3, type=int, default=[4096, 4096, 4096], metavar=("M", "N", "K"))
    ap.add_argument("--n-configs", type=int, default=16)
    ap.add_argument("--out", type=Path, default=None, help="directory for results.json (default: a temp dir)")
    ap.add_argument("--only", default=None, help=argparse.SUPPRESS)  # internal: run one tuner in this process
    a = ap.parse_args()
    M, N, K = a.shape
    if a.only:
        print("RESULT " + json.dumps(run_one(a.only, M, N, K, a.n_configs)), flush=True)
        return
    out_dir = a.out or Path(tempfile.mkdtemp(prefix="tilecarve-bench-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    results = []
    for which in ("ours-compile", "ours-compile-loky", "tilelang-compile", "ours-tune", "tilelang-tune"):
        with tempfile.TemporaryDirectory() as tl, tempfile.TemporaryDirectory() as tc:
            env = dict(os.environ, TILELANG_CACHE_DIR=tl, TILECARVE_CACHE_DIR=tc)
            t0 = time.perf_counter()
            p = subprocess.run([sys.executable, __file__, "--only", which, "--shape", str(M), str(N), str(K),
                                "--n-configs", str(a.n_configs)], env=env, capture_output=True, text=True)
            line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
            if line is None:
                print(f"{which} failed:\n{p.stderr[-3000:]}", file=sys.stderr)
                continue
            r = json.loads(line[7:])
            r["process_wall_s"] = time.perf_counter() - t0
            results.append(r)
            print(json.dumps(r), flush=True)
    summary = {"date": time.strftime("%Y-%m-%d"), "shape": [M, N, K], "results": results}
    by = {r["tuner"]: r for r in results}
    if "ours-compile" in by and "tilelang-compile" in by:
        for name in ("ours-compile", "ours-compile-loky", "tilelang-compile"):
            r = by.get(name)
            if r is None:
                continue
            print(f"{name:17s} wall {r['compile_wall_s']:6.1f} s  per-config median "
                  f"{statistics.median(r['per_config_s']):5.2f} s  failed {r['failed']}")
    for name in ("ours-tune", "tilelang-tune"):
        if name in by:
            r = by[name]
            extra = f"  warm {r['warm_wall_s']:.2f} s" if "warm_wall_s" in r else ""
            print(f"{name:17s} tune wall {r['tune_wall_s']:6.1f} s  best {r['best_ms']:.4f} ms {r['best']}{extra}")
    (out_dir / "autotuner_compile.json").write_text(json.dumps(summary, indent=1))
    print(f"wrote {out_dir / 'autotuner_compile.json'}")


if __name__ == "__main__":
    main()

"""TileLang's 288-config GEMM grid at 4096³ tuned on one GPU and on every GPU of the host (issue 13).

Each tuning runs in its own subprocess (a fresh CUDA context and tuning database). The arms:

* ``1gpu``: today's single measuring process; ``all``: ``set_tuning(devices="all")``;
* ``ray`` (``--ray``): ``set_tuning(backend="ray")`` on a local Ray instance started in the child before
  the clock starts (its start is recorded as ``ray_init_s``): compile tasks and one actor per GPU;
* ``1gpu_spawn``, ``all_spawn`` (``--spawn``): the same with every measuring process a fresh interpreter
  (``TILECARVE_MEASURE_START=spawn``) rather than forked from the tuning process;
* ``tl`` (``--tilelang``, cold only): TileLang's own AutoTuner with ``benchmark_multi_gpu=True``, as
  its ``example_gemm_autotune.py`` calls it.

``cold`` runs each get a fresh TileLang kernel cache: compiling and measuring, as a user's first tune.
``warm`` runs share the cache ``1gpu-cold`` filled (it runs first, also with ``--modes warm``), so
every compile is a cache hit and measuring dominates: how measuring itself scales. Then ``compare``
times every distinct winner of a mode side by side in one process (5 interleaved rounds), so "same
winner or within 1%" is judged on one GPU at one time. ``pairs`` has, per mode and arm, the wall time
over ``1gpu``'s and over ``all``'s (the Ray target: ``ray`` within 1.10 of ``all``). The clock starts
after ``import tilelang`` in every arm (TileLang's arm always had it so, and a script that writes a TileLang
kernel has imported it before it tunes); ``tilelang_import_s`` is that import, timed in every arm, and
``with_import_over_*`` the same ratios with it counted, as this benchmark counted them for tilecarve's arms
before 2026-11-28.

Each tuning arm's JSON has the job's ``timeline`` (autotuner/timeline.py): ``events`` as
``[t, what, where]``, t in seconds since the plan started, and per device ``measured``, ``ready_s``,
``busy_s``, ``idle_s``, ``first_s``, ``last_s``; ``before_plan_s`` is the wall time outside the job's
timeline (building the tuner, ``tuner_built_s`` of it, and returning after the job's end); ``compile_s``
summarises each candidate's compile seconds as its task measured; ``trials`` lists each measured
candidate as ``[config, device, median ms, rounds]`` (``rounds`` set for the finalists, whose device is
then the one they were re-timed on)
them. The log prints each arm's key events on one line. The Ray arm also leaves Ray's own trace of every
task and actor call beside ``--out`` (``<out>.ray-warm.ray-trace.json``, for chrome://tracing).

Saves JSON after every step (``--out``); ``--time-limit`` (default 510 s) skips what would not fit.
``--rounds N`` runs the warm arms N times in turn, each round with its own ``pairs`` entry
(``warm``, ``warm-2``...), so that a ratio is seen more than once on one host. ``--again`` has each
tilecarve arm tune the grid a second time in its process, right after the first (runs ``<arm>-<mode>-again``,
pairs ``<mode>-again``): a script's or notebook's next tuning, where Ray's run takes the measuring actors
and compile hosts the first one kept, and the direct arms fork their measuring processes again.
On an ``nvidia-h200-x2`` host (32 cores) ``--modes cold`` with every arm takes about 5-7 minutes,
``--ray --modes warm`` about 4-5. Shorter: ``--configs 96`` (every third config of the grid).

    . .gpu/setup.sh && python3 benchmarks/multi_gpu.py --ray --tilelang --modes cold --out $OUT/cold.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]
from benchlib import T0, dump, log  # noqa: E402


def grid(shape: list[int], n: int) -> tuple[Any, list[Any]]:
    """The problem and an even spread of ``n`` configs over its 288-config grid (all of them by default)."""
    from templates import matmul as mm

    problem = mm.MatmulProblem(*shape)
    return problem, spread(mm.MATMUL.space(problem), n)


def spread(space: list[Any], n: int) -> list[Any]:
    step = max(1, len(space) // n)
    return space[::step][:n]


def child_tune(args: argparse.Namespace) -> dict[str, Any]:
    """One tuning of the grid by one arm (``1gpu``, ``all``, ``ray``, ``tl``); runs in a subprocess."""
    import torch

    from templates import matmul as mm

    problem, configs = grid(args.shape, args.configs)
    arm = args.child.split("-")[0].removesuffix("_spawn")
    out: dict[str, Any] = {"mode": args.child, "n_configs": len(configs),
                           "measure_start": os.environ.get("TILECARVE_MEASURE_START", "fork")}
    t0 = time.perf_counter()
    import tilelang  # noqa: F401 - before every arm's clock, as any script that writes a TileLang kernel has it
    out["tilelang_import_s"] = round(time.perf_counter() - t0, 2)
    if arm == "tl":
        return {**out, **tilelang_tune(problem, spread(mm.default_space(*args.shape), args.configs)), **gpus(torch)}
    tuning: dict[str, Any] = {"devices": "all"} if arm == "all" else {}
    if arm == "ray":
        import ray

        # the GPU machines' memory grows as it is used, so Ray's memory monitor, which reads the size at the
        # start, would kill compile tasks the direct arms run unhindered
        os.environ.setdefault("RAY_memory_monitor_refresh_ms", "0")
        t0 = time.perf_counter()
        ray.init(include_dashboard=False, log_to_driver=False, object_store_memory=2 << 30)
        out["ray_init_s"] = round(time.perf_counter() - t0, 2)
        out["ray_gpus"] = ray.cluster_resources().get("GPU")
        tuning = {"backend": "ray"}
    result = {**out, **tune_once(problem, configs, tuning, arm)}
    if args.again:  # the same tuning again in this process: what a script's or a notebook's next run costs
        result["again"] = tune_once(problem, configs, tuning, arm)
    return {**result, **gpus(torch)}


def tune_once(problem: Any, configs: list[Any], tuning: dict[str, Any], arm: str) -> dict[str, Any]:
    """One tuning of ``configs`` with ``tuning``, its clock from building the tuner."""
    from templates import matmul as mm

    t0 = time.perf_counter()
    tuner = mm.MATMUL.tuner(problem, mm.TuneOptions(configs=configs, validate_configs=False))
    built = time.perf_counter() - t0  # the target resolved (the driver asked), the configs checked
    r = tuner.set_tuning(cache=False, progress=False, **tuning).run(3, 20)
    wall = time.perf_counter() - t0
    per_device: dict[str, int] = {}
    statuses: dict[str, int] = {}
    for t in r.trials:
        per_device[str(t.device)] = per_device.get(str(t.device), 0) + 1
        statuses[str(t.status)] = statuses.get(str(t.status), 0) + 1
    timeline = r.timeline.as_dict()
    end = max(e[0] for e in timeline["events"])
    if arm == "ray" and os.environ.get("MULTI_GPU_RAY_TRACE"):  # every Ray task and actor call, for chrome://tracing
        import ray

        ray.timeline(filename=os.environ["MULTI_GPU_RAY_TRACE"])
    return {"tuning": tuning, "wall_s": round(wall, 2),
            "phases": {k: round(v, 2) for k, v in r.phases.items()},
            "config": r.config, "latency_ms": r.latency, "statuses": statuses, "trials_per_device": per_device,
            "compile_s": quantiles([t.compile_s for t in r.trials if t.compile_s is not None]),
            "timeline": timeline, "before_plan_s": round(wall - end, 2), "tuner_built_s": round(built, 2),
            "trials": [[short(t.config), t.device, t.median_ms, t.rounds] for t in r.trials if t.median_ms]}


def short(cfg: dict[str, Any]) -> str:
    """A config in one word: ``128x256x64s3t256r`` (``r``: rasterized)."""
    return (f"{cfg['block_M']}x{cfg['block_N']}x{cfg['block_K']}s{cfg['num_stages']}t{cfg['thread_num']}"
            + ("r" if cfg.get("enable_rasterization") else ""))


def gpus(torch: Any) -> dict[str, Any]:
    """The host's GPUs. Asked after tuning: asking torch starts CUDA (``cuInit``) in this process, after which
    the tuner spawns its measuring processes rather than forking them (autotuner/forking.py)."""
    n = torch.cuda.device_count()
    return {"gpus": n, "gpu_names": [torch.cuda.get_device_name(i) for i in range(n)]}


def quantiles(xs: list[float]) -> dict[str, float]:
    """Median, 90th percentile, maximum and sum of ``xs`` (each candidate's compile seconds, as its task
    measured them: a disk-cache hit when warm), rounded."""
    if not xs:
        return {}
    xs = sorted(xs)
    return {"n": len(xs), "median": round(xs[len(xs) // 2], 3), "p90": round(xs[int(0.9 * (len(xs) - 1))], 3),
            "max": round(xs[-1], 3), "sum": round(sum(xs), 1)}


#: The timeline events the log line shows (every event is in the JSON).
KEY_EVENTS = ("key hashed", "job start", "process spawned", "process forked", "opened", "process up", "torch imported",
              "context created", "device ready", "tilelang imported",
              "imports done", "inputs made #0", "reference timed #0", "first kernel loaded #0", "pool ready",
              "first compiled", "last compiled", "first measured", "last measured", "finalists start", "job end")


def timeline_line(run: dict[str, Any]) -> str:
    """One arm's key events and each device's busy/idle seconds, for the log."""
    tl = run.get("timeline")
    if not tl:
        return ""
    events = " ".join(f"{where}:{what}@{t:.2f}" for t, what, where in tl["events"] if what in KEY_EVENTS)
    use = " ".join(f"{k}[n={d['measured']} ready={d['ready_s']} busy={d['busy_s']:.2f} idle={d['idle_s']:.2f}]"
                   for k, d in tl["devices"].items())
    return f"before plan {run.get('before_plan_s')} s; {events} | {use}"


def tilelang_tune(problem: Any, configs: list[dict[str, Any]]) -> dict[str, Any]:
    """TileLang's AutoTuner over ``configs`` (the same grid configs as plain dicts of its six keys) on every
    GPU (``benchmark_multi_gpu=True``), called as its ``example_gemm_autotune.py`` calls it (integer
    inputs, a torch reference, warmup=3, rep=20)."""
    import tilelang
    from gemm import make_tl_kernel
    from tilelang.autotuner import AutoTuner as TileLangAutoTuner

    t0 = time.perf_counter()
    r = (TileLangAutoTuner.from_kernel(kernel=make_tl_kernel(problem.M, problem.N, problem.K, "float16"),
                                       configs=configs)
         .set_compile_args(out_idx=[-1], target="auto")
         .set_profile_args(supply_type=tilelang.TensorSupplyType.Integer, ref_prog=lambda A, B: A @ B.T,
                           skip_check=False)
         .run(warmup=3, rep=20, benchmark_multi_gpu=True))
    return {"tuning": {"benchmark_multi_gpu": True}, "wall_s": round(time.perf_counter() - t0, 2),
            "config": r.config, "latency_ms": r.latency}


def child_compare(args: argparse.Namespace) -> dict[str, Any]:
    """Every winner of ``--pair`` (a JSON list) timed in 5 interleaved rounds on GPU 0; medians in ms."""
    import statistics

    import torch

    from autotuner.timing import time_callable
    from templates import matmul as mm

    problem, _ = grid(args.shape, args.configs)
    cfgs = json.loads(args.pair)
    kernels = [mm.MATMUL.compile(problem, c) for c in cfgs]
    a = torch.randn(problem.M, problem.K, device="cuda", dtype=torch.float16)
    b = torch.randn(problem.N, problem.K, device="cuda", dtype=torch.float16)
    rounds: list[list[float]] = [[] for _ in kernels]
    for r in range(5):
        for j in [(r + i) % len(kernels) for i in range(len(kernels))]:
            rounds[j].append(time_callable(lambda k=kernels[j]: k(a, b), 3, 20, "cuda").median_ms)
    return {"medians_ms": [statistics.median(x) for x in rounds]}


def run_child(args: argparse.Namespace, which: str, env: dict[str, str], extra: list[str], limit: float) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", which, "--configs", str(args.configs),
           "--shape", *map(str, args.shape), *extra]
    t = time.time()
    try:
        p = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True, timeout=limit,
                           cwd=tempfile.gettempdir())  # TileLang's AutoTuner writes autotuner.log where it runs
    except subprocess.TimeoutExpired:
        return {"mode": which, "error": f"killed at the time limit after {limit:.0f} s"}
    last = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else ""
    if p.returncode != 0 or not last.startswith("{"):
        return {"mode": which, "error": f"exit {p.returncode}: {p.stderr[-1500:]}"}
    out = json.loads(last)
    out["process_s"] = round(time.time() - t, 1)
    return out


def compare_mode(args: argparse.Namespace, data: dict[str, Any], kind: str, arms: list[str], env: dict[str, str],
                 cache: str) -> dict[str, Any]:
    """Wall-time ratios of each arm over ``1gpu`` and ``all``, and every distinct winner timed side by side."""
    runs = {a: data["runs"][f"{a}-{kind}"] for a in arms if "config" in data["runs"].get(f"{a}-{kind}", {})}
    pair: dict[str, Any] = {}
    def with_import(run: dict[str, Any]) -> float:
        return run["wall_s"] + run.get("tilelang_import_s", 0.0)

    for a, run in runs.items():
        pair[a] = {"wall_s": run["wall_s"], "wall_with_import_s": round(with_import(run), 2)}
        for base in ("1gpu", "all", "1gpu_spawn", "all_spawn"):
            if base in runs and base != a:
                pair[a][f"wall_over_{base}"] = round(run["wall_s"] / runs[base]["wall_s"], 3)
                pair[a][f"with_import_over_{base}"] = round(with_import(run) / with_import(runs[base]), 3)
    winners = list({json.dumps(r["config"], sort_keys=True): r["config"] for r in runs.values()}.values())
    if len(winners) > 1 and args.time_limit - (time.time() - T0) > 60:
        cmp = run_child(args, "compare", {**env, "TILELANG_CACHE_DIR": cache}, ["--pair", json.dumps(winners)],
                        min(150.0, args.time_limit - (time.time() - T0) - 10))
        pair["side_by_side_ms"] = cmp.get("medians_ms", cmp.get("error"))
        if "medians_ms" in cmp:
            ms = {json.dumps(w, sort_keys=True): m for w, m in zip(winners, cmp["medians_ms"])}
            best = min(cmp["medians_ms"])
            for a, run in runs.items():
                pair[a]["winner_over_best"] = round(ms[json.dumps(run["config"], sort_keys=True)] / best, 4)
    for a in runs:
        ratio = pair[a].get("winner_over_best", 1.0 if len(winners) == 1 else None)
        pair[a]["winner_ok"] = ratio is not None and ratio <= 1.01
    return pair


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", nargs=3, type=int, default=[4096, 4096, 4096])
    p.add_argument("--configs", type=int, default=288, help="an even spread of this many grid configs")
    p.add_argument("--modes", choices=["cold", "warm", "both"], default="both")
    p.add_argument("--ray", action="store_true", help="add the arm on a local Ray instance (backend='ray')")
    p.add_argument("--tilelang", action="store_true", help="add TileLang's AutoTuner with benchmark_multi_gpu "
                   "(cold only)")
    p.add_argument("--spawn", action="store_true", help="add the one-GPU and every-GPU arms with measuring "
                   "processes started as fresh interpreters (TILECARVE_MEASURE_START=spawn), beside the forked ones")
    p.add_argument("--rounds", type=int, default=1, help="warm arms this many times over, in turn (1gpu, all, "
                   "1gpu, all...): pairs for each round (warm, warm-2, ...)")
    p.add_argument("--skip", nargs="*", default=[], help="runs of the plan to leave out, e.g. ray-cold")
    p.add_argument("--again", action="store_true", help="each tilecarve arm tunes twice in its process; the "
                   "second runs are mode <mode>-again's arms (Ray's second takes the actors and hosts the first kept)")
    p.add_argument("--time-limit", type=float, default=510.0, help="seconds for the whole run")
    p.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "multi_gpu.json")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--pair", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child_compare(args) if args.child == "compare" else child_tune(args)), flush=True)
        return
    tl_cache = tempfile.mkdtemp(prefix="multi-gpu-tl-")
    env = {"TILECARVE_CACHE_DIR": tempfile.mkdtemp(prefix="multi-gpu-db-")}
    kinds = ["cold", "warm"] if args.modes == "both" else [args.modes]
    arms = ["1gpu", "all"] + ["ray"] * args.ray + ["tl"] * args.tilelang + ["1gpu_spawn", "all_spawn"] * args.spawn
    plan = [(a, "cold") for a in arms] if "cold" in kinds else [("1gpu", "cold")]  # fills the warm runs' cache
    for r in range(1, args.rounds + 1):  # TileLang's cache keys are not ours: no warm TileLang arm
        plan += [(a, "warm" if r == 1 else f"warm-{r}") for a in arms if a != "tl" and "warm" in kinds]
    plan = [(a, k) for a, k in plan if f"{a}-{k}" not in args.skip or (a, k) == ("1gpu", "cold")]
    data: dict[str, Any] = {"shape": args.shape, "configs": args.configs, "started": time.strftime("%Y-%m-%d %H:%M"),
                            "plan": [f"{a}-{k}" for a, k in plan], "runs": {}, "pairs": {}}
    warm_cache = os.path.join(tl_cache, "1gpu-cold")
    longest = 0.0
    for i, (arm, kind) in enumerate(plan):
        which = f"{arm}-{kind}"
        left = args.time_limit - (time.time() - T0)
        if left < max(60.0, 1.1 * longest):
            data["runs"][which] = {"mode": which, "error": f"skipped: {left:.0f} s left of --time-limit"}
            log(f"{which}: skipped ({left:.0f} s left)")
        else:
            log(f"{which}: tuning {args.configs} configs at {'x'.join(map(str, args.shape))}")
            cache = os.path.join(tl_cache, which) if kind == "cold" else warm_cache
            extra_env = {"TILELANG_CACHE_DIR": cache}
            if arm.endswith("_spawn"):
                extra_env["TILECARVE_MEASURE_START"] = "spawn"
            if arm == "ray":
                extra_env["MULTI_GPU_RAY_TRACE"] = str(args.out.with_name(f"{args.out.stem}.{which}.ray-trace.json"))
            run = run_child(args, which, {**env, **extra_env}, ["--again"] * args.again, left - 30)
            data["runs"][which] = run
            if "again" in run:
                data["runs"][f"{which}-again"] = run.pop("again")
                log(f"{which}-again: {data['runs'][f'{which}-again'].get('wall_s')} s")
            longest = max(longest, run.get("process_s", 0.0))
            log(f"{which}: {run.get('wall_s', '-')} s, winner {run.get('config')} {run.get('latency_ms')} ms, "
                f"per device {run.get('trials_per_device')}, compile s {run.get('compile_s')} {run.get('error', '')}")
            if run.get("timeline"):
                log(f"{which} timeline: {timeline_line(run)}")
        dump(args.out, data)
        if kind.split("-")[0] in kinds and (i + 1 == len(plan) or plan[i + 1][1] != kind):  # the mode's last arm
            for k in [kind] + [f"{kind}-again"] * args.again:
                data["pairs"][k] = compare_mode(args, data, k, arms, env, warm_cache)
                log(f"{k}: {json.dumps(data['pairs'][k])}")
                dump(args.out, data)
    data["total_s"] = round(time.time() - T0, 1)
    dump(args.out, data)
    print(json.dumps(data["pairs"], indent=1))
    log(f"saved {args.out}")


if __name__ == "__main__":
    main()

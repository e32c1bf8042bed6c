"""Pick fidelity: is the tuner's pick really the best candidate of its run?

The acceptance benchmark for the target "on at least 6 shapes, the pick against the best candidate of
the same run, each re-timed independently afterwards in interleaved rounds: >= 0.99 on every shape".

Run on the GPU machine from the repository root (the defaults are sized for an H100/H200 in under 8 minutes:
7 shapes of ~30-60 s each, at most ``--shape-timeout`` 90 s each and ``--budget`` 480 s in all):

    . .gpu/setup.sh && python3 benchmarks/pick_fidelity.py --out $OUT/fidelity
    python3 benchmarks/pick_fidelity.py --out /tmp/f --dry-run     # the plan only; needs no GPU

For each shape (fp16 GEMMs C = A @ B.T that are none of the carver's calibration shapes, by default),
in a child process of its own, so that ``--shape-timeout`` can stop it:

1. Tune cold: ``templates.matmul.tuner(M, N, K, dtype, trans_B=True, topk).run(warmup, rep)`` with a
   fresh tuning database (``TILECARVE_CACHE_DIR``) in a temporary directory; TileLang's kernel cache is
   one temporary directory shared by all shapes (no two shapes share a kernel). The wall time of the
   call is the tune time.
2. Candidates: every ``ok`` trial whose tuner-measured median is within ``--margin`` of the best, at
   most ``--max-candidates``, the pick always among them.
3. Re-time them independently: each config compiled afresh with ``templates.matmul.compile``, the same
   inputs for all, then ``--rounds`` interleaved rounds; in each round every candidate and cuBLAS
   (``torch.matmul``, a reference) runs ``--calls`` timed calls, in an order shuffled per round with a
   fixed seed. A timing is benchmarks/gemm.py's: ``autotuner.timing.time_callable``, CUDA events
   around each call, L2 flushed before each call, the median per call; a candidate's time is the
   median of its round medians, its spread (slowest - fastest round) / that median.
4. ratio = best candidate's time / pick's time (1.0 when the pick is the best; <= 1.0 by
   construction); the pick's rank; cuBLAS time / pick time (> 1: the pick beats cuBLAS).

Written under ``--out``: ``shape-<MxNxK>-<dtype>.json`` by each child as it goes, ``results.json``
after every shape, and ``fidelity.md`` (also printed) at the end. ``--strict`` exits 1 when a shape's
ratio is below 0.99 or a shape has no ratio (failed, timed out, skipped).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import functools
import inspect
import json
import os
import random
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gemm import (  # noqa: E402 - the board's helpers, so both benchmarks build and time kernels alike
    ROOT,
    _cfg_label,
    _cublas_nt,
    _cuda_up,
    _environment,
    _error,
    _inputs,
    _max_err,
    _shape,
    _tflops,
)
from gemm_sustained import gpu_state  # noqa: E402

__all__ = ["CALIBRATION_SHAPES", "DEFAULT_SHAPES", "main"]

#: Held-out shapes: LLM projections, non-square, a non-multiple of 128 (5000x5000x2000), long K, small M.
DEFAULT_SHAPES: tuple[tuple[int, int, int], ...] = (
    (3072, 3072, 3072),
    (6144, 2048, 8192),
    (1024, 8192, 4096),
    (5000, 5000, 2000),
    (128, 11008, 4096),
    (8192, 1536, 6144),
    (2048, 2048, 16384),
)
#: Shapes the carver was calibrated on: measured if asked for, but not counted towards the target.
CALIBRATION_SHAPES: tuple[tuple[int, int, int], ...] = (
    (2048, 14336, 4096), (256, 8192, 8192), (4096, 4096, 4096), (8192, 8192, 8192),
)
TARGET_RATIO = 0.99
TARGET_SHAPES = 6
_DTYPES = {"fp16": "float16", "float16": "float16", "bf16": "bfloat16", "bfloat16": "bfloat16"}
_MIN_SHAPE_S = 20.0  # a shape is not started with less of --budget left than this
TIMING_METHOD = ("autotuner.timing.time_callable as in benchmarks/gemm.py: CUDA events around each call, "
                 "L2 flushed before each call, median per call; a candidate's time is the median over rounds")


# --------------------------------------------------------------------------------------------------
# arguments and settings
# --------------------------------------------------------------------------------------------------
def _label(shape: tuple[int, int, int]) -> str:
    return "x".join(map(str, shape))


def _fraction(text: str) -> float:
    v = float(text)
    if not 0 <= v <= 1:
        raise argparse.ArgumentTypeError(f"a fraction between 0 and 1 (0.1 is 10%), got {text!r}")
    return v


def _positive(kind: type) -> Any:
    def parse(text: str) -> Any:
        v = kind(text)
        if v <= 0:
            raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
        return v
    return parse


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--out", required=True, type=Path, help="directory for the JSON files and fidelity.md")
    ap.add_argument("--shapes", nargs="+", type=_shape, help=f"MxNxK ... (default: {len(DEFAULT_SHAPES)} shapes, "
                    f"{' '.join(_label(s) for s in DEFAULT_SHAPES)})")
    ap.add_argument("--dtype", default="float16", choices=sorted(_DTYPES), help="input dtype (default float16)")
    ap.add_argument("--topk", type=_positive(int), default=8, help="carver hints tuned (default 8)")
    ap.add_argument("--tune-warmup", type=int, default=3, help="the tuner's run(warmup=...) in calls (default 3)")
    ap.add_argument("--tune-rep", type=_positive(int), default=20,
                    help="the tuner's run(rep=...) in calls (default 20)")
    ap.add_argument("--timing", choices=("burst", "sustained"),
                    help="AutoTuner.set_tuning(timing=...); left to the tuner's default when not given")
    ap.add_argument("--timing-backend", choices=("event", "cudagraph"),
                    help="AutoTuner.set_tuning(timing_backend=...); left to the tuner's default when not given")
    ap.add_argument("--margin", type=_fraction, default=0.10,
                    help="re-time ok trials within this fraction of the tuner's best median (default 0.10)")
    ap.add_argument("--max-candidates", type=_positive(int), default=8,
                    help="at most this many candidates, the pick included (default 8)")
    ap.add_argument("--rounds", type=_positive(int), default=5, help="interleaved timing rounds (default 5)")
    ap.add_argument("--calls", type=_positive(int), default=100,
                    help="timed calls per candidate per round (default 100)")
    ap.add_argument("--warmup", type=int, default=10, help="untimed calls before each timing (default 10)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the per-round shuffles (default 0)")
    ap.add_argument("--compile-jobs", type=_positive(int), default=8,
                    help="threads compiling the candidates for re-timing (default 8)")
    ap.add_argument("--shape-timeout", type=_positive(float), default=90.0,
                    help="seconds per shape, tuning included; a shape past it is killed and recorded (default 90)")
    ap.add_argument("--budget", type=_positive(float), default=480.0,
                    help="seconds for the whole run; shapes not started in time are recorded as skipped "
                         "(default 480)")
    ap.add_argument("--keep-temp", action="store_true", help="keep the temporary cache directories")
    ap.add_argument("--strict", action="store_true",
                    help="exit 1 when a shape's ratio is below 0.99 or a shape has no ratio")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and exit; touches neither CUDA nor --out")
    ap.add_argument("--_child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.tune_warmup < 0 or args.warmup < 0:
        ap.error("--tune-warmup and --warmup are numbers of calls, >= 0")
    return args


def build_settings(args: argparse.Namespace, argv: list[str]) -> dict[str, Any]:
    """Everything a shape's child needs, resolved once in the parent and stored as settings.json."""
    shapes = [tuple(s) for s in args.shapes] if args.shapes else list(DEFAULT_SHAPES)
    tuning = {k: v for k, v in (("timing", args.timing), ("timing_backend", args.timing_backend)) if v is not None}
    return dict(
        shapes=[_label(s) for s in dict.fromkeys(shapes)], dtype=_DTYPES[args.dtype], topk=args.topk,
        tune_warmup=args.tune_warmup, tune_rep=args.tune_rep, set_tuning=tuning,
        margin=args.margin, max_candidates=args.max_candidates, rounds=args.rounds, calls=args.calls,
        warmup=args.warmup, seed=args.seed, compile_jobs=args.compile_jobs,
        shape_timeout_s=args.shape_timeout, budget_s=args.budget, timing_method=TIMING_METHOD,
        command="python3 benchmarks/pick_fidelity.py " + shlex.join(argv),
    )


def _set_tuning_accepts(names: list[str]) -> bool | None:
    """Whether this checkout's ``AutoTuner.set_tuning`` takes these keywords (None: autotuner not importable)."""
    try:
        from autotuner import AutoTuner
    except ImportError:
        return None
    params = inspect.signature(AutoTuner.set_tuning).parameters
    return all(n in params for n in names) or any(p.kind is p.VAR_KEYWORD for p in params.values())


def print_plan(settings: dict[str, Any], out: Path) -> None:
    s = settings
    accepts = _set_tuning_accepts(list(s["set_tuning"]))
    print("pick_fidelity plan (dry run: nothing compiled, CUDA untouched, nothing written)")
    print(f"  command        {s['command']}")
    print(f"  out            {out}  (shape-<MxNxK>-{s['dtype']}.json per shape, results.json, fidelity.md)")
    print(f"  caches         {tempfile.gettempdir()}/pick_fidelity-*/: tilelang/ shared, tuning/<shape>/ per shape")
    print(f"  shapes ({len(s['shapes'])}), {s['dtype']}, C = A @ B.T:")
    for label in s["shapes"]:
        m, n, k = _shape(label)
        cal = "  <- calibration shape: measured, not counted for the target" if (m, n, k) in CALIBRATION_SHAPES else ""
        print(f"    {label:>18}  {2 * m * n * k / 1e9:8.1f} GFLOP{cal}")
    kw = ", ".join(f"{k}={v!r}" for k, v in s["set_tuning"].items())
    print(f"  tuning         templates.matmul.tuner(M, N, K, dtype={s['dtype']!r}, trans_B=True, topk={s['topk']})"
          f"{f'.set_tuning({kw})' if kw else ''}.run(warmup={s['tune_warmup']}, rep={s['tune_rep']}), cold")
    if kw:
        print(f"                 set_tuning accepts {list(s['set_tuning'])}: "
              f"{ {True: 'yes', False: 'NO (this checkout predates them)', None: 'unknown'}[accepts] }")
    print(f"  candidates     ok trials within {s['margin']:.0%} of the tuner's best median, at most "
          f"{s['max_candidates']}, the pick always; compiled afresh on {s['compile_jobs']} threads")
    print(f"  re-timing      {s['rounds']} interleaved rounds x (candidates + cuBLAS) x {s['warmup']} warm-up + "
          f"{s['calls']} timed calls, order shuffled per round (seed {s['seed']})")
    print(f"                 {s['timing_method']}")
    print(f"  verdict        ratio = best candidate ms / pick ms >= {TARGET_RATIO} on every shape, "
          f"at least {TARGET_SHAPES} non-calibration shapes")
    worst = min(s["budget_s"], len(s["shapes"]) * s["shape_timeout_s"])
    print(f"  time limits    {s['shape_timeout_s']:.0f} s per shape, {s['budget_s']:.0f} s in all "
          f"(worst case {worst:.0f} s)")


# --------------------------------------------------------------------------------------------------
# the parent: one child process per shape, then the report
# --------------------------------------------------------------------------------------------------
def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    tmp.replace(path)


def _load(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _shape_file(out: Path, label: str, dtype: str) -> Path:
    return out / f"shape-{label}-{dtype}.json"


def run_shape(out: Path, tmp: Path, label: str, settings: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Run one shape's child under ``timeout`` and return its record (what it wrote, plus how it ended)."""
    path = _shape_file(out, label, settings["dtype"])
    path.unlink(missing_ok=True)
    env = dict(os.environ, TILELANG_CACHE_DIR=str(tmp / "tilelang"),
               TILECARVE_CACHE_DIR=str(tmp / "tuning" / label), PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    cmd = [sys.executable, str(Path(__file__).resolve()), "--out", str(out), "--_child", label]
    t0 = time.perf_counter()
    # its own session, so a timeout also ends the tuner's workers and measuring process
    proc = subprocess.Popen(cmd, env=env, cwd=tmp, start_new_session=True)
    try:
        rc = proc.wait(timeout=timeout)
        ended = "ok" if rc == 0 else f"exit {rc}"
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:  # it ended on its own meanwhile
            pass
        proc.wait()
        ended = "timeout"
    row = _load(path) or dict(shape=label, dtype=settings["dtype"])
    row.update(ended=ended, wall_s=time.perf_counter() - t0)
    if ended == "timeout":
        row["error"] = f"timed out after {timeout:.0f} s (at stage {row.get('stage', 'start')!r})"
    elif ended != "ok" and not row.get("error"):
        row["error"] = f"the shape's process ended with {ended} (at stage {row.get('stage', 'start')!r})"
    return row


def verdict(rows: list[dict[str, Any]]) -> dict[str, Any]:
    counted = [r for r in rows if not r.get("calibration")]
    measured = [r for r in counted if r.get("ratio") is not None]
    failing = [r["shape"] for r in measured if r["ratio"] < TARGET_RATIO]
    missing = [r["shape"] for r in counted if r.get("ratio") is None]
    return dict(target=f"pick vs best candidate of its run, re-timed: >= {TARGET_RATIO} on every shape, "
                       f"at least {TARGET_SHAPES} shapes",
                measured=len(measured), passing=len(measured) - len(failing), failing=failing, missing=missing,
                worst=min((r["ratio"] for r in measured), default=None),
                met=len(measured) >= TARGET_SHAPES and not failing)


def _fmt(v: Any, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def render_markdown(rep: dict[str, Any]) -> str:
    s, env = rep["settings"], rep["env"]
    kw = ", ".join(f"{k}={v}" for k, v in s["set_tuning"].items()) or "the tuner's defaults"
    lines = [
        f"Device: {env.get('device', '?')} ({env.get('sms', '?')} SMs), {env.get('cpus', '?')} CPU cores; "
        f"torch {env.get('torch')}, CUDA {env.get('cuda')}, tilelang {env.get('tilelang')}. Date: {rep['date']}.",
        f"Command: `{s['command']}`",
        "",
        f"Tuning: `templates.matmul.tuner(topk={s['topk']}, trans_B=True).run(warmup={s['tune_warmup']}, "
        f"rep={s['tune_rep']})`, cold, timing: {kw}. Candidates: ok trials within {s['margin']:.0%} of the "
        f"tuner's best, at most {s['max_candidates']}, each compiled afresh. Re-timing: {s['rounds']} "
        f"interleaved rounds (order shuffled per round, seed {s['seed']}) of {s['calls']} calls per candidate "
        f"and cuBLAS; {s['timing_method']}.",
        "",
        "ratio = best candidate ms / pick ms (1.00: the pick is the best). spread = (slowest - fastest round) / "
        "median. cuBLAS / pick = cuBLAS ms / pick ms (> 1: the pick is faster).",
        "",
        "| shape | dtype | pick | pick TFLOP/s | best re-timed | ratio | >= 0.99 | pick rank | pick fastest in "
        "| spread pick / max | cuBLAS / pick | tune s | SM MHz |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rep["shapes"]:
        shape = r["shape"] + (" (calibration)" if r.get("calibration") else "")
        if r.get("ratio") is None:
            lines.append(f"| {shape} | {r['dtype']} | {_cfg_label(r.get('pick'))} | - | - | - | no ratio | - | - | - "
                         f"| - | {_fmt(r.get('tune_s'), '.1f')} | - |")
            continue
        best = "= pick" if r["best_is_pick"] else _cfg_label(r["best"])
        clocks = r.get("sm_mhz") or []
        mhz = f"{min(clocks)}-{max(clocks)}" if clocks else "-"
        lines.append(
            f"| {shape} | {r['dtype']} | {_cfg_label(r.get('pick'))} | {_fmt(r.get('pick_tflops'), '.0f')} | {best} "
            f"| {r['ratio']:.3f} | {'yes' if r['ratio'] >= TARGET_RATIO else 'NO'} "
            f"| {r['pick_rank']} of {r['n_timed']} | {r['pick_round_wins']} of {s['rounds']} rounds "
            f"| {r['pick_spread']:.3f} / {r['max_spread']:.3f} | {_fmt(r.get('cublas_over_pick'), '.2f')} "
            f"| {_fmt(r.get('tune_s'), '.1f')} | {mhz} |")
    for r in rep["shapes"]:
        if r.get("error"):
            lines.append(f"\n{r['shape']} {r['dtype']}: `{r['error'].strip().splitlines()[0][:300]}`")
        lost = [c for c in r.get("candidates", []) if c.get("retime_error")]
        if lost:  # a candidate that could not be re-timed is not in the ratio: say which
            lines.append(f"\n{r['shape']} {r['dtype']}: not re-timed: " + "; ".join(
                f"{c['label']} (`{c['retime_error'].strip().splitlines()[0][:120]}`)" for c in lost))
    if any(r.get("warning") for r in rep["shapes"]):
        lines.append("\n" + "; ".join(f"{r['shape']}: {r['warning']}" for r in rep["shapes"] if r.get("warning")))
    v = rep["verdict"]
    met = "met" if v["met"] else "NOT met"
    lines += ["", f"Target ({v['target']}): **{met}**: {v['passing']} of {v['measured']} measured shapes pass"
              + (f", worst {v['worst']:.3f}" if v["worst"] is not None else "")
              + (f"; below: {', '.join(v['failing'])}" if v["failing"] else "")
              + (f"; no ratio: {', '.join(v['missing'])}" if v["missing"] else "") + "."]
    return "\n".join(lines) + "\n"


def run_all(settings: dict[str, Any], out: Path, keep_temp: bool) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    _write_json(out / "settings.json", settings)
    tmp = Path(tempfile.mkdtemp(prefix="pick_fidelity-"))
    started = datetime.datetime.now(datetime.timezone.utc)
    rep: dict[str, Any] = dict(settings=settings, env={}, date=started.strftime("%Y-%m-%d %H:%M UTC"),
                               gpu_before=gpu_state(), shapes=[], complete=False)
    t0 = time.perf_counter()
    try:
        for label in settings["shapes"]:
            left = settings["budget_s"] - (time.perf_counter() - t0)
            if left < _MIN_SHAPE_S:
                row = dict(shape=label, dtype=settings["dtype"], ended="skipped",
                           error=f"skipped: under {_MIN_SHAPE_S:.0f} s of --budget {settings['budget_s']:.0f} s left")
            else:
                print(f"[fidelity] {label} {settings['dtype']} ({datetime.datetime.now():%H:%M:%S})", flush=True)
                row = run_shape(out, tmp, label, settings, min(settings["shape_timeout_s"], left))
            row["calibration"] = _shape(label) in CALIBRATION_SHAPES
            rep["shapes"].append(row)
            rep["env"] = rep["env"] or row.get("env", {})
            rep["verdict"] = verdict(rep["shapes"])
            _write_json(out / "results.json", rep)
            print(f"[fidelity] {label}: {row['ended']} after {row.get('wall_s', 0):.0f} s, "
                  f"ratio {_fmt(row.get('ratio'), '.3f')}", flush=True)
    finally:
        if keep_temp:
            print(f"[fidelity] caches kept in {tmp}", flush=True)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    rep.update(gpu_after=gpu_state(), total_s=time.perf_counter() - t0, complete=True)
    _write_json(out / "results.json", rep)
    md = render_markdown(rep)
    (out / "fidelity.md").write_text(md)
    print(md)
    return rep


# --------------------------------------------------------------------------------------------------
# a shape's child process: tune, pick candidates, compile them afresh, re-time in interleaved rounds
# --------------------------------------------------------------------------------------------------
def _trial_dict(i: int, t: Any) -> dict[str, Any]:
    status = getattr(t.status, "value", t.status)
    headline = getattr(t, "headline", None) or ((t.error or "").strip().splitlines() or [""])[0][:300]
    return dict(index=i, config=t.config, label=_cfg_label(t.config), status=status, median_ms=t.median_ms,
                min_ms=t.min_ms, iqr_ms=t.iqr_ms, compile_s=t.compile_s, rounds=getattr(t, "rounds", None),
                spread=getattr(t, "spread", None), error=headline or None)


def select_candidates(trials: list[dict[str, Any]], pick: dict[str, Any], margin: float,
                      cap: int) -> tuple[list[dict[str, Any]], int]:
    """ok trials within ``margin`` of the best tuner median, fastest first, at most ``cap``, the pick first;
    and how many were within the margin before the cap."""
    ok = sorted((t for t in trials if t["status"] == "ok" and t["median_ms"] is not None),
                key=lambda t: t["median_ms"])
    best = ok[0]["median_ms"] if ok else None
    near = [t for t in ok if t["median_ms"] <= best * (1 + margin)]
    pick_t = next((t for t in near if t["config"] == pick), None) or next((t for t in ok if t["config"] == pick), None)
    if pick_t is None:  # the pick is not among the trials as recorded: re-time it anyway
        pick_t = dict(index=-1, config=pick, label=_cfg_label(pick), status="ok", median_ms=None)
    return [pick_t] + [t for t in near if t is not pick_t][: cap - 1], len(near)


def _exc_text(e: BaseException) -> str:
    """An exception caught in another thread, with its own traceback (``gemm._error`` reads the current one)."""
    tb = "".join(traceback.format_exception(type(e), e, e.__traceback__))
    return f"{type(e).__name__}: {str(e)[-500:]}\n{tb[-1500:]}"


def _compile_all(M: int, N: int, K: int, dtype: str, cands: list[dict[str, Any]], jobs: int) -> dict[str, Any]:
    """Compile each candidate's config afresh (as templates.matmul.compile builds it), on ``jobs`` threads
    as TileLang's own AutoTuner does; ``{key: kernel or exception}`` and seconds per compile."""
    import torch

    from templates import matmul as mm

    device = torch.cuda.current_device()

    def build(cfg: dict[str, Any]) -> tuple[Any, float]:
        torch.cuda.set_device(device)
        t0 = time.perf_counter()
        return mm.compile(M, N, K, cfg, dtype=dtype), time.perf_counter() - t0

    results: dict[str, Any] = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(jobs, len(cands))) as pool:
        futures = {pool.submit(build, dict(c["config"])): c["key"] for c in cands}
        for f in concurrent.futures.as_completed(futures):
            try:
                results[futures[f]] = f.result()
            except Exception as e:  # noqa: BLE001 - a candidate that fails to build is recorded, not fatal
                results[futures[f]] = e
    return results


def measure_shape(out: Path, label: str) -> int:
    """The child: tune ``label`` cold, then re-time the candidates; writes its record after every stage."""
    s = json.loads((out / "settings.json").read_text())
    M, N, K = _shape(label)
    dtype = s["dtype"]
    path = _shape_file(out, label, dtype)
    row: dict[str, Any] = dict(shape=label, dtype=dtype, M=M, N=N, K=K, stage="import")
    _write_json(path, row)

    t_imp = time.perf_counter()
    import tilelang  # noqa: F401
    import torch

    from autotuner.timing import time_callable
    from templates import matmul as mm
    row["import_s"] = time.perf_counter() - t_imp
    _cuda_up()
    row.update(env=_environment(), gpu_before_tuning=gpu_state(), stage="tuning",
               tilecarve_cache_dir=os.environ.get("TILECARVE_CACHE_DIR"))
    _write_json(path, row)

    print(f"  tuning {label} {dtype} (cold)", flush=True)
    tuner = mm.tuner(M, N, K, dtype=dtype, trans_B=True, topk=s["topk"])
    if s["set_tuning"]:
        tuner.set_tuning(**s["set_tuning"])
    t0 = time.perf_counter()
    try:
        res = tuner.run(warmup=s["tune_warmup"], rep=s["tune_rep"])
    except Exception as e:  # noqa: BLE001 - a failed shape is a row of the report
        row.update(tune_s=time.perf_counter() - t0, error=_error(e), stage="tuning failed")
        _write_json(path, row)
        return 1
    trials = [_trial_dict(i, t) for i, t in enumerate(res.trials)]
    row.update(tune_s=time.perf_counter() - t0, tuner_seconds=res.seconds, from_cache=res.from_cache,
               pick=res.config, tuner_ms=res.latency,
               n_trials=len(trials), statuses={st: sum(t["status"] == st for t in trials)
                                               for st in sorted({t["status"] for t in trials})},
               trials=trials, gpu_after_tuning=gpu_state(), stage="compiling")
    if res.from_cache:
        row["warning"] = "the tuning database answered: this run was not cold"
    cands, n_near = select_candidates(trials, res.config, s["margin"], s["max_candidates"])
    for i, c in enumerate(cands):
        c["key"] = f"c{i}"
    row.update(n_ok=row["statuses"].get("ok", 0), n_within_margin=n_near)
    _write_json(path, row)
    print(f"  tuned in {row['tune_s']:.1f} s: pick {_cfg_label(res.config)} at {res.latency:.4f} ms; "
          f"re-timing {len(cands)} of {n_near} within {s['margin']:.0%}", flush=True)

    a, b = _inputs(dict(M=M, N=N, K=K, dtype=dtype))
    ref = _cublas_nt(a, b)
    t0 = time.perf_counter()
    built = _compile_all(M, N, K, dtype, cands, s["compile_jobs"])
    row["compile_wall_s"] = time.perf_counter() - t0
    fns = {"cublas": functools.partial(_cublas_nt, a, b)}
    for c in cands:
        got = built[c["key"]]
        c.update(retimed_ms=None, round_ms=[])
        if isinstance(got, BaseException):
            c["retime_error"] = _exc_text(got)
            continue
        kernel, c["compile_s_retime"] = got
        try:
            c["max_err"] = _max_err(kernel(a, b), ref)
            torch.cuda.synchronize()
            fns[c["key"]] = functools.partial(kernel, a, b)
        except Exception as e:  # noqa: BLE001
            c["retime_error"] = _error(e)
    row.update(candidates=cands, stage="re-timing")
    _write_json(path, row)

    rng = random.Random(s["seed"])
    rounds: dict[str, list[float]] = {k: [] for k in fns}
    row["round_order"], row["gpu_rounds"] = [], []
    for r in range(s["rounds"]):
        order = list(fns)
        rng.shuffle(order)
        row["round_order"].append(order)
        for key in order:
            try:
                rounds[key].append(time_callable(fns[key], s["warmup"], s["calls"], "cuda").median_ms)
            except Exception as e:  # noqa: BLE001 - drop the candidate from later rounds, keep the rest
                del fns[key]
                for c in cands:
                    if c["key"] == key:
                        c["retime_error"] = _error(e)
        row["gpu_rounds"].append(gpu_state())
        row["stage"] = f"re-timing: round {r + 1} of {s['rounds']} done"
        _write_json(path, row)

    row.update(summarize(row, cands, rounds, s["rounds"]), stage="done")
    _write_json(path, row)
    if row.get("ratio") is None:
        return 1
    print(f"  ratio {row['ratio']:.3f} (pick rank {row['pick_rank']} of {row['n_timed']}), cuBLAS / pick "
          f"{_fmt(row.get('cublas_over_pick'), '.2f')}, spread {row['max_spread']:.3f}", flush=True)
    return 0


def summarize(row: dict[str, Any], cands: list[dict[str, Any]], rounds: dict[str, list[float]],
              n_rounds: int) -> dict[str, Any]:
    """Per candidate: median over rounds and spread; per shape: ratio, the pick's rank and its round wins."""
    c_ = dict(M=row["M"], N=row["N"], K=row["K"])
    timed = []
    for c in cands:
        ms = rounds.get(c["key"], [])
        c["round_ms"] = ms
        if len(ms) == n_rounds:  # a candidate that failed in a later round is not compared
            c["retimed_ms"] = statistics.median(ms)
            c["spread"] = (max(ms) - min(ms)) / c["retimed_ms"]
            c["tflops"] = _tflops(c_, c["retimed_ms"])
            timed.append(c)
    timed.sort(key=lambda c: c["retimed_ms"])
    for rank, c in enumerate(timed, 1):
        c["rank"] = rank
    cub = rounds.get("cublas") or []
    out: dict[str, Any] = dict(cublas_ms=statistics.median(cub) if len(cub) == n_rounds else None,
                               n_timed=len(timed), sm_mhz=_clocks(row.get("gpu_rounds", [])))
    out["cublas_tflops"] = _tflops(c_, out["cublas_ms"])
    pick = cands[0]
    if pick.get("retimed_ms") is None:
        out["error"] = row.get("error") or ("the pick could not be re-timed: "
                                            + (pick.get("retime_error") or "no timing in some round"))
        return out
    best = timed[0]
    wins = sum(1 for r in range(n_rounds) if all(pick["round_ms"][r] <= c["round_ms"][r] for c in timed))
    out.update(ratio=best["retimed_ms"] / pick["retimed_ms"], pick_rank=pick["rank"], best=best["config"],
               best_is_pick=best is pick, pick_ms=pick["retimed_ms"], best_ms=best["retimed_ms"],
               pick_tflops=pick["tflops"], pick_spread=pick["spread"], max_spread=max(c["spread"] for c in timed),
               pick_round_wins=wins, passes=best["retimed_ms"] / pick["retimed_ms"] >= TARGET_RATIO,
               cublas_over_pick=out["cublas_ms"] / pick["retimed_ms"] if out["cublas_ms"] else None)
    return out


def _clocks(states: list[dict[str, str]]) -> list[int]:
    """SM clocks (MHz) from nvidia-smi readings such as ``{"clocks.sm": "1980 MHz"}``."""
    mhz = []
    for st in states:
        try:
            mhz.append(int(st.get("clocks.sm", "").split()[0]))
        except (ValueError, IndexError):
            pass
    return mhz


# --------------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    out = args.out.resolve()
    if args._child:
        return measure_shape(out, args._child)
    settings = build_settings(args, argv)
    if args.dry_run:
        print_plan(settings, out)
        return 0
    import torch

    if not torch.cuda.is_available():
        print("benchmarks/pick_fidelity.py measures on a CUDA GPU and found none here; run it on the GPU "
              "machine (--dry-run prints the plan)", file=sys.stderr)
        return 2
    if settings["set_tuning"] and _set_tuning_accepts(list(settings["set_tuning"])) is False:
        print(f"this checkout's AutoTuner.set_tuning takes no {list(settings['set_tuning'])}; "
              "drop --timing/--timing-backend", file=sys.stderr)
        return 2
    rep = run_all(settings, out, args.keep_temp)
    if args.strict and any(r.get("ratio") is None or r["ratio"] < TARGET_RATIO for r in rep["shapes"]):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

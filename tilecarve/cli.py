"""The ``tilecarve`` command line (``docs/cli.md``): ``hints``, ``tune``, ``cache`` and ``quality``.

Exit status: 0 done; 1 a failure, said in one message on stderr (with the traceback under ``--debug``
or ``TILECARVE_DEBUG=1``); 2 bad usage, argparse's and every value the library refuses before work
starts; 3 the command needs a CUDA GPU and none is visible. Output goes to stdout (``--json`` for a
program to read), everything else (the progress bar, logs, errors) to stderr. Heavy modules (torch,
tilelang) are imported only by the commands that need them, so ``--help``, ``hints`` and ``cache``
answer at once on any machine.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import re
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from . import cache_cmd
from .errors import CommandError, NeedsGPU, UsageError

__all__ = ["EXIT_FAILURE", "EXIT_NO_GPU", "EXIT_OK", "EXIT_USAGE", "build_parser", "main", "ranked_hints",
           "report_tuning"]

EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_NO_GPU = 0, 1, 2, 3
#: ``--layout``: which operands are stored transposed, BLAS style (``nt``: C = A @ B.T, A is MxK, B is NxK).
LAYOUTS = {"nn": (False, False), "nt": (False, True), "tn": (True, False), "tt": (True, True)}
FAMILIES = ("matmul", "gemv")
#: ``autotuner.settings.TIMING_MODES``, written out so that building the parser imports no autotuner module
#: (tests/test_cli.py holds the two equal)
TIMING_CHOICES = ("burst", "sustained", "back_to_back", "batched")


# --------------------------------------------------------------------------------------------------
# Argument types
# --------------------------------------------------------------------------------------------------
def _gpu_names() -> str:
    from carver.arch import ARCHS

    return ", ".join(ARCHS)


def gpu(value: str) -> Any:
    """A GPU the carver models: a name from its table (or an alias) as a ``GPUArch``, or "cuda" / "cuda:N"
    (N a device index: 0, 1, ...) for the local device, kept as text until a command needs it."""
    from carver.arch import CUDA

    if value.strip().lower().split(":")[0] == "cuda":
        if not re.fullmatch(r"cuda(:[0-9]+)?", value.strip().lower()):
            raise argparse.ArgumentTypeError(f"{value!r}: the local GPU is 'cuda' (device 0) or 'cuda:N' with N a "
                                             f"device index (0, 1, ...), e.g. cuda:1; or name a GPU: {_gpu_names()}")
        return value.strip()
    try:
        return CUDA(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"unknown GPU {value!r}; known: {_gpu_names()} (and aliases such as sm90, "
                                         f"hopper, a100), or 'cuda' for the local one") from None


def _integer(value: str, what: str, lo: int, hi: int | None = None) -> int:
    """``value`` as an int from ``lo`` to ``hi``, else an ``ArgumentTypeError`` (exit 2) saying ``what`` it is."""
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{what}, got {value!r}") from None
    if n < lo or hi is not None and n > hi:
        raise argparse.ArgumentTypeError(f"{what}, got {n}")
    return n


def dim(value: str) -> int:
    """M, N, K: a positive integer."""
    return _integer(value, "a dimension is a positive integer", 1)


#: The largest --topk (``templates.protocol.TuneOptions`` takes a 32-bit count).
TOPK_MAX = 2**31 - 1


def topk(value: str) -> int:
    """--topk: how many ranked configs, 1 or more (``TuneOptions.topk``)."""
    return _integer(value, f"a number of configs is an integer from 1 to {TOPK_MAX}, e.g. 8", 1, TOPK_MAX)


def calls(value: str) -> int:
    """--rep: a number of timed calls, 1 or more (``check_setting('rep')``: >= 1)."""
    return _integer(value, "a number of timed calls is an integer >= 1, e.g. 20", 1)


def warmup_calls(value: str) -> int:
    """--warmup: a number of calls before timing, 0 or more (``check_setting('warmup')``: >= 0; 0: none)."""
    return _integer(value, "a number of warmup calls is an integer >= 0 (0: no warmup), e.g. 3", 0)


def jobs(value: str) -> int:
    """--jobs: compile workers, 1 or more, or -1 for all cores (``check_setting('n_jobs')``)."""
    n = _integer(value, "a number of compile workers is an integer >= 1, or -1 for all cores", -1)
    if n == 0:
        raise argparse.ArgumentTypeError("a number of compile workers is an integer >= 1, or -1 for all cores, got 0")
    return n


# --------------------------------------------------------------------------------------------------
# hints
# --------------------------------------------------------------------------------------------------
def _problem(family: str, args: argparse.Namespace) -> Any:
    """The family's problem from M N K, --dtype, --out-dtype and --layout, validated by the family."""
    try:
        if family == "matmul":
            from templates import matmul as mm

            trans_a, trans_b = LAYOUTS[args.layout or "nt"]
            return mm.make_problem(args.M, args.N, args.K, args.dtype, args.out_dtype, "float32", trans_a, trans_b,
                                   in_name="--dtype")
        if args.layout not in (None, "nt"):
            raise ValueError(f"the gemv template computes y = x @ W.T (layout nt) only, got --layout {args.layout}")
        from templates import gemv

        return gemv.make_problem(args.M, args.N, args.K, args.dtype, args.out_dtype)
    except (TypeError, ValueError) as e:
        raise UsageError(str(e)) from e


def _arch(value: Any) -> Any:
    from carver.arch import CUDA

    try:
        return CUDA(value)
    except RuntimeError as e:  # "cuda" without a visible GPU
        raise NeedsGPU(f"--gpu {value} models the local GPU and none is visible here; name one instead, e.g. "
                       f"--gpu H100 (known: {_gpu_names()})") from e
    except ValueError as e:  # a local GPU the carver has no model for: the message says what to build
        raise CommandError(f"--gpu {value}: {e}; or name a GPU the carver knows: {_gpu_names()}") from e


def ranked_hints(family: str, problem: Any, arch: Any, topk: int) -> list[dict[str, Any]]:
    """The carver's ranked configs for ``problem`` on ``arch`` with its predictions, best first."""
    rows: list[tuple[dict[str, Any], Any]] = []
    if family == "matmul":
        from templates import matmul as mm

        p = problem
        tmpl = mm.carver_template(p.M, p.N, p.K, p.in_dtype, p.out_dtype, p.accum_dtype, p.trans_A, p.trans_B, arch)
        rows = [(h.to_config(), h.prediction) for h in tmpl.recommend_hints(topk)]
        flops = p.flops
    else:
        from carver import GEMVTemplate
        from templates import gemv

        for c in gemv.candidates(problem, arch, topk):
            model = gemv.carver_template(problem, arch, vec=c.vec)
            rows.append((c.to_dict(), model.predict({k: getattr(c, k) for k in GEMVTemplate.keys})))
        flops = 2 * problem.M * problem.N * problem.K
    return [{"rank": i, "config": cfg, "predicted_ms": pred.latency_ms,
             "predicted_tflops": flops / (pred.latency_ms * 1e-3) / 1e12, "bound": pred.bound}
            for i, (cfg, pred) in enumerate(rows, 1)]


def describe(family: str, problem: Any) -> str:
    if family == "matmul":
        return f"GEMM {problem.describe()}"
    return f"GEMV {problem.M}x{problem.N}x{problem.K} {problem.dtype}->{problem.out_dtype or problem.dtype}"


def cmd_hints(args: argparse.Namespace) -> int:
    from autotuner.config import config_label

    problem = _problem(args.family, args)
    arch = _arch(args.gpu)
    try:
        hints = ranked_hints(args.family, problem, arch, args.topk)
    except ValueError as e:  # e.g. a dtype this GPU has no tensor-core path for
        raise UsageError(str(e)) from e
    if args.json:
        _print_json({"family": args.family, "problem": describe(args.family, problem), "gpu": arch.name,
                     "hints": hints})
        return EXIT_OK
    print(f"carver hints for a {describe(args.family, problem)} on {arch.name} (the model's prediction; "
          f"nothing was run)")
    print(f"{'rank':>4}  {'predicted ms':>12}  {'TFLOP/s':>8}  {'bound':<8}  config")
    for h in hints:
        print(f"{h['rank']:>4}  {h['predicted_ms']:>12.4f}  {h['predicted_tflops']:>8.1f}  {h['bound']:<8}  "
              f"{config_label(h['config'])}")
    if any(b["predicted_ms"] < a["predicted_ms"] for a, b in zip(hints, hints[1:])):
        print(OUT_OF_ORDER[args.family])
    return EXIT_OK


#: Why a family's hint list is not in the order of its predictions (printed where it is not).
OUT_OF_ORDER = {
    "matmul": "(a config outside the region the model was calibrated on, e.g. 4+ stages, ranks above a calibrated "
              "one only if predicted 5% faster: docs/carver.md)",
    "gemv": "(the list hedges the model: at least half of its top-k from each path, SIMT and mma, at most two "
            "per path and block_N, then the cp.async configs (tma=False), which the model does not tell from "
            "their TMA twins: docs/gemv.md)",
}


# --------------------------------------------------------------------------------------------------
# tune
# --------------------------------------------------------------------------------------------------
def _need_gpu(family: str, args: argparse.Namespace) -> None:
    from autotuner.forking import local_gpus

    if not local_gpus():  # asked without starting CUDA here: the measuring processes are forked
        gemv = " --family gemv" if family == "gemv" else ""
        raise NeedsGPU(f"tuning needs a CUDA GPU and none is visible (torch.cuda.is_available() is False); "
                       f"nothing was compiled. Offline, the carver ranks configs for a named GPU: tilecarve hints "
                       f"--gpu H100{gemv} {args.M} {args.N} {args.K}")


def cmd_tune(args: argparse.Namespace) -> int:
    from templates.protocol import CUDAUnavailableError, TuneOptions

    problem = _problem(args.family, args)
    try:
        options = TuneOptions(topk=args.topk, arch=args.gpu, split_k=not args.no_split_k,
                              variants=not args.no_variants, warmup=args.warmup, rep=args.rep, n_jobs=args.jobs,
                              cache=not args.no_cache, timing=args.timing,
                              progress=not args.no_progress and sys.stderr.isatty())
    except (TypeError, ValueError) as e:
        raise UsageError(str(e)) from e
    _need_gpu(args.family, args)
    if args.family == "matmul":
        from templates.matmul import MATMUL as template
    else:
        from templates.gemv import GEMV as template
    try:
        result = template.tuner(problem, options).run(warmup=options.warmup, rep=options.rep)
    except CUDAUnavailableError as e:
        raise NeedsGPU(str(e)) from e
    flops = problem.flops if args.family == "matmul" else 2 * problem.M * problem.N * problem.K
    report_tuning(result, flops, describe(args.family, problem), args.json)
    return EXIT_OK


def report_tuning(result: Any, flops: int | None, what: str, as_json: bool) -> dict[str, Any]:
    """Print a :class:`autotuner.TuneResult` as a table (fastest first) or as JSON; return the JSON form."""
    from autotuner.config import config_label
    from autotuner.trial import error_headline

    def tflops(ms: float | None) -> float | None:
        return flops / (ms * 1e-3) / 1e12 if flops and ms else None

    trials = sorted(result.trials, key=lambda t: (t.status != "ok", t.median_ms or float("inf")))
    out = {"problem": what, "target": result.target, "from_cache": result.from_cache, "key": result.key,
           "seconds": result.seconds, "best": {"config": result.config, "latency_ms": result.latency,
                                               "tflops": tflops(result.latency)},
           "reference_ms": result.ref_latency,
           "trials": [{"config": t.config, "status": str(t.status), "median_ms": t.median_ms, "min_ms": t.min_ms,
                       "iqr_ms": t.iqr_ms, "compile_s": t.compile_s, "tflops": tflops(t.median_ms),
                       "error": error_headline(t.error) or None} for t in trials]}
    if as_json:
        _print_json(out)
        return out
    cached = " (from the tuning cache)" if result.from_cache else ""
    print(f"tuned {len(trials)} configs of a {what} on {result.target} in {result.seconds:.1f} s{cached}")
    print(f"{'status':<15}{'median ms':>11}{'TFLOP/s':>9}  config")
    for t in out["trials"]:
        ms = f"{t['median_ms']:>11.4f}" if t["median_ms"] is not None else f"{'-':>11}"
        tf = f"{t['tflops']:>9.1f}" if t["tflops"] is not None else f"{'-':>9}"
        err = f"  [{t['error']}]" if t["error"] else ""
        print(f"{t['status']:<15}{ms}{tf}  {config_label(t['config'])}{err}")
    ref = f"; reference {result.ref_latency:.4f} ms" if result.ref_latency else ""
    best_tf = f" ({out['best']['tflops']:.1f} TFLOP/s)" if out["best"]["tflops"] else ""
    print(f"best: {config_label(result.config)} at {result.latency:.4f} ms{best_tf}{ref}")
    return out


# --------------------------------------------------------------------------------------------------
# quality
# --------------------------------------------------------------------------------------------------
def cmd_quality(args: argparse.Namespace) -> int:
    if not args.data_dir.is_dir():
        raise UsageError(f"DATA_DIR {str(args.data_dir)!r} is not a directory; give the folder of measured hint "
                         f"files, e.g. benchmarks/data/h200-hints-2026-11-21")
    try:
        quality = importlib.import_module("tilecarve.quality")
    except ModuleNotFoundError as e:  # a dependency of the report (tilecarve.quality ships with the package)
        raise CommandError(f"the quality report needs {e.name}, which is not installed: "
                           f"python3 -m pip install 'tilecarve[bench]'") from e
    if args.out is not None:
        _check_report_dir(args.out)
    out = args.out if args.out is not None else Path(tempfile.mkdtemp(prefix="tilecarve-quality-"))
    out.mkdir(parents=True, exist_ok=True)
    try:
        summary = quality.write_report(args.data_dir, out, arch=args.arch)
    except FileNotFoundError as e:  # no measured grid under DATA_DIR: the message says what was looked for
        raise CommandError(str(e)) from e
    if args.json:
        _print_json(summary)
        return EXIT_OK
    print(f"hint-quality report of {args.data_dir} written to {out}:")
    for path in sorted(out.iterdir()):
        print(f"  {path}")
    return EXIT_OK


def _check_report_dir(out: Path) -> None:
    """Refuse an ``--out`` that is a file, or where the report's ``hint_quality.json`` would replace a measured
    grid (``--out DATA_DIR`` with a grid of that name): measured data is not written over."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {str(out)!r} is a file; give a folder for the report (it is created if missing)")
    report = out / "hint_quality.json"
    try:
        doc = json.loads(report.read_text(encoding="utf-8")) if report.is_file() else None
    except (OSError, ValueError):
        doc = None  # not a grid: the report replaces it, as it replaces an earlier report
    if isinstance(doc, dict) and {"summary", "results"} <= doc.keys():
        raise UsageError(f"--out {str(out)!r} holds a measured grid named hint_quality.json, which the report would "
                         f"replace; give another folder")


# --------------------------------------------------------------------------------------------------
# The parser and main
# --------------------------------------------------------------------------------------------------
def _print_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, indent=2, default=str)
    print()


def _problem_args(p: argparse.ArgumentParser, layout: bool) -> None:
    p.add_argument("M", type=dim, help="rows of the output (gemv: rows of x, 1-16)")
    p.add_argument("N", type=dim, help="columns of the output")
    p.add_argument("K", type=dim, help="the reduced dimension")
    fp8 = ", float8_e4m3 (matmul on Hopper, layout nt)" if layout else ""
    p.add_argument("--dtype", default="float16", help=f"input dtype: float16 (default), bfloat16{fp8}; aliases such "
                   "as fp16, bf16 work")
    p.add_argument("--out-dtype", default=None, help="output dtype (default: the input's; fp8 gives float16)")
    if layout:
        p.add_argument("--layout", choices=sorted(LAYOUTS), default=None,
                       help="which operands are stored transposed: nt (default) C = A @ B.T with A MxK, B NxK; "
                            "nn C = A @ B with B KxN; tn, tt: A stored KxM")
    else:
        p.set_defaults(layout=None)
    p.add_argument("--topk", type=topk, default=8, help="how many of the carver's ranked configs (default 8)")
    p.add_argument("--json", action="store_true", help="print JSON on stdout instead of a table")


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show the traceback of a failure and debug logs (also: TILECARVE_DEBUG=1)")
    ap = argparse.ArgumentParser(
        prog="tilecarve", description="Rank, tune and inspect TileLang kernels (docs/cli.md). Offline on any "
        "machine: hints, cache, quality; on a CUDA GPU: tune.", parents=[common],
        epilog="exit status: 0 ok, 1 failure, 2 bad usage, 3 needs a CUDA GPU")
    ap.set_defaults(debug=False)
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")

    known = f"GPUs: {_gpu_names()} (aliases such as sm_90, a100 work), or cuda for the local one"
    h = sub.add_parser("hints", parents=[common], help="the carver's ranked configs for a GPU, offline",
                       description=f"The carver's ranked configs with predicted latency, for a named GPU; nothing "
                                   f"is compiled or run, so any machine will do. {known}.")
    h.add_argument("--gpu", type=gpu, required=True, help=f"the GPU to model; {known}")
    h.add_argument("--family", choices=FAMILIES, default="matmul", help="kernel family (default matmul)")
    _problem_args(h, layout=True)
    h.set_defaults(func=cmd_hints, prog=h.prog)

    t = sub.add_parser("tune", parents=[common], help="tune a kernel on the local CUDA GPU",
                       description="Tune on the local CUDA GPU: the carver's top-k (plus variants) are compiled, "
                                   "checked against torch and timed; every trial is stored in the tuning cache.")
    fam = t.add_subparsers(dest="family", required=True, metavar="FAMILY")
    for name, text in (("matmul", "C = op(A) @ op(B), fp32 accumulation"), ("gemv", "y = x @ W.T, 1-16 rows")):
        f = fam.add_parser(name, parents=[common], help=text, description=f"Tune the {name} template: {text}.")
        _problem_args(f, layout=name == "matmul")
        f.add_argument("--gpu", type=gpu, default=None, help=f"the GPU the carver models (default: the local one); "
                                                             f"{known}")
        if name == "matmul":
            f.add_argument("--no-split-k", action="store_true", help="no split-K variants for few-wave shapes")
            f.add_argument("--no-variants", action="store_true",
                           help="no Hopper variants (full_row, persistent, ws, pingpong)")
        f.set_defaults(no_split_k=False, no_variants=False, func=cmd_tune, prog=f.prog)
        f.add_argument("--warmup", type=warmup_calls, default=3, help="calls before timing, 0 or more (default 3)")
        f.add_argument("--rep", type=calls, default=20, help="timed calls per candidate, 1 or more (default 20)")
        f.add_argument("--jobs", type=jobs, default=None, help="compile workers, 1 or more, or -1 for all cores "
                                                               "(default: all cores)")
        f.add_argument("--timing", choices=TIMING_CHOICES, default="burst",
                       help="burst (default); sustained: finalists timed at the clock a busy GPU holds; "
                            "back_to_back: every candidate timed back to back, as a model's forward runs it, "
                            "each call between two events; batched: the same, an event every few calls")
        f.add_argument("--no-cache", action="store_true", help="neither read nor write the tuning cache")
        f.add_argument("--no-progress", action="store_true", help="no progress bar (it shows only on a terminal)")

    cache_cmd.add_parser(sub, common)

    q = sub.add_parser("quality", parents=[common], help="the hint-quality report (figures as PNG)",
                       description="How well the carver's ranking matched measurements: figures as PNG files and "
                                   "a summary, from a folder of measured hint files.")
    q.add_argument("data_dir", type=Path, metavar="DATA_DIR",
                   help="folder of measured hint files, searched for *.json: JSON files that are not measured grids "
                        "are skipped, and so are files that are not valid JSON (or whose summary and results are "
                        "not an object and a list), each named in a warning on stderr")
    q.add_argument("--out", type=Path, default=None, help="the folder to write the figures and hint_quality.json "
                                                          "into (default: a new temporary folder, printed)")
    q.add_argument("--arch", default=None, help="the GPU the data was measured on, e.g. H200 (optional)")
    q.add_argument("--json", action="store_true", help="print the summary as JSON")
    q.set_defaults(func=cmd_quality, prog=q.prog)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (argparse exits with 2 itself on bad usage)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    debug = args.debug or os.environ.get("TILECARVE_DEBUG", "") not in ("", "0")
    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING, stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except KeyboardInterrupt:
        print("tilecarve: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `tilecarve cache list | head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FAILURE
    except Exception as e:  # noqa: BLE001 - the command line's edge: one message instead of a traceback
        if debug:
            raise
        status = EXIT_USAGE if isinstance(e, UsageError) else EXIT_NO_GPU if isinstance(e, NeedsGPU) else EXIT_FAILURE
        expected = isinstance(e, (UsageError, NeedsGPU, CommandError))
        kind = "" if expected else f"{type(e).__name__}: "
        hint = "" if expected else " (--debug shows the traceback)"
        print(f"{args.prog}: error: {kind}{e}{hint}", file=sys.stderr)
        return status

"""Run TileLang's own GEMM autotuning examples on tilecarve, with only their import lines changed.

Each example is copied (with the ``.py`` files and packages beside it, which some import) into a fresh
temporary directory; for ``--impl tilecarve`` its import lines are rewritten by :data:`IMPORT_MAP` and nothing
else, and it runs with this checkout first on ``PYTHONPATH`` and fresh tuning and TileLang caches, so
every tune is cold. ``--impl tilelang`` runs the same file untouched, for comparison. The examples
come from a directory in the tree (TileLang's repository is not reachable from the GPU machine):

    mkdir -p .gpu/tilelang-examples && cp -r <tilelang>/examples/{gemm,dequantize_gemm,gemv} .gpu/tilelang-examples/
    . .gpu/setup.sh && python3 benchmarks/tilelang_examples.py --impl both --out $OUT/tilelang-examples

Writes ``<out>/<impl>-<run>.log`` for every run and ``<out>/summary.json``; prints a table with each
run's exit status, wall seconds and the latency lines the example printed. ``--rewrite-only`` writes
the rewritten files and checks that they parse, without running anything (no GPU needed).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: TileLang import line -> tilecarve's: the whole change made to an example (docs/dropin.md). The bare
#: ``import tilelang`` (``as tl``) becomes tilecarve.tilelang, TileLang's namespace whose ``autotune`` and
#: ``autotuner`` are tilecarve's: in every file, since every other name there is TileLang's own object.
IMPORT_MAP = [
    (r"import tilelang as (\w+)(?=\s*(#.*)?$)", r"import tilecarve.tilelang as \2"),
    (r"import tilelang(?=\s*(#.*)?$)", "import tilecarve.tilelang as tilelang"),
    (r"from tilelang\.autotuner import", "from autotuner import"),
    (r"from tilelang\.carver\.template import", "from carver.template import"),
    (r"from tilelang\.carver\.arch import", "from carver.arch import"),
    (r"from tilelang\.carver\.roller\.rasterization import", "from carver.roller.rasterization import"),
    (r"from tilelang\.carver\.roller\.hint import", "from carver.roller.hint import"),
    (r"from tilelang\.carver\.roller import", "from carver.roller import"),
    (r"from tilelang\.carver import", "from carver import"),
]


@dataclass(frozen=True)
class Call:
    """Import the example as a module (its ``__main__`` block does not run) and evaluate ``expr`` in it:
    for examples whose command line cannot ask for tuning (their ``main(..., tune=True)``)."""

    expr: str


_CALL = "import importlib, sys; m = importlib.import_module(sys.argv[1]); eval(sys.argv[2], vars(m))"
_WHOSE = "print('tilelang: matmul was tuned by', type(matmul).__module__)"

#: (name, example path under the examples directory, arguments or a Call, seconds allowed)
RUNS = [
    ("gemm_autotune_roller", "gemm/example_gemm_autotune.py",
     ["--use_autotune", "--with_roller", "--m", "4096", "--n", "4096", "--k", "4096"], 600),
    ("gemm_autotune_pass_configs", "gemm/example_gemm_autotune_pass_configs.py",
     ["--m", "4096", "--n", "4096", "--k", "4096"], 600),
    ("gemm_autotune_early_stop", "gemm/example_gemm_autotune_early_stop.py", [], 600),
    ("gemm_advanced_autotune_roller", "gemm/example_gemm_advanced_autotune.py",
     ["--use_autotune", "--with_roller", "--use_pipeline", "--enable_grouped_compile"], 600),
    ("dequant_gemm_w4a8_tune", "dequantize_gemm/example_dequant_gemm_w4a8.py", ["--tune"], 600),
    ("dequant_gemm_fp4_hopper_tune", "dequantize_gemm/example_dequant_gemm_fp4_hopper.py", ["--tune"], 600),
    ("gemm_autotune_grid", "gemm/example_gemm_autotune.py", ["--use_autotune"], 600),  # 288 configs
    # @tilelang.autotune reached through the module (tilecarve.tilelang); 108 and 324 configs
    # (the second print says whose autotuner the decorator was: autotuner.decorator is tilecarve's)
    ("dequant_gemm_bf16_fp4_hopper_tune", "dequantize_gemm/example_dequant_gemm_bf16_fp4_hopper.py",
     Call(f"main(256, 256, 256, True, tune=True), {_WHOSE}"), 540),
    ("dequant_gemm_bf16_mxfp4_hopper_tune", "dequantize_gemm/example_dequant_gemm_bf16_mxfp4_hopper.py",
     Call(f"main(256, 256, 256, 32, fast_dequant=True, with_bias=False, tune=True), {_WHOSE}"), 540),
]

_RESULT_LINE = re.compile(r"latency|tflops|best config|^\{|tile-lang|tilelang:|ref:", re.IGNORECASE)
_ATTRIBUTE_USE = re.compile(r"\b(tilelang|tl)\.(?:autotune\b|autotuner\.)")
_REBIND = re.compile(r"^\s*import tilelang\.[\w.]+\s*(#.*)?$", re.MULTILINE)  # binds `tilelang` to TileLang's


def attribute_note(text: str) -> str:
    """For a rewritten file that reaches the autotuner through the module (``tl.autotune``), whether
    that is tilecarve's now, or which line keeps it TileLang's."""
    aliases = sorted(set(_ATTRIBUTE_USE.findall(text)))
    for alias in aliases:
        bind = re.search(rf"^\s*import tilecarve\.tilelang as {alias}\b", text, re.MULTILINE)
        if bind is None:
            return f"calls {alias}.autotune/autotuner but no import line binds {alias}: TileLang's autotuner stays"
        if alias == "tilelang" and any(m.start() > bind.start() for m in _REBIND.finditer(text)):
            return "a later `import tilelang.<submodule>` rebinds tilelang to TileLang's module: its autotuner stays"
    return f"reaches the autotuner as {'/'.join(aliases)}.autotune: now tilecarve's" if aliases else ""


def rewrite(source: str) -> tuple[str, int]:
    """``source`` with its TileLang import lines mapped to tilecarve's, and how many lines changed."""
    out, changed = [], 0
    for line in source.splitlines(keepends=True):
        new = line
        for pattern, repl in IMPORT_MAP:
            new = re.sub(rf"^(\s*){pattern}", rf"\g<1>{repl}", new)
        changed += new != line
        out.append(new)
    return "".join(out), changed


@dataclass
class Outcome:
    run: str
    impl: str
    example: str
    args: list[str]
    rc: int | None
    seconds: float
    lines_rewritten: int
    results: list[str]
    note: str = ""


def prepare(src: Path, impl: str, work: Path) -> tuple[Path, int, str]:
    """Copy the example and its sibling modules and packages (``dequantize_gemm/quantize/``) into
    ``work``; rewrite them for tilecarve."""
    for f in src.parent.iterdir():
        if f.suffix == ".py":
            shutil.copy(f, work / f.name)
        elif (f / "__init__.py").exists():
            shutil.copytree(f, work / f.name, ignore=shutil.ignore_patterns("__pycache__"))
    changed, note = 0, ""
    if impl == "tilecarve":
        for f in work.rglob("*.py"):
            text, n = rewrite(f.read_text())
            ast.parse(text, str(f))  # a rewrite that breaks the syntax is this script's bug
            f.write_text(text)
            changed += n if f.name == src.name else 0
        note = attribute_note((work / src.name).read_text())
    return work / src.name, changed, note


def run_one(name: str, rel: str, args: list[str] | Call, limit: int, impl: str, examples: Path,
            out: Path) -> Outcome:
    src = examples / rel
    if not src.exists():
        return Outcome(name, impl, rel, _shown(args), None, 0.0, 0, [],
                       f"missing: copy TileLang's examples to {examples}")
    with tempfile.TemporaryDirectory(prefix=f"tl-example-{name}-") as tmp:
        work = Path(tmp) / "example"
        work.mkdir()
        path, changed, note = prepare(src, impl, work)
        env = dict(os.environ, TILECARVE_CACHE_DIR=str(Path(tmp) / "tuning-cache"),
                   TILELANG_CACHE_DIR=str(Path(tmp) / "tilelang-cache"))
        if impl == "tilecarve":
            env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        t0 = time.perf_counter()
        try:
            cmd = ([sys.executable, "-c", _CALL, path.stem, args.expr] if isinstance(args, Call)
                   else [sys.executable, str(path), *args])
            proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=limit)
            rc, text = proc.returncode, proc.stdout + proc.stderr
        except subprocess.TimeoutExpired as e:
            rc, text = None, f"{e.stdout or ''}{e.stderr or ''}\n[timed out after {limit} s]"
            text = text if isinstance(text, str) else text.decode(errors="replace")
        seconds = time.perf_counter() - t0
    (out / f"{impl}-{name}.log").write_text(text)
    results = [ln.strip() for ln in text.splitlines() if _RESULT_LINE.search(ln) and "INFO" not in ln][-12:]
    return Outcome(name, impl, rel, _shown(args), rc, round(seconds, 1), changed, results, note)


def _shown(args: list[str] | Call) -> list[str]:
    return [f"call: {args.expr}"] if isinstance(args, Call) else list(args)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--examples", type=Path, default=REPO / ".gpu" / "tilelang-examples",
                   help="TileLang's examples/ directory, or a copy of its gemm/ and dequantize_gemm/ folders")
    p.add_argument("--impl", choices=["tilecarve", "tilelang", "both"], default="tilecarve")
    p.add_argument("--runs", nargs="*", default=None, help=f"which runs (default all): {[r[0] for r in RUNS]}")
    p.add_argument("--out", type=Path, default=None, help="where logs and summary.json go (default $OUT or a temp dir)")
    p.add_argument("--rewrite-only", action="store_true", help="rewrite and parse every example; run nothing")
    a = p.parse_args()
    out = a.out or Path(os.environ.get("OUT") or tempfile.mkdtemp(prefix="tilelang-examples-")) / "tilelang-examples"
    out.mkdir(parents=True, exist_ok=True)
    runs = [r for r in RUNS if a.runs is None or r[0] in a.runs]
    impls = ["tilelang", "tilecarve"] if a.impl == "both" else [a.impl]
    outcomes = []
    for name, rel, args, limit in runs:
        if a.rewrite_only:
            with tempfile.TemporaryDirectory() as tmp:
                _, n, note = prepare(a.examples / rel, "tilecarve", Path(tmp))
            print(f"{rel}: {n} import lines rewritten {note}")
            continue
        for impl in impls:
            o = run_one(name, rel, args, limit, impl, a.examples, out)
            outcomes.append(o)
            print(f"\n== {impl} {name} ({rel} {' '.join(o.args)}): rc={o.rc} in {o.seconds} s, "
                  f"{o.lines_rewritten} import lines rewritten {o.note}", flush=True)
            for line in o.results:
                print(f"   {line}", flush=True)
    if outcomes:
        (out / "summary.json").write_text(json.dumps([asdict(o) for o in outcomes], indent=1))
        print(f"\nlogs and summary.json in {out}")
    return 0 if all(o.rc == 0 for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())

"""The ``tilecarve`` command line, the examples' ``--help``, and TileLang's logging during a run; CPU only.

Exit codes and ``--help`` run as subprocesses (what a shell sees); the rest in-process through
``tilecarve.cli.main``. The cache commands work on a database written by real C-target tunes.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import subprocess
import sys
import tempfile
import textwrap
import types
from pathlib import Path

import pytest
from kernels.c_kernels import add, ref_add

from autotuner import AutoTuner
from autotuner.config import config_label
from autotuner.logs import MEMORY_CACHE_ADVICE, tilelang_logs_for_run
from tilecarve import cli
from tilecarve.cli import main

ROOT = Path(__file__).resolve().parents[1]
HAS_GPU = importlib.util.find_spec("torch") is not None and __import__("torch").cuda.is_available()
HELP_TIMEOUT = 60  # generous for a loaded machine; each is well under a few seconds when idle


def sh(*argv: str, env: dict[str, str] | None = None, timeout: float = HELP_TIMEOUT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# ----------------------------------------------------------------------------------------- the shell
@pytest.mark.parametrize("argv", [[], ["hints"], ["tune"], ["tune", "matmul"], ["tune", "gemv"], ["cache"],
                                  ["cache", "list"], ["cache", "show"], ["cache", "export"], ["cache", "import"],
                                  ["cache", "clear"], ["quality"]])
def test_every_command_has_help(argv):
    r = sh("-m", "tilecarve", *argv, "--help")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"usage: tilecarve {' '.join(argv)}".rstrip()), r.stdout[:200]


def test_the_timing_choices_are_the_autotuners_modes():
    from autotuner.settings import TIMING_MODES
    from tilecarve.cli import TIMING_CHOICES

    assert TIMING_CHOICES == TIMING_MODES


def test_the_console_script_is_main():
    tomllib = pytest.importorskip("tomllib")
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, func = scripts["tilecarve"].split(":")
    assert getattr(importlib.import_module(module), func) is main


def test_help_and_offline_commands_import_neither_torch_nor_tilelang():
    code = ("import sys; from tilecarve.cli import main; main(['hints', '--gpu', 'H100', '64', '64', '64']); "
            "main(['cache', 'list', '--db', sys.argv[1]]); print(sorted({'torch', 'tilelang'} & set(sys.modules)))")
    r = sh("-c", code, str(Path(tempfile.mkdtemp()) / "none.sqlite"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("[]"), r.stdout


@pytest.mark.parametrize("argv, says", [
    ([], "required: COMMAND"),
    (["bogus"], "invalid choice"),
    (["hints", "64", "64", "64"], "--gpu"),
    (["hints", "--gpu", "B200", "64", "64", "64"], "unknown GPU 'B200'; known: H100, H100-PCIe, H200"),
    (["hints", "--gpu", "H100", "64", "0", "64"], "positive integer, got 0"),
    (["hints", "--gpu", "H100", "64", "64", "64", "--dtype", "int8"], "--dtype must be one of"),
    (["hints", "--gpu", "H100", "--family", "gemv", "1", "64", "64", "--layout", "nn"], "layout nt"),
    (["tune", "matmul", "64", "64", "64", "--dtype", "fp8", "--layout", "nn"], "float8_e4m3 needs"),
    (["cache", "show", "xyz"], "hex digits"),
])
def test_bad_usage_exits_2_with_one_message(argv, says):
    r = sh("-m", "tilecarve", *argv)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert says in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert r.stdout == ""


@pytest.mark.skipif(HAS_GPU, reason="checks the message a CPU-only machine gets")
def test_tune_without_a_gpu_exits_3_and_says_what_works_offline(tmp_path):
    r = sh("-m", "tilecarve", "tune", "matmul", "512", "1024", "256", env={"TILECARVE_CACHE_DIR": str(tmp_path)})
    assert r.returncode == 3, r.stderr
    assert "needs a CUDA GPU" in r.stderr and "tilecarve hints --gpu H100 512 1024 256" in r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""
    assert list(tmp_path.iterdir()) == []  # nothing compiled, no database opened
    r = sh("-m", "tilecarve", "tune", "gemv", "1", "4096", "4096")
    assert r.returncode == 3 and "tilecarve hints --gpu H100 --family gemv 1 4096 4096" in r.stderr


def test_examples_answer_help_without_working():
    r = sh("examples/cpu/axpby.py", "--help")
    assert r.returncode == 0 and r.stdout.startswith("usage: axpby.py"), r.stderr
    assert "tuning:" not in r.stderr and "CPU tuning:" not in r.stdout  # neither the bar nor the result
    blocked = ("import runpy, sys; sys.modules['triton'] = None; sys.argv = ['measure_gemm_grid.py', '--help']; "
               "runpy.run_path('benchmarks/measure_gemm_grid.py', run_name='__main__')")
    r = sh("-c", blocked)
    assert r.returncode == 0 and "usage: measure_gemm_grid.py" in r.stdout, r.stderr
    assert "import triton" not in Path(ROOT, "benchmarks/measure_gemm_grid.py").read_text().split("def gemm")[0]


def test_quickstart_refuses_an_unknown_gpu_before_any_work():
    r = sh("examples/quickstart.py", "--gpu", "B200")
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert lines[-1].startswith("quickstart.py: error: --gpu 'B200'") and "H100" in lines[-1] and len(lines) == 2
    assert r.stdout == ""  # no CPU tune ran first


# ----------------------------------------------------------------------------------------- hints
def test_hints_are_the_carvers_ranking(capsys):
    from templates import matmul as mm

    code, out, _ = run(capsys, "hints", "--gpu", "H100", "2048", "1024", "512", "--topk", "4", "--layout", "nn",
                       "--json")
    assert code == 0
    doc = json.loads(out)
    want = mm.carver_template(2048, 1024, 512, trans_B=False, arch="H100").recommend_hints(4)
    assert [h["config"] for h in doc["hints"]] == [h.to_config() for h in want]
    assert [h["rank"] for h in doc["hints"]] == [1, 2, 3, 4] and doc["gpu"] == "H100" and "(NN)" in doc["problem"]
    for h, w in zip(doc["hints"], want):
        assert h["predicted_ms"] == pytest.approx(w.prediction.latency_ms)
        assert h["predicted_tflops"] == pytest.approx(2 * 2048 * 1024 * 512 / (h["predicted_ms"] * 1e-3) / 1e12)
    code, table, _ = run(capsys, "hints", "--gpu", "sm90", "2048", "1024", "512", "--topk", "4", "--layout", "nn")
    assert code == 0 and "on H100" in table
    assert all(config_label(h["config"]) in table for h in doc["hints"])


def test_gemv_hints_are_what_gemv_tune_measures(capsys):
    from carver.arch import CUDA
    from templates import gemv

    code, out, _ = run(capsys, "hints", "--gpu", "H200", "--family", "gemv", "4", "4096", "4096", "--topk", "3",
                       "--json")
    assert code == 0
    want = gemv.candidates(gemv.make_problem(4, 4096, 4096), CUDA("H200"), 3)
    assert [h["config"] for h in json.loads(out)["hints"]] == [c.to_dict() for c in want]


@pytest.mark.parametrize("family, shape, docs", [("matmul", ("4096", "4096", "4096"), "docs/carver.md"),
                                                  ("gemv", ("1", "4096", "4096"), "docs/gemv.md")])
def test_a_hint_list_out_of_the_predictions_order_says_why_in_its_familys_terms(family, shape, docs, capsys):
    """An unsorted "predicted ms" column is explained by the family's own hedge (a GEMV list is not ordered
    by the matmul carver's extrapolation margin), and a sorted one gets no note."""
    code, table, _ = run(capsys, "hints", "--gpu", "H100", "--family", family, *shape, "--topk", "8")
    ms = [float(line.split()[1]) for line in table.splitlines() if line.split() and line.split()[0].isdigit()]
    assert code == 0 and ms != sorted(ms)  # these lists are hedged out of the predictions' order
    assert table.rstrip().splitlines()[-1] == cli.OUT_OF_ORDER[family] and docs in cli.OUT_OF_ORDER[family]
    code, table, _ = run(capsys, "hints", "--gpu", "H100", "--family", family, *shape, "--topk", "1")
    assert code == 0 and not any(note in table for note in cli.OUT_OF_ORDER.values())


@pytest.mark.skipif(HAS_GPU, reason="checks the message a CPU-only machine gets")
def test_hints_for_the_local_gpu_without_one_exits_3(capsys):
    code, _, err = run(capsys, "hints", "--gpu", "cuda", "64", "64", "64")
    assert code == 3 and "name one instead, e.g. --gpu H100" in err


# ----------------------------------------------------------------------------------------- cache
GRID_A = [dict(block_M=bm, block_N=32) for bm in (32, 64)]
GRID_B = [dict(block_M=32, block_N=bn) for bn in (16, 64)]


def _tune(configs, db):
    return (AutoTuner.from_kernel(add, configs).set_compile_args(out_idx=[-1], ref_prog=ref_add, target="c")
            .set_tuning(n_jobs=1, db_path=str(db), progress=False).run(1, 3))


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """A database with two finished C-target runs, and their results (first A, then B)."""
    db = tmp_path_factory.mktemp("cli-db") / "tuning.sqlite"
    return db, [_tune(GRID_A, db), _tune(GRID_B, db)]


@pytest.mark.parametrize("command", [["list"], ["show", "ab"], ["export", "out.json"], ["clear", "--yes"],
                                     ["import", "in.json"]])
@pytest.mark.parametrize("content", ["json", "other sqlite"])
def test_a_file_that_is_not_a_tuning_database_is_never_changed(capsys, tmp_path, command, content):
    """``--db notes.json`` by mistake: exit 1 naming the file, which is left as it was (a tuning run would
    move a damaged database aside and start a new one; a command only reads what it was given)."""
    import sqlite3

    db = tmp_path / "notes.json"
    if content == "json":
        db.write_text('{"hello": 1}')
    else:
        with sqlite3.connect(db) as conn:
            conn.execute("CREATE TABLE mine (a)")
    before = db.read_bytes()
    from autotuner.cache import EXPORT_FORMAT

    (tmp_path / "in.json").write_text(json.dumps({"format": EXPORT_FORMAT, "runs": []}))  # an empty export
    argv = [a if not a.endswith(".json") else str(tmp_path / a) for a in command]
    code, _, err = run(capsys, "cache", *argv, "--db", str(db))
    assert code == 1 and "is not a tilecarve tuning database" in err and "nothing was changed" in err, err
    assert db.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["in.json", "notes.json"]


def test_cache_list_and_show(tuned, capsys):
    db, results = tuned
    code, out, _ = run(capsys, "cache", "list", "--db", str(db), "--json")
    rows = {r["key"]: r for r in json.loads(out)}
    assert code == 0 and set(rows) == {r.key for r in results}
    for r in results:
        row = rows[r.key]
        assert (row["best_config"], row["best_latency_ms"]) == (r.config, r.latency)
        assert row["n_trials"] == row["n_configs"] == len(r.trials) and row["kernel"].endswith("c_kernels.add")
    code, table, _ = run(capsys, "cache", "list", "--db", str(db))
    assert code == 0 and all(r.key[:12] in table for r in results) and "2/2" in table
    a = results[0]
    code, out, _ = run(capsys, "cache", "show", a.key[:8], "--db", str(db), "--json")
    shown = json.loads(out)
    assert code == 0 and shown["key"] == a.key and len(shown["trials"]) == len(GRID_A)
    assert [t["config"] for t in shown["trials"]] == GRID_A
    code, table, _ = run(capsys, "cache", "show", a.key[:8], "--db", str(db))
    assert all(config_label(c) in table for c in GRID_A) and f"{a.latency:.4f}" in table
    code, _, err = run(capsys, "cache", "show", "0" * 64, "--db", str(db))
    assert code == 1 and "no stored run" in err and "Traceback" not in err


def test_reading_a_missing_database_creates_nothing(tmp_path, capsys):
    db = tmp_path / "none.sqlite"
    code, out, _ = run(capsys, "cache", "list", "--db", str(db))
    assert code == 0 and "no database there yet" in out and not db.exists()
    code, _, err = run(capsys, "cache", "export", str(tmp_path / "x.json"), "--db", str(db))
    assert code == 1 and "nothing to export" in err and not db.exists()


def test_export_import_round_trip_serves_a_warm_hit(tuned, tmp_path, capsys):
    db, results = tuned
    dump = tmp_path / "all.json"
    assert run(capsys, "cache", "export", str(dump), "--db", str(db))[0] == 0
    assert run(capsys, "cache", "export", str(dump), "--db", str(db))[0] == 1  # never overwritten unasked
    other = tmp_path / "other.sqlite"
    code, out, _ = run(capsys, "cache", "import", str(dump), "--db", str(other), "--json")
    assert code == 0 and sorted(json.loads(out)["added"]) == sorted(r.key for r in results)
    again = _tune(GRID_A, other)  # rows imported are rows the tuner trusts
    assert again.from_cache and again.config == results[0].config and again.latency == results[0].latency
    code, out, _ = run(capsys, "cache", "import", str(dump), "--db", str(other))
    assert code == 0 and "0 added, 0 replaced by newer runs, 2 skipped" in out


def test_import_keeps_newer_rows_and_replaces_older_ones(tuned, tmp_path, capsys):
    db, (a, b) = tuned
    one = tmp_path / "one.json"
    assert run(capsys, "cache", "export", str(one), "--db", str(db), "--key", a.key[:10])[0] == 0
    doc = json.loads(one.read_text())
    assert [r["key"] for r in doc["runs"]] == [a.key]
    mine = tmp_path / "mine.sqlite"
    assert run(capsys, "cache", "import", str(one), "--db", str(mine))[0] == 0
    for shift, verdict in ((-100.0, "skipped"), (+100.0, "replaced")):
        doc["runs"][0]["finished"] += shift
        doc["runs"][0]["best_latency_ms"] = doc["runs"][0]["trials"][0]["median_ms"] = 123.0
        doc["runs"][0]["best_config"] = doc["runs"][0]["trials"][0]["config"]
        path = tmp_path / f"{verdict}.json"
        path.write_text(json.dumps(doc))
        code, out, _ = run(capsys, "cache", "import", str(path), "--db", str(mine), "--json")
        report = json.loads(out)
        assert code == 0 and [k if isinstance(k, str) else k[0] for k in report[verdict]] == [a.key]
        doc["runs"][0]["finished"] -= shift
    code, out, _ = run(capsys, "cache", "list", "--db", str(mine), "--json")
    assert json.loads(out)[0]["best_latency_ms"] == 123.0  # the newer one, and only it, replaced the row


@pytest.mark.parametrize("damage, says", [
    (lambda r: r["trials"][0].update(status="fine"), "'fine' is not a valid Status"),
    (lambda r: r["trials"][1].update(median_ms=-1.0), "median_ms=-1.0"),
    (lambda r: r.update(key="not-a-key"), "SHA-256"),
    (lambda r: r.update(best_latency_ms=float("nan")), "best_latency_ms=nan"),
])
def test_a_damaged_import_changes_nothing(tuned, tmp_path, capsys, damage, says):
    db, _ = tuned
    dump = tmp_path / "all.json"
    run(capsys, "cache", "export", str(dump), "--db", str(db))
    doc = json.loads(dump.read_text())
    damage(doc["runs"][1])
    dump.write_text(json.dumps(doc))
    target = tmp_path / "t.sqlite"
    code, _, err = run(capsys, "cache", "import", str(dump), "--db", str(target))
    assert code == 1 and says in err and "nothing was imported" in err
    assert json.loads(run(capsys, "cache", "list", "--db", str(target), "--json")[1]) == []
    dump.write_text(json.dumps({"runs": []}))
    code, _, err = run(capsys, "cache", "import", str(dump), "--db", str(target))
    assert code == 1 and "not a tilecarve cache export" in err


def test_clear_asks_or_needs_yes(tuned, tmp_path, capsys, monkeypatch):
    db, (a, b) = tuned
    dump, mine = tmp_path / "all.json", tmp_path / "mine.sqlite"
    run(capsys, "cache", "export", str(dump), "--db", str(db))
    run(capsys, "cache", "import", str(dump), "--db", str(mine))
    monkeypatch.setattr(sys, "stdin", types.SimpleNamespace(isatty=lambda: False))
    code, _, err = run(capsys, "cache", "clear", "--db", str(mine))
    assert code == 2 and "--yes" in err
    monkeypatch.setattr(sys, "stdin", types.SimpleNamespace(isatty=lambda: True))
    monkeypatch.setattr("builtins.input", lambda prompt: "n")
    assert run(capsys, "cache", "clear", "--db", str(mine))[1].strip() == "nothing deleted"
    code, out, _ = run(capsys, "cache", "clear", "--db", str(mine), "--key", a.key[:12], "--yes")
    assert code == 0 and "deleted 1 runs" in out
    keys = [r["key"] for r in json.loads(run(capsys, "cache", "list", "--db", str(mine), "--json")[1])]
    assert keys == [b.key]
    monkeypatch.setattr("builtins.input", lambda prompt: "y")
    assert "deleted 1 runs" in run(capsys, "cache", "clear", "--db", str(mine))[1]
    assert json.loads(run(capsys, "cache", "list", "--db", str(mine), "--json")[1]) == []


def test_tune_report_of_a_real_result(tuned, capsys):
    from tilecarve.cli import report_tuning

    _, (a, _) = tuned
    doc = report_tuning(a, 2 * 256 * 256, "add 256x256", as_json=True)
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(doc))
    assert doc["best"]["config"] == a.config and doc["trials"][0]["median_ms"] == a.latency
    report_tuning(a, 2 * 256 * 256, "add 256x256", as_json=False)
    table = capsys.readouterr().out
    assert f"best: {config_label(a.config)} at {a.latency:.4f} ms" in table and table.count("\nok ") == 2


# ----------------------------------------------------------------------------------------- quality
def test_quality_writes_the_real_report_for_shipped_data(tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="pip install -e '.[test]' for matplotlib")
    data = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "gemv-2026-11-21b-h200"
    code, out, _ = run(capsys, "quality", str(data), "--arch", "H200", "--out", str(tmp_path), "--json")
    summary = json.loads(out)
    assert code == 0 and "gemv" in json.dumps(summary)
    pngs = sorted(tmp_path.glob("*.png"))
    assert pngs and all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)


def test_quality_names_a_missing_dependency(tmp_path, capsys, monkeypatch):
    def no_matplotlib(name: str):
        raise ModuleNotFoundError("No module named 'matplotlib'", name="matplotlib")

    monkeypatch.setattr("tilecarve.cli.importlib.import_module", no_matplotlib)
    code, _, err = run(capsys, "quality", str(tmp_path))
    assert code == 1 and "needs matplotlib" in err and "tilecarve[bench]" in err


def test_quality_writes_into_a_fresh_temp_dir_by_default(tmp_path, capsys, monkeypatch):
    """The wiring only (the report itself is tilecarve/quality.py's): a stand-in write_report records its call."""
    calls = []

    def write_report(data_dir: Path, out_dir: Path, arch: str | None = None) -> dict:
        calls.append((data_dir, out_dir, arch))
        (out_dir / "ranks.png").write_bytes(b"png")
        return {"figures": [str(out_dir / "ranks.png")]}

    monkeypatch.setitem(sys.modules, "tilecarve.quality", types.SimpleNamespace(write_report=write_report))
    monkeypatch.chdir(tmp_path)
    code, out, _ = run(capsys, "quality", str(tmp_path), "--arch", "H200")
    (data_dir, out_dir, arch), = calls
    assert code == 0 and data_dir == tmp_path and arch == "H200" and list(tmp_path.iterdir()) == []
    assert out_dir.parent == Path(tempfile.gettempdir()) and str(out_dir) in out and "ranks.png" in out
    code, out, _ = run(capsys, "quality", str(tmp_path), "--out", str(tmp_path / "rep"), "--json")
    assert code == 0 and json.loads(out) == {"figures": [str(tmp_path / "rep" / "ranks.png")]}
    assert run(capsys, "quality", str(tmp_path / "missing"))[0] == 2


# ----------------------------------------------------------------------------------------- logging
LOGGED_RUN = textwrap.dedent("""
    import json, logging, os, sys
    sys.path.insert(0, "tests")
    from kernels.c_kernels import add, add_failing, ref_add
    from autotuner import AutoTuner, TuningError

    def state():
        log = logging.getLogger("tilelang")
        return [log.level, [type(h).__name__ for h in log.handlers], os.environ.get("TILELANG_PRINT_ON_COMPILATION")]

    def tune(kernel, configs):
        return (AutoTuner.from_kernel(kernel, configs).set_compile_args(out_idx=[-1], ref_prog=ref_add, target="c")
                .set_tuning(n_jobs=2, progress=True).run(1, 3))

    import tilelang
    before = state()
    cold = tune(add, [dict(block_M=bm, block_N=8) for bm in (8, 16)])
    warm = tune(add, [dict(block_M=bm, block_N=8) for bm in (8, 16)])  # the winner from TileLang's memory cache
    try:
        tune(add_failing, [dict(block_M=0)])
    except TuningError:
        pass
    print(json.dumps({"before": before, "after": state(), "cold": cold.from_cache, "warm": warm.from_cache}))
""")


def test_tilelang_logs_stay_off_stdout_and_out_of_the_bar(tmp_path):
    env = {"TILECARVE_CACHE_DIR": str(tmp_path / "tc"), "TILELANG_CACHE_DIR": str(tmp_path / "tl")}
    r = sh("-c", LOGGED_RUN, env=env, timeout=600)  # a fresh TileLang cache: every config really compiles
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout)  # stdout holds only what the program printed
    assert doc["cold"] is False and doc["warm"] is True
    assert doc["after"] == doc["before"] and doc["before"][0] == logging.INFO  # TileLang's own state, restored
    assert "tuning:" in r.stderr  # the bar was drawn, so the lines had a chance to break it up
    assert "compile kernel" not in r.stderr and "memory cache" not in r.stderr, r.stderr[-3000:]


def test_remaining_tilelang_records_go_above_the_bar_on_stderr(capsys):
    import tilelang  # noqa: F401

    log = logging.getLogger("tilelang")
    before = (log.level, list(log.handlers), os.environ.get("TILELANG_PRINT_ON_COMPILATION"))
    with pytest.raises(KeyError), tilelang_logs_for_run(progress=True):
        assert os.environ["TILELANG_PRINT_ON_COMPILATION"] == "0" and log.getEffectiveLevel() == logging.WARNING
        child = logging.getLogger("tilelang.cache.kernel_cache")
        child.warning(MEMORY_CACHE_ADVICE + " For better performance, ...", "main")
        child.warning("disk cache entry %s is damaged", "x")
        child.info("TileLang begins to compile kernel `main`")
        raise KeyError("an error inside the run")
    out, err = capsys.readouterr()
    assert out == "" and "disk cache entry x is damaged" in err
    assert "memory cache" not in err and "compile kernel" not in err
    assert (log.level, list(log.handlers), os.environ.get("TILELANG_PRINT_ON_COMPILATION")) == before

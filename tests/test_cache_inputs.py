"""``tilecarve cache`` and the tuning database against what it is given: a failed export write, a damaged or
read-only database, parallel imports into a new file, two processes finding one damaged file, bad imports, and
a relative ``XDG_CACHE_HOME``. Pure logic on sqlite3 and the command line: no kernel is compiled."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
import tempfile
import textwrap
import warnings
from pathlib import Path

import pytest

from autotuner import cache as cache_mod
from autotuner.cache import EXPORT_FORMAT, TuningCacheWarning, TuningDB
from autotuner.trial import Status, Trial
from tilecarve.cli import main

ROOT = Path(__file__).resolve().parents[1]
KEYS = [f"{i:064x}" for i in range(1, 41)]


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def stored_keys(path: Path) -> list[str]:
    with contextlib.closing(sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)) as conn:
        return [r[0] for r in conn.execute("SELECT key FROM runs ORDER BY key")]


def make_db(path: Path, n: int = 40) -> Path:
    """A finished run of two trials under each of ``n`` keys, written as a tuning run writes them."""
    db = TuningDB(path)
    for key in KEYS[:n]:
        db.open_run(key, "kernels.c_kernels.add", "c", 2, {"note": "x" * 2000})
        for i in range(2):
            db.record_trial(key, i, Trial({"block_M": 16 << i}, Status.OK, None, 0.1, 1.0 + i, 1.0 + i, 0.01))
        db.finish_run(key, Trial({"block_M": 16}, Status.OK, None, 0.1, 1.0, 1.0, 0.01), None)
    db.close()
    assert not Path(f"{path}-wal").exists()  # checkpointed: the file holds everything
    return path


def damage_a_page(path: Path) -> None:
    """Overwrite the header of a page in the middle of the file: SQLite's quick_check fails on it, while the
    file still starts as an SQLite database."""
    data = bytearray(path.read_bytes())
    page = int.from_bytes(data[16:18], "big")
    assert len(data) >= 6 * page
    data[4 * page: 4 * page + 64] = b"\xff" * 64
    path.write_bytes(bytes(data))
    with contextlib.closing(sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)) as conn:
        assert conn.execute("PRAGMA quick_check").fetchone()[0] != "ok"


def listing(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if not p.name.endswith(("-wal", "-shm", ".lock")))  # the DB's own


# ------------------------------------------------------------------------------------------- 1. export
def test_a_failed_export_leaves_the_old_file_and_names_it(tmp_path, capsys):
    """``export FILE --force`` under ``ulimit -f``: the old file is kept whole, with its mode, no temporary
    is left, and the error names the file; a write that succeeds keeps the mode too."""
    import resource

    db = make_db(tmp_path / "tuning.sqlite")
    out = tmp_path / "out.json"
    out.write_text('{"old": true}\n')
    out.chmod(0o640)
    limit = 64 * 1024  # room for SQLite's -shm (32 KiB), not for the export

    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    p = subprocess.run([sys.executable, "-m", "tilecarve", "cache", "export", str(out), "--force", "--db", str(db)],
                       cwd=ROOT, capture_output=True, text=True, timeout=120, preexec_fn=small_files,
                       env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    assert p.returncode == 1, p.stderr
    assert str(out) in p.stderr and "File too large" in p.stderr and "left as it was" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr
    assert out.read_text() == '{"old": true}\n' and stat.S_IMODE(out.stat().st_mode) == 0o640
    assert listing(tmp_path) == ["out.json", "tuning.sqlite"]  # no temporary left
    assert run(capsys, "cache", "export", out, "--force", "--db", db)[0] == 0
    assert out.stat().st_size > limit and len(json.loads(out.read_text())["runs"]) == 40
    assert stat.S_IMODE(out.stat().st_mode) == 0o640
    old = os.umask(0o027)
    try:
        assert run(capsys, "cache", "export", tmp_path / "new.json", "--db", db)[0] == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "new.json").stat().st_mode) == 0o640  # 0666 less the umask


# ------------------------------------------------------------------------------- 2. a damaged database
@pytest.mark.parametrize("command", [["list"], ["list", "--json"], ["show", "00"], ["export", "out.json"],
                                     ["clear", "--yes"], ["import", "in.json"]])
def test_a_damaged_database_is_reported_and_never_moved(tmp_path, capsys, command):
    db = make_db(tmp_path / "tuning.sqlite")
    (tmp_path / "in.json").write_text(json.dumps({"format": EXPORT_FORMAT, "runs": []}))
    damage_a_page(db)
    before = db.read_bytes()
    argv = [str(tmp_path / a) if a.endswith(".json") else a for a in command]
    code, out, err = run(capsys, "cache", *argv, "--db", db)
    assert code == 1 and str(db) in err and "damaged" in err and "nothing was changed" in err, (out, err)
    assert ".recover" in err and "Traceback" not in err and "no tuned problems" not in out
    assert db.read_bytes() == before and listing(tmp_path) == ["in.json", "tuning.sqlite"]


def test_a_tuning_run_still_moves_a_damaged_database_aside(tmp_path):
    db = make_db(tmp_path / "tuning.sqlite")
    damage_a_page(db)
    with pytest.warns(TuningCacheWarning, match="moved to"):
        TuningDB(db).close()
    assert [p for p in listing(tmp_path) if ".damaged-" in p]
    assert stored_keys(db) == []


# ----------------------------------------------------------------------- 3. read-only, and parallel imports
_AS_OTHER_USER = textwrap.dedent("""
    import os, sys
    import autotuner, autotuner.cache, autotuner.config, autotuner.trial, carver, tilecarve.cache_cmd, tilecarve.cli
    if os.getuid() == 0:  # root reads and writes whatever the permissions say: be nobody
        os.setgid(65534)
        os.setuid(65534)
    sys.exit(tilecarve.cli.main(sys.argv[1:]))
""")


def test_a_database_that_cannot_be_written_is_read_and_not_called_foreign():
    """A WAL database in a read-only directory, read-only itself, whose -shm cannot be created: list, show and
    export read it (as it stands: ``immutable=1``) and say why, creating nothing."""
    top = Path(tempfile.mkdtemp(prefix="tilecarve-ro-"))  # not under pytest's 0700 base: nobody must reach it
    try:
        top.chmod(0o755)
        d = top / "ro"
        d.mkdir()
        db = make_db(d / "tuning.sqlite", n=3)
        with contextlib.closing(sqlite3.connect(db)) as conn:
            assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        db.chmod(0o444)
        d.chmod(0o555)
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(ROOT)}
        for argv in (["list", "--json"], ["show", KEYS[0], "--json"], ["export", "-"]):
            p = subprocess.run([sys.executable, "-c", _AS_OTHER_USER, "cache", *argv, "--db", str(db)], cwd=top,
                               capture_output=True, text=True, timeout=120, env=env)
            assert p.returncode == 0, p.stderr
            assert "not a tilecarve tuning database" not in p.stderr and "cannot be written here" in p.stderr
            assert str(db) in p.stderr
            out = json.loads(p.stdout)
            keys = [r["key"] for r in out] if argv[0] == "list" else [out["key"]] if argv[0] == "show" else [
                r["key"] for r in out["runs"]]
            assert sorted(keys) == sorted(KEYS[:3] if argv[0] != "show" else KEYS[:1])
        assert sorted(p.name for p in d.iterdir()) == ["tuning.sqlite", "tuning.sqlite.lock"]
    finally:
        for p in (top, *top.rglob("*")):
            with contextlib.suppress(OSError):
                p.chmod(0o755 if p.is_dir() else 0o644)
        shutil.rmtree(top, ignore_errors=True)


@pytest.mark.parametrize("state", ["empty file", "wal, no tables"])
def test_import_into_a_database_another_process_is_creating(tmp_path, capsys, state):
    """What a parallel ``import`` into a new file sees while another creates it: an SQLite file with no table
    yet. It waits and adds its runs; ``list`` says there is nothing yet."""
    src = make_db(tmp_path / "src.sqlite", n=3)
    dump = tmp_path / "all.json"
    assert run(capsys, "cache", "export", dump, "--db", src)[0] == 0
    new = tmp_path / "new.sqlite"
    new.touch()
    if state != "empty file":
        with contextlib.closing(sqlite3.connect(new)) as conn:
            conn.execute("PRAGMA journal_mode = WAL")
    code, out, err = run(capsys, "cache", "list", "--db", new)
    assert code == 0 and "no tuned problems" in out, err
    code, out, err = run(capsys, "cache", "import", dump, "--db", new, "--json")
    assert code == 0 and sorted(json.loads(out)["added"]) == KEYS[:3], err


def test_parallel_imports_into_a_new_file_all_succeed(tmp_path, capsys):
    src = make_db(tmp_path / "src.sqlite")
    dump = tmp_path / "all.json"
    assert run(capsys, "cache", "export", dump, "--db", src)[0] == 0
    new = tmp_path / "new.sqlite"
    procs = [subprocess.Popen([sys.executable, "-m", "tilecarve", "cache", "import", str(dump), "--db", str(new),
                               "--json"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(6)]
    results = [(p.wait(timeout=180), *p.communicate()) for p in procs]
    assert all(code == 0 for code, _, _ in results), [err for _, _, err in results]
    added = [k for _, out, _ in results for k in json.loads(out)["added"]]
    assert sorted(added) == KEYS  # each run added once, by one of them


# -------------------------------------------------------------- 4. two processes find one damaged file
def test_a_second_opener_does_not_move_aside_the_new_database(tmp_path, monkeypatch):
    """B found the file damaged, then A moved it aside and started a new one (and wrote to it): B must use A's
    new database, not move it (and its -wal) aside too."""
    path = make_db(tmp_path / "tuning.sqlite", n=2)
    damage_a_page(path)
    with pytest.warns(TuningCacheWarning):
        a = TuningDB(path)
    a.open_run(KEYS[5], "k", "c", 1, {})
    real, calls = TuningDB._open, []

    def stale_first_look(self):
        calls.append(1)
        if len(calls) == 1:  # what B saw before A moved the damaged file
            raise sqlite3.DatabaseError("database disk image is malformed")
        return real(self)

    monkeypatch.setattr(TuningDB, "_open", stale_first_look)
    with warnings.catch_warnings():
        warnings.simplefilter("error", TuningCacheWarning)
        b = TuningDB(path)
    assert b.keys() == [KEYS[5]] and len(calls) == 2
    assert len([p for p in listing(tmp_path) if ".damaged-" in p]) == 1
    a.close()
    b.close()


_OPEN_AND_WRITE = textwrap.dedent("""
    import sys, time, warnings
    from autotuner.cache import TuningDB
    from autotuner.trial import Status, Trial
    warnings.simplefilter("ignore")
    time.sleep(max(0.0, float(sys.argv[2]) - time.time()))
    db = TuningDB(sys.argv[1])
    key = "%064x" % (1000 + int(sys.argv[3]))
    db.open_run(key, "k", "c", 1, {})
    db.record_trial(key, 0, Trial({"block_M": 16}, Status.OK, None, 0.1, 1.0, 1.0, 0.0))
    db.close()
""")


def test_processes_that_find_one_damaged_file_at_once_move_it_aside_once(tmp_path):
    import time

    path = make_db(tmp_path / "tuning.sqlite")
    damage_a_page(path)
    start = time.time() + 3.0
    procs = [subprocess.Popen([sys.executable, "-c", _OPEN_AND_WRITE, str(path), str(start), str(i)], cwd=ROOT,
                              stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
             for i in range(6)]
    errs = [(p.wait(timeout=180), p.communicate()[1]) for p in procs]
    assert all(code == 0 for code, _ in errs), errs
    assert len([p for p in listing(tmp_path) if ".damaged-" in p]) == 1
    assert stored_keys(path) == [f"{1000 + i:064x}" for i in range(6)]  # no write was lost


# ------------------------------------------------------------------------------------------- 5. import
def _export(tmp_path, capsys) -> dict:
    db = make_db(tmp_path / "src.sqlite", n=2)
    assert run(capsys, "cache", "export", tmp_path / "all.json", "--db", db)[0] == 0
    return json.loads((tmp_path / "all.json").read_text())


def _trial(doc):
    return doc["runs"][1]["trials"][0]


@pytest.mark.parametrize("damage, says", [
    (lambda d: d["runs"][1].update(n_configs=10**30), "run 1 (key "),
    (lambda d: _trial(d).update(recorded=10**400), "trial 0 (idx 0): recorded=1000"),
    (lambda d: _trial(d).update(recorded=1e400), "recorded=inf"),
    (lambda d: d["runs"][1].update(created=True), "created=True"),
    (lambda d: d["runs"][1].update(finished="yesterday"), "finished='yesterday'"),
    (lambda d: _trial(d).update(rounds="x"), "rounds='x'"),
    (lambda d: _trial(d).update(rounds=2**64), "rounds=18446744073709551616"),
    (lambda d: _trial(d).update(idx=True), "idx=True"),
    (lambda d: _trial(d).update(median_ms=False), "median_ms=False"),
    (lambda d: _trial(d).update(config="block_M=16"), "config='block_M=16'"),
    (lambda d: _trial(d).update(status=["ok"]), "status:"),
    (lambda d: _trial(d).update(device=3), "device=3"),
    (lambda d: d["runs"][1].update(kernel=5), "kernel=5"),
    (lambda d: d["runs"][1].update(meta=[]), "meta=[]"),
    (lambda d: d["runs"][1].update(best_latency_ms=True), "best_latency_ms=True"),
    (lambda d: d["runs"].append(d["runs"][0]), "the same key as run 0"),
    (lambda d: d.update(runs={}), "runs={}, expected a list of runs"),
    (lambda d: d.update(format="tilecarve-table/1"), "format='tilecarve-table/1', expected"),
])
def test_a_bad_import_names_the_file_run_and_field_and_creates_nothing(tmp_path, capsys, damage, says):
    doc = _export(tmp_path, capsys)
    damage(doc)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    target = tmp_path / "new.sqlite"
    code, _, err = run(capsys, "cache", "import", bad, "--db", target)
    assert code == 1 and str(bad) in err and says in err and "nothing was imported" in err, err
    assert "Traceback" not in err and "OverflowError" not in err
    assert not target.exists()  # checked before the database was created
    if "runs" in says or "format" in says:
        return
    assert "run 1 (key " in err or "run 2 (key " in err


def test_the_numbers_an_export_holds_import_again(tmp_path, capsys):
    doc = _export(tmp_path, capsys)
    _trial(doc).update(rounds=3, spread=0.0, recorded=0, compile_s=None)
    ok = tmp_path / "ok.json"
    ok.write_text(json.dumps(doc))
    code, out, err = run(capsys, "cache", "import", ok, "--db", tmp_path / "new.sqlite", "--json")
    assert code == 0 and sorted(json.loads(out)["added"]) == KEYS[:2], err


# ----------------------------------------------------------------------------------- 6. XDG_CACHE_HOME
def test_a_relative_xdg_cache_home_is_ignored(monkeypatch, tmp_path, caplog):
    monkeypatch.delenv("TILECARVE_CACHE_DIR")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", "rel/cache")
    with caplog.at_level(logging.DEBUG, logger="autotuner.cache"):
        assert cache_mod.cache_dir() == tmp_path / ".cache" / "tilecarve"
    assert "XDG_CACHE_HOME" in caplog.text and "rel/cache" in caplog.text
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_mod.cache_dir() == tmp_path / "xdg" / "tilecarve"

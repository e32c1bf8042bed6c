"""``tilecarve``'s command line where a reviewer found faults: what it writes over, damaged rows, the values its
options take, the quality scan, and the advice its errors give. CPU only and quick: the database is written
through :class:`autotuner.cache.TuningDB` itself (no kernel is compiled).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import sqlite3
from pathlib import Path

import pytest

from autotuner.cache import DamagedRow, TuningDB
from autotuner.settings import check_setting
from autotuner.trial import Status, Trial
from tilecarve.cli import build_parser, main


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def usage(capsys, *argv: str) -> tuple[int, str]:
    """What argparse says of a bad value: its exit status and stderr."""
    with pytest.raises(SystemExit) as e:
        main(list(argv))
    return e.value.code, capsys.readouterr().err


def _key(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()


def _store(path: Path, names: tuple[str, ...] = ("a", "b")) -> list[str]:
    """Two finished runs of two trials each in the database ``path``, as a tuning run stores them; their keys."""
    db = TuningDB(path)
    try:
        for name in names:
            key = _key(name)
            db.open_run(key, f"kernels.{name}", "c", 2, {"settings": name})
            trials = [Trial({"block_M": bm}, Status.OK, None, 0.5, ms, ms, 0.0) for bm, ms in ((32, 1.5), (64, 1.25))]
            for i, t in enumerate(trials):
                db.record_trial(key, i, t)
            db.finish_run(key, trials[1], 2.0)
    finally:
        db.close()
    return [_key(n) for n in names]


@pytest.fixture
def db(tmp_path) -> tuple[Path, list[str]]:
    path = tmp_path / "cache" / "tuning.sqlite"
    return path, _store(path)


def _listed(capsys, path: Path) -> list[str]:
    code, out, err = run(capsys, "cache", "list", "--db", str(path), "--json")
    assert code == 0, err
    return sorted(r["key"] for r in json.loads(out))


# ------------------------------------------------------------------------------ 1. never over the database
@pytest.mark.parametrize("force", [True, False])
@pytest.mark.parametrize("suffix", ["", "-wal", "-shm", ".lock", "link"])
def test_export_never_writes_over_the_database_or_its_files(db, tmp_path, capsys, suffix, force):
    path, keys = db
    target = tmp_path / "link.json" if suffix == "link" else Path(f"{path}{suffix}")
    if suffix == "link":
        target.symlink_to(path)
    before = {p.name: p.read_bytes() for p in path.parent.iterdir()}
    code, _, err = run(capsys, "cache", "export", str(target), "--db", str(path), *(["--force"] if force else []))
    assert code == 2, err
    assert f"FILE {target} is the" in err and str(path) in err and "pick another file" in err, err
    assert {p.name: p.read_bytes() for p in path.parent.iterdir()} == before
    assert _listed(capsys, path) == sorted(keys)


def test_export_over_the_default_database_as_the_reviewer_ran_it(tmp_path, capsys, monkeypatch):
    """``TILECARVE_CACHE_DIR=$PWD/ex tilecarve cache export ex/tuning.sqlite --force`` wrote JSON over it."""
    keys = _store(tmp_path / "ex" / "tuning.sqlite")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TILECARVE_CACHE_DIR", str(tmp_path / "ex"))
    code, _, err = run(capsys, "cache", "export", "ex/tuning.sqlite", "--force")
    assert code == 2 and "FILE ex/tuning.sqlite is the tuning database" in err, err
    code, out, _ = run(capsys, "cache", "list", "--json")
    assert code == 0 and sorted(r["key"] for r in json.loads(out)) == sorted(keys)


def test_import_of_the_database_itself_and_a_db_that_is_its_lock_file(db, tmp_path, capsys):
    path, keys = db
    code, _, err = run(capsys, "cache", "import", str(path), "--db", str(path))
    assert code == 2 and f"FILE {path} is the tuning database" in err and "tilecarve cache export" in err, err
    dump = tmp_path / "dump.json"
    assert run(capsys, "cache", "export", str(dump), "--db", str(path))[0] == 0
    lock = Path(f"{path}.lock")
    before = sorted(p.name for p in path.parent.iterdir())
    assert lock.name in before and lock.stat().st_size == 0
    for argv in (["import", str(dump)], ["list"], ["clear", "--yes"]):  # the lock file is empty: a "new database"
        code, _, err = run(capsys, "cache", *argv, "--db", str(lock))
        assert code == 1 and f"{lock} is the .lock file of the tuning database {path}" in err, err
        assert f"Pass --db {path}" in err
    assert sorted(p.name for p in path.parent.iterdir()) == before and lock.stat().st_size == 0


def test_export_to_a_folder_is_refused_before_reading(db, tmp_path, capsys):
    path, _ = db
    code, _, err = run(capsys, "cache", "export", str(tmp_path), "--db", str(path), "--force")
    assert code == 2 and f"FILE {tmp_path} is a folder" in err and str(tmp_path / "runs.json") in err, err


# ------------------------------------------------------------------------------ 2. a damaged row
def _damage(path: Path, key: str) -> None:
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE trials SET status='bogus' WHERE key=? AND idx=0", (key,))
    conn.close()


def test_a_damaged_run_is_named_and_export_skips_it(db, tmp_path, capsys):
    path, (bad, good) = db
    _damage(path, bad)
    with contextlib.closing(TuningDB(path, readonly=True)) as ro:  # what the library says of it
        with pytest.raises(DamagedRow, match="'bogus' is not a valid Status"):
            ro.export_runs()
    code, _, err = run(capsys, "cache", "show", bad[:8], "--db", str(path))
    assert code == 1 and f"the run {bad} in the tuning database {path} is damaged" in err, err
    assert "'bogus' is not a valid Status" in err and "tilecarve cache clear --key" in err and "DamagedRow" not in err
    assert run(capsys, "cache", "show", good[:8], "--db", str(path))[0] == 0

    out_file = tmp_path / "all.json"
    code, _, err = run(capsys, "cache", "export", str(out_file), "--db", str(path))
    assert code == 1, err  # not a silent success
    assert [r["key"] for r in json.loads(out_file.read_text())["runs"]] == [good]
    assert "exported 1 runs" in err and "skipped 1 damaged" in err and bad in err and str(path) in err, err
    code, out, err = run(capsys, "cache", "export", "-", "--db", str(path))
    assert code == 1 and [r["key"] for r in json.loads(out)["runs"]] == [good] and bad in err, err

    one = tmp_path / "one.json"
    code, _, err = run(capsys, "cache", "export", str(one), "--db", str(path), "--key", bad[:8])
    assert code == 1 and "Nothing was exported" in err and bad in err and not one.exists(), err
    assert run(capsys, "cache", "export", str(one), "--db", str(path), "--key", good[:8])[0] == 0
    assert _listed(capsys, path) == sorted([bad, good])  # nothing was changed by reading


def test_export_with_every_run_damaged_writes_nothing(db, tmp_path, capsys):
    path, keys = db
    for key in keys:
        _damage(path, key)
    out_file = tmp_path / "all.json"
    code, _, err = run(capsys, "cache", "export", str(out_file), "--db", str(path))
    assert code == 1 and "Nothing was exported" in err and all(k in err for k in keys) and not out_file.exists()


# ------------------------------------------------------------------------------ 3., 4. option values
@pytest.mark.parametrize("value", ["cuda:abc", "cuda:", "cuda:-1", "cuda:1.5", "cuda:0:1"])
def test_a_local_gpu_that_is_no_device_index_is_bad_usage(capsys, value):
    code, err = usage(capsys, "hints", "--gpu", value, "64", "64", "64")
    assert code == 2 and f"argument --gpu: {value!r}: the local GPU is 'cuda' (device 0) or 'cuda:N'" in err, err
    assert "ValueError" not in err and "H100" in err


@pytest.mark.parametrize("value", ["cuda", "cuda:0", "CUDA:1", " cuda:2 "])
def test_a_local_gpu_with_an_index_parses(value):
    args = build_parser().parse_args(["hints", "--gpu", value, "64", "64", "64"])
    assert args.gpu == value.strip()


def test_warmup_zero_is_accepted_as_the_library_accepts_it():
    args = build_parser().parse_args(["tune", "matmul", "64", "64", "64", "--warmup", "0"])
    assert args.warmup == 0 and check_setting("warmup", 0) == 0


@pytest.mark.parametrize("flag, setting", [("--warmup", "warmup"), ("--rep", "rep"), ("--jobs", "n_jobs")])
def test_counts_take_what_the_library_takes(capsys, flag, setting):
    """Every value from -3 to 3: the command line takes it if and only if ``check_setting`` does."""
    for value in range(-3, 4):
        try:
            check_setting(setting, value)
            library = True
        except ValueError:
            library = False
        argv = ["tune", "gemv", "1", "64", "64", flag, str(value)]
        if library:
            assert getattr(build_parser().parse_args(argv), flag[2:]) == value
        else:
            code, err = usage(capsys, *argv)
            assert code == 2 and f"argument {flag}:" in err and f"got {value}" in err, err
            assert "dimension" not in err, err  # its own wording, not M N K's


def test_topk_takes_what_tune_options_take(capsys):
    from templates.protocol import TuneOptions

    for value in (-1, 0, 1, 8, 2**31 - 1, 2**31):
        try:
            TuneOptions(topk=value)
            library = True
        except ValueError:
            library = False
        argv = ["hints", "--gpu", "H100", "64", "64", "64", "--topk", str(value)]
        if library:
            assert build_parser().parse_args(argv).topk == value
        else:
            code, err = usage(capsys, *argv)
            assert code == 2 and "argument --topk: a number of configs" in err and "dimension" not in err, err


def test_counts_and_dimensions_name_what_they_are(capsys):
    assert "a number of warmup calls is an integer >= 0" in usage(capsys, "tune", "matmul", "64", "64", "64",
                                                                   "--warmup", "x")[1]
    assert "a number of timed calls is an integer >= 1" in usage(capsys, "tune", "matmul", "64", "64", "64",
                                                                 "--rep", "0")[1]
    assert "a dimension is a positive integer, got 0" in usage(capsys, "hints", "--gpu", "H100", "0", "64", "64")[1]


# ------------------------------------------------------------------------------ 5. the quality scan
GRID = {"summary": {"family": "attention", "device": "NVIDIA H200",
                    "problem": {"batch": 1, "heads": 8, "seq_len": 1024, "dim": 64}},
        "results": [{"config": {"block_M": 128, "block_N": 64, "num_stages": 1, "threads": 256}, "ms": 1.0,
                     "correct": True}]}
NOT_JSON = '{\n "a": 1\n "b": 2\n}\n'  # json.loads: "Expecting ',' delimiter: line 3 column 2"


def test_quality_names_a_file_that_is_not_json(tmp_path, capsys, caplog):
    from tilecarve import quality

    notes, odd = tmp_path / "notes.json", tmp_path / "odd.json"
    notes.write_text(NOT_JSON)
    odd.write_text(json.dumps({"summary": "a test report", "results": 3}))
    with caplog.at_level(logging.WARNING, logger="tilecarve.quality"):
        code, _, err = run(capsys, "quality", str(tmp_path), "--out", str(tmp_path / "report"))
    assert code == 1 and "no measured grid" in err and str(notes) in err and str(odd) in err, err
    assert "JSONDecodeError" not in err and "Traceback" not in err
    said = [r.getMessage() for r in caplog.records]
    assert any(f"{notes} is not valid JSON (Expecting ',' delimiter: line 3 column 2" in m for m in said), said
    assert any(f"{odd} has 'summary' and 'results' but is no measured grid" in m for m in said), said
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "grid.json").write_text(json.dumps(GRID))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="tilecarve.quality"):
        (grid,) = quality.load_grids(tmp_path)  # a folder: the files that are no grids are skipped, and named
    assert grid.path == tmp_path / "sub" / "grid.json" and len(caplog.records) == 2
    with pytest.raises(ValueError, match=f"{notes} is not valid JSON"):
        quality.load_grids(notes)  # a file named itself must be a grid
    with pytest.raises(ValueError, match=f"{odd} has 'summary' and 'results' but is no measured grid"):
        quality.load_grids(odd)


def test_quality_help_says_what_the_scan_skips(capsys):
    with pytest.raises(SystemExit):
        main(["quality", "--help"])
    assert "not valid JSON" in " ".join(capsys.readouterr().out.split())


def test_quality_report_never_replaces_a_measured_grid(tmp_path, capsys):
    grid = tmp_path / "hint_quality.json"
    grid.write_text(json.dumps(GRID))
    code, _, err = run(capsys, "quality", str(tmp_path), "--out", str(tmp_path))
    assert code == 2 and "holds a measured grid named hint_quality.json" in err, err
    assert json.loads(grid.read_text()) == GRID
    code, _, err = run(capsys, "quality", str(tmp_path), "--out", str(grid))
    assert code == 2 and "is a file" in err, err


# ------------------------------------------------------------------------------ 6. advice by errno
def test_export_into_a_missing_folder_says_so(db, tmp_path, capsys):
    path, _ = db
    target = tmp_path / "nodir" / "x.json"
    code, _, err = run(capsys, "cache", "export", str(target), "--db", str(path))
    assert code == 1 and f"The folder {tmp_path / 'nodir'} does not exist" in err, err
    assert "ulimit" not in err and "space" not in err and not target.parent.exists()


ADVICE = {"space": "Free some space, raise the file size limit (ulimit -f)", "access": "cannot be written here",
          "missing": "does not exist"}


@pytest.mark.parametrize("code_, advice", [(errno.ENOSPC, "space"), (errno.EFBIG, "space"), (errno.EDQUOT, "space"),
                                           (errno.EACCES, "access"), (errno.EROFS, "access"),
                                           (errno.ENOENT, "missing")])
def test_export_advice_follows_the_errno(db, tmp_path, capsys, monkeypatch, code_, advice):
    path, _ = db

    def failing(target, text):
        raise OSError(code_, os.strerror(code_))

    monkeypatch.setattr("autotuner.files.write_atomically", failing)
    code, _, err = run(capsys, "cache", "export", str(tmp_path / "x.json"), "--db", str(path))
    assert code == 1 and os.strerror(code_) in err and "'-' for stdout" in err, err
    assert [k for k, says in ADVICE.items() if says in err] == [advice], err


# ------------------------------------------------------------------------------ 7. a database that cannot be written
@pytest.fixture
def read_only(monkeypatch):
    """The database reads only as it stands on disk (``immutable=1``) and refuses writes, as one in a folder the
    user cannot write does (the tests may run as root, whom permissions do not stop)."""
    read = TuningDB._open_readonly

    def readonly_open(self):
        conn = read(self)
        self.immutable = True
        return conn

    def writable_open(self):
        raise sqlite3.OperationalError("attempt to write a readonly database")

    monkeypatch.setattr(TuningDB, "_open_readonly", readonly_open)
    monkeypatch.setattr(TuningDB, "_open", writable_open)


def test_writing_a_read_only_database_gives_command_line_advice(db, tmp_path, capsys, read_only):
    path, keys = db
    dump = tmp_path / "dump.json"
    code, _, err = run(capsys, "cache", "export", str(dump), "--db", str(path))
    assert code == 0 and "immutable=1" in err  # reading: the note says what was read
    for argv in (["clear", "--yes"], ["import", str(dump)]):
        code, _, err = run(capsys, "cache", *argv, "--db", str(path))
        assert code == 1 and f"cannot write the tuning database {path}" in err, err
        assert "immutable=1" not in err and "note:" not in err, err  # nothing was read for the user
        assert "set_tuning" not in err and "TILECARVE_CACHE_DIR" not in err, err  # the Python API's advice
        assert "Make it writable" in err and "--db" in err, err


def test_a_database_another_process_holds_is_not_called_read_only(db, capsys, monkeypatch):
    path, _ = db

    def locked(self):
        raise sqlite3.OperationalError("database is locked")

    monkeypatch.setattr(TuningDB, "_open", locked)
    code, _, err = run(capsys, "cache", "clear", "--yes", "--db", str(path))
    assert code == 1 and "database is locked" in err and "Another process is writing it" in err, err
    assert "Make it writable" not in err and "set_tuning" not in err, err


def _permissions_stop_us() -> bool:
    """Whether a file without write permission cannot be written here (not so for root, who may ignore them)."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        probe = Path(d, "probe")
        probe.write_text("")
        probe.chmod(0o444)
        try:
            with open(probe, "a"):
                return False
        except PermissionError:
            return True
        finally:
            probe.chmod(0o644)


@pytest.mark.skipif(os.name != "posix" or not _permissions_stop_us(), reason="permissions do not stop this user")
def test_a_database_in_a_read_only_folder(db, tmp_path, capsys):
    path, keys = db
    os.chmod(path, 0o444)
    os.chmod(path.parent, 0o555)
    try:
        code, _, err = run(capsys, "cache", "clear", "--yes", "--db", str(path))
        assert code == 1 and "note:" not in err and "set_tuning" not in err and "Make it writable" in err, err
        assert _listed(capsys, path) == sorted(keys)
    finally:
        os.chmod(path.parent, 0o755)
        os.chmod(path, 0o644)


# ------------------------------------------------------------------------------ 8. where the database is
@pytest.mark.parametrize("action", ["list", "show", "export", "import", "clear"])
def test_db_help_says_where_the_default_is(capsys, action):
    with pytest.raises(SystemExit):
        main(["cache", action, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for part in ("$TILECARVE_CACHE_DIR", "$XDG_CACHE_HOME/tilecarve/ if that is an absolute path",
                 "~/.cache/tilecarve/"):
        assert part in text, text


def test_the_default_database_follows_xdg_cache_home(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("TILECARVE_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    code, out, _ = run(capsys, "cache", "list")
    assert code == 0 and f"no tuned problems in {tmp_path / 'tilecarve' / 'tuning.sqlite'}" in out

"""The tuning database where it is not simply writable (from a hostile review of persistence, 2026-11-28):
a serving process only reads it and creates none; a tune that cannot open it for writing reads it and
stores nothing, instead of failing; an export is one snapshot while another process writes; a file from
before the later columns reads without being changed; the cache directory and ``db_path`` settings."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import pytest
import torch
from kernels.c_kernels import add, ref_add
from kernels.keyed_kernels import make_keyed

from autotuner import AutoTuner, Status
from autotuner.cache import TuningCacheWarning, TuningDB, cache_dir
from autotuner.settings import RunSettings
from autotuner.trial import Trial


def tuner(configs, db: Path):
    return (AutoTuner.from_kernel(add, configs).set_compile_args(out_idx=[-1], ref_prog=ref_add, target="c")
            .set_tuning(n_jobs=1, isolate=False, progress=False, db_path=str(db)))


def test_a_serving_keyed_kernel_creates_no_database_and_serves_without_an_unusable_one(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for where in (tmp_path / "empty", blocker / "cache"):  # nothing there; a directory that cannot be made
        monkeypatch.setenv("TILECARVE_CACHE_DIR", str(where))
        kk = make_keyed(tune_on_miss=False)
        x, y = torch.randn(8, 64), torch.randn(8, 64)
        kk(x, y)  # served by the fallback, no error
        assert kk.config_for({"M": 8, "N": 64, "dtype": "float32"})[1] == "fallback"
        assert not (where / "tuning.sqlite").exists() and not (where / "tuning.sqlite.lock").exists()


def test_a_serving_keyed_kernel_reads_the_database_without_writing(tmp_path, monkeypatch):
    db = tmp_path / "tuning.sqlite"
    make_keyed(db_path=db).tune({"M": 8, "N": 64, "dtype": "float32"})
    opened = []
    real = TuningDB.__init__

    def spy(self, path=None, *, readonly=False, move_damaged=True):
        opened.append(readonly)
        real(self, path, readonly=readonly, move_damaged=move_damaged)

    monkeypatch.setattr(TuningDB, "__init__", spy)
    kk = make_keyed(db_path=db, tune_on_miss=False)
    assert kk.config_for({"M": 8, "N": 64, "dtype": "float32"})[1] == "database"
    assert opened == [True]


def _unwritable(monkeypatch):
    """Opening the file for writing fails as a read-only file does (root writes through chmod)."""
    def fail(self):
        raise sqlite3.OperationalError("attempt to write a readonly database")

    monkeypatch.setattr(TuningDB, "_open", fail)


def test_a_tune_on_a_database_it_cannot_write_uses_its_winners_and_stores_nothing(tmp_path, monkeypatch):
    db = tmp_path / "tuning.sqlite"
    first = tuner([dict(block_M=16), dict(block_M=32)], db).run(1, 2)
    _unwritable(monkeypatch)
    with pytest.warns(TuningCacheWarning, match="readonly database.*opened read-only"):
        again = tuner([dict(block_M=16), dict(block_M=32)], db).run(1, 2)
    assert again.from_cache and again.config == first.config
    with pytest.warns(TuningCacheWarning, match="opened read-only"):
        new = tuner([dict(block_M=64)], db).run(1, 2)  # not stored: measured, returned
    assert not new.from_cache and new.trials[0].status == Status.OK
    a, b = torch.randn(256, 256), torch.randn(256, 256)
    torch.testing.assert_close(new.kernel(a, b), a + b)
    monkeypatch.undo()
    assert len(TuningDB(db, readonly=True).runs()) == 1


def test_a_tune_that_cannot_create_its_database_still_says_so_before_measuring(tmp_path, monkeypatch):
    _unwritable(monkeypatch)
    with pytest.raises(OSError, match="readonly database"):
        tuner([dict(block_M=16)], tmp_path / "none-yet.sqlite").run(1, 2)


def test_an_export_is_one_snapshot_while_another_process_records_trials(tmp_path, monkeypatch):
    path, key = tmp_path / "tuning.sqlite", "a" * 64
    writer = TuningDB(path)
    writer.open_run(key, "add", "c", 4, {})
    for i in range(2):
        writer.record_trial(key, i, Trial({"block_M": 16 * (i + 1)}, Status.OK, None, 0.1, 1.0, 1.0, 0.0))
    reader = TuningDB(path, readonly=True)
    real = TuningDB._trial_rows

    def interleaved(self, k):  # another process records a trial between the run's row and its trials
        writer.record_trial(key, 2, Trial({"block_M": 64}, Status.OK, None, 0.1, 1.0, 1.0, 0.0))
        return real(self, k)

    monkeypatch.setattr(TuningDB, "_trial_rows", interleaved)
    (run,) = reader.export_runs()  # before: KeyError for the trial missing from the first query
    assert [t["idx"] for t in run["trials"]] == [0, 1]  # as of the snapshot: the run's row saw two trials
    monkeypatch.undo()
    assert [t["idx"] for t in reader.export_runs()[0]["trials"]] == [0, 1, 2]
    reader.close()
    writer.close()


OLDEST = """CREATE TABLE runs (key TEXT PRIMARY KEY, kernel TEXT NOT NULL, target TEXT NOT NULL,
    created REAL NOT NULL, finished REAL, best_config TEXT, best_latency_ms REAL, ref_latency_ms REAL,
    n_configs INTEGER NOT NULL, meta TEXT NOT NULL);
CREATE TABLE trials (key TEXT NOT NULL, idx INTEGER NOT NULL, config TEXT NOT NULL, status TEXT NOT NULL,
    error TEXT, compile_s REAL, median_ms REAL, min_ms REAL, iqr_ms REAL, recorded REAL NOT NULL,
    PRIMARY KEY (key, idx));"""


def test_a_file_from_before_the_later_columns_reads_read_only_unchanged(tmp_path):
    path, key = tmp_path / "old.sqlite", "b" * 64
    with sqlite3.connect(path) as conn:
        conn.executescript(OLDEST)
        conn.execute("INSERT INTO runs VALUES (?, 'k', 'c', 1.0, 2.0, '{\"block_M\": 16}', 0.5, NULL, 1, '{}')",
                     (key,))
        conn.execute("INSERT INTO trials VALUES (?, 0, '{\"block_M\": 16}', 'ok', NULL, 1.0, 0.5, 0.4, 0.1, 1.0)",
                     (key,))
    conn.close()
    before = path.read_bytes()
    db = TuningDB(path, readonly=True)
    (run,) = db.export_runs()
    assert run["best_prim"] is None and run["trials"][0]["device"] is None and run["trials"][0]["recorded"] == 1.0
    stored = db.finished_run(key)
    assert stored.best_prim is None and stored.trials[0].rounds is None
    db.close()
    assert path.read_bytes() == before


def test_a_relative_cache_dir_is_made_absolute_and_said_once(tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TILECARVE_CACHE_DIR", "rel-cache")
    with caplog.at_level(logging.WARNING, logger="autotuner.cache"):
        assert cache_dir() == tmp_path / "rel-cache" and cache_dir().is_absolute()
        cache_dir()
    assert sum("relative path" in r.getMessage() for r in caplog.records) == 1


def test_a_bytes_db_path_is_a_path():
    assert RunSettings(db_path=b"/tmp/x.sqlite").db_path == "/tmp/x.sqlite"
    assert RunSettings(db_path=Path("/tmp/y.sqlite")).db_path == "/tmp/y.sqlite"

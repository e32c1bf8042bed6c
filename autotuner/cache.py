"""The persistent tuning database (stdlib SQLite) and the key that decides a hit.

Where: ``$TILECARVE_CACHE_DIR/tuning.sqlite``, else ``$XDG_CACHE_HOME/tilecarve/``, else
``~/.cache/tilecarve/``. Never the working directory.

What: one ``runs`` row per tuning problem (its key, the best config and latency, whether the run
finished) and one ``trials`` row per candidate (status, error, compile seconds, latency median /
min / IQR). Trials are written as they finish, so an interrupted run keeps what it measured, and running it
again resumes it: only the configs without a trial are compiled and measured.

The key hashes everything that changes the answer (see :func:`tuning_key`). It includes the
values of globals and closure cells the kernel reads, so changing a module-level ``M = 4096`` to
``8192`` misses (TileLang's own key hits: tile-ai/tilelang#1250), and the text of the PrimFunc the
first config elaborates to, which pins the resolved shapes and dtypes.

Concurrency: WAL journal, a busy timeout, and short ``BEGIN IMMEDIATE`` transactions; two
processes tuning at once each see a consistent database.
"""

from __future__ import annotations

import builtins
import hashlib
import inspect
import json
import os
import re
import sqlite3
import time
import types
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

__all__ = ["TuningDB", "cache_dir", "tuning_key"]

_ADDR = re.compile(r" at 0x[0-9a-fA-F]+")
_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    key TEXT PRIMARY KEY,
    kernel TEXT NOT NULL,
    target TEXT NOT NULL,
    created REAL NOT NULL,
    finished REAL,
    best_config TEXT,
    best_latency_ms REAL,
    ref_latency_ms REAL,
    n_configs INTEGER NOT NULL,
    meta TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS trials (
    key TEXT NOT NULL REFERENCES runs(key) ON DELETE CASCADE,
    idx INTEGER NOT NULL,
    config TEXT NOT NULL,
    status TEXT NOT NULL,
    error TEXT,
    compile_s REAL,
    median_ms REAL,
    min_ms REAL,
    iqr_ms REAL,
    recorded REAL NOT NULL,
    PRIMARY KEY (key, idx)
);
"""


def cache_dir() -> Path:
    """The user cache directory for tilecarve (created on first use, never the working directory)."""
    env = os.environ.get("TILECARVE_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tilecarve"


# ---------------------------------------------------------------------------------------------
# the key


def _stable(value: Any, seen: set[int], depth: int) -> Any:
    """A JSON-able, address-free description of ``value`` that changes when its meaning does."""
    if isinstance(value, (bool, int, float, str, type(None))):
        return value
    if depth > 4 or id(value) in seen:
        return f"<{type(value).__qualname__}>"
    seen = seen | {id(value)}
    if isinstance(value, (list, tuple)):
        return [type(value).__name__, [_stable(v, seen, depth + 1) for v in value]]
    if isinstance(value, dict):
        return {str(k): _stable(v, seen, depth + 1) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, types.ModuleType):
        return f"module:{value.__name__}:{getattr(value, '__version__', '')}"
    if isinstance(value, types.FunctionType) or hasattr(value, "func") and callable(value):
        return _function_fingerprint(value, seen, depth + 1)
    if isinstance(value, type):
        return f"class:{value.__module__}.{value.__qualname__}"
    if hasattr(value, "shape") and hasattr(value, "dtype"):  # arrays and tensors: by shape and dtype
        return f"{type(value).__name__}(shape={tuple(value.shape)}, dtype={value.dtype})"
    return _ADDR.sub("", repr(value))[:2000]


def _source(fn: Any) -> str:
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):
        code = getattr(fn, "__code__", None)
        return code.co_code.hex() if code is not None else repr(fn)


def _referenced_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _referenced_names(const)
    return names


def _function_fingerprint(fn: Any, seen: set[int], depth: int) -> dict[str, Any]:
    """Source, bound arguments, closure values and the globals it reads (recursively, bounded)."""
    if hasattr(fn, "func") and not isinstance(fn, types.FunctionType):  # functools.partial
        return {
            "partial": _function_fingerprint(fn.func, seen, depth),
            "args": [_stable(a, seen, depth) for a in fn.args],
            "kwargs": {k: _stable(v, seen, depth) for k, v in sorted(fn.keywords.items())},
        }
    out: dict[str, Any] = {"name": getattr(fn, "__qualname__", repr(fn)), "source": _source(fn)}
    code = getattr(fn, "__code__", None)
    if code is None:
        return out
    cells = fn.__closure__ or ()
    closure = {}
    for name, cell in zip(code.co_freevars, cells):
        try:
            closure[name] = _stable(cell.cell_contents, seen, depth)
        except ValueError:  # empty cell
            closure[name] = "<empty>"
    out["closure"] = closure
    glb = getattr(fn, "__globals__", {})
    out["globals"] = {
        n: _stable(glb[n], seen, depth)
        for n in sorted(_referenced_names(code))
        if n in glb and not (hasattr(builtins, n) and glb[n] is getattr(builtins, n))
    }
    out["defaults"] = _stable(fn.__defaults__, seen, depth)
    out["kwdefaults"] = _stable(fn.__kwdefaults__, seen, depth)
    return out


def _versions() -> dict[str, str | None]:
    import tilelang
    import torch

    from . import __version__

    return {"tilelang": tilelang.__version__, "torch": torch.__version__, "cuda": torch.version.cuda,
            "tilecarve": __version__}


def tuning_key(kernel: Callable[..., Any], configs: Iterable[dict[str, Any]], prim_func_text: str,
               target_key: str, settings: dict[str, Any]) -> str:
    """SHA-256 over everything that changes which config wins and how fast it is."""
    blob = {
        "kernel": _function_fingerprint(kernel, set(), 0),
        "prim_func": hashlib.sha256(prim_func_text.encode()).hexdigest(),
        "configs": [json.dumps(c, sort_keys=True) for c in configs],
        "target": target_key,
        "versions": _versions(),
        "settings": settings,
    }
    return hashlib.sha256(json.dumps(blob, sort_keys=True, default=str).encode()).hexdigest()


# ---------------------------------------------------------------------------------------------
# the database


class TuningDB:
    """A thin, process-safe wrapper over the SQLite file. Open one per tuning run."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = Path(path) if path is not None else cache_dir() / "tuning.sqlite"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._conn = sqlite3.connect(self.path, timeout=60.0, isolation_level=None)
        self._conn.execute("PRAGMA busy_timeout = 60000")
        self._conn.execute("PRAGMA journal_mode = WAL")
        self._conn.execute("PRAGMA foreign_keys = ON")
        with self._tx():
            for stmt in _SCHEMA.split(";"):
                if stmt.strip():
                    self._conn.execute(stmt)

    def _tx(self):
        conn = self._conn

        class _Tx:
            def __enter__(self_inner):
                conn.execute("BEGIN IMMEDIATE")

            def __exit__(self_inner, exc_type, exc, tb):
                conn.execute("COMMIT" if exc_type is None else "ROLLBACK")
                return False

        return _Tx()

    def close(self) -> None:
        self._conn.close()

    def finished_run(self, key: str) -> dict[str, Any] | None:
        """The finished run stored under ``key`` with its trials, or ``None``."""
        row = self._conn.execute(
            "SELECT best_config, best_latency_ms, ref_latency_ms, meta FROM runs WHERE key=? AND finished IS NOT NULL",
            (key,),
        ).fetchone()
        if row is None:
            return None
        trials = self._trial_rows(key)
        return {"best_config": json.loads(row[0]) if row[0] else None, "best_latency_ms": row[1],
                "ref_latency_ms": row[2], "meta": json.loads(row[3]), "trials": trials}

    def open_run(self, key: str, kernel: str, target: str, n_configs: int,
                 meta: dict[str, Any]) -> list[tuple]:
        """Open the run under ``key`` and return the trials already recorded for it.

        An unfinished run (the process was interrupted) is resumed: its trials are returned, so the
        caller measures only what is missing. A finished run that found nothing is started afresh.
        """
        with self._tx():
            row = self._conn.execute("SELECT finished FROM runs WHERE key=?", (key,)).fetchone()
            if row is None:
                self._conn.execute(
                    "INSERT INTO runs (key, kernel, target, created, finished, n_configs, meta) "
                    "VALUES (?, ?, ?, ?, NULL, ?, ?)",
                    (key, kernel, target, time.time(), n_configs, json.dumps(meta)))
            else:
                if row[0] is not None:
                    self._conn.execute("DELETE FROM trials WHERE key=?", (key,))
                self._conn.execute("UPDATE runs SET finished=NULL, created=?, meta=? WHERE key=?",
                                   (time.time(), json.dumps(meta), key))
            return self._trial_rows(key)

    def _trial_rows(self, key: str) -> list[tuple]:
        return self._conn.execute(
            "SELECT idx, config, status, error, compile_s, median_ms, min_ms, iqr_ms FROM trials "
            "WHERE key=? ORDER BY idx", (key,)).fetchall()

    def record_trial(self, key: str, idx: int, config_json: str, status: str, error: str | None,
                     compile_s: float | None, median_ms: float | None, min_ms: float | None,
                     iqr_ms: float | None) -> None:
        with self._tx():
            self._conn.execute(
                "INSERT OR REPLACE INTO trials (key, idx, config, status, error, compile_s, median_ms, min_ms, "
                "iqr_ms, recorded) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (key, idx, config_json, status, error, compile_s, median_ms, min_ms, iqr_ms, time.time()))

    def finish_run(self, key: str, best_config_json: str | None, best_ms: float | None,
                   ref_ms: float | None) -> None:
        with self._tx():
            self._conn.execute(
                "UPDATE runs SET finished=?, best_config=?, best_latency_ms=?, ref_latency_ms=? WHERE key=?",
                (time.time(), best_config_json, best_ms, ref_ms, key))

"""The persistent tuning database (stdlib SQLite) and the key that decides a hit.

Where: ``$TILECARVE_CACHE_DIR/tuning.sqlite``, else ``$XDG_CACHE_HOME/tilecarve/`` (an absolute one: the
XDG spec ignores a relative value), else ``~/.cache/tilecarve/``. Never the working directory.

What: one ``runs`` row per tuning problem (its key, the best config and latency, whether the run
finished) and one ``trials`` row per candidate (status, error, compile seconds, latency median /
min / IQR). Trials are written as they finish, so an interrupted run keeps what it measured, and running it
again resumes it: only the configs without a trial are compiled and measured.

The key hashes everything that changes the answer (see :func:`tuning_key`). It includes the
values of globals and closure cells the kernel reads, so changing a module-level ``M = 4096`` to
``8192`` misses (TileLang's own key hits: tile-ai/tilelang#1250), and the text of the PrimFunc the
first config elaborates to, which pins the resolved shapes and dtypes.

Concurrency: WAL journal, a busy timeout, and short ``BEGIN IMMEDIATE`` transactions; two
processes tuning at once each see a consistent database. A damaged file is moved aside by one process
only, and while no other has it open: the check and the move are made under an exclusive lock on
``<file>.lock`` beside it (kept there), which each open holds shared while it connects and checks.

Reading only (``TuningDB(path, readonly=True)``, what ``tilecarve cache list/show/export`` use) opens the
file read-only (``mode=ro``, or ``immutable=1`` where its ``-wal``/``-shm`` cannot be created) and never
creates, moves or changes anything: a damaged file is a :class:`DamagedDatabaseError` naming it.
"""

from __future__ import annotations

import builtins
import contextlib
import hashlib
import inspect
import json
import logging
import math
import os
import re
import sqlite3
import time
import types
import warnings
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .config import config_to_json
from .errors import TuningCacheError
from .trial import Status, Trial

__all__ = ["EXPORT_FORMAT", "DamagedDatabaseError", "DamagedRow", "ImportReport", "RunInfo", "StoredRun",
           "TuningCacheWarning", "TuningDB", "cache_dir", "check_export", "check_exported_run", "db_file",
           "finished_under", "function_fingerprint", "key_from_parts", "key_parts", "prekey", "prim_hash",
           "tuning_key"]

logger = logging.getLogger(__name__)
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
    meta TEXT NOT NULL,
    best_prim TEXT
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
    rounds INTEGER,
    spread REAL,
    device TEXT,
    PRIMARY KEY (key, idx)
);
"""


_RELATIVE_WARNED: set[str] = set()


def cache_dir() -> Path:
    """The user cache directory for tilecarve (created on first use, never the working directory)."""
    env = os.environ.get("TILECARVE_CACHE_DIR")
    if env:
        path = Path(env).expanduser()
        if not path.is_absolute():  # it would follow the working directory: say which one it is now
            path = path.absolute()
            if env not in _RELATIVE_WARNED:
                _RELATIVE_WARNED.add(env)
                logger.warning("TILECARVE_CACHE_DIR=%r is a relative path, so the tuning database moves with the "
                               "working directory; using %s (set an absolute path to keep one place)", env, path)
        return path
    base = os.environ.get("XDG_CACHE_HOME")
    if base and not os.path.isabs(base):  # the XDG spec: a relative path is invalid and is ignored
        logger.debug("XDG_CACHE_HOME=%r is not an absolute path; ignored (the XDG base directory spec), "
                     "using ~/.cache", base)
        base = None
    return Path(base or os.path.join(os.path.expanduser("~"), ".cache")) / "tilecarve"


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
    if isinstance(value, (types.FunctionType, types.MethodType)) or hasattr(value, "func") and callable(value):
        return function_fingerprint(value, seen, depth + 1)
    if isinstance(value, type):
        return f"class:{value.__module__}.{value.__qualname__}"
    if hasattr(value, "shape") and hasattr(value, "dtype"):  # arrays and tensors: by shape and dtype
        return f"{type(value).__name__}(shape={tuple(value.shape)}, dtype={value.dtype})"
    return _ADDR.sub("", repr(value))[:2000]


#: ``inspect.getsource`` of plain functions, by function, with the stat of the file it was read from: a job
#: of many problems of one template reads the same two dozen functions for each (0.09 s a plan).
_SOURCES: weakref.WeakKeyDictionary[Any, tuple[tuple[int, int], types.CodeType, str]] = weakref.WeakKeyDictionary()


def _file_stamp(fn: types.FunctionType) -> tuple[int, int] | None:
    """``(mtime_ns, size)`` of the file ``fn`` was defined in, as ``linecache`` checks it; ``None`` if none."""
    try:
        st = os.stat(fn.__code__.co_filename)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


def _source(fn: Any) -> str:
    """``inspect.getsource(fn)``, read again only when its file changed (as ``linecache`` does)."""
    plain = isinstance(fn, types.FunctionType) and not hasattr(fn, "__wrapped__")
    stamp = _file_stamp(fn) if plain else None
    if stamp is not None:
        hit = _SOURCES.get(fn)
        if hit is not None and hit[0] == stamp and hit[1] is fn.__code__:
            return hit[2]
    try:
        text = inspect.getsource(fn)
    except (OSError, TypeError):
        code = getattr(fn, "__code__", None)
        return code.co_code.hex() if code is not None else repr(fn)
    if stamp is not None:
        _SOURCES[fn] = (stamp, fn.__code__, text)
    return text


def _referenced_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _referenced_names(const)
    return names


def function_fingerprint(fn: Any, seen: set[int], depth: int) -> dict[str, Any]:
    """Source, bound arguments, closure values and the globals it reads (recursively, bounded)."""
    if hasattr(fn, "func") and not isinstance(fn, types.FunctionType):  # functools.partial
        return {
            "partial": function_fingerprint(fn.func, seen, depth),
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


#: What a stored winner's PrimFunc hash is taken of. 2: the PrimFunc as elaborated, before TileLang's
#: lowering renames variables in place (1, before 2026-11-23: after, on a cache miss; those rows were
#: distrusted with a warning that blamed the factory, so they are keyed apart and tune again, silently).
PRIM_HASH_FORM = "2"


def _versions() -> dict[str, str | None]:
    import tilelang
    import torch

    from . import __version__

    return {"tilelang": tilelang.__version__, "torch": torch.__version__, "cuda": torch.version.cuda,
            "tilecarve": __version__, "prim_hash": PRIM_HASH_FORM}


def key_parts(kernel: Callable[..., Any], configs: Iterable[dict[str, Any]],
              settings: dict[str, Any]) -> dict[str, Any]:
    """The parts of :func:`tuning_key` that need neither TVM nor TileLang (the kernel, its configs, the
    settings): with the target as given, they name a problem before TileLang is imported (``prekey``)."""
    return {"kernel": function_fingerprint(kernel, set(), 0),
            "configs": [json.dumps(c, sort_keys=True) for c in configs], "settings": settings}


def _sha(blob: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(blob, sort_keys=True, default=str).encode()).hexdigest()


def tuning_key(kernel: Callable[..., Any], configs: Iterable[dict[str, Any]], target_key: str,
               settings: dict[str, Any]) -> str:
    """SHA-256 over everything that changes which config wins and how fast it is, as far as it can be
    known without running the user's kernel factory (which runs only in bounded places).

    What the factory elaborates to is pinned per winner instead: the run stores the hash of the
    winner's PrimFunc (:func:`prim_hash`), and a warm hit is served only when the winner, elaborated
    again, hashes the same (code the kernel reaches through a module attribute may have changed).
    """
    return key_from_parts(key_parts(kernel, configs, settings), target_key)


def key_from_parts(parts: dict[str, Any], target_key: str) -> str:
    """:func:`tuning_key` from its :func:`key_parts` and the target's key."""
    return _sha({**parts, "target": target_key, "versions": _versions()})


def prekey(parts: dict[str, Any], target: str, devices: list[str]) -> str:
    """A problem's name before TileLang is imported: :func:`key_parts`, the target as given (its spec)
    and the devices' models. Stored with each run (``meta``) so that :func:`finished_under` can tell,
    early, whether a plan is likely served from the database."""
    return _sha({**parts, "target_spec": target, "devices": devices})


def db_file(path: Path | str | None) -> Path:
    """The tuning database file for ``path`` (``None``: the default one in :func:`cache_dir`)."""
    return Path(path) if path is not None else cache_dir() / "tuning.sqlite"


def finished_under(path: Path | str | None, pre: str) -> bool:
    """Whether the database holds a finished run whose problem had :func:`prekey` ``pre`` (read only; a
    file that is missing or cannot be read holds none). A hint, not a hit: the key decides."""
    f = db_file(path)
    if not f.is_file():
        return False
    try:
        with contextlib.closing(sqlite3.connect(f"{f.resolve().as_uri()}?mode=ro", uri=True, timeout=1.0)) as conn:
            return conn.execute("SELECT 1 FROM runs WHERE finished IS NOT NULL AND best_config IS NOT NULL AND "
                                "json_extract(meta, '$.prekey') = ? LIMIT 1", (pre,)).fetchone() is not None
    except sqlite3.Error:
        return False


def prim_hash(func: Any) -> str:
    """SHA-256 of a PrimFunc's TVMScript with its metadata: what a config actually elaborates to (shapes,
    dtypes, body, and what the body refers to there, such as device code put in with ``T.import_source``,
    which the plain script names only as ``metadata["ffi.String"][0]``). A PrimFunc without metadata prints
    the same either way, so its hash is what it was before metadata counted."""
    return hashlib.sha256(func.script(show_meta=True).encode()).hexdigest()


# ---------------------------------------------------------------------------------------------
# the database


class TuningCacheWarning(RuntimeWarning):
    """The tuning database had something it could not trust: a damaged file, set aside, or a bad row."""


class DamagedRow(ValueError):
    """A stored row that cannot be what tilecarve wrote: it is ignored and the problem re-tuned."""


@dataclass(frozen=True)
class StoredRun:
    """A finished run as stored: its winner and every trial, by config index."""

    best_config: dict[str, Any] | None
    best_latency_ms: float | None
    ref_latency_ms: float | None
    best_prim: str | None
    trials: dict[int, Trial]


def _trial_from_row(row: tuple) -> tuple[int, Trial]:
    """``(idx, Trial)`` from a trials row, or :class:`DamagedRow` saying what is wrong with it."""
    idx, config, status, error, compile_s, median_ms, min_ms, iqr_ms, rounds, spread, device = row
    if not isinstance(idx, int) or idx < 0:
        raise DamagedRow(f"trial index {idx!r}")
    try:
        cfg = json.loads(config)
        status = Status(status)
    except (TypeError, ValueError) as e:
        raise DamagedRow(f"trial {idx}: {e}") from None
    if not isinstance(cfg, dict):
        raise DamagedRow(f"trial {idx}: config {config!r} is not a dict")
    for name, v in (("compile_s", compile_s), ("median_ms", median_ms), ("min_ms", min_ms), ("iqr_ms", iqr_ms),
                    ("spread", spread)):
        if v is not None and (not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0):
            raise DamagedRow(f"trial {idx}: {name}={v!r}")
    if status is Status.OK and (median_ms is None or median_ms <= 0):
        raise DamagedRow(f"trial {idx}: status ok without a positive latency ({median_ms!r})")
    if error is not None and not isinstance(error, str):
        raise DamagedRow(f"trial {idx}: error {error!r}")
    if device is not None and not isinstance(device, str):
        raise DamagedRow(f"trial {idx}: device {device!r}")
    return idx, Trial(cfg, status, error, compile_s, median_ms, min_ms, iqr_ms,
                      rounds if isinstance(rounds, int) else None, spread, device)


def _run_numbers(best: Any, best_ms: Any, ref_ms: Any) -> dict[str, Any] | None:
    """The stored winner's config (parsed), checked with its latencies; :class:`DamagedRow` if not sound."""
    try:
        best_config = json.loads(best) if best is not None else None
    except (TypeError, ValueError) as e:
        raise DamagedRow(f"best_config {best!r}: {e}") from None
    if best_config is not None and not isinstance(best_config, dict):
        raise DamagedRow(f"best_config {best!r} is not a dict")
    for name, v in (("best_latency_ms", best_ms), ("ref_latency_ms", ref_ms)):
        if v is not None and (not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0):
            raise DamagedRow(f"{name}={v!r}")
    return best_config


#: What ``tilecarve cache export`` writes and ``import`` reads: ``{"format": EXPORT_FORMAT, "runs": [...]}``.
EXPORT_FORMAT = "tilecarve-tuning-cache/1"
#: Columns added to the schema after its first form: a writable open adds them to an older file, a read-only
#: one reads them as NULL (:meth:`TuningDB._select`).
_LATER_COLUMNS = (("runs", "best_prim", "TEXT"), ("trials", "rounds", "INTEGER"), ("trials", "spread", "REAL"),
                  ("trials", "device", "TEXT"))

_RUN_COLUMNS = ("key", "kernel", "target", "created", "finished", "best_config", "best_latency_ms", "ref_latency_ms",
                "n_configs", "meta", "best_prim")
# and "device", optional (files exported before it lack it)
_TRIAL_COLUMNS = ("idx", "config", "status", "error", "compile_s", "median_ms", "min_ms", "iqr_ms", "recorded",
                  "rounds", "spread")
_KEY = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class RunInfo:
    """One stored run, for listing: its key, what was tuned where, the winner and how many trials."""

    key: str
    kernel: str
    target: str
    created: float
    finished: float | None
    best_config: dict[str, Any] | None
    best_latency_ms: float | None
    n_configs: int
    n_trials: int


@dataclass
class ImportReport:
    """What :meth:`TuningDB.import_runs` did with each run of the file (keys, and why one was skipped)."""

    added: list[str]
    replaced: list[str]
    skipped: list[tuple[str, str]]


def _when(run: Mapping[str, Any]) -> tuple[bool, float]:
    """How recent a run is: a finished one beats an unfinished one, then the later time wins."""
    return run["finished"] is not None, float(run["finished"] if run["finished"] is not None else run["created"])


#: SQLite's integers are signed 64-bit: a larger one does not fit a column (``OverflowError`` on insert).
_INT_MAX = 2**63 - 1


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:40]}...({len(text)} characters)"


def _number(value: Any, *, positive: bool = False, optional: bool = True, integer: bool = False) -> bool:
    """Whether ``value`` is a number SQLite stores as given: not a bool, finite, in 64-bit range, >= 0 (> 0
    if ``positive``); ``None`` if ``optional``; an ``int`` if ``integer``."""
    if value is None:
        return optional
    if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)):
        return False
    if isinstance(value, int):
        if value > _INT_MAX:
            return False
    elif not math.isfinite(value):
        return False
    return value > 0 if positive else value >= 0


def check_exported_run(run: Any, where: str | None = None) -> dict[str, Any]:
    """An exported run checked as strictly as rows read from the database, and every field for its type and
    range, so that nothing of it fails (or is dropped) when written (:class:`DamagedRow` names the run, the
    trial and the field); returned with its trials as :class:`Trial`s keyed by index under ``"trials"``.
    ``where`` names the run in messages (``"run 3"``: its place in the file)."""
    where = where or "run"
    if not isinstance(run, Mapping):
        raise DamagedRow(f"{where}: must be an object, got {type(run).__name__}")
    missing = [c for c in (*_RUN_COLUMNS, "trials") if c not in run]
    if missing:
        raise DamagedRow(f"{where} (key {_shown(run.get('key', '?'))}) lacks the fields {missing}")
    key = run["key"]
    if not isinstance(key, str) or not _KEY.match(key):
        raise DamagedRow(f"{where}: key={_shown(key)} is not a SHA-256 hex digest (64 characters 0-9, a-f)")
    where = f"{where} (key {key[:12]})"

    def bad(field: str, value: Any, expected: str, at: str = where) -> DamagedRow:
        return DamagedRow(f"{at}: {field}={_shown(value)}, expected {expected}")

    for name in ("kernel", "target"):
        if not isinstance(run[name], str):
            raise bad(name, run[name], "a string")
    if not _number(run["created"], optional=False):
        raise bad("created", run["created"], "a time in seconds (a number >= 0)")
    if not _number(run["finished"]):
        raise bad("finished", run["finished"], "null or a time in seconds (a number >= 0)")
    n = run["n_configs"]
    if not _number(n, optional=False, integer=True):
        raise bad("n_configs", n, f"an integer from 0 to {_INT_MAX}")
    if not isinstance(run["meta"], dict):
        raise bad("meta", run["meta"], "an object")
    if run["best_prim"] is not None and not isinstance(run["best_prim"], str):
        raise bad("best_prim", run["best_prim"], "null or a string")
    best = run["best_config"]
    if best is not None and not isinstance(best, dict):
        raise bad("best_config", best, "null or an object")
    for name in ("best_latency_ms", "ref_latency_ms"):
        if not _number(run[name], positive=True):
            raise bad(name, run[name], "null or a number > 0")
    try:
        _run_numbers(None if best is None else json.dumps(best), run["best_latency_ms"], run["ref_latency_ms"])
    except DamagedRow as e:
        raise DamagedRow(f"{where}: {e}") from None
    if not isinstance(run["trials"], list):
        raise bad("trials", run["trials"], "a list")
    trials: dict[int, tuple[Trial, float]] = {}
    for j, t in enumerate(run["trials"]):
        at = f"{where}, trial {j}"
        if not isinstance(t, Mapping):
            raise DamagedRow(f"{at}: must be an object, got {type(t).__name__}")
        lacks = [c for c in _TRIAL_COLUMNS if c not in t]
        if lacks:
            raise DamagedRow(f"{at} lacks the fields {lacks}")
        idx = t["idx"]
        if not _number(idx, optional=False, integer=True) or idx >= n:
            raise bad("idx", idx, f"an integer from 0 to n_configs-1 = {n - 1}", at)
        if idx in trials:
            raise DamagedRow(f"{at}: idx={idx} is repeated (each config index has one trial)")
        at = f"{where}, trial {j} (idx {idx})"
        if not isinstance(t["config"], dict):
            raise bad("config", t["config"], "an object", at)
        try:
            if not isinstance(t["status"], str):
                raise ValueError(f"{_shown(t['status'])} is not a string")
            Status(t["status"])
        except ValueError as e:
            raise DamagedRow(f"{at}: status: {e}; expected one of {[s.value for s in Status]}") from None
        for name in ("error", "device"):
            if t.get(name) is not None and not isinstance(t[name], str):
                raise bad(name, t[name], "null or a string", at)
        for name in ("compile_s", "median_ms", "min_ms", "iqr_ms", "spread"):
            if not _number(t[name]):
                raise bad(name, t[name], "null or a number >= 0", at)
        if not _number(t["rounds"], integer=True):
            raise bad("rounds", t["rounds"], f"null or an integer from 0 to {_INT_MAX}", at)
        if not _number(t["recorded"], optional=False):
            raise bad("recorded", t["recorded"], "a time in seconds (a number >= 0)", at)
        try:
            _, trial = _trial_from_row((*(json.dumps(t[c]) if c == "config" else t[c]
                                          for c in _TRIAL_COLUMNS if c != "recorded"), t.get("device")))
        except DamagedRow as e:
            raise DamagedRow(f"{at}: {e}") from None
        trials[idx] = (trial, float(t["recorded"]))
    return {**run, "trials": trials}


def check_export(doc: Any) -> list[dict[str, Any]]:
    """The runs of an exported document (what ``tilecarve cache export`` writes), each checked by
    :func:`check_exported_run`, before anything is created or written; :class:`DamagedRow` says what is wrong
    (the caller names the file)."""
    if not isinstance(doc, dict):
        raise DamagedRow(f"the file holds a JSON {type(doc).__name__}, expected an object "
                         f'{{"format": "{EXPORT_FORMAT}", "runs": [...]}}')
    if doc.get("format") != EXPORT_FORMAT:
        raise DamagedRow(f"format={_shown(doc.get('format'))}, expected {EXPORT_FORMAT!r}: it is not a tilecarve "
                         "cache export")
    if not isinstance(doc.get("runs"), list):
        raise DamagedRow(f"runs={_shown(doc.get('runs'))}, expected a list of runs")
    return _check_runs(doc["runs"])


def _check_runs(runs: Iterable[Any]) -> list[dict[str, Any]]:
    """Every run checked (:func:`check_exported_run`, named by its place), and no key twice."""
    checked = [check_exported_run(r, f"run {i}") for i, r in enumerate(runs)]
    first: dict[str, int] = {}
    for i, run in enumerate(checked):
        if run["key"] in first:
            raise DamagedRow(f"run {i} (key {run['key'][:12]}): the same key as run {first[run['key']]}; an export "
                             "holds each run once")
        first[run["key"]] = i
    return checked


_CACHE_FIX = "set TILECARVE_CACHE_DIR to a writable directory, or tune without the database: .set_tuning(cache=False)"


def _wal(conn: sqlite3.Connection, deadline: float) -> None:
    """Put the database in WAL mode. Two processes opening a new file at once can both ask, and SQLite then
    answers one "database is locked" at once rather than wait (its busy handler is not called where
    waiting could deadlock; seen in CI, 2026-11-22): ask again until ``deadline``, as the busy timeout
    would have waited."""
    delay = 0.01
    while True:
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() >= deadline:
                raise
        time.sleep(delay)
        delay = min(delay * 2, 0.5)


class DamagedDatabaseError(TuningCacheError):
    """The tuning database file is damaged (or is not an SQLite file) and was left as it was: raised where
    it is only read, or opened with ``move_damaged=False`` (``tilecarve cache``). ``reason`` is SQLite's word,
    ``not_sqlite`` whether the file is no SQLite database at all."""

    def __init__(self, path: Path, reason: str, not_sqlite: bool) -> None:
        self.path, self.reason, self.not_sqlite = path, reason, not_sqlite
        super().__init__(f"the tuning database {path} is damaged ({reason}); it was left as it was. Keep a copy, "
                         f"then recover what it holds with `sqlite3 {path} .recover | sqlite3 NEW.sqlite`, or move "
                         "it away (a tuning run moves it aside itself and starts a new one)")


def _says(check: tuple | None) -> str:
    """What ``PRAGMA quick_check`` said, on one line."""
    text = " ".join(str(check[0] if check else check).split())
    return text if len(text) <= 200 else text[:200] + "..."


def _cannot_write(e: sqlite3.Error) -> bool:
    """Whether ``e`` says a read-only open failed only because nothing could be written beside the file
    (its ``-shm``/``-wal``: a directory or files without write permission)."""
    return getattr(e, "sqlite_errorname", "").startswith(("SQLITE_READONLY", "SQLITE_CANTOPEN")) or any(
        m in str(e) for m in ("readonly database", "unable to open database file"))


@contextlib.contextmanager
def _locked(lock: Path, shared: bool = False):
    """A lock on the file ``lock`` (created if need be and never removed: removing it would let two processes
    lock two files), exclusive or ``shared``. Without ``fcntl``, or where the file cannot be made (a read-only
    directory, where nothing can be moved either), no lock."""
    try:
        import fcntl

        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
    except (ImportError, OSError):
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


class TuningDB:
    """A thin, process-safe wrapper over the SQLite file. Open one per tuning run.

    A file that is not a database or is damaged is moved aside (kept, next to it, with a
    ``.damaged-<time>`` suffix) and a new one started, with a :class:`TuningCacheWarning`; a
    directory or file that cannot be written is a :class:`TuningCacheError` naming it and the fix.
    With ``move_damaged=False`` a damaged file is a :class:`DamagedDatabaseError` instead, and nothing moves.

    ``readonly=True`` reads an existing file without creating, moving or writing anything (not even its
    tables): ``keys``, ``tables``, ``runs``, ``trials``, ``finished_run`` and ``export_runs`` work, writes
    fail. ``self.immutable`` says the file could only be opened as unchanging (``immutable=1``: its
    ``-wal``/``-shm`` could not be created), so changes another process makes meanwhile are not seen.
    """

    def __init__(self, path: Path | None = None, *, readonly: bool = False, move_damaged: bool = True) -> None:
        self.path = db_file(path)
        self.readonly, self.immutable = readonly, False
        self._opened: dict[str, tuple[str, str, int, str]] = {}  # runs opened here: what re-opens one deleted
        self._absent: set[tuple[str, str]] = set()  # later columns an older file opened read-only lacks
        if readonly:
            self._conn = self._open_readonly()
            tables = self.tables()
            self._absent = {(t, c) for t, c, _ in _LATER_COLUMNS if t in tables
                            and c not in {r[1] for r in self._conn.execute(f"PRAGMA table_info({t})")}}
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise TuningCacheError(f"cannot create the tuning cache directory {self.path.parent}: "
                                   f"{e.strerror or e}; {_CACHE_FIX}") from e
        try:
            with _locked(self._lock, shared=True):  # never while another process moves a damaged file aside
                self._conn = self._open()
        except sqlite3.OperationalError as e:
            if not self._damaged(e):
                raise TuningCacheError(f"cannot open or write the tuning database {self.path}: {e}; "
                                       f"{_CACHE_FIX}") from e
            self._conn = self._replace(e, move_damaged)
        except sqlite3.DatabaseError as e:  # "file is not a database", "database disk image is malformed"
            self._conn = self._replace(e, move_damaged)

    @property
    def _lock(self) -> Path:
        """Held shared while a connection is opened and checked, exclusive while a damaged file is moved aside."""
        return self.path.with_name(self.path.name + ".lock")

    @staticmethod
    def _damaged(e: sqlite3.Error) -> bool:
        return getattr(e, "sqlite_errorname", "") in ("SQLITE_CORRUPT", "SQLITE_NOTADB") or any(
            m in str(e) for m in ("malformed", "not a database"))

    def _damage(self, e: sqlite3.Error) -> DamagedDatabaseError:
        notadb = getattr(e, "sqlite_errorname", "") == "SQLITE_NOTADB" or "not a database" in str(e)
        return DamagedDatabaseError(self.path, str(e), notadb)

    def _open_readonly(self) -> sqlite3.Connection:
        """The file opened read-only and checked (``quick_check``); nothing is created or changed."""
        if not self.path.is_file():
            raise TuningCacheError(f"there is no tuning database file {self.path}")
        uri = self.path.resolve().as_uri()
        for query in ("mode=ro", "immutable=1"):
            conn = sqlite3.connect(f"{uri}?{query}", uri=True, timeout=60.0, isolation_level=None)
            try:
                conn.execute("PRAGMA busy_timeout = 60000")
                check = conn.execute("PRAGMA quick_check").fetchone()
                if check is None or check[0] != "ok":
                    raise sqlite3.DatabaseError(f"database disk image is malformed (quick_check: {_says(check)})")
                self.immutable = query == "immutable=1"
                return conn
            except sqlite3.Error as e:
                conn.close()
                if self._damaged(e):
                    raise self._damage(e) from e
                if query == "mode=ro" and _cannot_write(e):
                    continue  # a WAL file whose -shm cannot be made here: read the file as it stands
                raise TuningCacheError(f"cannot read the tuning database {self.path}: {e}") from e
        raise AssertionError("unreachable")

    def tables(self) -> set[str]:
        """The names of the file's tables (``runs`` and ``trials`` in a tuning database; none in a new one)."""
        return {r[0] for r in self._conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}

    def _open(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=60.0, isolation_level=None)
        try:
            conn.execute("PRAGMA busy_timeout = 60000")
            check = conn.execute("PRAGMA quick_check").fetchone()
            if check is None or check[0] != "ok":
                raise sqlite3.DatabaseError(f"database disk image is malformed (quick_check: {_says(check)})")
            _wal(conn, time.monotonic() + 60.0)
            conn.execute("PRAGMA foreign_keys = ON")
            conn.execute("BEGIN IMMEDIATE")
            for stmt in _SCHEMA.split(";"):
                if stmt.strip():
                    conn.execute(stmt)
            for table, column, decl in _LATER_COLUMNS:  # files from before these columns
                have = {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}
                if column not in have:
                    conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {decl}")
            conn.execute("COMMIT")
        except BaseException:
            conn.close()
            raise
        return conn

    def _replace(self, err: sqlite3.Error, move: bool = True) -> sqlite3.Connection:
        """Move a damaged file aside (never delete it: it may be all someone has) and start anew; with
        ``move`` False, a :class:`DamagedDatabaseError` instead.

        Two processes can find the same damaged file at once: the check and the move are made again under an
        exclusive lock on ``<file>.lock``, so the second finds the new database the first started, and uses
        it, rather than moving it (and its ``-wal``) aside too. Every open holds that lock shared while it
        connects and checks the file, so none has the damaged file open while it moves (closing, SQLite would
        remove the ``-wal`` beside it by name: by then the new database's)."""
        if not move:
            raise self._damage(err) from err
        with _locked(self._lock):
            try:
                return self._open()  # set aside and started anew by another process since we looked?
            except sqlite3.DatabaseError as e:
                if not self._damaged(e):
                    raise TuningCacheError(f"cannot open or write the tuning database {self.path}: {e}; "
                                           f"{_CACHE_FIX}") from e
                err = e
            aside = self.path.with_name(f"{self.path.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
            try:
                for suffix in ("", "-wal", "-shm"):
                    src = Path(str(self.path) + suffix)
                    if src.exists():
                        os.replace(src, Path(str(aside) + suffix))
            except OSError as e:
                raise TuningCacheError(f"the tuning database {self.path} is damaged ({err}) and cannot be moved "
                                       f"aside: {e.strerror or e}; move it away yourself, or {_CACHE_FIX}") from e
            warnings.warn(f"the tuning database {self.path} is damaged ({err}); it was moved to {aside} and a new "
                          "one started, so earlier tuning results will be measured again", TuningCacheWarning,
                          stacklevel=4)
            try:
                return self._open()
            except sqlite3.Error as e:
                raise TuningCacheError(f"cannot create a new tuning database {self.path}: {e}; {_CACHE_FIX}") from e

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

    def _select(self, table: str, columns: Iterable[str]) -> str:
        """``columns`` of ``table`` for a SELECT, a later column an older file lacks read as NULL (a file opened
        read-only is not brought up to date)."""
        return ", ".join(f"NULL AS {c}" if (table, c) in self._absent else c for c in columns)

    @contextlib.contextmanager
    def _snapshot(self):
        """One read transaction: what is read inside it is one state of the file, whatever another process
        writes meanwhile (a run's row and its trials, as one run)."""
        if self._conn.in_transaction:  # already one (a caller's): it is the snapshot
            yield
            return
        self._conn.execute("BEGIN")
        try:
            yield
        finally:
            self._conn.execute("COMMIT")

    def finished_run(self, key: str) -> StoredRun | None:
        """The finished run stored under ``key``, or ``None``; :class:`DamagedRow` if a row is not sound."""
        with self._snapshot():
            row = self._conn.execute(
                f"SELECT {self._select('runs', ('best_config', 'best_latency_ms', 'ref_latency_ms', 'best_prim'))} "
                "FROM runs WHERE key=? AND finished IS NOT NULL", (key,)).fetchone()
            if row is None:
                return None
            best, best_ms, ref_ms, best_prim = row
            best_config = _run_numbers(best, best_ms, ref_ms)
            return StoredRun(best_config, best_ms, ref_ms, best_prim, self.trials(key))

    def trials(self, key: str) -> dict[int, Trial]:
        """The trials recorded under ``key``; :class:`DamagedRow` if one is not sound."""
        return dict(_trial_from_row(r[:-1]) for r in self._trial_rows(key))

    def _trial_rows(self, key: str) -> list[tuple]:
        """The trial rows of ``key``, as :func:`_trial_from_row` reads them, each with its ``recorded`` last."""
        cols = ("idx", "config", "status", "error", "compile_s", "median_ms", "min_ms", "iqr_ms", "rounds", "spread",
                "device", "recorded")
        return self._conn.execute(f"SELECT {self._select('trials', cols)} FROM trials WHERE key=? ORDER BY idx",
                                  (key,)).fetchall()

    def open_run(self, key: str, kernel: str, target: str, n_configs: int, meta: dict[str, Any]) -> None:
        """Open the run under ``key``. An unfinished one (the process was interrupted) keeps its trials,
        so the caller measures only what is missing; a finished one is started afresh."""
        self._opened[key] = (kernel, target, n_configs, json.dumps(meta))
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
                self._conn.execute("UPDATE runs SET finished=NULL, best_config=NULL, best_prim=NULL, created=?, "
                                   "meta=? WHERE key=?", (time.time(), json.dumps(meta), key))

    def forget_trials(self, key: str, indices: Iterable[int]) -> None:
        """Drop trials that cannot be trusted, so that they are measured again."""
        with self._tx():
            self._conn.executemany("DELETE FROM trials WHERE key=? AND idx=?", [(key, i) for i in indices])

    def discard_run(self, key: str) -> None:
        """Remove a run and its trials (the problem itself was wrong: nothing of it is worth keeping)."""
        self.delete([key])

    def record_trial(self, key: str, idx: int, trial: Trial) -> None:
        """Record a trial of the run opened under ``key``. A run deleted while it runs (``tilecarve cache
        clear`` in another process) is opened again first, so that the trials from then on are kept."""
        with self._tx():
            if key in self._opened:
                kernel, target, n_configs, meta = self._opened[key]
                self._conn.execute("INSERT OR IGNORE INTO runs (key, kernel, target, created, finished, n_configs, "
                                   "meta) VALUES (?, ?, ?, ?, NULL, ?, ?)",
                                   (key, kernel, target, time.time(), n_configs, meta))
            self._insert_trial(key, idx, trial, time.time())

    def _insert_trial(self, key: str, idx: int, trial: Trial, recorded: float) -> None:
        self._conn.execute(
            "INSERT OR REPLACE INTO trials (key, idx, config, status, error, compile_s, median_ms, min_ms, "
            "iqr_ms, recorded, rounds, spread, device) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (key, idx, config_to_json(trial.config), str(trial.status), trial.error, trial.compile_s,
             trial.median_ms, trial.min_ms, trial.iqr_ms, recorded, trial.rounds, trial.spread, trial.device))

    def finish_run(self, key: str, best: Trial | None, ref_ms: float | None, best_prim: str | None = None) -> None:
        with self._tx():
            self._conn.execute(
                "UPDATE runs SET finished=?, best_config=?, best_latency_ms=?, ref_latency_ms=?, best_prim=? "
                "WHERE key=?",
                (time.time(), config_to_json(best.config) if best else None, best.median_ms if best else None,
                 ref_ms, best_prim, key))

    # ------------------------------------------------------------------ for `tilecarve cache`
    def keys(self, prefix: str = "") -> list[str]:
        """Stored run keys starting with ``prefix`` (hex digits), sorted."""
        if not re.fullmatch(r"[0-9a-f]*", prefix):
            raise ValueError(f"a key prefix is hex digits (0-9, a-f), got {prefix!r}")
        return [r[0] for r in self._conn.execute("SELECT key FROM runs WHERE key LIKE ? ORDER BY key", (prefix + "%",))]

    def runs(self) -> list[RunInfo]:
        """Every stored run, newest first, with its number of recorded trials (rows are shown as stored)."""
        rows = self._conn.execute(
            "SELECT r.key, r.kernel, r.target, r.created, r.finished, r.best_config, r.best_latency_ms, r.n_configs, "
            "(SELECT COUNT(*) FROM trials t WHERE t.key = r.key) FROM runs r "
            "ORDER BY COALESCE(r.finished, r.created) DESC").fetchall()
        out = []
        for key, kernel, target, created, finished, best, best_ms, n_configs, n_trials in rows:
            try:
                best_config = _run_numbers(best, best_ms, None)
            except DamagedRow:
                best_config, best_ms = None, None
            out.append(RunInfo(key, kernel, target, created, finished, best_config, best_ms, n_configs, n_trials))
        return out

    def export_runs(self, keys: Iterable[str] | None = None) -> list[dict[str, Any]]:
        """The runs under ``keys`` (all when None) with their trials, as JSON-able dicts; a run that is
        not sound (:class:`DamagedRow`) is an error, not a silent omission."""
        with self._snapshot():  # a run and its trials as of one moment, while a tuning run may be writing
            return self._export(self.keys() if keys is None else list(keys))

    def _export(self, wanted: list[str]) -> list[dict[str, Any]]:
        out = []
        for key in wanted:
            row = self._conn.execute(f"SELECT {self._select('runs', _RUN_COLUMNS)} FROM runs WHERE key=?",
                                     (key,)).fetchone()
            if row is None:
                raise KeyError(key)
            run = dict(zip(_RUN_COLUMNS, row))
            run["best_config"] = _run_numbers(run["best_config"], run["best_latency_ms"], run["ref_latency_ms"])
            try:
                run["meta"] = json.loads(run["meta"])
            except (TypeError, ValueError) as e:
                raise DamagedRow(f"run {key[:12]}: meta {run['meta']!r}: {e}") from None
            trials = []
            for r in self._trial_rows(key):  # each trial with its own row's recorded time: one query, no gap
                i, t = _trial_from_row(r[:-1])
                trials.append({"idx": i, "config": t.config, "status": str(t.status), "error": t.error,
                               "compile_s": t.compile_s, "median_ms": t.median_ms, "min_ms": t.min_ms,
                               "iqr_ms": t.iqr_ms, "recorded": r[-1], "rounds": t.rounds, "spread": t.spread,
                               "device": t.device})
            run["trials"] = trials
            out.append(run)
        return out

    def import_runs(self, runs: Iterable[Any]) -> ImportReport:
        """Add exported runs. Every run is checked (:func:`check_exported_run`) before anything is written, so
        a bad file changes nothing. A run whose key is stored already replaces it only if it is newer (a
        finished run beats an unfinished one, then the later time); otherwise it is skipped and reported."""
        checked = _check_runs(runs)
        report = ImportReport([], [], [])
        with self._tx():
            for run in checked:
                key = run["key"]
                have = self._conn.execute("SELECT finished, created FROM runs WHERE key=?", (key,)).fetchone()
                if have is not None:
                    mine = _when({"finished": have[0], "created": have[1]})
                    if mine >= _when(run):
                        report.skipped.append((key, "the database holds the same run or a newer one"))
                        continue
                    self._delete_one(key)
                best = run["best_config"]
                values = {**run, "best_config": None if best is None else config_to_json(best),
                          "meta": json.dumps(run["meta"])}
                self._conn.execute(f"INSERT INTO runs ({', '.join(_RUN_COLUMNS)}) VALUES "
                                   f"({', '.join('?' * len(_RUN_COLUMNS))})", [values[c] for c in _RUN_COLUMNS])
                for idx, (trial, recorded) in run["trials"].items():
                    self._insert_trial(key, idx, trial, recorded)
                (report.replaced if have is not None else report.added).append(key)
        return report

    def delete(self, keys: Iterable[str] | None = None) -> int:
        """Remove the runs under ``keys`` (every run when None) with their trials; how many runs went."""
        wanted = self.keys() if keys is None else list(keys)
        with self._tx():
            return sum(self._delete_one(key) for key in wanted)

    def _delete_one(self, key: str) -> int:
        self._conn.execute("DELETE FROM trials WHERE key=?", (key,))
        return self._conn.execute("DELETE FROM runs WHERE key=?", (key,)).rowcount

"""``tilecarve cache list | show | export | import | clear``: the tuning database (``autotuner/cache.py``).

Every read goes through :class:`autotuner.cache.TuningDB`, so rows are checked as a tuning run checks
them; an import is checked the same way (every field, :func:`autotuner.cache.check_export`) before the
database is opened or created, and never replaces a run with an older one. Nothing is created by reading:
``list`` on a machine that never tuned says so, and ``list``/``show``/``export`` open the file read-only.
No command moves or changes a damaged database (a tuning run would move it aside): it is an error naming
the file. A damaged row names the file and the run; ``export`` of every run skips such a run, writes the others
and exits 1 naming what it skipped. ``export`` writes its file whole or not at all (a temporary file beside it,
then a rename), never over the database or a file beside it that the database needs (its ``-wal``, ``-shm``
and ``.lock``), whatever ``--force`` says.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import re
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

from .errors import CommandError, UsageError

__all__ = ["add_parser"]


def key_prefix(value: str) -> str:
    value = value.strip().lower()
    if not re.fullmatch(r"[0-9a-f]{1,64}", value):
        raise argparse.ArgumentTypeError(f"a key (or the start of one) is hex digits, got {value!r}; "
                                         f"tilecarve cache list shows the keys")
    return value


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    db = argparse.ArgumentParser(add_help=False, parents=[common])
    db.add_argument("--db", type=Path, default=None,
                    help="the database file (default: tuning.sqlite in $TILECARVE_CACHE_DIR if set, else in "
                         "$XDG_CACHE_HOME/tilecarve/ if that is an absolute path, else in ~/.cache/tilecarve/)")
    c = sub.add_parser("cache", parents=[common], help="the tuning database: list, show, export, import, clear",
                       description="The tuning database: one run per tuned problem, one trial per config measured.")
    cmds = c.add_subparsers(dest="cache_command", required=True, metavar="ACTION")
    p = cmds.add_parser("list", parents=[db], help="one row per tuned problem",
                        description="One row per stored run: key, kernel, best latency, date, trials.")
    p.add_argument("--json", action="store_true", help="print JSON on stdout")
    p.set_defaults(func=cmd_list, prog=p.prog)
    p = cmds.add_parser("show", parents=[db], help="one run and its trials",
                        description="One stored run with every trial (status, latency, compile time, error).")
    p.add_argument("key", type=key_prefix, metavar="KEY", help="the run's key, or a unique start of it")
    p.add_argument("--json", action="store_true", help="print JSON on stdout")
    p.set_defaults(func=cmd_show, prog=p.prog)
    p = cmds.add_parser("export", parents=[db], help="write runs to a JSON file",
                        description="Write runs and their trials to a JSON file that `tilecarve cache import` reads. "
                                    "Exporting every run, a damaged one is skipped and named on stderr, the others "
                                    "are written, and the exit status is 1; a damaged run named with --key is an "
                                    "error and nothing is written.")
    p.add_argument("file", metavar="FILE", help="the file to write ('-': stdout); an existing one needs --force. "
                                                "Never the database itself or its -wal, -shm or .lock file")
    p.add_argument("--key", type=key_prefix, action="append", default=None,
                   help="only this run (a key or a unique start of one); repeat for more")
    p.add_argument("--force", action="store_true", help="overwrite FILE if it exists")
    p.set_defaults(func=cmd_export, prog=p.prog)
    p = cmds.add_parser("import", parents=[db], help="add runs from an exported JSON file",
                        description="Add the runs of an exported file. Each is checked as rows read from the "
                                    "database are; a bad file changes nothing. A stored run is replaced only by a "
                                    "newer one; older or equal ones are skipped and reported.")
    p.add_argument("file", type=Path, metavar="FILE", help="a file written by tilecarve cache export")
    p.add_argument("--json", action="store_true", help="print what was added, replaced and skipped as JSON")
    p.set_defaults(func=cmd_import, prog=p.prog)
    p = cmds.add_parser("clear", parents=[db], help="delete runs (asks first, or --yes)",
                        description="Delete stored runs and their trials: all of them, or one with --key. Asks "
                                    "for confirmation on a terminal; elsewhere --yes is required.")
    p.add_argument("--key", type=key_prefix, default=None, help="only this run (a key or a unique start of one)")
    p.add_argument("--yes", "-y", action="store_true", help="do not ask")
    p.set_defaults(func=cmd_clear, prog=p.prog)


# --------------------------------------------------------------------------------------------------
def _path(args: argparse.Namespace) -> Path:
    from autotuner.cache import cache_dir

    return args.db if args.db is not None else cache_dir() / "tuning.sqlite"


#: The files SQLite and the tuner keep beside a database ``F``: ``F-wal``, ``F-shm`` and the lock ``F.lock``.
_COMPANIONS = ("-wal", "-shm", ".lock")


def _database_files(db: Path) -> dict[str, str]:
    """The real paths of the database file (``""``) and of its companions (their suffix), beside both the path
    as given and the file it resolves to (SQLite keeps its ``-wal`` beside the real file, the tuner its lock
    beside the path it was given)."""
    out: dict[str, str] = {}
    for base in (os.path.abspath(db), os.path.realpath(db)):
        for suffix in ("", *_COMPANIONS):
            out.setdefault(os.path.realpath(base + suffix), suffix)
    return out


def _what(suffix: str, db: Path) -> str:
    return f"the tuning database {db}" if not suffix else f"the {suffix} file of the tuning database {db}"


def _companion_of(path: Path) -> tuple[str, Path] | None:
    """``(suffix, database)`` when ``path`` is the ``-wal``, ``-shm`` or ``.lock`` file of a database beside it."""
    for suffix in _COMPANIONS:
        if path.name.endswith(suffix) and len(path.name) > len(suffix):
            base = path.with_name(path.name[: -len(suffix)])
            if base.is_file():
                return suffix, base
    return None


def _open(args: argparse.Namespace, write: bool = False, create: bool = False) -> Any:
    """The database, or None when there is none yet (no file, or an SQLite file with no table at all: one
    another process is creating) and ``create`` is False: reading creates nothing.

    A file that is there must be a tilecarve tuning database already, checked read-only: a command never
    moves, repairs or adds tables to a file that is not one (``--db notes.json`` by mistake), nor to a
    damaged one, as a tuning run would. ``list``, ``show`` and ``export`` read through a read-only
    connection (:class:`TuningDB` ``readonly=True``), so a database they cannot write (its permissions) is
    read all the same; ``import`` and ``clear`` (``write``) open it for writing afterwards."""
    path = _path(args)
    companion = _companion_of(path)
    if companion is not None:  # a lock file is empty: read as a database it would be one, and `import` fill it
        suffix, base = companion
        raise CommandError(f"{path} is {_what(suffix, base)}, not a database; nothing was changed. Pass --db {base}")
    if not path.exists():
        return _writer(path) if create else None
    reader = _reader(path, note=not write)  # a write action opens it again for writing: no note about reading
    try:
        tables = reader.tables()
    except sqlite3.Error as e:
        reader.close()
        raise CommandError(f"cannot read {path}: {e}; nothing was changed") from e
    missing = {"runs", "trials"} - tables
    if tables and missing:
        reader.close()
        raise CommandError(f"{path} is not a tilecarve tuning database (it has no {' or '.join(sorted(missing))} "
                           f"table); nothing was changed. {_DB_FIX}")
    if not write:
        if not tables:  # an empty SQLite file: a database being created, with no run yet
            reader.close()
            return None
        return reader
    reader.close()
    if not tables and not create:
        return None
    return _writer(path)


_DB_FIX = "Name the database with --db, or leave --db out for the cache's own"


def _reader(path: Path, note: bool = True) -> Any:
    """``path`` opened read-only, or a :class:`CommandError` naming it and what to do. ``note``: say on stderr
    when it can only be read as it stands on disk (what ``list``, ``show`` and ``export`` show)."""
    from autotuner.cache import DamagedDatabaseError, TuningCacheError, TuningDB

    try:
        db = TuningDB(path, readonly=True)
    except DamagedDatabaseError as e:
        if e.not_sqlite:
            raise CommandError(f"{path} is not a tilecarve tuning database ({e.reason}); nothing was changed. "
                               f"{_DB_FIX}") from e
        raise CommandError(f"{e}; nothing was changed") from e
    except TuningCacheError as e:
        raise CommandError(f"{e}; nothing was changed") from e
    if db.immutable and note:
        print(f"note: {path} cannot be written here (its permissions), so it was read as it stands on disk "
              "(immutable=1)" + (": changes in its -wal file that are not yet in it are not shown"
                                 if _has_wal(path) else ""), file=sys.stderr)
    return db


def _has_wal(path: Path) -> bool:
    try:
        return Path(f"{path}-wal").stat().st_size > 0
    except OSError:
        return False


def _writer(path: Path) -> Any:
    """``path`` opened for writing (created if missing), or a :class:`CommandError`: a damaged file is not
    moved aside, unlike in a tuning run."""
    from autotuner.cache import DamagedDatabaseError, TuningCacheError, TuningDB

    try:
        return TuningDB(path, move_damaged=False)
    except DamagedDatabaseError as e:
        raise CommandError(f"{e}; nothing was changed") from e
    except TuningCacheError as e:  # its text advises the Python API (TILECARVE_CACHE_DIR, cache=False): not ours
        cause = e.__cause__
        why = (getattr(cause, "strerror", None) or str(cause)) if cause is not None else str(e)
        if any(m in str(cause).lower() for m in ("locked", "busy")):
            fix = "Another process is writing it (a tuning run, an import): try again when it is done"
        elif path.exists():
            fix = (f"Make it writable (and its folder {path.parent}, where SQLite keeps its -wal and -shm files), "
                   f"or copy it to a writable place and pass --db COPY")
        else:
            fix = "Pass --db a file in a folder you can write"
        raise CommandError(f"cannot write the tuning database {path}: {why}; nothing was changed. {fix}") from e


@contextlib.contextmanager
def _reading(path: Path, db: Any):
    """Close ``db`` at the end; an SQLite error while reading rows (damage that ``quick_check`` did not see)
    is a :class:`CommandError` naming the file."""
    try:
        yield
    except sqlite3.DatabaseError as e:
        raise CommandError(f"cannot read the tuning database {path}: {e}; nothing was changed. If it is damaged, "
                           f"keep a copy and recover what it holds with `sqlite3 {path} .recover | sqlite3 "
                           "NEW.sqlite`, or move it away") from e
    finally:
        db.close()


def _resolve(db: Any, prefix: str) -> str:
    keys = db.keys(prefix)
    if not keys:
        raise CommandError(f"no stored run has a key starting with {prefix!r}; tilecarve cache list shows the keys")
    if len(keys) > 1:
        raise CommandError(f"{prefix!r} starts {len(keys)} keys ({', '.join(k[:16] for k in keys[:5])}...); give "
                           f"more digits")
    return keys[0]


def _damaged_run(path: Path, key: str, e: Exception) -> str:
    """What is wrong with the stored run ``key`` (a :class:`DamagedRow` ``e``) and what to do about it."""
    return (f"the run {key} in the tuning database {path} is damaged ({e}); a tuning run would ignore it and tune "
            f"the problem again. Delete it with tilecarve cache clear --key {key[:16]} --db {path}, or correct the "
            f"row with sqlite3")


def _export_one(db: Any, path: Path, key: str) -> dict[str, Any] | None:
    """The run ``key`` as :meth:`TuningDB.export_runs` gives it; None if it was deleted meanwhile (another
    process); a :class:`DamagedRow` names the file and the run."""
    from autotuner.cache import DamagedRow

    try:
        return db.export_runs([key])[0]
    except KeyError:
        return None
    except DamagedRow as e:
        raise DamagedRow(_damaged_run(path, key, e)) from e


def _date(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t)) if t is not None else "-"


def cmd_list(args: argparse.Namespace) -> int:
    from autotuner.config import config_label

    db = _open(args)
    runs = []
    if db is not None:
        with _reading(_path(args), db):
            runs = db.runs()
    if args.json:
        json.dump([vars(r) | {"database": str(_path(args))} for r in runs], sys.stdout, indent=2)
        print()
        return 0
    if not runs:
        print(f"no tuned problems in {_path(args)}" + ("" if db is not None else " (no database there yet)"))
        return 0
    print(f"{len(runs)} tuned problems in {_path(args)}")
    print(f"{'key':<14}{'best ms':>10}  {'date':<17}{'trials':>9}  {'target':<18}kernel / best config")
    for r in runs:
        best = f"{r.best_latency_ms:>10.4f}" if r.best_latency_ms is not None else f"{'-':>10}"
        state = "" if r.finished is not None else "  (unfinished: tuning again resumes it)"
        print(f"{r.key[:12]:<14}{best}  {_date(r.finished or r.created):<17}{f'{r.n_trials}/{r.n_configs}':>9}  "
              f"{r.target[:17]:<18}{r.kernel}{state}")
        if r.best_config:
            print(f"{'':<72}{config_label(r.best_config)}")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from autotuner.config import config_label
    from autotuner.trial import error_headline

    db = _open(args)
    if db is None:
        raise CommandError(f"no tuning database at {_path(args)}")
    from autotuner.cache import DamagedRow

    with _reading(_path(args), db):
        key = _resolve(db, args.key)
        try:
            run = _export_one(db, _path(args), key)
        except DamagedRow as e:
            raise CommandError(str(e)) from e
        if run is None:
            raise CommandError(f"the run {key} was deleted from {_path(args)} while it was read (another process)")
    if args.json:
        json.dump(run, sys.stdout, indent=2)
        print()
        return 0
    best = run["best_config"]
    print(f"key      {run['key']}\nkernel   {run['kernel']}\ntarget   {run['target']}")
    print(f"tuned    {_date(run['created'])} .. {_date(run['finished']) if run['finished'] else 'unfinished'}")
    if best is not None:
        ref = f" (reference {run['ref_latency_ms']:.4f} ms)" if run["ref_latency_ms"] else ""
        print(f"best     {config_label(best)} at {run['best_latency_ms']:.4f} ms{ref}")
    print(f"trials   {len(run['trials'])} of {run['n_configs']} configs; settings {json.dumps(run['meta'])}")
    print(f"{'idx':>4}  {'status':<15}{'median ms':>10}{'min ms':>10}{'iqr ms':>9}{'compile s':>10}  config")
    for t in run["trials"]:
        nums = "".join(f"{v:>{w}.4f}" if v is not None else f"{'-':>{w}}"
                       for v, w in ((t["median_ms"], 10), (t["min_ms"], 10), (t["iqr_ms"], 9), (t["compile_s"], 10)))
        err = f"  [{error_headline(t['error'], 80)}]" if t["error"] else ""
        print(f"{t['idx']:>4}  {t['status']:<15}{nums}  {config_label(t['config'])}{err}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from autotuner import __version__
    from autotuner.cache import EXPORT_FORMAT, DamagedRow

    path = _path(args)
    to_stdout = args.file == "-"
    if not to_stdout:
        suffix = _database_files(path).get(os.path.realpath(args.file))
        if suffix is not None:  # checked first: --force (or the advice to use it) must not reach the database
            raise UsageError(f"FILE {args.file} is {_what(suffix, path)}: writing the export there would destroy "
                             f"the database's data, with --force or without; pick another file (or '-' for stdout)")
        if Path(args.file).is_dir():
            raise UsageError(f"FILE {args.file} is a folder; name a file in it, e.g. {Path(args.file) / 'runs.json'}")
        if Path(args.file).exists() and not args.force:
            raise CommandError(f"{args.file} exists; choose another name, or --force to overwrite it")
    db = _open(args)
    if db is None:
        raise CommandError(f"no tuning database at {path}: nothing to export")
    runs, damaged = [], []
    with _reading(path, db):
        keys = db.keys() if args.key is None else list(dict.fromkeys(_resolve(db, k) for k in args.key))
        for key in keys:  # one run at a time: a damaged one is named, and (exporting all) the others still go
            try:
                run = _export_one(db, path, key)
            except DamagedRow as e:
                damaged.append(str(e))
                continue
            if run is not None:
                runs.append(run)
    if damaged and (args.key is not None or not runs):
        raise CommandError(f"{'; '.join(damaged)}. Nothing was exported"
                           + (" (the runs named with --key are exported together or not at all)"
                              if args.key is not None else ""))
    doc = {"format": EXPORT_FORMAT, "tilecarve": __version__, "exported": time.time(), "database": str(path),
           "runs": runs}
    text = json.dumps(doc, indent=1)
    where = "stdout" if to_stdout else args.file
    if to_stdout:
        print(text)
    else:
        _write_atomically(Path(args.file), text + "\n")
        if not damaged:
            print(f"exported {len(runs)} runs to {args.file}", file=sys.stderr)
    if damaged:  # after the others were written: exit 1, naming each run left out
        raise CommandError(f"exported {len(runs)} runs to {where} and skipped {len(damaged)} damaged: "
                           + "; ".join(damaged))
    return 0


def _write_atomically(path: Path, text: str) -> None:
    """:func:`autotuner.files.write_atomically`, its failure a :class:`CommandError` naming the file."""
    from autotuner.files import write_atomically

    real = Path(os.path.realpath(path))
    existed = real.exists()
    try:
        write_atomically(path, text)
    except OSError as e:
        kept = "was left as it was" if existed else "was not created"
        raise CommandError(f"cannot write {path}: {e.strerror or e}; {path} {kept}. {_write_fix(e, real)}"
                           "export to another place (or '-' for stdout)") from e


def _write_fix(e: OSError, real: Path) -> str:
    """What to do about ``e``, by its errno (``real``: the file, its links followed), ending where "export to
    another place" follows."""
    folder = real.parent
    if e.errno == errno.ENOENT:
        return f"The folder {folder} does not exist: create it first (mkdir -p {folder}), or "
    if e.errno == errno.ENOTDIR:
        return f"A part of {folder} is a file, not a folder: "
    if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"The folder {folder} cannot be written here (its permissions, or a read-only file system): "
    if e.errno in (errno.ENOSPC, errno.EFBIG, getattr(errno, "EDQUOT", errno.ENOSPC)):
        return "Free some space, raise the file size limit (ulimit -f) or the disk quota, or "
    return "Correct the path, or "


def cmd_import(args: argparse.Namespace) -> int:
    from autotuner.cache import DamagedRow, check_export

    suffix = _database_files(_path(args)).get(os.path.realpath(args.file))
    if suffix is not None:  # nothing to gain, and SQLite's files are no export: say so rather than "not JSON"
        raise UsageError(f"FILE {args.file} is {_what(suffix, _path(args))}, the database it would import into; "
                         f"give a file written by tilecarve cache export")
    try:
        doc = json.loads(args.file.read_text())
    except (OSError, ValueError) as e:
        raise CommandError(f"cannot read {args.file} as JSON: {e}") from e
    try:  # every field of every run, before the database is opened (or created)
        check_export(doc)
    except DamagedRow as e:
        raise CommandError(f"{args.file}: {e}; nothing was imported. Correct the file, or write it again with "
                           "tilecarve cache export") from e
    db = _open(args, write=True, create=True)
    try:
        report = db.import_runs(doc["runs"])
    except DamagedRow as e:
        raise CommandError(f"{args.file}: {e}; nothing was imported") from e
    finally:
        db.close()
    if args.json:
        json.dump(vars(report) | {"database": str(_path(args))}, sys.stdout, indent=2)
        print()
        return 0
    print(f"imported into {_path(args)}: {len(report.added)} added, {len(report.replaced)} replaced by newer runs, "
          f"{len(report.skipped)} skipped")
    for key in report.replaced:
        print(f"  replaced {key[:12]}: the file's run is newer")
    for key, why in report.skipped:
        print(f"  skipped  {key[:12]}: {why}")
    return 0


def cmd_clear(args: argparse.Namespace) -> int:
    db = _open(args, write=True)
    if db is None:
        print(f"no tuning database at {_path(args)}: nothing to clear")
        return 0
    try:
        keys = [_resolve(db, args.key)] if args.key else db.keys()
        what = f"run {keys[0][:12]}" if args.key else f"all {len(keys)} runs"
        if not keys:
            print(f"no runs in {_path(args)}: nothing to clear")
            return 0
        if not args.yes:
            if not sys.stdin.isatty():
                raise UsageError(f"clearing {what} of {_path(args)} needs --yes when not asked on "
                                                 f"a terminal")
            answer = input(f"delete {what} (and their trials) from {_path(args)}? [y/N] ")
            if answer.strip().lower() not in ("y", "yes"):
                print("nothing deleted")
                return 0
        n = db.delete(keys)
    finally:
        db.close()
    print(f"deleted {n} runs from {_path(args)}")
    return 0

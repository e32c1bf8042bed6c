"""Files written whole or not at all: what the tuned tables and the cache's exports are written with."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

__all__ = ["write_atomically"]


def write_atomically(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` whole or not at all: into a temporary file beside it, synced, then renamed
    over it (``os.replace``), and the folder synced (best effort: not every OS allows it). The new file gets
    the mode of the file it replaces, else ``0o666 & ~umask`` (not mkstemp's 0600: a table or an export
    ships to other users). Through a symbolic link, the file it points to is replaced. If anything fails (a
    full disk, ``ulimit -f``) the ``OSError`` is raised, the old file is left as it was and the temporary
    file is removed."""
    target = Path(os.path.realpath(path))
    try:
        mode = target.stat().st_mode & 0o7777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        os.replace(tmp, target)
        tmp = None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    with contextlib.suppress(OSError):  # the rename itself survives a crash once the folder is synced
        dfd = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

"""Tuned tables: a small JSON file of tuned configs, shipped with a model so that it never tunes.

A table holds, for one target (GPU name, TVM target) and one tilelang/tilecarve version, per kernel
(its name, a hash of its source, its key names and bucket edges) the winning config for each key::

    {"format": "tilecarve-table/1", "target": "...", "gpu": "NVIDIA H200", "tilelang": "0.1.15",
     "tilecarve": "0.1.0", "created": "2026-01-01T00:00:00Z",
     "kernels": {"my.kernel": {"source": "3f2a...", "key": ["M", "N"], "buckets": {"M": [1, 2, 4, ...]},
                 "entries": [{"key": {"M": 128, "N": 4096}, "config": {"block_M": 64}, "latency_ms": 0.0123}]}}}

:func:`load_table` refuses, with a :class:`TableError` naming the file, the field and the mismatch, a
file that is not such a table, or one from another GPU, target or tilelang version (``allow`` lets
named mismatches through). A kernel's own identity (source, key, buckets) is checked when a kernel
uses the table (:meth:`KernelSection.check`). Nothing in a table is measured again: it is
authoritative, and the same file gives the same configs on every rank.
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["ALLOWABLE", "FORMAT", "Entry", "KernelSection", "TableError", "TunedTable", "environment", "load_table",
           "write_table"]

logger = logging.getLogger(__name__)

FORMAT = "tilecarve-table/1"
#: Mismatches ``load_table(allow=...)`` can let through (``allow=True``: all of them).
ALLOWABLE = ("gpu", "target", "tilelang", "tilecarve", "source")
_SCALARS = (bool, int, float, str, type(None))


class TableError(ValueError):
    """A tuned table that cannot be used here: malformed, or made for another GPU, version or kernel."""


@dataclass(frozen=True)
class Entry:
    """One tuned key: its values (bucketed keys by their edge), the winning config, its latency (ms)."""

    key: dict[str, Any]
    config: dict[str, Any]
    latency_ms: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "config": self.config, "latency_ms": self.latency_ms}


@dataclass(frozen=True)
class KernelSection:
    """One kernel's part of a table."""

    name: str
    source: str
    key: tuple[str, ...]
    buckets: dict[str, tuple[int, ...]]
    entries: tuple[Entry, ...]
    path: str = ""  # the file it came from, for messages
    allow: frozenset[str] = frozenset()

    def lookup(self, key: Mapping[str, Any]) -> Entry | None:
        want = tuple(key[k] for k in self.key)
        return next((e for e in self.entries if tuple(e.key[k] for k in self.key) == want), None)

    def check(self, source: str, key: Sequence[str], buckets: Mapping[str, Sequence[int]]) -> None:
        """Refuse this section for a kernel whose key names or bucket edges differ (or its source,
        unless allowed): its entries would be looked up under the wrong key."""
        where = f"{self.path}: field kernels.{self.name}"
        if list(key) != list(self.key):
            raise TableError(f"{where}.key is {list(self.key)} but the kernel's key is {list(key)}; tune the "
                             "kernel again with this key and write a new table")
        mine = {k: list(v) for k, v in buckets.items()}
        theirs = {k: list(v) for k, v in self.buckets.items()}
        if mine != theirs:
            raise TableError(f"{where}.buckets is {theirs} but the kernel buckets {mine}; use the same buckets or "
                             "write a new table")
        if source != self.source:
            msg = (f"{where}.source is {self.source[:16]} but the kernel's source hashes to {source[:16]}: the kernel "
                   "changed since the table was written")
            if "source" not in self.allow:
                raise TableError(f"{msg}; tune it again and write a new table, or load with allow=['source']")
            logger.warning("%s; using the table anyway (allowed)", msg)

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "key": list(self.key), "buckets": {k: list(v) for k, v in self.buckets.items()},
                "entries": [e.to_json() for e in self.entries]}


@dataclass(frozen=True)
class TunedTable:
    """A loaded table: its environment fields and its kernels' sections, by kernel name."""

    path: str
    target: str
    gpu: str
    tilelang: str
    tilecarve: str
    created: str
    kernels: dict[str, KernelSection]
    allow: frozenset[str] = frozenset()

    def check_target(self, target: Any) -> None:
        """Refuse this table for a kernel that compiles for another target or GPU than it was tuned for (a
        resolved target, ``target.py``), unless allowed: :func:`load_table` checked the table against one
        target, and a kernel may name its own."""
        here = environment(target)
        _check_fields(self.path, {"target": self.target, "gpu": self.gpu}, here, self.allow)


def environment(target: Any) -> dict[str, str]:
    """What a table records about where it was tuned, for a resolved target (``target.py``)."""
    import tilelang

    from . import __version__

    return {"target": str(target.tvm()), "gpu": target.device_name or "cpu", "tilelang": tilelang.__version__,
            "tilecarve": __version__}


def write_table(path: str | os.PathLike[str], sections: Iterable[KernelSection], target: Any) -> Path:
    """Write ``sections`` as a table for ``target`` (atomically: a reader never sees half a file).
    One entry per line, so that a diff of two tables reads line by line."""
    path = Path(path)
    env = environment(target)
    kernels = {}
    for s in sections:
        if s.name in kernels:
            raise ValueError(f"two kernels are named {s.name!r}; give one of them another name= so that the table "
                             "can tell them apart")
        kernels[s.name] = s
    lines = ["{", f'  "format": {json.dumps(FORMAT)},']
    lines += [f"  {json.dumps(k)}: {json.dumps(v)}," for k, v in env.items()]
    lines.append(f'  "created": {json.dumps(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))},')
    lines.append('  "kernels": {')
    for i, s in enumerate(kernels.values()):
        d = s.to_json()
        lines.append(f"    {json.dumps(s.name)}: {{")
        lines += [f"      {json.dumps(k)}: {json.dumps(d[k], sort_keys=True)}," for k in ("source", "key", "buckets")]
        lines.append('      "entries": [')
        rows = [f"        {json.dumps(e.to_json(), sort_keys=True)}" for e in s.entries]
        lines.append(",\n".join(rows))
        lines.append("      ]")
        lines.append("    }" + ("," if i < len(kernels) - 1 else ""))
    lines += ["  }", "}", ""]
    text = "\n".join(x for x in lines if x)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text + "\n")
    os.replace(tmp, path)
    logger.info("wrote a tuned table for %d kernel(s), %d entries, to %s", len(kernels),
                sum(len(s.entries) for s in kernels.values()), path)
    return path


# ---------------------------------------------------------------------------------------------
# loading


def _field(doc: Mapping[str, Any], name: str, kind: type | tuple[type, ...], where: str) -> Any:
    if name not in doc:
        raise TableError(f"{where}: field {name!r} is missing")
    v = doc[name]
    if not isinstance(v, kind) or isinstance(v, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise TableError(f"{where}: field {name!r} is {v!r}, not a {getattr(kind, '__name__', kind)}")
    return v


def _entry(raw: Any, where: str, key: tuple[str, ...], buckets: Mapping[str, tuple[int, ...]]) -> Entry:
    if not isinstance(raw, dict):
        raise TableError(f"{where} is {raw!r}, not an object with key, config and latency_ms")
    k = _field(raw, "key", dict, where)
    if sorted(k) != sorted(key):
        raise TableError(f"{where}.key has names {sorted(k)} but the kernel's key is {list(key)}")
    for name, v in k.items():
        if not isinstance(v, _SCALARS) or v is None:
            raise TableError(f"{where}.key.{name} is {v!r}, not a number, string or bool")
        if name in buckets and (isinstance(v, bool) or not isinstance(v, int) or v not in buckets[name]):
            # an int edge: True == 1 and 8.0 == 8 would pass `in`, and be looked up as that edge
            raise TableError(f"{where}.key.{name} is {v!r}, which is not one of its bucket edges {list(buckets[name])}")
    cfg = _field(raw, "config", dict, where)
    for name, v in cfg.items():
        if not isinstance(v, _SCALARS) and not (name == "pass_configs" and isinstance(v, dict)):
            raise TableError(f"{where}.config.{name} is {v!r}, not a bool, int, float, str or null")
    lat = raw.get("latency_ms")
    if lat is not None and (isinstance(lat, bool) or not isinstance(lat, (int, float)) or not math.isfinite(lat)
                            or lat <= 0):
        raise TableError(f"{where}.latency_ms is {lat!r}, not a positive number or null")
    return Entry(dict(k), dict(cfg), lat)


def _section(name: str, raw: Any, path: str, allow: frozenset[str]) -> KernelSection:
    where = f"{path}: kernels.{name}"
    if not isinstance(raw, dict):
        raise TableError(f"{where} is {raw!r}, not an object")
    source = _field(raw, "source", str, where)
    key = _field(raw, "key", list, where)
    if not key or not all(isinstance(k, str) for k in key) or len(set(key)) != len(key):
        raise TableError(f"{where}.key is {key!r}, not a list of distinct key names")
    buckets = {}
    for k, edges in _field(raw, "buckets", dict, where).items():
        if k not in key:
            raise TableError(f"{where}.buckets names {k!r}, which is not in its key {key}")
        if (not isinstance(edges, list) or not edges or any(isinstance(e, bool) or not isinstance(e, int) or e < 1
                                                            for e in edges) or edges != sorted(set(edges))):
            raise TableError(f"{where}.buckets.{k} is {edges!r}, not strictly increasing positive ints")
        buckets[k] = tuple(edges)
    entries = []
    seen: dict[tuple, int] = {}
    for i, e in enumerate(_field(raw, "entries", list, where)):
        entry = _entry(e, f"{where}.entries[{i}]", tuple(key), buckets)
        ident = tuple(entry.key[k] for k in key)
        if ident in seen:
            raise TableError(f"{where}.entries[{i}] repeats the key {entry.key} of entries[{seen[ident]}]")
        seen[ident] = i
        entries.append(entry)
    return KernelSection(name, source, tuple(key), buckets, tuple(entries), path, allow)


def load_table(path: str | os.PathLike[str], target: Any = "auto", allow: bool | Iterable[str] = ()) -> TunedTable:
    """Read and check a table for ``target`` (resolved as the autotuner does: "auto" is the local GPU,
    else the CPU). A malformed file, or one for another GPU, target or tilelang version, is a
    :class:`TableError` naming the file, the field and both values; ``allow`` names mismatches to accept
    (from :data:`ALLOWABLE`; ``True`` for all), each logged as a warning."""
    from .target import resolve_target

    allowed = frozenset(ALLOWABLE) if allow is True else frozenset(allow or ())
    bad = sorted(allowed - set(ALLOWABLE))
    if bad:
        raise ValueError(f"allow names {bad}, which are not fields a table may differ in; use some of {ALLOWABLE}")
    where = str(path)
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise TableError(f"{where}: cannot read the tuned table: {e.strerror or e}") from e
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise TableError(f"{where}: not JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
    if not isinstance(doc, dict):
        raise TableError(f"{where}: a tuned table is a JSON object, got {type(doc).__name__}")
    fmt = doc.get("format")
    if fmt != FORMAT:
        raise TableError(f"{where}: field 'format' is {fmt!r}, expected {FORMAT!r}; is this a tilecarve tuned table?")
    fields = {name: _field(doc, name, str, where) for name in ("target", "gpu", "tilelang", "tilecarve", "created")}
    _check_fields(where, {k: fields[k] for k in ("gpu", "target", "tilelang", "tilecarve")},
                  environment(resolve_target(target)), allowed)
    kernels = {name: _section(name, raw, where, allowed) for name, raw in _field(doc, "kernels", dict, where).items()}
    return TunedTable(where, fields["target"], fields["gpu"], fields["tilelang"], fields["tilecarve"],
                      fields["created"], kernels, allowed)


def _check_fields(where: str, fields: dict[str, str], here: dict[str, str], allowed: frozenset[str]) -> None:
    """A :class:`TableError` for the first of a table's ``fields`` that differs from ``here`` and is not
    allowed; a warning for each allowed one (and for tilecarve's version, never refused)."""
    for name, value in fields.items():
        if value == here[name]:
            continue
        msg = f"{where}: field {name!r} is {value!r} but here it is {here[name]!r}"
        if name in allowed or name == "tilecarve":  # configs are pinned by each kernel's source hash instead
            logger.warning("%s; using the table anyway%s", msg, " (allowed)" if name in allowed else "")
            continue
        raise TableError(f"{msg}: the table was tuned elsewhere. Tune again here (autotuner.record, then "
                         f"Recording.tune), or load with allow=[{name!r}] to use it anyway")

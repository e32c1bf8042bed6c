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

Entries are checked when the file is loaded: a key value is an int, a string or a bool and is matched
type-strictly (``true`` never serves ``N=1``); a config value is an int, a bool, a finite float or a
string, sets no key parameter, and the reserved tiling parameters (:data:`.config.RESERVED_PARAMS`)
lie in their domains. Each loaded entry remembers where it came from (:attr:`Entry.origin`):
:func:`write_table` refuses to write an entry whose table was tuned for another GPU, target, tilelang
or kernel source than the one it would be stamped with (such a table was loaded with ``allow=``), so
that allowing a mismatch once never turns into a table that later loads as native.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .files import write_atomically

__all__ = ["ALLOWABLE", "FORMAT", "Entry", "KernelSection", "TableError", "TunedTable", "environment", "load_table",
           "write_table"]

logger = logging.getLogger(__name__)

FORMAT = "tilecarve-table/1"
#: Mismatches ``load_table(allow=...)`` can let through (``allow=True``: all of them).
ALLOWABLE = ("gpu", "target", "tilelang", "tilecarve", "source")
#: Fields of a table's provenance that an entry keeps (:attr:`Entry.origin`) and :func:`write_table` checks.
PROVENANCE = ("gpu", "target", "tilelang")
#: Reserved tiling parameters (every one of ``config.RESERVED_PARAMS``: tests/test_table_inputs.py checks): the
#: test a value must pass, and its domain.
_INT31 = 2**31
_RESERVED_DOMAINS: dict[str, tuple[Any, str]] = {
    **{k: (lambda v: _is_int(v) and 0 < v < _INT31, "a positive int below 2**31")
       for k in ("block_M", "block_N", "block_K", "thread_num")},
    "num_stages": (lambda v: _is_int(v) and 0 <= v < _INT31, "an int >= 0 below 2**31"),
    "enable_rasterization": (lambda v: isinstance(v, bool), "a bool (true or false)"),
}


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _scalar_problem(v: Any) -> str | None:
    """Why ``v`` is not a config value a kernel can take from a table (an int, a bool, a finite float or a
    string), or ``None``."""
    if isinstance(v, (bool, str)):
        return None
    if isinstance(v, int):
        return None if -2**63 <= v < 2**63 else "an int outside 64 bits"
    if isinstance(v, float):
        return None if math.isfinite(v) else "not a finite number"
    if v is None:
        return "not a value"
    return f"a JSON {'array' if isinstance(v, list) else 'object' if isinstance(v, dict) else type(v).__name__}"


def key_kind(v: Any) -> str:
    """The type a key value is matched by: bool, int and str never match one another (``True`` is not ``1``)."""
    return "bool" if isinstance(v, bool) else "int" if isinstance(v, int) else "str" if isinstance(v, str) else \
        type(v).__name__


def typed_key(values: Iterable[Any]) -> tuple:
    """Key values as a type-strict lookup key."""
    return tuple((key_kind(v), v) for v in values)


class TableError(ValueError):
    """A tuned table that cannot be used here: malformed, or made for another GPU, version or kernel."""


@dataclass(frozen=True)
class Entry:
    """One tuned key: its values (bucketed keys by their edge), the winning config, its latency (ms)."""

    key: dict[str, Any]
    config: dict[str, Any]
    latency_ms: float | None = None
    #: Where a loaded entry was tuned: the table's ``path``, ``gpu``, ``target``, ``tilelang`` and its kernel's
    #: ``source`` (``None``: tuned in this process or stored in its database). :func:`write_table` refuses to
    #: stamp an entry with another provenance than this.
    origin: Mapping[str, str] | None = field(default=None, compare=False, repr=False)

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

    def __post_init__(self) -> None:
        index = {typed_key(e.key[k] for k in self.key): e for e in reversed(self.entries)}  # the first wins
        object.__setattr__(self, "_index", index)

    def lookup(self, key: Mapping[str, Any]) -> Entry | None:
        """The entry for ``key``, matched type-strictly: ``True`` is not ``1``, ``1.0`` is not ``1``."""
        return self._index.get(typed_key(key[k] for k in self.key))  # type: ignore[attr-defined]

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
        for e in s.entries:
            _check_origin(path, s, e, env)
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
    write_atomically(path, text + "\n")
    logger.info("wrote a tuned table for %d kernel(s), %d entries, to %s", len(kernels),
                sum(len(s.entries) for s in kernels.values()), path)
    return path


def _check_origin(path: Path, s: KernelSection, e: Entry, env: Mapping[str, str]) -> None:
    """Refuse to write a loaded entry with a provenance other than its own: one loaded from a table tuned
    elsewhere (accepted with ``allow=``) must not come out as tuned here."""
    o = e.origin
    if not o:
        return
    diff = [(f"field {f!r}", o[f], env[f]) for f in PROVENANCE if o.get(f) != env[f]]
    if o.get("source") != s.source:
        diff.append((f"kernels.{s.name}.source", str(o.get("source"))[:16], s.source[:16]))
    if diff:
        what, theirs, here = diff[0]
        allow = sorted({"source" if "source" in d[0] else d[0].split("'")[1] for d in diff})
        raise TableError(f"{path}: not writing kernels.{s.name} entry {e.key}: it came from the table {o.get('path')}, "
                         f"whose {what} is {theirs!r} but the table written here has {here!r} (it was loaded with "
                         f"allow={allow}, never tuned here); writing it would stamp it as native. Tune the key here "
                         "(kk.tune(key), or autotuner.record then Recording.tune) and write that, or ship the original "
                         f"table and load it with allow={allow}")


# ---------------------------------------------------------------------------------------------
# loading


def _field(doc: Mapping[str, Any], name: str, kind: type | tuple[type, ...], where: str) -> Any:
    if name not in doc:
        raise TableError(f"{where}: field {name!r} is missing")
    v = doc[name]
    if not isinstance(v, kind) or isinstance(v, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise TableError(f"{where}: field {name!r} is {v!r}, not a {getattr(kind, '__name__', kind)}")
    return v


def _entry(raw: Any, where: str, key: tuple[str, ...], buckets: Mapping[str, tuple[int, ...]],
           origin: Mapping[str, str]) -> Entry:
    if not isinstance(raw, dict):
        raise TableError(f"{where} is {raw!r}, not an object with key, config and latency_ms")
    k = _field(raw, "key", dict, where)
    if sorted(k) != sorted(key):
        raise TableError(f"{where}.key has names {sorted(k)} but the kernel's key is {list(key)}")
    for name, v in k.items():
        if name in buckets and (isinstance(v, bool) or not isinstance(v, int) or v not in buckets[name]):
            # an int edge: True == 1 and 8.0 == 8 would pass `in`, and be looked up as that edge
            raise TableError(f"{where}.key.{name} is {v!r}, which is not one of its bucket edges {list(buckets[name])}")
        if not isinstance(v, (bool, int, str)):
            # a call's key values are ints, strings or bools (8.0 is looked up as 8): this entry could never serve
            raise TableError(f"{where}.key.{name} is {json.dumps(v)}, which no call can match: a call's key values "
                             "are ints, strings or bools, matched type-strictly (8.0 is looked up as 8); write it as "
                             "an int, a string or a bool, or tune the key again and write a new table")
    cfg = _field(raw, "config", dict, where)
    _check_config(cfg, where, key)
    lat = raw.get("latency_ms")
    if lat is not None and (isinstance(lat, bool) or not isinstance(lat, (int, float)) or not math.isfinite(lat)
                            or lat <= 0):
        raise TableError(f"{where}.latency_ms is {lat!r}, not a positive number or null")
    return Entry(dict(k), dict(cfg), lat, origin)


def _check_config(cfg: Mapping[str, Any], where: str, key: tuple[str, ...]) -> None:
    """A table entry's config, checked before anything compiles it: values a kernel can take (no null, NaN,
    infinity, array or object but ``pass_configs``), no key parameter, reserved tiling parameters in range."""
    fix = "fix the value or tune the key again and write a new table"
    for name, v in cfg.items():
        at = f"{where}.config.{name}"
        if name in key:
            raise TableError(f"{at} sets the key parameter {name!r} (to {json.dumps(v)}): keys come from the call, "
                             f"not from the config; remove {name!r} from the config or tune again")
        if name == "pass_configs" and isinstance(v, dict):
            for pk, pv in v.items():
                why = _scalar_problem(pv)
                if why is not None:
                    raise TableError(f"{at}.{pk} is {json.dumps(pv)}, {why}; a pass config is an int, a bool, a finite "
                                     f"number or a string: {fix}")
            continue
        why = _scalar_problem(v)
        if why is not None:
            raise TableError(f"{at} is {json.dumps(v)}, {why}; a config value is an int, a bool, a finite number "
                             f"or a string: {fix}")
        if name in _RESERVED_DOMAINS:
            ok, domain = _RESERVED_DOMAINS[name]
            if not ok(v):
                raise TableError(f"{at} is {json.dumps(v)}, but {name} must be {domain}; {fix}")


def _section(name: str, raw: Any, path: str, allow: frozenset[str], env: Mapping[str, str]) -> KernelSection:
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
    origin = {"path": path, **{f: env[f] for f in PROVENANCE}, "source": source}
    entries = []
    seen: dict[tuple, int] = {}
    for i, e in enumerate(_field(raw, "entries", list, where)):
        entry = _entry(e, f"{where}.entries[{i}]", tuple(key), buckets, origin)
        ident = typed_key(entry.key[k] for k in key)
        if ident in seen:
            raise TableError(f"{where}.entries[{i}] repeats the key {entry.key} of entries[{seen[ident]}]")
        seen[ident] = i
        entries.append(entry)
    return KernelSection(name, source, tuple(key), buckets, tuple(entries), path, allow)


class _DuplicateName(Exception):
    def __init__(self, name: str, others: list[str]) -> None:
        super().__init__(name)
        self.name, self.others = name, others


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook``: a JSON object that names a field twice is refused (json keeps the last silently)."""
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _DuplicateName(k, [n for n, _ in pairs])
        out[k] = v
    return out


def _allowed(allow: Any) -> frozenset[str]:
    if allow is True:
        return frozenset(ALLOWABLE)
    if allow is None or allow is False:
        return frozenset()
    if isinstance(allow, str):
        names = [allow]  # one name, not its letters
    elif isinstance(allow, Iterable) and not isinstance(allow, (bytes, Mapping)):
        names = list(allow)
    else:
        raise TypeError(f"allow is {allow!r}; give True (every mismatch), a field name such as 'gpu', or a list of "
                        f"them from {ALLOWABLE}")
    bad = [n for n in names if not isinstance(n, str) or n not in ALLOWABLE]
    if bad:
        raise ValueError(f"allow names {bad}, which are not fields a table may differ in; use some of {ALLOWABLE}")
    return frozenset(names)


def load_table(path: str | os.PathLike[str], target: Any = "auto",
               allow: bool | str | Iterable[str] = ()) -> TunedTable:
    """Read and check a table for ``target`` (resolved as the autotuner does: "auto" is the local GPU,
    else the CPU). A malformed file, or one for another GPU, target or tilelang version, is a
    :class:`TableError` naming the file, the field and both values; ``allow`` names mismatches to accept
    (one name or a list of names from :data:`ALLOWABLE`; ``True`` for all), each logged as a warning.
    Entries of a table loaded with a mismatch allowed keep their provenance (:attr:`Entry.origin`):
    :func:`write_table` will not stamp them as tuned here."""
    from .target import resolve_target

    allowed = _allowed(allow)
    where = str(path)
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise TableError(f"{where}: cannot read the tuned table: {e.strerror or e}") from e
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TableError(f"{where}: not a tuned table: byte {data[e.start]:#04x} at offset {e.start} is not UTF-8 "
                         "(a table is a UTF-8 JSON file written by autotuner.write_table); give the table's path, "
                         "or write it again") from None
    try:
        doc = json.loads(text, object_pairs_hook=_unique_pairs)
    except json.JSONDecodeError as e:
        raise TableError(f"{where}: not JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
    except _DuplicateName as e:
        raise TableError(f"{where}: the name {e.name!r} appears twice in one JSON object (with {e.others}): a "
                         "repeated field, kernel section or key name, of which JSON would silently keep the last; "
                         "keep one of them") from None
    except RecursionError:
        raise TableError(f"{where}: not a tuned table: its JSON is nested too deeply to read (a table nests 6 "
                         "levels); give the table's path, or write it again") from None
    if not isinstance(doc, dict):
        raise TableError(f"{where}: a tuned table is a JSON object, got {type(doc).__name__}")
    fmt = doc.get("format")
    if fmt != FORMAT:
        raise TableError(f"{where}: field 'format' is {fmt!r}, expected {FORMAT!r}; is this a tilecarve tuned table?")
    fields = {name: _field(doc, name, str, where) for name in ("target", "gpu", "tilelang", "tilecarve", "created")}
    _check_fields(where, {k: fields[k] for k in ("gpu", "target", "tilelang", "tilecarve")},
                  environment(resolve_target(target)), allowed)
    kernels = {name: _section(name, raw, where, allowed, fields)
               for name, raw in _field(doc, "kernels", dict, where).items()}
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

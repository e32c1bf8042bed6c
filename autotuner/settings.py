"""The AutoTuner's settings: four frozen objects, each field checked by one validator.

``set_compile_args``, ``set_profile_args``, ``set_tuning`` and ``run`` rebuild these objects
(:class:`CheckSettings`, :class:`TimingSettings`, :class:`CompileSettings`, :class:`RunSettings`),
and every field passes :func:`check_setting`, so a setting means the same and is refused the same
way whichever setter it comes through: a NaN tolerance, a zero timeout or ``n_jobs=True`` is a
``ValueError``/``TypeError`` naming the setting, the value and what would be accepted. The cache
key takes every field not marked ``key=False`` (:func:`key_fields`).
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

__all__ = ["TIMING_BACKENDS", "TIMING_MODES", "CheckSettings", "CompileSettings", "RunSettings", "TimingSettings",
           "check_out_idx", "check_setting", "key_fields", "resolve_out_idx"]

TIMING_MODES = ("burst", "sustained", "back_to_back", "batched")
TIMING_BACKENDS = ("event", "cudagraph")


@dataclass(frozen=True)
class _Rule:
    kind: str  # "number", "int", "bool", "choice", "devices"
    lo: float | None = None
    lo_open: bool = False  # lo itself is refused
    hi: float | None = None
    optional: bool = False  # None is accepted
    choices: tuple[str, ...] = ()
    hint: str = ""


_RULES: dict[str, _Rule] = {
    "atol": _Rule("number", lo=0, optional=True, hint="an absolute tolerance such as 1e-2, or None for the default"),
    "rtol": _Rule("number", lo=0, optional=True, hint="a relative tolerance such as 1e-2, or None for the default"),
    "max_mismatched_ratio": _Rule("number", lo=0, hi=1, hint="the fraction of elements allowed to differ, 0 to 1"),
    "compile_timeout": _Rule("number", lo=0, lo_open=True, hint="seconds, e.g. 300"),
    "run_timeout": _Rule("number", lo=0, lo_open=True, hint="seconds, e.g. 120"),
    "timeout": _Rule("number", lo=0, lo_open=True, optional=True, hint="seconds, e.g. 300"),
    "warmup": _Rule("int", lo=0, optional=True, hint="a number of calls, e.g. 3"),
    "rep": _Rule("int", lo=1, optional=True, hint="a number of calls, e.g. 20"),
    "n_jobs": _Rule("int", lo=-1, optional=True, hint="a positive number of workers, or -1 for all cores"),
    "finalist_margin": _Rule("number", lo=0, hi=1, hint="a fraction such as 0.03 (3 per cent)"),
    "finalist_rounds": _Rule("int", lo=1, hi=100, hint="a number of rounds such as 5"),
    "max_finalists": _Rule("int", lo=1, hint="a number of candidates such as 8"),
    "sustain_s": _Rule("number", lo=0, hi=600, hint="seconds of back-to-back calls before timing, e.g. 2"),
    "skip_check": _Rule("bool"),
    "cache": _Rule("bool"),
    "progress": _Rule("bool"),
    "isolate": _Rule("bool"),
    "recheck": _Rule("bool"),
    "cache_input_tensors": _Rule("bool"),
    "timing": _Rule("choice", choices=TIMING_MODES),
    "timing_backend": _Rule("choice", choices=TIMING_BACKENDS),
    "allow_mixed_devices": _Rule("bool"),
    "devices": _Rule("devices", optional=True, hint='"all", or a list of device indices such as [0, 1]'),
}


def check_setting(name: str, value: Any) -> Any:
    """Return ``value`` normalised (``float`` for numbers) or raise naming ``name``, the value and the fix."""
    rule = _RULES[name]
    if value is None and rule.optional:
        return None
    if rule.kind == "devices":
        return _check_devices(name, value, rule.hint)
    if rule.kind == "bool":
        if not isinstance(value, bool) and type(value).__name__ != "bool_":  # numpy.bool_ is accepted
            raise TypeError(f"{name} must be True or False, got {value!r}")
        return bool(value)
    if rule.kind == "choice":
        if value not in rule.choices:
            raise ValueError(f"{name} must be one of {list(rule.choices)}, got {value!r}")
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number ({rule.hint}), got {value!r}")
    if rule.kind == "int":
        if not isinstance(value, numbers.Integral):
            raise TypeError(f"{name} must be an int ({rule.hint}), got {value!r}")
        value = int(value)
    else:
        value = float(value)
        if not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number ({rule.hint}), got {value!r}")
    if rule.lo is not None and (value < rule.lo or rule.lo_open and value == rule.lo):
        bound = f"> {rule.lo:g}" if rule.lo_open else f">= {rule.lo:g}"
        raise ValueError(f"{name} must be {bound} ({rule.hint}), got {value!r}")
    if rule.hi is not None and value > rule.hi:
        raise ValueError(f"{name} must be <= {rule.hi:g} ({rule.hint}), got {value!r}")
    if name == "n_jobs" and value == 0:
        raise ValueError(f"n_jobs must be a positive number of workers or -1 for all cores, got {value!r}")
    return value


def _check_devices(name: str, value: Any, hint: str) -> str | tuple[int, ...]:
    """``"all"`` or a non-empty tuple of distinct device indices (checked against the host at ``run``)."""
    if isinstance(value, str):
        if value != "all":
            raise ValueError(f"{name} must be {hint}, got {value!r}")
        return value
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        raise TypeError(f"{name} must be {hint}, got {value!r}; one device is a list of one: [{value!r}]")
    if not isinstance(value, Sequence):
        raise TypeError(f"{name} must be {hint}, got {value!r}")
    out = []
    for i in value:
        if isinstance(i, bool) or not isinstance(i, numbers.Integral) or i < 0:
            raise ValueError(f"{name} entries must be device indices >= 0, got {i!r} in {value!r}")
        out.append(int(i))
    if not out or len(set(out)) != len(out):
        raise ValueError(f"{name} must name at least one device, each once ({hint}), got {value!r}")
    return tuple(out)


def check_out_idx(out_idx: Any) -> list[int] | None:
    """``out_idx`` as a list of ints (checked against the kernel's parameters later, by
    :func:`resolve_out_idx`, once the parameter count is known)."""
    if out_idx is None:
        return None
    idx = [out_idx] if isinstance(out_idx, numbers.Integral) and not isinstance(out_idx, bool) else out_idx
    if isinstance(idx, (str, bytes)) or not isinstance(idx, Sequence):
        raise TypeError(f"out_idx must be an int or a list of ints (negative counts from the end), got {out_idx!r}")
    out = []
    for i in idx:
        if isinstance(i, bool) or not isinstance(i, numbers.Integral):
            raise TypeError(f"out_idx entries must be ints (negative counts from the end), got {i!r} in {out_idx!r}")
        out.append(int(i))
    if len(set(out)) != len(out):
        raise ValueError(f"out_idx {out_idx!r} names an output twice; list each output once")
    return out


def resolve_out_idx(out_idx: list[int] | None, n_params: int, what: str = "out_idx") -> list[int]:
    """Non-negative indices into ``n_params`` parameters; an index out of range is an error, never wrapped."""
    out: list[int] = []
    for i in out_idx or []:
        if not -n_params <= i < n_params:
            raise ValueError(
                f"{what} {out_idx!r}: index {i} is out of range for a kernel with {n_params} parameters "
                f"(valid: {-n_params} to {n_params - 1}); the outputs are usually the last ones, e.g. [-1]")
        j = i % n_params
        if j in out:
            raise ValueError(f"{what} {out_idx!r} names parameter {j} twice (as {i} and another index); list it once")
        out.append(j)
    return out


# ---------------------------------------------------------------------------------------------
# the typed settings objects: built (and rebuilt by the setters) through check_setting


def _keyed(default: Any, key: bool = True) -> Any:
    """A settings field; ``key=False`` marks one that cannot change which config wins or its latency."""
    return field(default=default, metadata={"key": key})


def _validate(obj: Any, names: Sequence[str]) -> None:
    for name in names:
        object.__setattr__(obj, name, check_setting(name, getattr(obj, name)))


@dataclass(frozen=True)
class CheckSettings:
    """How a candidate is run and judged: its inputs, outputs and the reference it must match."""

    out_idx: tuple[int, ...] | None = None
    supply_type: Any = None  # a check.SupplyType
    ref_prog: Callable[..., Any] | None = None
    skip_check: bool = False
    atol: float | None = None  # None: check.DEFAULT_TOL scaled to each output (check.tolerances)
    rtol: float | None = None  # None: check.DEFAULT_TOL
    max_mismatched_ratio: float = 0.0
    reset_to_zero: tuple[int | str, ...] = ()
    restore_value: tuple[int | str, ...] = ()
    supply_prog: Callable[..., Any] | None = None  # TileLang's: input params -> input tensors
    manual_check_prog: Callable[..., Any] | None = None  # TileLang's: (outputs, refs) -> raises if wrong

    def __post_init__(self) -> None:
        from .check import parse_supply_type

        _validate(self, ("skip_check", "atol", "rtol", "max_mismatched_ratio"))
        out = check_out_idx(self.out_idx)
        object.__setattr__(self, "out_idx", tuple(out) if out is not None else None)
        object.__setattr__(self, "supply_type", parse_supply_type(self.supply_type))
        for name in ("ref_prog", "supply_prog", "manual_check_prog"):
            v = getattr(self, name)
            if v is not None and not callable(v):
                raise TypeError(f"{name} must be callable, got {v!r}")
        if self.manual_check_prog is not None and self.ref_prog is None:
            raise ValueError("manual_check_prog compares the kernel's outputs with ref_prog's, and no ref_prog is "
                             "set; pass ref_prog too (or drop manual_check_prog)")
        for name in ("reset_to_zero", "restore_value"):
            object.__setattr__(self, name, _arg_names(name, getattr(self, name)))


@dataclass(frozen=True)
class TimingSettings:
    """How candidates are timed and how the finalists are decided."""

    warmup: int = 3
    rep: int = 20
    timing: str = "burst"
    timing_backend: str = "event"
    sustain_s: float = 0.5
    finalist_margin: float = 0.03
    finalist_rounds: int = 5
    max_finalists: int = 8

    def __post_init__(self) -> None:
        _validate(self, [f.name for f in fields(self)])
        if self.timing == "batched" and self.timing_backend == "cudagraph":
            raise ValueError("timing='batched' groups calls between events, and timing_backend='cudagraph' replays "
                             "captured calls with nothing between them already; use timing='back_to_back' with "
                             "timing_backend='cudagraph', or timing='batched' with timing_backend='event'")

    @property
    def candidate_mode(self) -> str:
        """How every candidate is timed (``time_callable``'s mode): back to back only under ``back_to_back`` (each
        call between two events) and ``batched`` (groups of calls between two events)."""
        return {"back_to_back": "sustained", "batched": "batched"}.get(self.timing, "burst")

    @property
    def finalist_mode(self) -> str:
        """How the finalists, and the reference they are compared with, are timed."""
        return {"burst": "burst", "batched": "batched"}.get(self.timing, "sustained")


@dataclass(frozen=True)
class CompileSettings:
    """What candidates are built for and how long one build may take."""

    target: Any = _keyed("auto", key=False)  # in the key as the resolved target, not as written
    compile_timeout: float = _keyed(300.0, key=False)
    pass_configs: tuple[tuple[str, Any], ...] | None = None

    def __post_init__(self) -> None:
        from .target import resolve_target

        if self.target is not None and not (isinstance(self.target, str) and self.target == "auto"):
            # a bad target is refused when it is set, not at run(); "auto" never is. TileLang is not imported
            # meanwhile: the plan decides that (its measuring processes may have to start first)
            resolve_target(self.target, prefetch_tilelang=False)
        _validate(self, ("compile_timeout",))
        pc = self.pass_configs
        if pc is not None and not isinstance(pc, (Mapping, tuple)):
            raise TypeError(f"pass_configs must be a dict of TileLang pass configs, got {pc!r}")
        object.__setattr__(self, "pass_configs", tuple(sorted(dict(pc).items())) if pc else None)

    @property
    def pass_config_dict(self) -> dict[str, Any] | None:
        return dict(self.pass_configs) if self.pass_configs else None


@dataclass(frozen=True)
class RunSettings:
    """How the run is carried out: none of it changes which config wins."""

    n_jobs: int | None = _keyed(None, key=False)
    backend: str | None = _keyed(None, key=False)  # "ray": compile hosts and measuring actors on Ray
    isolate: bool = _keyed(True, key=False)
    run_timeout: float = _keyed(120.0, key=False)
    cache: bool = _keyed(True, key=False)
    db_path: Any = _keyed(None, key=False)
    progress: bool = _keyed(True, key=False)
    recheck: bool = _keyed(True, key=False)
    devices: str | tuple[int, ...] | None = _keyed(None, key=False)  # None: one measuring process, as always
    allow_mixed_devices: bool = _keyed(False, key=False)

    def __post_init__(self) -> None:
        _validate(self, ("n_jobs", "isolate", "run_timeout", "cache", "progress", "recheck", "devices",
                         "allow_mixed_devices"))
        if self.devices is not None and not self.isolate:
            raise ValueError(f"devices={self.devices!r} measures in one isolated process per device; "
                             "it needs isolate=True (drop isolate=False, or devices)")
        if self.backend is not None and not isinstance(self.backend, str):
            raise TypeError(f"backend must be 'ray' or a joblib backend name such as 'loky', got {self.backend!r}")
        if self.backend == "ray" and not self.isolate:
            raise ValueError("backend='ray' measures in Ray actors, each its own process; it needs isolate=True "
                             "(drop isolate=False, or backend='ray')")
        if self.db_path is not None:
            if not isinstance(self.db_path, (str, bytes)) and not hasattr(self.db_path, "__fspath__"):
                raise TypeError(f"db_path must be a path, got {self.db_path!r}")
            object.__setattr__(self, "db_path", os.fsdecode(self.db_path))  # bytes too (pathlib takes str only)


def key_fields(*settings: Any) -> dict[str, Any]:
    """Every field of the settings objects that may change the answer, by name: the cache key's part.

    Fields are in unless marked ``key=False``, so a new setting is in the key unless someone
    decides, in its declaration, that it cannot change which config wins.
    """
    return {f"{type(s).__name__}.{f.name}": getattr(s, f.name) for s in settings for f in fields(s)
            if f.metadata.get("key", True)}


def _arg_names(what: str, value: Any) -> tuple[int | str, ...]:
    if value is None:
        return ()
    items = [value] if isinstance(value, (int, str)) else list(value)
    for v in items:
        if isinstance(v, bool) or not isinstance(v, (int, str)):
            raise TypeError(f"{what} entries must be argument indices or buffer names, got {v!r}")
    return tuple(items)

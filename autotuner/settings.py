"""One validator for every setting the AutoTuner takes, whichever setter it comes through.

``set_compile_args``, ``set_profile_args`` and ``set_tuning`` all pass their values through
:func:`check_setting`, so a setting means the same and is refused the same way everywhere: a NaN
tolerance, a zero timeout or ``n_jobs=True`` is a ``ValueError``/``TypeError`` naming the setting,
the value and what would be accepted.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["TIMING_BACKENDS", "TIMING_MODES", "check_out_idx", "check_setting", "resolve_out_idx"]

TIMING_MODES = ("burst", "sustained")
TIMING_BACKENDS = ("event", "cudagraph")


@dataclass(frozen=True)
class _Rule:
    kind: str  # "number", "int", "bool", "choice"
    lo: float | None = None
    lo_open: bool = False  # lo itself is refused
    hi: float | None = None
    optional: bool = False  # None is accepted
    choices: tuple[str, ...] = ()
    hint: str = ""


_RULES: dict[str, _Rule] = {
    "atol": _Rule("number", lo=0, hint="an absolute tolerance such as 1e-2"),
    "rtol": _Rule("number", lo=0, hint="a relative tolerance such as 1e-2"),
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
}


def check_setting(name: str, value: Any) -> Any:
    """Return ``value`` normalised (``float`` for numbers) or raise naming ``name``, the value and the fix."""
    rule = _RULES[name]
    if value is None and rule.optional:
        return None
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

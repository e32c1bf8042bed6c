"""The base of every family's config (:class:`TemplateConfig`), and how the autotuner's config dicts
reach a family's program and its check (:func:`elaborate`, :func:`check_config_dict`).

Part of the template protocol (``templates/protocol.py``, ``docs/templates.md``).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, fields
from typing import TYPE_CHECKING, Any, ClassVar

from carver.problem import int_in_range, is_bool

if TYPE_CHECKING:
    from tvm.tirx import PrimFunc

    from carver.arch import GPUArch

__all__ = ["TemplateConfig", "check_config_dict", "elaborate"]


# --------------------------------------------------------------------------------------------------
# Configs
# --------------------------------------------------------------------------------------------------
def _check_value(key: str, annotation: str, value: Any) -> Any:
    """The per-key check every family gets for free, from the field's annotation (int, bool, str)."""
    if annotation == "bool":
        if not is_bool(value):
            raise TypeError(f"{key} must be a bool, got {value!r} of type {type(value).__name__}; use True or False")
        return bool(value)
    if annotation == "int":
        return int_in_range(value, key, -(2**63), 2**63 - 1, kind="an int", fix=f"pass {key} as an int")
    if annotation == "str" and not isinstance(value, str):
        raise TypeError(f"{key} must be a str, got {value!r} of type {type(value).__name__}")
    if annotation == "float":
        if is_bool(value) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise ValueError(f"{key} must be a finite number, got {value!r}")
        return float(value)
    return value


@dataclass(frozen=True, kw_only=True)
class TemplateConfig:
    """Base of every family's config: a frozen, hashable dataclass of the kernel's tunable parameters.

    A family declares its keys as fields (those without a default must be set by every config) and may
    override :meth:`normalize` to check values with its own rules (matmul asks the carver's rule
    table). Rules between a config and the problem or the GPU belong to the family's ``check``.
    ``pass_configs`` are TileLang pass configs for this config alone (the autotuner hands them to the
    compiler, never to the kernel); they are stored as sorted pairs so the config stays hashable.

    The autotuner works on plain dicts (its cache key, its worker payload): :meth:`to_dict` and
    :meth:`from_dict` convert, once, at the edge.
    """

    pass_configs: tuple[tuple[str, Any], ...] = ()

    #: The key under which a config dict carries its pass configs (the autotuner's name).
    PASS_CONFIGS_KEY: ClassVar[str] = "pass_configs"

    def __post_init__(self) -> None:
        pc = self.pass_configs
        if isinstance(pc, Mapping):
            pc = tuple(sorted(pc.items()))
        elif not isinstance(pc, tuple) or not all(isinstance(p, tuple) and len(p) == 2 for p in pc):
            raise TypeError(f"{self.PASS_CONFIGS_KEY} must be a dict of TileLang pass configs, got {pc!r}")
        object.__setattr__(self, "pass_configs", pc)
        for key, value in type(self).normalize(self.kernel_kwargs()).items():
            object.__setattr__(self, key, value)

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        """The kernel's keyword parameters, in declaration order."""
        return tuple(f.name for f in fields(cls) if f.name != "pass_configs")

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """The keys a config may leave out, with the value that stands for them."""
        return {f.name: f.default for f in fields(cls) if f.name != "pass_configs" and f.default is not MISSING}

    @classmethod
    def normalize(cls, values: Mapping[str, Any]) -> dict[str, Any]:
        """Each key on its own, returned normalised (numpy ints as ints); a bad one is a ValueError or
        TypeError naming the key, the value and the fix. ``values`` holds every key."""
        annotations = {f.name: f.type if isinstance(f.type, str) else getattr(f.type, "__name__", "")
                       for f in fields(cls)}
        return {k: _check_value(k, annotations[k], v) for k, v in values.items()}

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> TemplateConfig:
        """A config dict (the autotuner's form, or the user's) as this dataclass: unknown and missing keys
        are refused by name; absent optional keys take their defaults."""
        if not isinstance(config, Mapping):
            raise TypeError(f"a config must be a dict, got {config!r}")
        values = dict(config)
        pc = values.pop(cls.PASS_CONFIGS_KEY, None)
        if pc is not None and not isinstance(pc, Mapping):
            raise TypeError(f"{cls.PASS_CONFIGS_KEY} must be a dict of TileLang pass configs, got {pc!r}")
        keys = cls.keys()
        unknown = [k for k in values if k not in keys]
        if unknown:
            raise ValueError(f"unknown config key(s) {unknown}; a {cls.__name__} takes {list(keys)}")
        missing = [k for k in keys if k not in values and k not in cls.defaults()]
        if missing:
            raise ValueError(f"config {values} lacks {missing}; every {cls.__name__} sets them")
        return cls(**values, pass_configs=tuple(sorted((pc or {}).items())))

    def kernel_kwargs(self) -> dict[str, Any]:
        """Every key with its value, defaults included: the kernel's keyword arguments."""
        return {k: getattr(self, k) for k in self.keys()}

    def to_dict(self) -> dict[str, Any]:
        """The autotuner's form: the keys without defaults, the others only where they differ from the
        default (so a config reads, and is keyed, as it was written), then its pass configs if any."""
        defaults = self.defaults()
        out = {k: v for k, v in self.kernel_kwargs().items() if k not in defaults or v != defaults[k]}
        if self.pass_configs:
            out[self.PASS_CONFIGS_KEY] = dict(self.pass_configs)
        return out

    def __str__(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.to_dict().items())


def check_config_dict(config_type: type[TemplateConfig], check: Callable[..., list[str]], problem: Any,
                      arch: GPUArch | None, config: Mapping[str, Any]) -> list[str]:
    """The autotuner's ``validate=``: why a config dict cannot run (empty: legal), never raising."""
    try:
        cfg = config_type.from_dict(config)
    except (TypeError, ValueError) as e:
        return [str(e)]
    return list(check(problem, cfg, arch))


def elaborate(program: Callable[..., PrimFunc], config_type: type[TemplateConfig], problem: Any,
              **config: Any) -> PrimFunc:
    """``kernel(**config)`` for the autotuner: the family's program for one config dict.

    The autotuner keys its cache on this partial's arguments, ``program`` (its source and what it
    reads) and the problem (its repr), so an edit to a family's program misses the cache.
    """
    return program(problem, config_type.from_dict(config))

"""Config lists are normalised once, at the API edge, so every later step can trust them.

A config is a plain ``dict`` of keyword arguments for the user's kernel function. We check the
whole list before anything compiles: an unknown key or a non-dict entry is a user bug, and finding
it after ten minutes of compilation would be the worst time to find it.
"""

from __future__ import annotations

import functools
import inspect
import json
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

__all__ = ["PASS_CONFIGS_KEY", "RESERVED_PARAMS", "DuplicateConfigWarning", "as_reasons", "config_index",
           "config_label", "config_to_json", "kernel_name", "normalize_configs", "same_config", "split_config"]

#: Parameters a TileLang kernel conventionally exposes for tuning.
RESERVED_PARAMS = ("block_M", "block_N", "block_K", "num_stages", "thread_num", "enable_rasterization")

#: A config may carry TileLang pass configs of its own under this key, as in TileLang's AutoTuner:
#: ``{"block_M": 128, ..., "pass_configs": {"tl.disable_warp_specialized": True}}``. They are merged
#: over ``set_compile_args(pass_configs=...)`` for that config and never passed to the kernel.
PASS_CONFIGS_KEY = "pass_configs"

_JSON_SCALARS = (bool, int, float, str, type(None))


def _normalize_pass_configs(value: Any, i: int) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise TypeError(f"configs[{i}]['pass_configs'] must be a dict of TileLang pass configs, got {value!r}")
    out = {}
    for k, v in value.items():
        name = getattr(k, "value", k)  # tilelang.PassConfigKey members
        if not isinstance(name, str) or not isinstance(v, _JSON_SCALARS):
            raise TypeError(f"configs[{i}]['pass_configs'] entry {k!r}: {v!r} must map a string key to a "
                            "bool, int, float, str or None")
        out[name] = v
    return out


def split_config(config: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """``(kernel keyword arguments, the config's own pass configs or None)``."""
    kwargs = dict(config)
    return kwargs, kwargs.pop(PASS_CONFIGS_KEY, None)


def merge_pass_configs(base: dict[str, Any] | None, own: dict[str, Any] | None) -> dict[str, Any] | None:
    """A config's own pass configs over the run's."""
    if not own:
        return base
    return {**(base or {}), **own}


def _accepted_params(kernel: Callable[..., Any]) -> set[str] | None:
    """Keyword names ``kernel`` accepts, or ``None`` when it takes ``**kwargs`` (anything goes)."""
    try:
        sig = inspect.signature(kernel)  # a functools.partial reports only its unbound parameters
    except (TypeError, ValueError):  # builtins and some C callables have no signature
        return None
    names: set[str] = set()
    for p in sig.parameters.values():
        if p.kind is inspect.Parameter.VAR_KEYWORD:
            return None
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY):
            names.add(p.name)
    return names


def normalize_configs(kernel: Callable[..., Any], configs: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Return ``configs`` as a list of plain dicts, or raise ``ValueError``/``TypeError`` naming the culprit.

    Rejected up front: a non-list or empty list, a non-dict entry, a key the kernel does not accept,
    and a value that cannot be stored in the tuning database (it must be a JSON scalar). Duplicates
    (equal after normalisation, e.g. the rasterization twins of carver hints once a TileLang-style
    loop maps both to one flag) are dropped, keeping the first, with one :class:`DuplicateConfigWarning`
    saying how many went, as TileLang's AutoTuner accepts them.
    """
    if isinstance(configs, (str, bytes, Mapping)) or not isinstance(configs, Iterable):
        raise TypeError(
            f"configs must be a list of dicts, got {type(configs).__name__}; "
            "wrap a single config as [config]"
        )
    configs = list(configs)
    if not configs:
        raise ValueError("configs is empty: give at least one config dict, e.g. [{'block_M': 128, ...}]")
    accepted = _accepted_params(kernel)
    out: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    dropped: list[tuple[int, int]] = []  # (index dropped, index it repeats)
    for i, cfg in enumerate(configs):
        if not isinstance(cfg, Mapping):
            raise TypeError(f"configs[{i}] must be a dict of kernel keyword arguments, got {cfg!r}")
        cfg = dict(cfg)
        if PASS_CONFIGS_KEY in cfg and not (accepted is not None and PASS_CONFIGS_KEY in accepted):
            cfg[PASS_CONFIGS_KEY] = _normalize_pass_configs(cfg[PASS_CONFIGS_KEY], i)
        for k, v in cfg.items():
            if not isinstance(k, str):
                raise TypeError(f"configs[{i}] has a non-string key {k!r}")
            if k == PASS_CONFIGS_KEY and isinstance(v, dict):
                continue
            if accepted is not None and k not in accepted:
                raise ValueError(
                    f"configs[{i}] has unknown key {k!r}: {kernel_name(kernel)} accepts "
                    f"{sorted(accepted)}; fix the key or add the parameter to the kernel"
                )
            if type(v).__module__ == "numpy" and hasattr(v, "item") and getattr(v, "ndim", None) == 0:
                v = cfg[k] = v.item()  # numpy scalars (np.int64 from np.arange, np.bool_) as Python's own
            if not isinstance(v, _JSON_SCALARS):
                raise TypeError(
                    f"configs[{i}][{k!r}] = {v!r} is a {type(v).__name__}; config values must be "
                    "bool, int, float, str or None so that trials can be stored and compared"
                )
        label = config_to_json(cfg)
        if label in seen:
            dropped.append((i, seen[label]))
            continue
        seen[label] = i
        out.append(cfg)
    if dropped:
        pairs = ", ".join(f"configs[{i}] = configs[{j}]" for i, j in dropped[:3])
        pairs += ", ..." if len(dropped) > 3 else ""
        warnings.warn(f"dropped {len(dropped)} duplicate config{'s' if len(dropped) > 1 else ''} of {len(configs)} "
                      f"({pairs}); tuning the {len(out)} distinct ones", DuplicateConfigWarning, stacklevel=4)
    return out


class DuplicateConfigWarning(UserWarning):
    """Some configs were equal to earlier ones and were dropped (one warning per config list)."""


def config_to_json(config: Mapping[str, Any]) -> str:
    """Canonical text of a config: the form stored in the database and hashed into cache keys."""
    return json.dumps(dict(config), sort_keys=True, separators=(",", ":"))


def same_config(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether two configs are one, by their canonical text (:func:`config_to_json`), as the database keeps
    them: 64 and 64.0, or 1 and True, are two configs (``==`` says one), and a NaN value equals itself."""
    return config_to_json(a) == config_to_json(b)


def config_index(configs: Sequence[Mapping[str, Any]], config: Mapping[str, Any]) -> int | None:
    """The position of ``config`` in ``configs`` by :func:`same_config`, or ``None``."""
    want = config_to_json(config)
    return next((i for i, c in enumerate(configs) if config_to_json(c) == want), None)


def as_reasons(verdict: Any) -> list[str]:
    """A ``validate`` callable's answer as a list of reasons: a string, an iterable of them, or a falsy
    value (legal)."""
    if not verdict:
        return []
    return [verdict] if isinstance(verdict, str) else [str(x) for x in verdict]


def config_label(config: Mapping[str, Any]) -> str:
    """Short human label for logs and tables, reserved parameters first."""
    keys = [k for k in RESERVED_PARAMS if k in config] + sorted(k for k in config if k not in RESERVED_PARAMS)
    short = {"block_M": "M", "block_N": "N", "block_K": "K", "num_stages": "st", "thread_num": "thr",
             "enable_rasterization": "ras"}
    return " ".join(f"{short.get(k, k)}={config[k]}" for k in keys)


def kernel_name(kernel: Callable[..., Any]) -> str:
    """A kernel factory's name in logs and the tuning database: its own ``kernel_name`` attribute when it
    has one (a template names the partial it tunes after its family), else ``module.qualname`` of the
    function under any ``functools.partial``."""
    named = getattr(kernel, "kernel_name", None)
    if isinstance(named, str):
        return named
    inner = kernel
    while isinstance(inner, functools.partial):
        inner = inner.func
    return f"{getattr(inner, '__module__', '?')}.{getattr(inner, '__qualname__', repr(inner))}"

"""Keyed, bucketed tuning: one kernel called at many shapes, a tuned config per key.

A :class:`KeyedKernel` wraps a kernel factory ``fn(**key, **config) -> T.prim_func`` whose *key*
parameters (``M``, ``N``, ``dtype``...) change the best config. Called with the kernel's arguments,
it computes the key (``key_of(*args)``), maps bucketed keys to their bucket's edge
(:mod:`.buckets`), finds the config for that bucket key, compiles it once (cached in memory and in
TileLang's disk cache) and runs it. Where the config comes from, first match wins:

1. a loaded tuned table (:func:`use_table`, :mod:`.table`): authoritative; with a table loaded, a
   key it lacks goes straight to 3, so that every rank given the same table runs the same kernels;
2. (no table) the tuning database: the winner a past :meth:`KeyedKernel.tune` stored;
3. (no table, ``tune_on_miss=True``, not inside CUDA-graph capture) tune it now;
4. the fallback: ``default`` or the first of ``configs(key)`` (a template's carver top-1), compiled
   without timing anything, logged once per key at INFO and counted (:func:`untuned`).

Compilation: a key listed in ``dynamic`` is compiled as a symbolic dimension (``T.dynamic``), so one
kernel serves every value in its bucket; any other key is compiled for its exact value on first use,
from its bucket's config, without timing. The kernel is tuned at the bucket's edge.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import numbers
import sqlite3
import threading
import weakref
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .buckets import Buckets, as_buckets
from .cache import TuningDB, db_file, function_fingerprint
from .compile import tl_compile
from .config import as_reasons, config_label, merge_pass_configs, normalize_configs, split_config
from .errors import KeyRefused, TuningCacheError, TuningError
from .scratch import input_positions, positions
from .table import Entry, KernelSection, TableError, TunedTable, load_table, typed_key

__all__ = ["KeyedKernel", "add_listener", "capturing", "keyed_kernel", "remove_listener", "tune_keys", "untuned",
           "use_table"]

logger = logging.getLogger(__name__)

_REGISTRY: weakref.WeakSet[KeyedKernel] = weakref.WeakSet()
_LISTENERS: list[Callable[[KeyedKernel, dict[str, Any]], None]] = []
_TABLE: list[TunedTable | None] = [None]  # the process-wide table (use_table)
_SERVING_ONLY = ("reset_to_zero", "restore_value")
_NO_SECTION_WARNED: set[tuple[str, str, str]] = set()  # (table path, created, kernel name), warned once


def capturing() -> bool:
    """Is a CUDA graph being captured on the current stream? Nothing is tuned then."""
    import torch

    return torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing()  # no capture before CUDA starts


def add_listener(fn: Callable[[KeyedKernel, dict[str, Any]], None]) -> None:
    """Call ``fn(kernel, bucket_key)`` on every keyed call (:mod:`.record` uses it)."""
    _LISTENERS.append(fn)


def remove_listener(fn: Callable[[KeyedKernel, dict[str, Any]], None]) -> None:
    _LISTENERS.remove(fn)


def _params(fn: Callable[..., Any]) -> list[str] | None:
    import inspect

    try:
        ps = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_KEYWORD for p in ps):
        return None
    return [p.name for p in ps if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def _key_value(name: str, v: Any, kernel: str = "") -> Any:
    """A key value as stored: ints for sizes (numpy and torch ints too), "float16" for a torch dtype."""
    if isinstance(v, (bool, str)):
        return v
    module = type(v).__module__ or ""
    if module == "torch" or module.startswith("torch."):
        import torch

        if isinstance(v, torch.dtype):
            return str(v).removeprefix("torch.")
        if isinstance(v, torch.Tensor):  # it has is_floating_point too: once taken for a dtype, "tensor(64)"
            raise TypeError(f"{kernel + ': ' if kernel else ''}key {name!r} is a tensor ({v!r}); key values must be "
                            "ints, strings, bools or torch dtypes: pass an int, e.g. x.shape[0] (or int(t) for a "
                            "one-element tensor) in key_of")
    try:
        if int(v) == v:
            return int(v)
    except (TypeError, ValueError):
        pass
    raise TypeError(f"{kernel + ': ' if kernel else ''}key {name!r} has value {v!r} of type {type(v).__name__}; key "
                    "values must be ints, strings, bools or torch dtypes")


def _values(ident: tuple) -> tuple:
    """The key values of a :func:`.table.typed_key` (the type-strict dict key: ``True`` is not ``1``)."""
    return tuple(v for _, v in ident)


def _bool_like(v: Any) -> bool:
    """Could ``v`` equal a bool in a dict lookup (a 0 or a 1, or a bool)? Fast-path entries holding one check
    the call's types on a hit; the others cannot be hit by a call with a bool, nor hold one."""
    return isinstance(v, numbers.Number) and (v == 0 or v == 1)


class KeyedKernel:
    """A kernel tuned per key (see the module docstring). ``kk(*args)`` runs it; ``kk.tune(key)`` tunes a key.

    * ``fn``: ``fn(**key, **config)`` returns a ``T.prim_func``; ``key`` names parameters of ``fn``.
    * ``configs``: the candidates, a list of config dicts or ``configs(key) -> list`` (best guess first).
    * ``key_of(*args) -> {name: value}``: the key of a call's arguments (needed to call ``kk(*args)``).
    * ``buckets``: ``{name: "pow2" | list of edges | Buckets}`` for integer keys; others are exact.
    * ``dynamic``: bucketed keys to compile symbolically (the kernel must handle any value in a bucket).
    * ``default``: the fallback config, a dict or ``default(key) -> dict``; else ``configs(key)[0]``.
    * ``name``: the kernel's name in tables and logs (default ``module.qualname`` of ``fn``).
    * ``compile_args``/``tuning_args``: for ``AutoTuner.set_compile_args``/``set_tuning``; ``target``
      and ``out_idx`` also decide how served kernels are compiled. ``warmup``, ``rep``: for ``run``.
    * ``validate(key, config)``: reasons a config cannot run at that key (dropped before compiling).
    * ``refine(exact, bucket, config)``: for a call whose bucketed values are not their bucket's edge, a
      config to serve at that exact key instead of the bucket's own ``config`` (tuned, from a table, or the
      fallback), or ``None`` to serve the bucket's. It must be a pure function of its arguments (every rank
      serves the same kernels from the same table) and must not time anything; a config it names is checked
      with ``validate`` at the exact key, compiled once per bucket and config (dynamic keys) and checked
      against the reference like any served kernel; one that fails to compile or to match leaves its keys to
      the bucket's config, and during a CUDA-graph capture an unchecked one gives way to the bucket's checked
      kernel. The matmul op uses it to step off a wave cliff between two edges (``templates.matmul.op``).
    """

    def __init__(self, fn: Callable[..., Any], key: Sequence[str],
                 configs: Sequence[Mapping[str, Any]] | Callable[[dict[str, Any]], Sequence[Mapping[str, Any]]], *,
                 key_of: Callable[..., Mapping[str, Any]] | None = None, buckets: Mapping[str, Any] | None = None,
                 dynamic: Iterable[str] = (), default: Any = None, name: str | None = None,
                 compile_args: Mapping[str, Any] | None = None, tuning_args: Mapping[str, Any] | None = None,
                 warmup: int = 3, rep: int = 20, tune_on_miss: bool = False,
                 validate: Callable[[dict[str, Any], dict[str, Any]], Any] | None = None,
                 refine: Callable[[dict[str, Any], dict[str, Any], dict[str, Any]], Any] | None = None) -> None:
        from .tuner import AutoTuner

        if not callable(fn):
            raise TypeError(f"fn must be a kernel factory returning a T.prim_func, got {fn!r}")
        if isinstance(key, str) or not all(isinstance(k, str) for k in key) or not key:
            raise TypeError(f"key must be a non-empty list of parameter names such as ['M', 'N'], got {key!r}")
        self.fn, self.key = fn, tuple(key)
        params = _params(fn)
        for k in self.key:
            if params is not None and k not in params:
                raise ValueError(f"key {k!r} is not a parameter of {self._fn_name()}; its parameters are {params}")
        if len(set(self.key)) != len(self.key):
            raise ValueError(f"key {list(key)} names a parameter twice")
        self.buckets: dict[str, Buckets] = {}
        for k, spec in (buckets or {}).items():
            if k not in self.key:
                raise ValueError(f"buckets names {k!r}, which is not in the key {list(self.key)}")
            self.buckets[k] = as_buckets(k, spec)
        self.dynamic = tuple(dynamic)
        for k in self.dynamic:
            if k not in self.buckets:
                raise ValueError(f"dynamic key {k!r} must be bucketed (one symbolic kernel serves a bucket); add "
                                 f"buckets={{{k!r}: 'pow2'}} or drop it from dynamic")
        if not (callable(configs) or isinstance(configs, Sequence)) or isinstance(configs, (str, bytes)):
            raise TypeError(f"configs must be a list of config dicts or a callable configs(key) -> list, "
                            f"got {configs!r}")
        for c in ([] if callable(configs) else configs):
            clash = sorted(set(c) & set(self.key))
            if clash:
                raise ValueError(f"config {dict(c)!r} sets key parameter(s) {clash}; keys come from the call")
        if refine is not None and not callable(refine):
            raise TypeError(f"refine must be a callable refine(exact, bucket, config) -> config or None, "
                            f"got {refine!r}")
        self.configs, self.key_of, self.default, self.validate = configs, key_of, default, validate
        self.refine = refine
        self.name = name or self._fn_name()
        self.compile_args, self.tuning_args = dict(compile_args or {}), dict(tuning_args or {})
        for k in _SERVING_ONLY:
            if self.compile_args.get(k):
                raise ValueError(f"compile_args {k}= is not supported by KeyedKernel: served kernels allocate their "
                                 "outputs through TileLang (uninitialised); zero or restore them in the kernel")
        # refuse bad settings now, not at the first tune: the same validators as AutoTuner's
        AutoTuner(fn, [{}]).set_compile_args(**self.compile_args).set_tuning(**self.tuning_args)
        self.warmup, self.rep, self.tune_on_miss = warmup, rep, tune_on_miss
        self.table: TunedTable | None = None  # this kernel's own table; else the process-wide one
        self.stats: Counter[str] = Counter()  # table / database / tuned / fallback keys, compiles
        self._chosen: dict[tuple, tuple[dict[str, Any], str, float | None]] = {}
        self._compiled: dict[tuple, tuple[dict[str, Any], Any]] = {}  # by exact (dynamic: bucket) key
        self._untuned: dict[tuple, int] = {}
        self._unchecked: set[tuple] = set()  # compiled during CUDA-graph capture: checked at the next call
        self._refused: dict[tuple, tuple[dict[str, Any], str]] = {}  # failed _check_served: (config, why)
        # refine: an exact key -> (the bucket's choice it was refined from, what is served); and one tuple per
        # (bucket, refined config), so that the compiled-kernel cache's identity checks hold across exact keys
        self._refined: dict[tuple, tuple[tuple, tuple]] = {}
        self._variants: dict[tuple, tuple[dict[str, Any], str, float | None]] = {}
        self._warm: dict[tuple, tuple[dict[str, Any], Any]] = {}  # precompile's kernels, not yet checked or served
        # the call's own key values -> (kernel, its bucket if a fallback serves it), while nothing is recording
        self._fast: dict[tuple, tuple[Any, tuple | None, tuple | None]] = {}  # + the call's types if bool-like
        self._section: tuple[TunedTable, KernelSection | None] | None = None
        self._source: str | None = None
        self._target: Any = None
        self._lock = threading.RLock()
        self._unreadable: set[str] = set()  # tuning databases it could not read, warned about once
        self._warned: set[tuple] = set()  # refine's warnings, once per bucket and cause
        _REGISTRY.add(self)

    def _fn_name(self) -> str:
        f = getattr(self.fn, "func", self.fn)
        return f"{getattr(f, '__module__', '?')}.{getattr(f, '__qualname__', repr(f))}"

    def __repr__(self) -> str:
        return f"KeyedKernel({self.name!r}, key={list(self.key)})"

    # ------------------------------------------------------------------ keys
    def make_key(self, key: Mapping[str, Any]) -> dict[str, Any]:
        """``key`` checked (exactly the key's names) and bucketed: bucketed values become their edge."""
        return self._bucket(self._exact(key))

    def _exact(self, key: Mapping[str, Any]) -> dict[str, Any]:
        if not isinstance(key, Mapping) or len(key) != len(self.key) or any(k not in key for k in self.key):
            got = sorted(key) if isinstance(key, Mapping) else key
            raise ValueError(f"{self.name}: a key must have exactly the names {list(self.key)}, got {got!r}")
        return {k: _key_value(k, key[k], self.name) for k in self.key}

    def _bucket(self, exact: dict[str, Any]) -> dict[str, Any]:
        out = dict(exact)
        for k, b in self.buckets.items():
            out[k] = b.bucket(out[k], key=k, kernel=self.name)
        return out

    def source(self) -> str:
        """A hash of the kernel factory (source, closures, globals it reads): a table's kernel identity."""
        if self._source is None:
            blob = json.dumps(function_fingerprint(self.fn, set(), 0), sort_keys=True, default=str)
            self._source = hashlib.sha256(blob.encode()).hexdigest()
        return self._source

    # ------------------------------------------------------------------ serving
    def __call__(self, *args: Any) -> Any:
        if self.key_of is None:
            raise TypeError(f"{self.name}: calling a KeyedKernel with arguments needs key_of=...; or call "
                            "kernel_for(key)(*args)")
        return self.kernel_for(self.key_of(*args))(*args)

    def kernel_for_values(self, values: tuple) -> Any:
        """:meth:`kernel_for` with the key's values in the order of ``self.key`` (a caller on a hot path
        that already has them, e.g. the matmul op): the same kernel, the same counting, one dict fewer."""
        fast = self._fast.get(values) if not _LISTENERS else None
        if fast is None or fast[2] is not None and tuple(map(type, values)) != fast[2]:
            return self.kernel_for(dict(zip(self.key, values)))
        return self._served_fast(fast)

    def _served_fast(self, fast: tuple[Any, tuple | None, tuple | None]) -> Any:
        """The kernel of a fast-path entry; a fallback is still counted per call (autotuner.untuned())."""
        kernel, untuned = fast[0], fast[1]
        if untuned is not None:
            with self._lock:
                self._untuned[untuned] = self._untuned.get(untuned, 0) + 1
        return kernel

    def kernel_for(self, key: Mapping[str, Any]) -> Any:
        """The compiled kernel for an exact ``key`` (compiling it on first use; never timing)."""
        try:
            raw = tuple(key[k] for k in self.key)
            fast = self._fast.get(raw) if not _LISTENERS and len(key) == len(self.key) else None
            if fast is not None and fast[2] is not None and tuple(map(type, raw)) != fast[2]:
                fast = None  # a bool where an int was stored, or the other way round: True == 1 in a dict
        except (KeyError, TypeError):  # a missing name or an unhashable value: the slow path says what is wrong
            fast = raw = None
        if fast is not None:
            return self._served_fast(fast)
        exact = self._exact(key)
        b = self._bucket(exact)
        for listener in list(_LISTENERS):
            listener(self, b)
        bt = typed_key(b.values())
        chosen = self._chosen.get(bt)
        if chosen is None or chosen[1] == "fallback":
            with self._lock:
                chosen = self._chosen.get(bt) or self._choose(b)
                if chosen[1] == "fallback":
                    self._untuned[bt] = self._untuned.get(bt, 0) + 1
        self._check_beyond_edge(exact, b, chosen)
        served = self._served(exact, b, bt, chosen)
        ck = self._compile_key(exact, b, chosen, served)
        hit = self._compiled.get(ck)
        if hit is not None and hit[0] is served[0] and ck not in self._unchecked:
            return hit[1]
        if served is not chosen and capturing():
            # a refined kernel cannot be checked during a capture: the bucket's kernel, checked already (a warm-up
            # at another M of the bucket), serves this call, and the refined one waits for a call outside it
            base = self._compile_key(exact, b, chosen, chosen)
            own = self._compiled.get(base)
            if own is not None and own[0] is chosen[0] and base not in self._unchecked:
                return own[1]
        with self._lock:
            refused = self._refused.get(ck)
            if refused is not None and refused[0] is served[0]:  # checked and found wrong: not compiled again
                if served is not chosen:
                    return self._unrefine(key, exact, chosen)
                raise KeyRefused(refused[1])
            hit = self._compiled.get(ck)
            try:
                if hit is None or hit[0] is not served[0]:
                    warm = self._warm.pop(ck, None)
                    jit = warm[1] if warm is not None and warm[0] == served[0] else self._compile(exact, served[0])
                    self._unchecked.discard(ck)  # another config's state; a capture now marks this one again
                    self._check_served(jit, exact, served, ck)
                    hit = (served[0], jit)
                    self._compiled[ck] = hit
                elif ck in self._unchecked and not capturing():  # compiled during a capture: checked now
                    self._check_served(hit[1], exact, served, ck)
                    self._unchecked.discard(ck)
            except Exception as e:
                transient = getattr(e, "transient", False)
                if served is not chosen and not transient:
                    # a refined kernel that does not compile or does not match the reference: never again, and
                    # the bucket's own config serves the keys refined to it (a refinement costs speed, not answers)
                    self._compiled.pop(ck, None)
                    self._unchecked.discard(ck)
                    self._refused[ck] = (served[0], f"{type(e).__name__}: {e}")
                    logger.warning("%s: the config %s refined for %s failed (%s: %s); the bucket's %s config "
                                   "serves the keys refined to it", self.name, config_label(served[0]), exact,
                                   type(e).__name__, str(e)[:500], chosen[1])
                    return self._unrefine(key, exact, chosen)
                if not isinstance(e, KeyRefused):
                    raise
                # never served, now or later, while this config is chosen for the key
                self._compiled.pop(ck, None)
                self._unchecked.discard(ck)
                if not transient:
                    self._refused[ck] = (served[0], str(e))
                raise
            if ck in self._unchecked:  # still unchecked, so still capturing: a graph would replay it unchecked
                err = KeyRefused(f"{self.name}: the kernel for {exact} ({served[1]} config {config_label(served[0])}) "
                                 f"is not checked against the reference yet, and a CUDA graph is being captured, "
                                 f"when no check can run; it is not put into the graph unchecked. Call it once "
                                 f"with these shapes before the capture (a warm-up), and it is checked then")
                err.transient = True
                raise err
            # only if no use_table, tune or forget replaced the choice meanwhile (it cleared the fast path)
            if raw is not None and self._chosen.get(bt) is chosen:
                self._fast[raw] = (hit[1], bt if chosen[1] == "fallback" else None,
                                   tuple(map(type, raw)) if any(map(_bool_like, raw)) else None)
        return hit[1]

    def _unrefine(self, key: Mapping[str, Any], exact: dict[str, Any], chosen: tuple) -> Any:
        """Serve the exact key with its bucket's choice from now on (its refined kernel failed); this call
        was counted once already (``untuned``)."""
        self._refined[typed_key(exact.values())] = (chosen, chosen)
        bt = typed_key(self._bucket(exact).values())
        if chosen[1] == "fallback" and self._untuned.get(bt):
            self._untuned[bt] -= 1
        return self.kernel_for(key)

    def _warn_once(self, ident: tuple, msg: str, *args: Any) -> None:
        if ident not in self._warned:
            self._warned.add(ident)
            logger.warning(msg, *args)

    def _compile_key(self, exact: dict[str, Any], b: dict[str, Any], chosen: tuple, served: tuple) -> tuple:
        """The compiled-kernel cache's key: the bucket's edge for dynamic keys, else the exact value; and the
        config where a refinement serves one beside the bucket's own."""
        ck = typed_key(b[k] if k in self.dynamic else exact[k] for k in self.key)
        return ck + (("refined", config_label(served[0])),) if served is not chosen else ck

    def _resolve(self, key: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any], tuple, tuple]:
        """``(exact key, bucket key, the bucket's choice, what serves the exact key)``, without compiling."""
        exact = self._exact(key)
        b = self._bucket(exact)
        bt = typed_key(b.values())
        with self._lock:
            chosen = self._chosen.get(bt) or self._choose(b, tune=False)
        self._check_beyond_edge(exact, b, chosen)  # KeyRefused: the call would not be served either
        return exact, b, chosen, self._served(exact, b, bt, chosen)

    def served_config(self, key: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
        """``(config, where it came from)`` that serves the exact ``key``, without compiling: the bucket's
        (:meth:`config_for`), or what ``refine`` put in its place (its source says from which)."""
        served = self._resolve(key)[3]
        return dict(served[0]), served[1]

    def precompile(self, keys: Iterable[Mapping[str, Any]], jobs: int = 4) -> int:
        """Compile, ``jobs`` at a time (threads), every kernel that serving ``keys`` will need and is not
        compiled yet, so that a model's first forward does not compile them one after another. Nothing is
        served, tuned or timed here: each kernel is checked against the reference at its first call, as
        always. A kernel that fails to compile is logged and left to its first call (which raises, or serves
        the bucket's config where it was a refinement). Returns how many were compiled."""
        from concurrent.futures import ThreadPoolExecutor

        todo: dict[tuple, tuple[dict[str, Any], dict[str, Any]]] = {}
        for key in keys:
            try:
                exact, b, chosen, served = self._resolve(key)
            except KeyRefused as e:  # beyond the last edge, where its config cannot run: its calls go elsewhere
                logger.info("%s: precompile: nothing to compile for %s: %s", self.name, dict(key), e)
                continue
            ck = self._compile_key(exact, b, chosen, served)
            hit, refused = self._compiled.get(ck), self._refused.get(ck)
            if (hit is None or hit[0] is not served[0]) and ck not in self._warm and \
                    (refused is None or refused[0] != served[0]):
                todo.setdefault(ck, (exact, served[0]))

        def build(item: tuple) -> tuple:
            ck, (exact, config) = item
            try:
                return ck, config, self._compile(exact, config)
            except Exception as e:  # one bad kernel does not cost the others theirs
                logger.warning("%s: precompile: the config %s for %s does not compile (%s: %s)", self.name,
                               config_label(config), exact, type(e).__name__, str(e)[:500])
                return ck, config, None

        with ThreadPoolExecutor(max(1, jobs)) as pool:
            built = [r for r in pool.map(build, todo.items()) if r[2] is not None]
        with self._lock:
            for ck, config, jit in built:
                self._warm[ck] = (config, jit)
        return len(built)

    def _served(self, exact: dict[str, Any], b: dict[str, Any], bt: tuple, chosen: tuple) -> tuple:
        """What serves the exact key: the bucket's ``chosen`` ``(config, source, latency)``, or the config
        ``refine`` names for it (decided once per exact key and choice). A refinement that raises, that
        ``validate`` refuses at the exact key, or that names the bucket's own config serves ``chosen``."""
        if self.refine is None or exact == b:
            return chosen
        et = typed_key(exact.values())
        hit = self._refined.get(et)
        if hit is not None and hit[0] is chosen:
            return hit[1]
        with self._lock:
            hit = self._refined.get(et)  # another thread may have decided it meanwhile
            if hit is not None and hit[0] is chosen:
                return hit[1]
            served = chosen
            try:
                want = self.refine(dict(exact), dict(b), dict(chosen[0]))
                if want is not None:
                    clash = sorted(set(want) & set(self.key)) if isinstance(want, Mapping) else []
                    if clash:
                        raise ValueError(f"the config {dict(want)!r} sets key parameter(s) {clash}; keys come from "
                                         "the call")
                    cfg = normalize_configs(functools.partial(self.fn, **exact), [want])[0]
                    reasons = as_reasons(self.validate(dict(exact), dict(cfg))) if self.validate else []
                    if reasons:
                        self._warn_once((bt, "refused", config_label(cfg)), "%s: refine named %s for %s, which "
                                        "cannot run there (%s); serving the bucket's %s config", self.name,
                                        config_label(cfg), exact, "; ".join(reasons), chosen[1])
                    elif cfg != chosen[0]:
                        vt = (bt, config_label(cfg), chosen[1])
                        served = self._variants.get(vt)
                        if served is None or served[0] != cfg:
                            served = (cfg, f"refined (from the {chosen[1]} config of {b})", None)
                            self._variants[vt] = served
                            logger.info("%s: %s is served by %s, refined from the %s config %s of its bucket %s",
                                        self.name, exact, config_label(cfg), chosen[1], config_label(chosen[0]), b)
                        self.stats["refined"] += 1
            except Exception as e:  # a faulty refine costs speed, never an answer: the bucket's config serves
                self._warn_once((bt, "raised", type(e).__name__), "%s: refine(%s, %s, ...) raised %s: %s; serving "
                                "the bucket's %s config (said once per bucket and error type)", self.name, exact, b,
                                type(e).__name__, e, chosen[1])
            self._refined[et] = (chosen, served)
        return served

    def _check_served(self, jit: Any, exact: dict[str, Any], chosen: tuple, ck: tuple) -> None:
        """A kernel about to be served, checked once against ``compile_args["ref_prog"]`` (where one is given)
        on inputs of this call's exact key: what is served is not what was tuned (a symbolic-M compile of a
        config measured at a bucket's edge, a table's entry, the untimed fallback), and a wrong one must not
        be. Not during CUDA-graph capture (nothing may run then: that compile is checked at its first call
        outside; :meth:`kernel_for` refuses it meanwhile, with a transient :class:`KeyRefused`, so that no graph
        holds a kernel nobody checked). :class:`KeyRefused` (the matmul op answers it with F.linear) naming the
        config when it fails."""
        ref_prog = self.compile_args.get("ref_prog")
        if ref_prog is None or self.compile_args.get("skip_check"):
            return
        device = self.target().device
        if device == "cuda":
            import torch

            if not torch.cuda.is_available():  # compiled for a GPU this machine lacks: it cannot run here either
                return
        if capturing():
            self._unchecked.add(ck)
            return
        params = list(jit.params)
        outs_at = [int(i) % len(params) for i in (getattr(jit, "out_idx", None) or [])]  # TileLang's, normalised
        try:
            shaped = [_Shaped([exact[str(d)] if str(d) in exact else int(d) for d in p.shape], p.dtype) for p in params]
        except (TypeError, ValueError):  # a size derived from a key (M * 2): no inputs to make for it here
            logger.info("%s: not checking the kernel served at %s: a parameter's size is an expression of the key",
                        self.name, exact)
            return
        import torch

        try:
            self._run_served_check(jit, exact, chosen, params, outs_at, shaped, device, ref_prog)
        except torch.cuda.OutOfMemoryError as e:  # no room for the check's inputs: not served unchecked
            err = KeyRefused(f"{self.name}: no GPU memory to check the kernel served at {exact} before serving "
                             f"it ({e}); this call is refused, a later one checks again")
            err.transient = True
            raise err from e

    def _run_served_check(self, jit: Any, exact: dict[str, Any], chosen: tuple, params: list, outs_at: list[int],
                          shaped: list, device: str, ref_prog: Any) -> None:
        from .check import (
            compare,
            make_args,
            needs_second_poison,
            parse_supply_type,
            poisoned_allocations,
            run_reference,
        )

        scratch = positions(jit)
        args = make_args(shaped, outs_at + scratch, parse_supply_type(self.compile_args.get("supply_type")), device,
                         seed=7)
        ins = [args[i] for i in input_positions(len(args), outs_at, scratch)]
        refs = run_reference(ref_prog, [a.clone() for a in ins], len(outs_at), [tuple(args[i].shape) for i in outs_at])
        made = sorted(set(outs_at + scratch))  # what the launcher allocates, in parameter order
        for second in (False, True):  # the second poison where an unwritten element could pass the first
            with poisoned_allocations([(args[i].shape, args[i].dtype) for i in made], device, second) as verified:
                got = jit(*ins)
            got = list(got) if isinstance(got, (list, tuple)) else [got]
            if not verified(got):
                logger.info("%s: the outputs of the kernel served at %s could not be made to start as poison for "
                            "its check (its launcher allocates them another way); checked as allocated",
                            self.name, exact)
            res = compare(got, refs, self.compile_args.get("atol"), self.compile_args.get("rtol"),
                          self.compile_args.get("max_mismatched_ratio") or 0.0)
            if not res.ok or second or not needs_second_poison(got, refs):
                break
        self.stats["served checks"] += 1
        if not res.ok:
            raise KeyRefused(f"{self.name}: the {chosen[1]} config {config_label(chosen[0])} does not match the "
                             f"reference at {exact} as served ({res.detail}); it is not served. Re-tune this key "
                             f"(or drop its table entry)")

    def _check_beyond_edge(self, exact: dict[str, Any], b: dict[str, Any], chosen: tuple) -> None:
        """A bucket's config was checked (``validate``) at the bucket's edge; a key beyond the last edge
        (larger than any edge) is checked at its own values before it is served, e.g. for a launch grid
        over CUDA's limit. :class:`KeyRefused` when ``validate`` refuses it."""
        if self.validate is None or not any(isinstance(exact[k], int) and exact[k] > b[k] for k in self.buckets):
            return
        reasons = as_reasons(self.validate(dict(exact), dict(chosen[0])))
        if reasons:
            raise KeyRefused(f"{self.name}: the config {config_label(chosen[0])} serving the bucket {b} cannot run "
                             f"at {exact}: {'; '.join(reasons)}")

    def config_for(self, key: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
        """``(config, where it came from)`` for ``key``, without compiling: table, database, tuned or fallback."""
        b = self.make_key(key)
        with self._lock:
            chosen = self._chosen.get(typed_key(b.values())) or self._choose(b)
        return dict(chosen[0]), chosen[1]

    def _choose(self, b: dict[str, Any], tune: bool = True) -> tuple[dict[str, Any], str, float | None]:
        """The bucket's ``(config, source, latency)``: table, database, a tune (``tune_on_miss``; with ``tune``
        False the fallback, not remembered, so that the first call still tunes) or the fallback."""
        bt = typed_key(b.values())
        table, section = self._table_section()
        chosen: tuple[dict[str, Any], str, float | None] | None = None
        if table is not None:
            entry = section.lookup(b) if section is not None else None
            if entry is not None:
                chosen = (self._checked(entry, b, table), "table", entry.latency_ms)
        else:
            stored = self._stored(b)
            if stored is not None:
                chosen = (stored[0], "database", stored[1])
            elif self.tune_on_miss and not capturing() and not tune:
                return (self._fallback(b), "fallback", None)
            elif self.tune_on_miss and not capturing():
                self.tune(b)
                return self._chosen[bt]
            elif self.tune_on_miss:
                logger.info("%s: not tuning %s inside CUDA-graph capture; using the fallback", self.name, b)
        if chosen is None:
            chosen = (self._fallback(b), "fallback", None)
            logger.info("%s: no tuned config for %s; using the fallback %s without timing (listed by "
                        "autotuner.untuned(); tune offline with autotuner.record())", self.name, b,
                        config_label(chosen[0]))
        self.stats[chosen[1]] += 1
        self._chosen[bt] = chosen
        return chosen

    def _checked(self, entry: Entry, b: dict[str, Any], table: TunedTable) -> dict[str, Any]:
        try:
            return normalize_configs(functools.partial(self.fn, **b), [entry.config])[0]
        except (TypeError, ValueError) as e:
            raise TableError(f"{table.path}: the config for {self.name} at {b} is not one the kernel takes: {e}") from e

    def _table_section(self) -> tuple[TunedTable | None, KernelSection | None]:
        table = self.table or _TABLE[0]
        if table is None:
            return None, None
        if self._section is None or self._section[0] is not table:
            section = self._check_table(table)
            if section is None:
                self._warn_no_section(table)
            self._section = (table, section)
        return self._section

    def _warn_no_section(self, table: TunedTable) -> None:
        """Warn once per (table, kernel) that ``table`` serves this kernel nothing, naming what it does hold."""
        ident = (table.path, table.created, self.name)
        if ident in _NO_SECTION_WARNED:
            return
        _NO_SECTION_WARNED.add(ident)
        have = [f"{n} (key {list(s.key)})" for n, s in table.kernels.items()]
        same = [n for n, s in table.kernels.items() if s.source == self.source()]
        hint = (f"; its section {same[0]!r} has this kernel's source: was the kernel renamed? give it "
                f"name={same[0]!r}" if same else "; record and tune this kernel and write a table that has it")
        logger.warning("%s: the table %s has no section for this kernel (key %s), so every key of it uses the "
                       "fallback; the table holds %s%s", self.name, table.path, list(self.key),
                       ", ".join(have) or "no kernels", hint)

    def _compile(self, exact: dict[str, Any], config: dict[str, Any]) -> Any:
        import tilelang.language as T

        shape = {k: T.dynamic(k) if k in self.dynamic else exact[k] for k in self.key}
        kwargs, own = split_config(config)
        with self._lock:  # precompile's threads count too
            self.stats["compiles"] += 1
        # TileLang's C adapter does not check shared symbolic sizes (served.ServedKernel says why)
        return tl_compile(self.fn(**shape, **kwargs), self.target().spec,
                          merge_pass_configs(self.compile_args.get("pass_configs"), own),
                          out_idx=self.compile_args.get("out_idx"), serve=True,
                          check_dims=bool(self.dynamic) and self.target().kind != "cuda")

    def target(self) -> Any:
        """The resolved target (``compile_args["target"]``, default "auto"), resolved once."""
        if self._target is None:
            from .target import resolve_target

            self._target = resolve_target(self.compile_args.get("target", "auto"))
        return self._target

    # ------------------------------------------------------------------ candidates, database, tuning
    def candidates(self, b: dict[str, Any]) -> list[dict[str, Any]]:
        raw = self.configs(dict(b)) if callable(self.configs) else self.configs
        return normalize_configs(functools.partial(self.fn, **b), [getattr(c, "to_dict", lambda c=c: c)() for c in raw])

    def _fallback(self, b: dict[str, Any]) -> dict[str, Any]:
        d = self.default(dict(b)) if callable(self.default) else self.default
        cfg = self.candidates(b)[0] if d is None else d
        return normalize_configs(functools.partial(self.fn, **b), [getattr(cfg, "to_dict", lambda: cfg)()])[0]

    def tuner(self, key: Mapping[str, Any]) -> Any:
        """The configured ``AutoTuner`` for ``key``'s bucket (tuned at the bucket's edge)."""
        from .tuner import AutoTuner

        b = self.make_key(key)
        validate = functools.partial(self.validate, dict(b)) if self.validate else None
        return (AutoTuner.from_kernel(functools.partial(self.fn, **b), self.candidates(b), validate)
                .set_compile_args(**self.compile_args).set_tuning(**self.tuning_args))

    def _stored(self, b: dict[str, Any], strict: bool = False) -> tuple[dict[str, Any], float | None] | None:
        """The database's winner for bucket ``b`` as ``(config, latency)``, or ``None``. The file is only read:
        a serving process creates no database where there is none (a model on a read-only filesystem, a
        serving host), and one it cannot read is logged once and served without (the fallback); ``strict``
        (writing a table, :meth:`section`) raises :class:`.errors.TuningCacheError` instead, since leaving
        the key out would lose its tuned config silently."""
        tuner = self.tuner(b)
        if not tuner.run_settings.cache:
            return None
        path = db_file(tuner.run_settings.db_path)
        if not path.is_file():
            return None
        try:
            db = TuningDB(path, readonly=True)
            try:
                stored, why = tuner.stored_winner(db, tuner.cache_key(self.warmup, self.rep))
            finally:
                db.close()
        except (TuningCacheError, sqlite3.Error) as e:
            if strict:
                raise TuningCacheError(f"{self.name}: cannot read the tuning database {path} for {b}: {e}") from e
            if str(path) not in self._unreadable:
                self._unreadable.add(str(path))
                logger.warning("%s: cannot read the tuning database %s (%s); the keys it would serve get the "
                               "fallback (untuned)", self.name, path, e)
            return None
        if why is not None:
            logger.warning("%s: not serving the tuning database's winner for %s: %s", self.name, b, why)
        return None if stored is None else (stored.best_config, stored.best_latency_ms)

    def plan(self, key: Mapping[str, Any]) -> Any:
        """The :class:`~.tuner.Plan` that tunes ``key``'s bucket, for :func:`autotuner.tune_all`."""
        b = self.make_key(key)
        label = f"{self.name} " + ",".join(f"{k}={v}" for k, v in b.items())
        return self.tuner(b).plan(self.warmup, self.rep, label=label)

    def tune(self, key: Mapping[str, Any]) -> Any:
        """Tune ``key``'s bucket (the database makes a tuned key a warm hit) and serve the winner in this
        process from now on. Refused inside CUDA-graph capture. Returns the ``TuneResult``. The one-key
        case of :func:`tune_keys`."""
        return tune_keys([(self, key)], load_kernels=True)[0]

    def _adopt(self, b: dict[str, Any], result: Any) -> None:
        """Serve ``result``'s winner for bucket key ``b`` from now on."""
        with self._lock:
            self._chosen[typed_key(b.values())] = (result.config, "tuned", result.latency)
            self._untuned.pop(typed_key(b.values()), None)
            self._fast.clear()
            self.stats["tuned"] += 1

    # ------------------------------------------------------------------ tables
    def use_table(self, table: TunedTable | str | Any | None, allow: bool | Iterable[str] = ()) -> TunedTable | None:
        """Serve from ``table`` (a path or a loaded table; ``None``: this kernel's own table no more), checked
        against this kernel first: a table refused changes nothing."""
        t = table if table is None or isinstance(table, TunedTable) else load_table(
            table, self.compile_args.get("target", "auto"), allow)
        with self._lock:
            if t is not None:
                self._check_table(t)
            self.table, self._section = t, None
            self._forget()
        return t

    def _check_table(self, table: TunedTable) -> KernelSection | None:
        """This kernel's section of ``table`` (``None``: it has none), refused (a :class:`TableError`) when the
        table is for another target or GPU than this kernel compiles for, or the section for another key,
        buckets or source."""
        section = table.kernels.get(self.name)
        if section is not None:  # a table without this kernel serves it nothing, whatever it was tuned for
            table.check_target(self.target())
            section.check(self.source(), self.key, {k: b.edges for k, b in self.buckets.items()})
        return section

    def _forget(self) -> None:
        self._fast.clear()
        self._chosen.clear()
        self._untuned.clear()
        self._refined.clear()
        self._variants.clear()
        self._warm.clear()

    def section(self, keys: Iterable[Mapping[str, Any]] | None = None) -> KernelSection:
        """This kernel's table section for ``keys`` (default: every key met in this process): each key's
        winner as served (tuned, table) or stored in the database; keys with neither are left out. An entry
        served from a loaded table keeps that table's provenance (``Entry.origin``), so that
        :func:`~.table.write_table` refuses to stamp an entry of a table loaded with ``allow=`` as tuned here."""
        bs = ([self.make_key(k) for k in keys] if keys is not None
              else [dict(zip(self.key, _values(bt))) for bt in self._chosen])
        entries, seen = [], set()
        for b in bs:
            bt = typed_key(b.values())
            if bt in seen:
                continue
            seen.add(bt)
            chosen = self._chosen.get(bt)
            if chosen is not None and chosen[1] != "fallback":
                origin = None
                if chosen[1] == "table":
                    with self._lock:  # a table choice was made from the current section (use_table forgets them)
                        section = self._section[1] if self._section is not None else None
                    entry = section.lookup(b) if section is not None else None
                    if entry is None:
                        raise TableError(f"{self.name}: {b} was served from a table that is no longer in use; call "
                                         "section() again")
                    origin = entry.origin
                entries.append(Entry(b, chosen[0], chosen[2], origin))
                continue
            stored = self._stored(b, strict=True)
            if stored is None:
                logger.info("%s: %s has no tuned config; left out of the table", self.name, b)
            else:
                entries.append(Entry(b, stored[0], stored[1]))
        return KernelSection(self.name, self.source(), self.key, {k: b.edges for k, b in self.buckets.items()},
                             tuple(entries))

    def untuned(self) -> list[tuple[dict[str, Any], int]]:
        """Keys served by the fallback in this process, with how many calls each served."""
        return [(dict(zip(self.key, _values(bt))), n) for bt, n in self._untuned.items()]


def tune_keys(pairs: Iterable[tuple[KeyedKernel, Mapping[str, Any]]], *, progress: bool | None = None,
              load_kernels: bool = False) -> list[Any]:
    """Tune every ``(kernel, key)`` as one job (:func:`autotuner.tune_all`: one compile pool, one measuring
    process, one progress bar, ``progress=None``: as the kernels' ``tuning_args`` say) and serve each
    winner from now on; the ``TuneResult`` s in order. Stored winners are warm hits. A key that fails does
    not stop the others: the winners found are adopted, then the failures raised. Refused inside CUDA-graph
    capture. ``load_kernels``: also load each winner in this process (``TuneResult.kernel``)."""
    from .job import raise_errors, tune_all

    pairs = list(pairs)
    if capturing():
        where = ", ".join(f"{kk.name} at {dict(key)}" for kk, key in pairs[:3])
        raise TuningError(f"refusing to tune {where} while a CUDA graph is being captured; tune before capture "
                          "(autotuner.record, then Recording.tune)")
    buckets = [kk.make_key(key) for kk, key in pairs]
    plans = [kk.plan(b) for (kk, _), b in zip(pairs, buckets)]
    out = tune_all(plans, progress=progress, load_kernels=load_kernels, errors="return")
    for (kk, _), b, r in zip(pairs, buckets, out):
        if not isinstance(r, BaseException):
            kk._adopt(b, r)
    raise_errors([p.label for p in plans], out)
    return out


def keyed_kernel(key: Sequence[str], configs: Any, **kwargs: Any) -> Callable[[Callable[..., Any]], KeyedKernel]:
    """Decorator form: ``@keyed_kernel(["M", "N"], configs, key_of=...)`` over a kernel factory."""
    return lambda fn: KeyedKernel(fn, key, configs, **kwargs)


@dataclass(frozen=True)
class _Shaped:
    """A kernel parameter with its symbolic sizes bound (what :func:`.check.make_args` reads)."""

    shape: list[int]
    dtype: Any


def use_table(table: TunedTable | str | Any | None, target: Any = "auto",
              allow: bool | Iterable[str] = ()) -> TunedTable | None:
    """Serve every keyed kernel of this process from ``table`` (a path or a loaded table; ``None``
    stops). It is checked now against the kernels that exist (and later ones on their first call)."""
    t = None if table is None else table if isinstance(table, TunedTable) else load_table(table, target, allow)
    kernels = list(_REGISTRY)
    for kk in kernels:  # every kernel it would serve checks it first: a table refused changes nothing
        if t is not None and kk.table is None:
            with kk._lock:
                kk._check_table(t)
    _TABLE[0] = t
    for kk in kernels:
        with kk._lock:
            kk._section = None
            kk._forget()
    return t


def untuned() -> list[tuple[str, dict[str, Any], int]]:
    """Every ``(kernel name, bucket key, calls)`` served by the fallback in this process."""
    return [(kk.name, k, n) for kk in list(_REGISTRY) for k, n in kk.untuned()]

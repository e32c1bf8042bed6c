"""``AutoTuner``: compile candidates in parallel, check each against a reference, time, cache.

The flow of one :meth:`AutoTuner.run`:

1. resolve the target in the parent (workers never touch the GPU);
2. hash the problem into a key; a finished run under that key is a warm hit: load the stored
   winner from TileLang's kernel cache and return, without compiling or timing anything else;
3. drop configs the optional ``validate`` callable rejects (status ``resource_error``);
4. compile the rest on joblib workers with a per-candidate timeout (:mod:`.compile`), and, while
   they compile, load each finished one in the parent, check it on NaN-poisoned outputs against
   ``ref_prog`` and time it (:mod:`.check`, :mod:`.timing`);
5. re-time the finalists back to back, once compilation no longer competes for the CPU;
6. record every trial in the database as it happens (:mod:`.cache`) and return a :class:`TuneResult`.

A failing config is a result, never an exception: each trial has a typed ``status``.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .bench import Bench, BenchSpec, IsolatedBench, TuningInputError
from .cache import TuningDB, _function_fingerprint, tuning_key
from .check import SupplyType, parse_supply_type
from .compile import build, compile_all
from .config import config_label, config_to_json, normalize_configs, split_config
from .target import ResolvedTarget, resolve_target
from .timing import METHOD
from .trial import STATUSES, Trial

__all__ = ["STATUSES", "AutoTuner", "Trial", "TuneResult", "TunedKernel", "TuningError"]

logger = logging.getLogger(__name__)

_FINALISTS = 3


class TuningError(RuntimeError):
    """No candidate survived; the message counts what failed and shows one error of each kind."""


class TunedKernel:
    """The winning compiled kernel, called like a TileLang kernel compiled with ``out_idx``.

    Candidates are compiled with every buffer as an argument, so the tuner can hand them
    NaN-poisoned outputs; this wrapper allocates the outputs named by ``out_idx`` and returns them.
    Passing every buffer yourself also works (and returns ``None``). Other attributes
    (``get_kernel_source()``...) come from the underlying ``tilelang`` ``JITKernel``.
    """

    def __init__(self, jit_kernel: Any, out_idx: list[int], device: str) -> None:
        self.jit_kernel = jit_kernel
        self.out_idx = out_idx
        self._device = device
        self._specs = [(list(map(int, p.shape)), p.dtype) for p in jit_kernel.params]

    def __call__(self, *args: Any) -> Any:
        from .check import _torch_dtype

        n = len(self._specs)
        if len(args) == n:
            self.jit_kernel(*args)
            return None
        if len(args) != n - len(self.out_idx):
            raise TypeError(f"kernel takes {n - len(self.out_idx)} inputs (or all {n} buffers), got {len(args)}")
        import torch

        device = next((a.device for a in args if isinstance(a, torch.Tensor)), torch.device(self._device))
        it = iter(args)
        full, outs = [], []
        for i, (shape, dtype) in enumerate(self._specs):
            if i in self.out_idx:
                t = torch.empty(shape, dtype=_torch_dtype(dtype), device=device)
                outs.append(t)
                full.append(t)
            else:
                full.append(next(it))
        self.jit_kernel(*full)
        return outs[0] if len(outs) == 1 else outs

    def __getattr__(self, name: str) -> Any:
        return getattr(self.jit_kernel, name)


@dataclass
class TuneResult:
    """The outcome of a tuning run. ``latency`` and ``ref_latency`` are medians in milliseconds."""

    kernel: TunedKernel
    config: dict[str, Any]
    latency: float
    ref_latency: float | None
    trials: list[Trial]
    from_cache: bool
    key: str
    seconds: float = 0.0
    target: str = ""
    notes: list[str] = field(default_factory=list)

    def summary(self, file: Any = None) -> str:
        """Print (to stderr by default) and return a short table of every trial, fastest first."""
        counts = Counter(t.status for t in self.trials)
        lines = [
            f"tuned {len(self.trials)} configs for {self.target} in {self.seconds:.1f} s"
            f"{' (from cache)' if self.from_cache else ''}: "
            + ", ".join(f"{counts[s]} {s}" for s in STATUSES if counts[s]),
            f"best {config_label(self.config)}: {self.latency:.4f} ms"
            + (f" (reference {self.ref_latency:.4f} ms)" if self.ref_latency else ""),
            f"{'status':<15}{'median ms':>11}{'min ms':>10}{'iqr ms':>9}{'compile s':>11}  config",
        ]
        order = sorted(self.trials, key=lambda t: (t.status != "ok", t.median_ms or float("inf")))
        for t in order:
            def f(v: float | None, w: int) -> str:
                return f"{v:>{w}.4f}" if v is not None else " " * (w - 1) + "-"

            err = f"  [{t.error.strip().splitlines()[-1][:60]}]" if t.error else ""
            lines.append(f"{t.status:<15}{f(t.median_ms, 11)}{f(t.min_ms, 10)}{f(t.iqr_ms, 9)}"
                         f"{f(t.compile_s, 11)}  {config_label(t.config)}{err}")
        text = "\n".join(lines)
        print(text, file=file or sys.stderr)
        return text


def _normalize_out_idx(out_idx: Any) -> list[int] | None:
    if out_idx is None:
        return None
    idx = [out_idx] if isinstance(out_idx, int) else list(out_idx)
    for i in idx:
        if not isinstance(i, int) or isinstance(i, bool):
            raise TypeError(f"out_idx entries must be ints (negative counts from the end), got {i!r}")
    return idx


class AutoTuner:
    """Tune a TileLang kernel over a list of configs. See the module docstring for the flow.

    >>> result = (AutoTuner.from_kernel(kernel=kernel, configs=configs)
    ...           .set_compile_args(out_idx=[-1], ref_prog=ref_program, target="auto")
    ...           .run(warmup=3, rep=20))
    """

    def __init__(self, fn: Callable[..., Any], configs: Iterable[Mapping[str, Any]],
                 validate: Callable[[dict[str, Any]], Any] | None = None) -> None:
        if not callable(fn):
            raise TypeError(f"kernel must be a callable returning a T.prim_func, got {fn!r}")
        self.fn = fn
        self.configs = normalize_configs(fn, configs)
        self.validate = validate
        # compile args
        self.out_idx: list[int] | None = None
        self.target: Any = "auto"
        self.supply_type = SupplyType.AUTO
        self.ref_prog: Callable[..., Any] | None = None
        self.skip_check = False
        self.atol = 1e-2
        self.rtol = 1e-2
        self.max_mismatched_ratio = 0.0
        self.compile_timeout = 300.0
        self.pass_configs: dict[str, Any] | None = None
        self._profile_defaults: tuple[int | None, int | None] = (None, None)  # set_profile_args' warmup, rep
        # run options
        self.n_jobs: int | None = None
        self.backend: str | None = None
        self.isolate = True
        self.run_timeout = 120.0
        self.cache = True
        self.db_path: str | None = None
        self.progress = True

    @classmethod
    def from_kernel(cls, kernel: Callable[..., Any], configs: Iterable[Mapping[str, Any]],
                    validate: Callable[[dict[str, Any]], Any] | None = None) -> AutoTuner:
        """``kernel(**config)`` must return a ``T.prim_func``; ``configs`` is a list of dicts.

        ``validate(config)``, if given, returns reasons a config cannot run (a list of strings, a
        string, or ``None``/empty when it is legal); rejected configs are recorded as
        ``resource_error`` without being compiled. ``carver``'s templates provide one.
        """
        return cls(kernel, configs, validate)

    def set_compile_args(self, out_idx: Any = None, target: Any = "auto", supply_type: Any = None,
                         ref_prog: Callable[..., Any] | None = None, skip_check: bool = False,
                         atol: float = 1e-2, rtol: float = 1e-2, max_mismatched_ratio: float = 0.0,
                         compile_timeout: float = 300.0, pass_configs: dict[str, Any] | None = None,
                         ) -> AutoTuner:
        """Set how candidates are compiled and checked. Every argument is used:

        * ``out_idx``: indices of the output buffers (negative from the end), as in TileLang.
        * ``target``: ``"auto"`` (local GPU, else the CPU), ``"cuda"``, ``"c"``, a dict such as
          ``{"kind": "cuda", "arch": "sm_90a"}`` or a ``tvm.target.Target``.
        * ``supply_type``: input data, ``"normal"``, ``"uniform"``, ``"integer"`` or ``"auto"``
          (also TileLang's ``TensorSupplyType``).
        * ``ref_prog``: reference; gets the inputs, returns the output(s).
        * ``skip_check``: do not compare with ``ref_prog`` (outputs are still checked for NaN).
        * ``atol``, ``rtol``, ``max_mismatched_ratio``: an element passes if
          ``|out - ref| <= atol + rtol*|ref|``; a candidate passes if the fraction of failing
          elements is at most ``max_mismatched_ratio`` (default 0: none).
        * ``compile_timeout``: seconds before one candidate's compile is killed.
        * ``pass_configs``: TileLang pass configs for every candidate.
        """
        self.out_idx = _normalize_out_idx(out_idx)
        self.target = target
        self.supply_type = parse_supply_type(supply_type)
        if ref_prog is not None and not callable(ref_prog):
            raise TypeError(f"ref_prog must be callable, got {ref_prog!r}")
        self.ref_prog = ref_prog
        self.skip_check = bool(skip_check)
        for name, v in (("atol", atol), ("rtol", rtol)):
            if not isinstance(v, (int, float)) or v < 0:
                raise ValueError(f"{name} must be a non-negative number, got {v!r}")
        if not 0.0 <= max_mismatched_ratio <= 1.0:
            raise ValueError(f"max_mismatched_ratio must be in [0, 1], got {max_mismatched_ratio!r}")
        if not isinstance(compile_timeout, (int, float)) or compile_timeout <= 0:
            raise ValueError(f"compile_timeout must be a positive number of seconds, got {compile_timeout!r}")
        self.atol, self.rtol = float(atol), float(rtol)
        self.max_mismatched_ratio = float(max_mismatched_ratio)
        self.compile_timeout = float(compile_timeout)
        self.pass_configs = dict(pass_configs) if pass_configs else None
        return self

    def set_profile_args(self, warmup: int | None = None, rep: int | None = None, timeout: float | None = None,
                         supply_type: Any = None, ref_prog: Callable[..., Any] | None = None,
                         supply_prog: Callable[..., Any] | None = None, rtol: float = 1e-2, atol: float = 1e-2,
                         max_mismatched_ratio: float = 0.0, skip_check: bool = False,
                         manual_check_prog: Callable[..., Any] | None = None,
                         cache_input_tensors: bool = False, backend: str = "event") -> AutoTuner:
        """TileLang's newer signature. ``warmup``/``rep`` (counts) become :meth:`run`'s defaults,
        ``timeout`` becomes ``compile_timeout``; the check arguments mean what they mean in
        :meth:`set_compile_args`. ``supply_prog``, ``manual_check_prog`` and a ``backend`` other
        than ``"event"`` are not supported and are rejected rather than ignored.
        """
        for name, v in (("supply_prog", supply_prog), ("manual_check_prog", manual_check_prog)):
            if v is not None:
                raise NotImplementedError(f"{name} is not supported by tilecarve's AutoTuner; use ref_prog")
        if backend != "event":
            raise NotImplementedError(f"backend={backend!r}: tilecarve times with CUDA events only ('event')")
        self.supply_type = parse_supply_type(supply_type)
        self.ref_prog = ref_prog if ref_prog is not None else self.ref_prog
        self.skip_check = bool(skip_check)
        self.atol, self.rtol = float(atol), float(rtol)
        if not 0.0 <= max_mismatched_ratio <= 1.0:
            raise ValueError(f"max_mismatched_ratio must be in [0, 1], got {max_mismatched_ratio!r}")
        self.max_mismatched_ratio = float(max_mismatched_ratio)
        if timeout is not None:
            self.compile_timeout = float(timeout)
        self._profile_defaults = (warmup, rep)
        del cache_input_tensors  # inputs are always generated once per run and reused
        return self

    def set_tuning(self, n_jobs: int | None = None, cache: bool = True, db_path: str | None = None,
                   progress: bool = True, backend: str | None = None, isolate: bool = True,
                   run_timeout: float = 120.0) -> AutoTuner:
        """Parallelism (``n_jobs`` compile workers, default all cores, on joblib ``backend``: default
        forked ``"multiprocessing"`` workers; ``"loky"``, or ``"dask"``/``"ray"`` with their joblib
        integration registered, to go past one machine), whether to use the tuning database
        (``cache``), where it lives (``db_path``; default :func:`autotuner.cache.cache_dir`) and
        whether to show the progress bar. ``isolate`` (default) checks and times candidates in a
        separate process, so a kernel that crashes or leaves a sticky CUDA error costs one trial;
        ``run_timeout`` is how long one candidate may take to be checked and timed there."""
        if n_jobs is not None and (not isinstance(n_jobs, int) or n_jobs == 0 or n_jobs < -1):
            raise ValueError(f"n_jobs must be a positive int or -1 (all cores), got {n_jobs!r}")
        self.n_jobs, self.cache, self.db_path, self.progress = n_jobs, bool(cache), db_path, bool(progress)
        self.backend = backend
        if not isinstance(run_timeout, (int, float)) or run_timeout <= 0:
            raise ValueError(f"run_timeout must be a positive number of seconds, got {run_timeout!r}")
        self.isolate, self.run_timeout = bool(isolate), float(run_timeout)
        return self

    # -----------------------------------------------------------------------------------------

    def _elaborate(self, config: dict[str, Any]) -> Any:
        return self.fn(**split_config(config)[0])

    def _settings(self, warmup: int, rep: int) -> dict[str, Any]:
        return {
            "out_idx": self.out_idx, "supply": self.supply_type.value,
            "ref_prog": _function_fingerprint(self.ref_prog, set(), 0) if self.ref_prog else None,
            "skip_check": self.skip_check, "atol": self.atol, "rtol": self.rtol,
            "max_mismatched_ratio": self.max_mismatched_ratio, "pass_configs": self.pass_configs,
            "warmup": warmup, "rep": rep, "timing": METHOD,
            "validate": _function_fingerprint(self.validate, set(), 0) if self.validate else None,
        }

    def run(self, warmup: int | None = None, rep: int | None = None) -> TuneResult:
        """Tune and return the best kernel. ``warmup`` and ``rep`` are numbers of calls (not ms)."""
        dw, dr = self._profile_defaults
        warmup = warmup if warmup is not None else (dw if dw is not None else 3)
        rep = rep if rep is not None else (dr if dr is not None else 20)
        for name, v, lo in (("warmup", warmup, 0), ("rep", rep, 1)):
            if not isinstance(v, int) or isinstance(v, bool) or v < lo:
                raise ValueError(f"{name} is a number of calls and must be an int >= {lo}, got {v!r}")
        t_start = time.perf_counter()
        target = resolve_target(self.target)
        if not target.runnable:
            raise ValueError(
                f"target {target.spec} cannot run here (local GPU: {target.device_name or 'none'}); tuning "
                "needs to run candidates. Compile-only use: autotuner.compile.compile_all"
            )
        prim_text = self._first_prim_text()
        key = tuning_key(self.fn, self.configs, prim_text, target.key(), self._settings(warmup, rep))
        db = TuningDB(self.db_path) if self.cache else None
        try:
            if db is not None:
                hit = self._from_cache(db, key, target, t_start)
                if hit is not None:
                    return hit
            return self._tune(db, key, target, warmup, rep, t_start)
        finally:
            if db is not None:
                db.close()

    def _first_prim_text(self) -> str:
        """Script of the first config that elaborates: pins shapes and dtypes into the key."""
        for cfg in self.configs[:8]:
            try:
                return self._elaborate(cfg).script()
            except Exception:  # noqa: BLE001 - a config that fails to elaborate is a later compile_error
                continue
        return ""

    def _kernel_name(self) -> str:
        fn = getattr(self.fn, "func", self.fn)
        return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"

    def _load(self, config: dict[str, Any], target: ResolvedTarget) -> Any:
        return build(self.fn, config, target.spec, self.pass_configs)

    def _wrap(self, jit: Any, target: ResolvedTarget) -> TunedKernel:
        n = len(jit.params)
        out_idx = [i % n for i in (self.out_idx or [])]
        return TunedKernel(jit, out_idx, target.device)

    def _from_cache(self, db: TuningDB, key: str, target: ResolvedTarget, t_start: float) -> TuneResult | None:
        stored = db.finished_run(key)
        if stored is None or stored["best_config"] is None:
            return None
        trials = [Trial(json.loads(c), s, e, cs, med, mn, iqr) for _, c, s, e, cs, med, mn, iqr in stored["trials"]]
        cfg = stored["best_config"]
        jit = self._load(cfg, target)  # a TileLang disk-cache hit when the kernel cache is intact
        logger.info("tuning cache hit %s: best %s at %.4f ms", key[:12], config_label(cfg), stored["best_latency_ms"])
        return TuneResult(self._wrap(jit, target), cfg, stored["best_latency_ms"], stored["ref_latency_ms"],
                          trials, True, key, time.perf_counter() - t_start, str(target.spec))

    def _tune(self, db: TuningDB | None, key: str, target: ResolvedTarget, warmup: int, rep: int,
              t_start: float) -> TuneResult:
        from tqdm import tqdm  # a plain bar on stderr, also in notebooks

        n = len(self.configs)
        trials: list[Trial | None] = [None] * n
        meta = {"warmup": warmup, "rep": rep, "n_jobs": self.n_jobs}
        prior = db.open_run(key, self._kernel_name(), str(target.spec), n, meta) if db is not None else []

        def record(i: int, trial: Trial) -> None:
            trials[i] = trial
            if db is not None:
                db.record_trial(key, i, config_to_json(trial.config), trial.status, trial.error, trial.compile_s,
                                trial.median_ms, trial.min_ms, trial.iqr_ms)
            bar.update(1)
            if trial.status != "ok":
                logger.debug("config %s: %s %s", config_label(trial.config), trial.status, trial.error or "")

        bar = tqdm(total=n, desc="tuning", unit="cfg", file=sys.stderr, disable=not self.progress, leave=False)
        for i, c, st, err, cs, med, mn, iqr in prior:  # an interrupted run of the same problem: resume it
            trials[i] = Trial(json.loads(c), st, err, cs, med, mn, iqr)
            bar.update(1)
        if prior:
            logger.info("resuming an interrupted tuning run: %d of %d trials already recorded", len(prior), n)
        to_compile = []
        for i, cfg in enumerate(self.configs):
            if trials[i] is not None:
                continue
            reasons = self._reasons(cfg)
            if reasons:
                record(i, Trial(cfg, "resource_error", "; ".join(reasons)))
            else:
                to_compile.append(i)

        spec = BenchSpec(self.fn, target.spec, target.device, self.pass_configs,
                         self.out_idx, self.supply_type, self.ref_prog, self.skip_check, self.atol, self.rtol,
                         self.max_mismatched_ratio, warmup, rep)
        bench: Bench | IsolatedBench = IsolatedBench(spec, self.run_timeout) if self.isolate else Bench(spec)
        try:
            for out in compile_all(self.fn, self.configs, to_compile, target.spec, timeout=self.compile_timeout,
                                   n_jobs=self.n_jobs, pass_configs=self.pass_configs, backend=self.backend):
                cfg = self.configs[out.index]
                if out.status != "ok":
                    record(out.index, Trial(cfg, out.status, out.error, out.seconds))
                    continue
                try:
                    record(out.index, bench.measure(out.index, cfg, out.seconds))
                except TuningInputError as e:
                    raise TuningError(str(e)) from e
            bar.close()
            # finalists: re-time back to back now that compilation no longer competes for the CPU
            ok = sorted((i for i, t in enumerate(trials) if t is not None and t.status == "ok"),
                        key=lambda i: trials[i].median_ms)
            for i in ok[:_FINALISTS] if len(ok) > 1 else []:
                timing = bench.retime(i, trials[i].config)
                if timing is None:
                    continue
                t = trials[i]
                trials[i] = Trial(t.config, "ok", None, t.compile_s, timing.median_ms, timing.min_ms, timing.iqr_ms)
                if db is not None:
                    db.record_trial(key, i, config_to_json(t.config), "ok", None, t.compile_s, timing.median_ms,
                                    timing.min_ms, timing.iqr_ms)
            ref_latency = bench.fetch_ref_latency()
            done = [t for t in trials if t is not None]
            ok_trials = [(i, t) for i, t in enumerate(trials) if t is not None and t.status == "ok"]
            if not ok_trials:
                if db is not None:
                    db.finish_run(key, None, None, ref_latency)
                raise TuningError(_failure_message(done, target))
            best_i, best = min(ok_trials, key=lambda it: it[1].median_ms)
            # the measuring process holds its own copy; here the winner is a TileLang disk-cache hit
            in_bench = isinstance(bench, Bench) and bench.has_kernel(best_i)  # not if measured before a resume
            jit = bench.kernel(best_i) if in_bench else self._load(best.config, target)
        finally:
            bar.close()
            bench.close()
        if db is not None:
            db.finish_run(key, config_to_json(best.config), best.median_ms, ref_latency)
        return TuneResult(self._wrap(jit, target), best.config, best.median_ms, ref_latency,
                          done, False, key, time.perf_counter() - t_start, str(target.spec))

    def _reasons(self, cfg: dict[str, Any]) -> list[str]:
        if self.validate is None:
            return []
        r = self.validate(dict(cfg))
        if not r:
            return []
        return [r] if isinstance(r, str) else [str(x) for x in r]


def _failure_message(trials: list[Trial], target: ResolvedTarget) -> str:
    counts = Counter(t.status for t in trials)
    lines = [f"no config survived tuning for {target.spec}: "
             + ", ".join(f"{counts[s]} {s}" for s in STATUSES if counts[s])]
    for status in STATUSES:
        first = next((t for t in trials if t.status == status), None)
        if first is not None and first.error:
            last = first.error.strip().splitlines()
            lines.append(f"  first {status} ({config_label(first.config)}): {last[0][:300] if last else ''}")
    return "\n".join(lines)

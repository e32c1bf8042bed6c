"""``AutoTuner``: compile candidates in parallel, check each against a reference, time, cache.

The flow of one :meth:`AutoTuner.run` (:meth:`AutoTuner.plan` does steps 1-2, :mod:`.job` the rest:
a run is the job of one problem, and :func:`autotuner.tune_all` tunes many problems as one job):

1. check every setting, resolve the target in the parent (workers never touch the GPU);
2. hash the problem into a key without running the user's kernel factory; a finished run under that
   key is a warm hit only if its rows are sound, its winner is one of the configs asked for and
   still elaborates to the PrimFunc it was tuned as, and, re-checked once against the reference,
   is still right; otherwise the problem is tuned again;
3. drop configs the optional ``validate`` callable rejects (status ``resource_error``);
4. compile the rest on joblib workers with a per-candidate timeout (:mod:`.compile`), and, while
   they compile, check each finished one on pristine inputs and NaN-poisoned outputs against
   ``ref_prog`` and time it, in a separate measuring process (:mod:`.bench`);
5. re-time the finalists (every candidate within ``finalist_margin`` of the best) in interleaved
   rounds once compilation no longer competes for the CPU, and pick on those rounds;
6. record every trial in the database as it happens (:mod:`.cache`) and return a :class:`TuneResult`.

A failing config is a result, never an exception: each trial has a typed ``status``. User code
runs in the parent only with a bound (:func:`_bounded`).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from . import forking
from .bench import Bench, BenchSpec, param_names, prestart, resolve_roles
from .cache import (
    DamagedRow,
    StoredRun,
    TuningCacheWarning,
    TuningDB,
    finished_under,
    function_fingerprint,
    key_from_parts,
    key_parts,
    prekey,
    prim_hash,
    tuning_key,
)
from .capture import AutotuneInputs, active_inputs
from .check import torch_dtype
from .compile import build, load_prim
from .config import (
    as_reasons,
    config_index,
    config_label,
    kernel_name,
    normalize_configs,
    same_config,
    split_config,
)
from .devices import Device, resolve_devices
from .errors import TuningError, TuningInputError
from .scratch import positions as scratch_positions
from .served import check_args, launch, on_device
from .settings import (
    TIMING_BACKENDS,
    CheckSettings,
    CompileSettings,
    RunSettings,
    TimingSettings,
    check_setting,
    key_fields,
)
from .target import ResolvedTarget, default_target, resolve_target
from .timeline import Timeline
from .timing import BATCHED_METHOD, METHOD
from .trial import STATUSES, Status, Trial, error_headline, format_error

__all__ = ["STATUSES", "AutoTuner", "Plan", "Trial", "TuneResult", "TunedKernel", "TuningError", "TuningInputError"]

logger = logging.getLogger(__name__)


class TunedKernel:
    """The winning compiled kernel, called like a TileLang kernel compiled with ``out_idx``.

    Candidates are compiled with every buffer as an argument, so the tuner can hand them
    NaN-poisoned outputs; this wrapper allocates the outputs named by ``out_idx`` (zeroed when
    they are in ``reset_to_zero``) and returns them, and its scratch buffers (:mod:`.scratch`), which
    it does not return. It takes the arguments the reference takes: every argument but the pure
    outputs and the scratch (an output in ``restore_value`` is updated in place, so it is passed in
    and returned). Passing every buffer yourself also works (and returns ``None``).
    Other attributes (``get_kernel_source()``...) come from the underlying ``tilelang`` ``JITKernel``.
    """

    def __init__(self, jit_kernel: Any, out_idx: list[int], device: str, zero: list[int] | None = None,
                 inout: list[int] | None = None) -> None:
        self.jit_kernel = jit_kernel
        self.out_idx = out_idx
        self._zero = set(zero or [])
        self._inout = set(inout or [])
        self._device = device
        self._specs = [(list(map(int, p.shape)), p.dtype) for p in jit_kernel.params]
        #: scratch parameters (:mod:`.scratch`): allocated per call, on the current stream, never returned
        self.scratch = scratch_positions(jit_kernel, out_idx)
        self._names = param_names(jit_kernel)
        skip = set(self.scratch) | {i for i in out_idx if i not in self._inout}
        self._in_names = [name for i, name in enumerate(self._names) if i not in skip]  # what a caller passes

    def __call__(self, *args: Any) -> Any:
        import torch

        n = len(self._specs)
        n_in = n - len(self.out_idx) + len(self._inout) - len(self.scratch)
        for i, a in enumerate(args):  # TileLang's C-target adapter takes None for a tensor and crashes the process
            if not isinstance(a, torch.Tensor):
                raise TypeError(f"argument {i} is {type(a).__name__} ({a!r:.60}), not a torch.Tensor; the kernel "
                                f"takes {n_in} input tensors (or all {n} buffers)")
        if len(args) == n and n != n_in:
            launch(self.jit_kernel, args, self._names)
            return None
        if len(args) != n_in:
            raise TypeError(f"kernel takes {n_in} inputs (or all {n} buffers), got {len(args)}")
        gpu = check_args(args, self._in_names)  # alignment, named as the caller passed them (autotuner.served)

        device = args[0].device if args else torch.device(self._device)  # every argument is a tensor (above)
        it = iter(args)
        full, outs = [], []
        for i, (shape, dtype) in enumerate(self._specs):
            if (i in self.out_idx and i not in self._inout) or i in self.scratch:
                make = torch.zeros if i in self._zero else torch.empty
                t = make(shape, dtype=torch_dtype(dtype), device=device)
            else:
                t = next(it)
            full.append(t)
            if i in self.out_idx:
                outs.append(t)
        on_device(gpu, self.jit_kernel, *full)  # the caller's current GPU kept (autotuner.served)
        return outs[0] if len(outs) == 1 else outs

    def get_profiler(self, tensor_supply_type: Any = None) -> Any:
        """TileLang's ``JITKernel.get_profiler`` for this kernel as it is called: the profiler's result
        index is ``out_idx``, so ``do_bench()``, ``do_bench(ref_program)`` and
        ``assert_allclose(ref_program)`` pass the inputs only, as with a kernel compiled with ``out_idx``."""
        from .profiler import TunedProfiler

        return TunedProfiler.of(self, tensor_supply_type)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "jit_kernel":  # copy/pickle probe a bare instance: no recursion
            raise AttributeError(name)
        return getattr(self.jit_kernel, name)


@dataclass
class TuneResult:
    """The outcome of a tuning run. ``latency`` and ``ref_latency`` are medians in milliseconds.
    ``kernel`` is ``None`` only from a job told not to load winners (``tune_all(load_kernels=False)``)."""

    kernel: TunedKernel | None
    config: dict[str, Any]
    latency: float
    ref_latency: float | None
    trials: list[Trial]
    from_cache: bool
    key: str
    seconds: float = 0.0
    target: str = ""
    notes: list[str] = field(default_factory=list)
    phases: dict[str, float] = field(default_factory=dict)  # seconds per step of a cold run
    timeline: Timeline | None = None  # a tuned (not cached) run's job: when what happened (autotuner.timeline)

    def __post_init__(self) -> None:
        if isinstance(self.kernel, TunedKernel):  # as TileLang's tuned JITKernel: kernel.config, .latency...
            k = self.kernel
            k.config, k.latency, k.ref_latency = self.config, self.latency, self.ref_latency

    @property
    def spread(self) -> float | None:
        """The winner's spread over its interleaved rounds, ``(slowest - fastest) / median``."""
        return next((t.spread for t in self.trials if t.config == self.config and t.status == Status.OK), None)

    def summary(self, file: Any = None) -> str:
        """Print (to stderr by default) and return a short table of every trial, fastest first."""
        counts = Counter(str(t.status) for t in self.trials)
        spread = self.spread
        lines = [
            f"tuned {len(self.trials)} configs for {self.target} in {self.seconds:.1f} s"
            f"{' (from cache)' if self.from_cache else ''}: "
            + ", ".join(f"{counts[s]} {s}" for s in STATUSES if counts[s]),
            f"best {config_label(self.config)}: {self.latency:.4f} ms"
            + (f" (spread {spread:.1%} over its rounds)" if spread is not None else "")
            + (f" (reference {self.ref_latency:.4f} ms)" if self.ref_latency else ""),
            f"{'status':<15}{'median ms':>11}{'min ms':>10}{'iqr ms':>9}{'compile s':>11}  config",
        ]
        if self.phases:
            lines.insert(2, "phases: " + ", ".join(f"{k} {v:.2f} s" for k, v in self.phases.items()))
        order = sorted(self.trials, key=lambda t: (t.status != Status.OK, t.median_ms or float("inf")))
        for t in order:
            def f(v: float | None, w: int) -> str:
                return f"{v:>{w}.4f}" if v is not None else " " * (w - 1) + "-"

            head = error_headline(t.error, 80)
            err = f"  [{head}]" if head else ""
            on = f"  on {t.device}" if t.device else ""
            lines.append(f"{str(t.status):<15}{f(t.median_ms, 11)}{f(t.min_ms, 10)}{f(t.iqr_ms, 9)}"
                         f"{f(t.compile_s, 11)}  {config_label(t.config)}{on}{err}")
        text = "\n".join(lines)
        print(text, file=file or sys.stderr)
        return text


def _bounded(call: Callable[[], Any], timeout: float, what: str) -> Any:
    """Run user code in the parent with a bound: ``call()`` in a daemon thread, given up after ``timeout``.

    The tuner must never hang on a kernel factory that does not return; a thread cannot be killed,
    but the run goes on to a clear error and the thread dies with the process.
    """
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = call()
        except BaseException as e:  # noqa: BLE001 - re-raised in the calling thread
            box["error"] = e

    thread = threading.Thread(target=target, name="tilecarve-user-code", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise TuningError(f"{what} did not return within {timeout:g} s (compile_timeout); the kernel factory "
                          "hangs for this config. Fix the factory, or raise compile_timeout if it is only slow")
    if "error" in box:
        raise box["error"]
    return box["value"]


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
        if validate is not None and not callable(validate):
            raise TypeError(f"validate must be a callable returning reasons a config cannot run, got {validate!r}")
        self.fn = fn
        self.configs = normalize_configs(fn, configs)
        self.validate = validate
        self.check_settings = CheckSettings()
        self.timing_settings = TimingSettings()
        self.compile_settings = CompileSettings()
        self.run_settings = RunSettings()
        self._profile_defaults: tuple[int | None, int | None] = (None, None)  # set_profile_args' warmup, rep

    @classmethod
    def from_kernel(cls, kernel: Callable[..., Any], configs: Iterable[Mapping[str, Any]],
                    validate: Callable[[dict[str, Any]], Any] | None = None) -> AutoTuner:
        """``kernel(**config)`` must return a ``T.prim_func``; ``configs`` is a list of dicts.

        ``validate(config)``, if given, returns reasons a config cannot run (a list of strings, a
        string, or ``None``/empty when it is legal); rejected configs are recorded as
        ``resource_error`` without being compiled, as are configs it raises for or does not return for
        within ``compile_timeout`` (it runs in this process). ``carver``'s templates provide one.
        """
        return cls(kernel, configs, validate)

    def _update_check(self, **given: Any) -> None:
        """The check settings with the arguments given (not ``None``) replaced and the rest kept, whichever
        setter set them, so the setters may come in any order and neither undoes the other's."""
        self.check_settings = replace(self.check_settings, **{k: v for k, v in given.items() if v is not None})

    def set_compile_args(self, out_idx: Any = None, target: Any = None, execution_backend: str | None = None,
                         target_host: Any = None, verbose: bool | None = None,
                         pass_configs: dict[str, Any] | None = None, *, supply_type: Any = None,
                         ref_prog: Callable[..., Any] | None = None, skip_check: bool | None = None,
                         atol: float | None = None, rtol: float | None = None,
                         max_mismatched_ratio: float | None = None, compile_timeout: float = 300.0,
                         reset_to_zero: Iterable[int | str] | None = None,
                         restore_value: Iterable[int | str] | None = None) -> AutoTuner:
        """Set how candidates are compiled and checked. The positional arguments are TileLang's, in its
        order (``out_idx, target, execution_backend, target_host, verbose, pass_configs``); the rest are
        keyword-only, so that TileLang code passing its six positionally never lands in a check argument
        (its fifth, ``verbose``, would otherwise have been ``skip_check``). Every argument is used:

        * ``out_idx``: indices of the output buffers (negative from the end), as in TileLang. An
          index out of range for the kernel is an error, never wrapped.
        * ``target``: ``"auto"`` (local GPU, else the CPU), ``"cuda"``, ``"c"``, a dict such as
          ``{"kind": "cuda", "arch": "sm_90a"}`` or a ``tvm.target.Target``. ``None`` (the default), as
          in TileLang: ``$TILELANG_DEFAULT_TARGET`` if set (a name, or a JSON dict), else ``"auto"``.
        * ``supply_type``: input data, ``"normal"``, ``"uniform"``, ``"integer"`` or ``"auto"``
          (also TileLang's ``TensorSupplyType``).
        * ``ref_prog``: reference; gets the inputs (every argument but the pure outputs), returns
          the output(s). It runs on copies: a reference may change its inputs.
        * ``skip_check``: do not compare with ``ref_prog`` (outputs are still checked for NaN).
        * ``atol``, ``rtol``, ``max_mismatched_ratio``: an element passes if
          ``|out - ref| <= atol + rtol*|ref|``; a candidate passes if the fraction of failing
          elements of each output is at most ``max_mismatched_ratio`` (default 0: none). Left unset,
          ``rtol`` is 1e-2 and ``atol`` 1e-2, lowered for small outputs to a share of the output's
          largest reference value, and integer and bool outputs must be equal
          (:func:`.check.tolerances` gives the rule).
        * ``compile_timeout``: seconds before one candidate's compile is killed; also the bound on
          elaborating a config in this process.
        * ``pass_configs``: TileLang pass configs for every candidate.
        * ``reset_to_zero``, ``restore_value`` (as Triton's autotuner): arguments, by index or
          buffer name, zeroed / restored to their generated values before every call, for kernels
          that accumulate into an output (atomics) or update an argument in place. Every other
          argument that is not an output must come back from each call bit for bit unchanged: a
          candidate that writes to one is a ``mismatch`` naming it.
        * TileLang's ``execution_backend`` (``"auto"`` or ``None`` only), ``target_host`` (``None``
          only) and ``verbose`` (no effect) are accepted so that TileLang code runs unchanged.

        Every check argument set before by either setter (``out_idx``, ``ref_prog``, ``supply_type``,
        ``skip_check``, ``atol``, ``rtol``, ``max_mismatched_ratio``, ``reset_to_zero``,
        ``restore_value``, and :meth:`set_profile_args`' ``supply_prog`` and ``manual_check_prog``) is
        kept unless given again, so the two setters may come in either order.
        """
        if execution_backend not in (None, "auto") or target_host is not None:
            raise NotImplementedError(f"execution_backend={execution_backend!r}, target_host={target_host!r}: "
                                      "tilecarve compiles with TileLang's default backend for the target; "
                                      "leave both unset")
        if verbose is not None and not isinstance(verbose, bool):
            raise TypeError(f"verbose must be True, False or None, got {verbose!r} ({type(verbose).__name__}); "
                            "the check arguments (ref_prog, skip_check, atol...) are keyword-only")
        self._update_check(out_idx=out_idx, supply_type=supply_type, ref_prog=ref_prog, skip_check=skip_check,
                           atol=atol, rtol=rtol, max_mismatched_ratio=max_mismatched_ratio,
                           reset_to_zero=reset_to_zero, restore_value=restore_value)
        self.compile_settings = CompileSettings(default_target() if target is None else target, compile_timeout,
                                                pass_configs)
        return self

    def set_profile_args(self, warmup: int | None = None, rep: int | None = None, timeout: float | None = None,
                         supply_type: Any = None, ref_prog: Callable[..., Any] | None = None,
                         supply_prog: Callable[..., Any] | None = None, rtol: float | None = None,
                         atol: float | None = None, max_mismatched_ratio: float | None = None,
                         skip_check: bool | None = None, manual_check_prog: Callable[..., Any] | None = None,
                         cache_input_tensors: bool = False, backend: str = "event") -> AutoTuner:
        """TileLang's signature. ``warmup``/``rep`` (counts) become :meth:`run`'s defaults,
        ``timeout`` becomes ``compile_timeout``; the check arguments mean what they mean in
        :meth:`set_compile_args`; ``backend`` is the timing backend, ``"event"`` or ``"cudagraph"``.

        * ``supply_prog(params)``, as in TileLang, gets the kernel's input parameters (``KernelParam``,
          every argument but the outputs) and returns one tensor per input; those inputs replace the
          generated ones (``supply_type`` is then unused). They are still copied aside, so every
          candidate sees them pristine, and one that writes to them is a ``mismatch``.
        * ``manual_check_prog(outputs, refs)``, as in TileLang, replaces the element-wise comparison:
          it raises (or returns ``False``) when a candidate's outputs, compared with ``ref_prog``'s on
          the same inputs, are wrong. It runs for every candidate, after the check for unwritten
          (NaN-poisoned) outputs, and needs a ``ref_prog``.
        * Under ``with set_autotune_inputs(...)`` (:mod:`.capture`) those inputs are the supply, and a
          ``supply_prog`` is ignored with a warning, as in TileLang.
        """
        if backend not in TIMING_BACKENDS:
            raise ValueError(f"backend={backend!r}: tilecarve times with {list(TIMING_BACKENDS)}")
        warmup, rep = check_setting("warmup", warmup), check_setting("rep", rep)
        check_setting("cache_input_tensors", cache_input_tensors)  # inputs are always made once per run
        self._update_check(supply_type=supply_type, skip_check=skip_check, atol=atol, rtol=rtol,
                           max_mismatched_ratio=max_mismatched_ratio, ref_prog=ref_prog, supply_prog=supply_prog,
                           manual_check_prog=manual_check_prog)
        self._use_captured_inputs()
        if timeout is not None:
            self.compile_settings = replace(self.compile_settings, compile_timeout=check_setting("timeout", timeout))
        self.timing_settings = replace(self.timing_settings, timing_backend=backend)
        self._profile_defaults = (warmup, rep)
        return self

    def set_tuning(self, n_jobs: int | None = None, cache: bool = True, db_path: str | None = None,
                   progress: bool = True, backend: str | None = None, isolate: bool = True,
                   run_timeout: float = 120.0, timing: str = "burst", timing_backend: str | None = None,
                   sustain_s: float = 0.5, finalist_margin: float = 0.03, finalist_rounds: int = 5,
                   max_finalists: int = 8, recheck: bool = True, devices: str | Iterable[int] | None = None,
                   allow_mixed_devices: bool = False) -> AutoTuner:
        """How the run is carried out.

        * ``n_jobs`` compile workers (default all cores) on ``backend``: default forked
          ``"multiprocessing"`` workers; joblib's ``"loky"``, or ``"dask"`` with its joblib integration
          registered; or ``"ray"``: a compile host per node and one measuring actor per GPU on a Ray cluster (the
          one this process is connected to, else ``RAY_ADDRESS``, else a local one), docs/scale_out.md.
        * ``cache``: use the tuning database, at ``db_path`` (default :func:`autotuner.cache.cache_dir`).
        * ``progress``: the progress bar.
        * ``isolate`` (default): check and time in a separate process, so a kernel that crashes or
          leaves a sticky CUDA error costs one trial; ``run_timeout`` is how long one candidate may
          take there.
        * ``timing``: ``"burst"`` (each call timed alone after an L2 flush), ``"sustained"`` (the
          finalists are re-timed after ``sustain_s`` seconds of back-to-back calls, at the clock the
          GPU holds under load) or ``"back_to_back"`` (every candidate and the finalists timed that
          way, as a model's forward runs its kernels;
          each candidate then costs ``sustain_s`` more, so keep it short, e.g. 0.05), or ``"batched"``
          (the same, with an event only every few calls rather than around each: the matmul op's default,
          ``templates/matmul/op.py``; ``autotuner.timing``; not with ``reset_to_zero``/``restore_value`` or
          the cudagraph backend). The reference is timed the way the finalists are.
          ``timing_backend``: ``"event"`` or ``"cudagraph"`` (for kernels of
          a few microseconds, where launch overhead would dominate).
        * Finalists, every candidate within ``finalist_margin`` (a fraction) of the fastest (and at least
          the three fastest: ``autotuner.job.MIN_FINALISTS``), at most
          ``max_finalists``, are re-timed in ``finalist_rounds`` interleaved rounds; the pick is the
          lowest median over those rounds, and each finalist's spread is recorded.
        * ``recheck``: a winner served from the database, or loaded again in this process, is
          checked once against the reference before it is returned.
        * ``devices``: ``None`` (one measuring process on the current GPU), ``"all"`` or GPU indices such
          as ``[0, 1]``: one isolated measuring process per GPU, fed from one queue as candidates finish
          compiling; finalists are re-timed on the first. GPUs of different models are refused unless
          ``allow_mixed_devices``. On the C target, ``devices`` are that many CPU measuring processes.
          With ``backend="ray"``, ``None`` and ``"all"`` mean one actor per GPU of the cluster, and a list
          of n indices n actors (labelled ``ray:<index>``; Ray picks the GPUs).
        """
        if devices is not None and not isinstance(devices, str):
            devices = tuple(devices) if isinstance(devices, Iterable) else devices
        self.run_settings = RunSettings(n_jobs, backend, isolate, run_timeout, cache, db_path, progress, recheck,
                                        devices, allow_mixed_devices)
        self.timing_settings = replace(
            self.timing_settings, timing=timing, sustain_s=sustain_s, finalist_margin=finalist_margin,
            finalist_rounds=finalist_rounds, max_finalists=max_finalists,
            timing_backend=timing_backend if timing_backend is not None else self.timing_settings.timing_backend)
        return self

    def _use_captured_inputs(self) -> None:
        """The inputs of an active ``set_autotune_inputs`` replace the supply (see :mod:`.capture`)."""
        captured, c = active_inputs(), self.check_settings
        if captured is None or captured is c.supply_prog:
            return
        if c.supply_prog is not None and not isinstance(c.supply_prog, AutotuneInputs):
            logger.warning("supply_prog %s is ignored: the tuner runs under `with set_autotune_inputs(...)`, whose "
                           "inputs it uses instead", getattr(c.supply_prog, "__qualname__", c.supply_prog))
        self.check_settings = replace(c, supply_prog=captured)

    # -----------------------------------------------------------------------------------------

    def _key_settings(self) -> dict[str, Any]:
        """Every setting that may change the answer (:func:`key_fields`), functions by fingerprint."""
        out = {name: function_fingerprint(v, set(), 0) if callable(v) else getattr(v, "value", v)
               for name, v in key_fields(self.check_settings, self.timing_settings, self.compile_settings).items()}
        out["timing_method"] = METHOD
        if self.timing_settings.timing == "batched":
            out["timing_batches"] = BATCHED_METHOD
        out["validate"] = function_fingerprint(self.validate, set(), 0) if self.validate else None
        return out

    def run(self, warmup: int | None = None, rep: int | None = None, timeout: float | None = None,
            **tilelang_options: Any) -> TuneResult:
        """Tune and return the best kernel. ``warmup`` and ``rep`` are numbers of calls (not ms);
        ``timeout`` (TileLang's) is ``compile_timeout``. TileLang's other ``run`` options are
        accepted and checked (:func:`_tilelang_run_options`); none of them changes the result.
        This is the job of one problem (:func:`autotuner.tune_all` tunes many as one job)."""
        from .job import tune_all

        return tune_all([self.plan(warmup, rep, timeout, **tilelang_options)])[0]

    def plan(self, warmup: int | None = None, rep: int | None = None, timeout: float | None = None,
             label: str = "", **tilelang_options: Any) -> Plan:
        """Everything :meth:`run` does before it tunes: settings checked, the target resolved (it must run
        here), the devices found, the database key computed. ``label`` names the problem in a job's
        progress bar and logs. :func:`autotuner.tune_all` takes a list of plans.

        Unless the database holds a finished run of this problem, the plan also starts the measuring
        processes (Ray: actors) its job will use, before the key's slow step (importing TileLang), so that
        their own start overlaps it (:mod:`.spares`); ``tune_all`` closes those no job took."""
        _tilelang_run_options(tilelang_options)
        self._use_captured_inputs()
        if timeout is not None:
            self.compile_settings = replace(self.compile_settings, compile_timeout=check_setting("timeout", timeout))
        dw, dr = self._profile_defaults
        self.timing_settings = replace(self.timing_settings,
                                       warmup=warmup if warmup is not None else (dw if dw is not None else 3),
                                       rep=rep if rep is not None else (dr if dr is not None else 20))
        t_start = time.perf_counter()
        # TileLang imported while the driver is asked about the GPU, where the measuring processes are
        # forked after it (they inherit it); not where they start before it, as Ray's actors or spawned ones
        prefetch = self.run_settings.backend != "ray" and forking.can_fork("cuda")
        target = resolve_target(self.compile_settings.target, prefetch_tilelang=prefetch)
        if not target.runnable:
            raise ValueError(
                f"target {target.spec} cannot run here (local GPU: {target.device_name or 'none'}); tuning "
                "needs to run candidates. Compile-only use: autotuner.compile.compile_all"
            )
        c = self.check_settings
        if self.timing_settings.timing_backend == "cudagraph" and (c.reset_to_zero or c.restore_value):
            raise ValueError("timing_backend='cudagraph' cannot reset or restore arguments between the calls it "
                             "captures; use timing_backend='event' with reset_to_zero/restore_value")
        if self.timing_settings.timing == "batched" and (c.reset_to_zero or c.restore_value):
            raise ValueError("timing='batched' times calls back to back with nothing between them, so it cannot "
                             "reset or restore arguments between calls; use timing='back_to_back' with "
                             "reset_to_zero/restore_value")
        rs = self.run_settings
        if rs.backend == "ray":  # connects (or starts a local Ray) here, before the run's scratch directory
            from .ray_cluster import resolve_ray_devices

            devices = resolve_ray_devices(rs.devices, target.kind, target.device_name, rs.allow_mixed_devices)
        elif rs.devices is not None:
            devices = resolve_devices(rs.devices, target.kind, rs.allow_mixed_devices)
        else:
            devices = None
        stamps = [(time.time(), "devices found")]
        names = sorted({d.name for d in devices or []})
        parts = key_parts(self.fn, self.configs, self._key_settings())
        pre = prekey(parts, str(target.spec), names)
        # likely tuned, not served from the database: start the measuring side now
        if not (rs.cache and finished_under(rs.db_path, pre)) and self._start_measuring(target, devices):
            stamps.append((time.time(), "measuring started"))
        target_key = target.key()  # imports TileLang in this process, the plan's longest step
        if target.kind == "cuda" and names and names != [target.device_name]:
            target_key += "|measured_on=" + ",".join(names)  # other models than the one the target names
        key = key_from_parts(parts, target_key)
        stamps.append((time.time(), "key hashed"))
        spec = BenchSpec(self.fn, target.spec, target.device, self.compile_settings.pass_config_dict, c,
                         self.timing_settings)
        return Plan(self, target, key, spec, devices, t_start, label or kernel_name(self.fn), pre, stamps)

    def _start_measuring(self, target: ResolvedTarget, devices: list[Device] | None) -> bool:
        """Start the measuring side the job will take (:mod:`.spares`), so that its imports and its GPU's
        start overlap the rest of the plan; on Ray, also start the compile hosts, whose fork servers import
        TileLang and the kernel. Before the job forks its compile pool, as every measuring process must be.
        Whether one was started (none when measuring in this process, ``isolate=False``, or when planning
        outside the main thread)."""
        rs = self.run_settings
        if rs.backend == "ray":
            from .ray_cluster import prestart_actors, prestart_compile_hosts

            prestart_actors(len(devices or []), target.device, [self.fn, self.check_settings.ref_prog])
            prestart_compile_hosts(self.fn, rs.n_jobs)
            return True
        if rs.isolate and threading.current_thread() is threading.main_thread():
            # a process dies with the thread that spawned it (PR_SET_PDEATHSIG): a plan made in a thread
            # that may end before the job does leaves the job to spawn its own
            prestart([d.env for d in devices] if devices else [{}], target.device)
            return True
        return False

    def cache_key(self, warmup: int, rep: int) -> str:
        """The database key that :meth:`run` ``(warmup, rep)`` tunes under, computed without compiling or
        timing anything: for callers that look a stored winner up without tuning (:mod:`.keyed`)."""
        saved = self.timing_settings
        self.timing_settings = replace(saved, warmup=check_setting("warmup", warmup), rep=check_setting("rep", rep))
        try:
            return tuning_key(self.fn, self.configs, resolve_target(self.compile_settings.target).key(),
                              self._key_settings())
        finally:
            self.timing_settings = saved

    def _load(self, config: dict[str, Any], target: ResolvedTarget, prim: bytes | None = None) -> tuple[Any, str]:
        """Compile ``config`` in this process (a TileLang disk-cache hit when it was built before) and
        return it with its PrimFunc's hash. ``prim``: the PrimFunc a compile worker built for it (the one
        checked and timed, :func:`.compile.load_prim`); without one, the user's factory elaborates it here."""
        func = load_prim(prim)
        if func is None:
            func = self._elaborate(config)  # here, bounded by compile_timeout, rather than inside build()
        return build(self.fn, config, target.spec, self.compile_settings.pass_config_dict, prim=func)

    def _elaborate(self, config: dict[str, Any]) -> Any:
        """``config``'s PrimFunc, elaborated here by the user's factory, bounded by ``compile_timeout``."""
        kwargs = split_config(config)[0]
        what = f"{kernel_name(self.fn)}({config_label(config)})"
        return _bounded(lambda: self.fn(**kwargs), self.compile_settings.compile_timeout, what)

    def _verified(self, jit: Any, spec: BenchSpec) -> str | None:
        """Check a kernel once in this process: ``None`` if it is right, else why not."""
        bench = Bench(replace(spec, timing=replace(spec.timing, warmup=0, rep=1)))
        try:
            failed = bench.check(jit)
        finally:
            bench.close()
        return None if failed is None else f"{failed[0]}: {error_headline(failed[1])}"

    def _wrap(self, jit: Any, target: ResolvedTarget) -> TunedKernel:
        c = self.check_settings
        out_idx, zero, restore = resolve_roles(c.out_idx, c.reset_to_zero, c.restore_value, param_names(jit))
        return TunedKernel(jit, out_idx, target.device, zero, [i for i in restore if i in out_idx])

    def _from_cache(self, db: TuningDB, key: str, target: ResolvedTarget, spec: BenchSpec,
                    t_start: float) -> TuneResult | None:
        """The stored winner, if every check passes; else ``None`` (with a warning saying why) to re-tune."""
        stored, cfg, why = self._sound_winner(db, key)
        if why is not None:
            return _distrust(why)
        if stored is None:
            return None
        jit, phash = self._load(cfg, target)
        if phash != stored.best_prim:
            return _distrust(_elaborates_otherwise(cfg))
        if self.run_settings.recheck:
            failed = self._verified(jit, spec)
            if failed is not None:
                return _distrust(f"the stored winner {config_label(cfg)} fails its check again ({failed})")
        logger.info("tuning cache hit %s: best %s at %.4f ms", key[:12], config_label(cfg), stored.best_latency_ms)
        trials = [stored.trials[i] for i in sorted(stored.trials)]
        return TuneResult(self._wrap(jit, target), cfg, stored.best_latency_ms, stored.ref_latency_ms, trials,
                          True, key, time.perf_counter() - t_start, str(target.spec))

    def stored_winner(self, db: TuningDB, key: str) -> tuple[StoredRun | None, str | None]:
        """The finished run stored under ``key`` if this tuner may serve its winner, and else why not (``None``
        when nothing is stored): its rows must be sound (:meth:`_unsound`) and its winner must elaborate
        here (bounded by ``compile_timeout``) to the PrimFunc that was tuned, as on :meth:`run`'s warm path.
        Compiles nothing: for callers that serve a stored winner without tuning (:mod:`.keyed`)."""
        stored, cfg, why = self._sound_winner(db, key)
        if stored is None:
            return None, why
        try:
            phash = prim_hash(self._elaborate(cfg))
        except Exception as e:  # noqa: BLE001 - the user's factory failing now: not a winner to serve
            return None, f"the winner {config_label(cfg)} fails to elaborate now: {error_headline(format_error(e))}"
        return (stored, None) if phash == stored.best_prim else (None, _elaborates_otherwise(cfg))

    def _sound_winner(self, db: TuningDB, key: str) -> tuple[StoredRun | None, dict[str, Any] | None, str | None]:
        """The finished run stored under ``key`` and its winner among :attr:`configs`, if its rows are sound
        (:meth:`_unsound`); else why not (all ``None`` when nothing is stored). The warm path's checks up to
        the winner's PrimFunc, which :meth:`_from_cache` and :meth:`stored_winner` each make their way."""
        try:
            stored = db.finished_run(key)
        except DamagedRow as e:
            return None, None, f"a damaged row ({e})"
        if stored is None or stored.best_config is None:
            return None, None, None
        why = self._unsound(stored)
        if why is not None:
            return None, None, why
        return stored, self.configs[config_index(self.configs, stored.best_config)], None

    def _unsound(self, stored: StoredRun) -> str | None:
        """Why a stored run cannot be what this tuner wrote for these configs, or ``None``."""
        n = len(self.configs)
        if set(stored.trials) != set(range(n)):
            return f"its trials cover configs {sorted(stored.trials)[:10]}..., not the {n} asked for"
        for i, t in stored.trials.items():
            if not same_config(t.config, self.configs[i]):
                return f"trial {i} is for {t.config!r}, not configs[{i}] = {self.configs[i]!r}"
        best_i = config_index(self.configs, stored.best_config)
        if best_i is None:
            return f"its best config {stored.best_config!r} is not one of the configs asked for"
        best = stored.trials[best_i]
        if best.status != Status.OK or best.median_ms != stored.best_latency_ms:
            return (f"its best config's trial is {best.status} at {best.median_ms!r} ms, "
                    f"not ok at the stored {stored.best_latency_ms!r} ms")
        if stored.best_prim is None:
            return "it was stored without the winner's PrimFunc hash (an older tilecarve)"
        return None

    def _reasons(self, cfg: dict[str, Any]) -> list[str]:
        """Why ``validate`` refuses ``cfg``. A validate that raises for it, or does not return within
        ``compile_timeout``, refuses it too, saying so: one config it cannot judge costs that config only."""
        if self.validate is None:
            return []
        timeout = self.compile_settings.compile_timeout
        try:
            r = _bounded(lambda: self.validate(dict(cfg)), timeout, f"validate({config_label(cfg)})")
        except TuningError:
            return [f"validate did not return within {timeout:g} s (compile_timeout) for this config"]
        except Exception as e:  # noqa: BLE001 - the user's validate failing for this config: its verdict
            return [f"validate raised {error_headline(format_error(e))}"]
        return as_reasons(r)


#: TileLang's ``AutoTuner.run`` options and their types. tilecarve always overlaps compiling with
#: measuring (``use_pipeline``), compiles one config per job in a pool (``enable_grouped_compile``,
#: ``group_compile_size``), measures on one GPU (``benchmark_multi_gpu``, ``benchmark_devices``) and
#: times every candidate in full (``early_stop``, ``early_stop_factor``): the same pick or a surer one.
_TILELANG_RUN_OPTIONS = {"use_pipeline": bool, "enable_grouped_compile": bool, "group_compile_size": int,
                         "benchmark_multi_gpu": bool, "benchmark_devices": (list, tuple, type(None)),
                         "early_stop": bool, "early_stop_factor": (int, float)}


def _tilelang_run_options(options: Mapping[str, Any]) -> None:
    for name, value in options.items():
        if name not in _TILELANG_RUN_OPTIONS:
            raise TypeError(f"run() got an unexpected keyword argument {name!r}; it takes warmup, rep, timeout "
                            f"and TileLang's {sorted(_TILELANG_RUN_OPTIONS)}")
        if isinstance(value, bool) and _TILELANG_RUN_OPTIONS[name] is not bool or not isinstance(
                value, _TILELANG_RUN_OPTIONS[name]):
            raise TypeError(f"run({name}={value!r}): expected {_TILELANG_RUN_OPTIONS[name]}")
    if options.get("early_stop_factor", 2.0) < 1.0:
        raise ValueError(f"early_stop_factor must be >= 1.0, got {options['early_stop_factor']!r}")
    if options.get("benchmark_multi_gpu"):
        logger.info("benchmark_multi_gpu: tilecarve measures every candidate on one GPU, so timings compare")


def _elaborates_otherwise(cfg: dict[str, Any]) -> str:
    return (f"the winner {config_label(cfg)} now elaborates to a different PrimFunc than the one tuned: code the "
            "kernel calls has changed, or the factory depends on the process it runs in (see KernelFactoryWarning)")


def _distrust(why: str) -> None:
    warnings.warn(f"not using the stored tuning result: {why}; tuning again", TuningCacheWarning, stacklevel=4)
    return None


@dataclass
class Plan:
    """One problem made ready to tune (:meth:`AutoTuner.plan`): its target resolved, its database key
    computed, what the measuring side needs. :func:`autotuner.tune_all` tunes a list of them as one job;
    what the job needs of the tuner it asks here."""

    tuner: AutoTuner
    target: ResolvedTarget
    key: str
    spec: BenchSpec
    devices: list[Device] | None
    t_start: float
    label: str = ""
    prekey: str = ""  # stored with the run: a later plan of the same problem starts no measuring side early
    stamps: list[tuple[float, str]] = field(default_factory=list)  # (wall time, what) of the plan's steps

    @property
    def configs(self) -> list[dict[str, Any]]:
        return self.tuner.configs

    @property
    def run_settings(self) -> RunSettings:
        return self.tuner.run_settings

    @property
    def kernel_name(self) -> str:
        return kernel_name(self.tuner.fn)

    def cached(self, db: TuningDB) -> TuneResult | None:
        """The stored winner if every check of the warm path passes, else ``None`` (tune it)."""
        return self.tuner._from_cache(db, self.key, self.target, self.spec, self.t_start)

    def reasons(self, cfg: dict[str, Any]) -> list[str]:
        """Why ``validate`` refuses ``cfg`` (empty: it may be compiled)."""
        return self.tuner._reasons(cfg)

    def load(self, cfg: dict[str, Any], prim: bytes | None = None) -> tuple[Any, str]:
        """``cfg`` compiled in this process (a disk-cache hit) and its PrimFunc's hash; from ``prim``, the
        PrimFunc a compile worker built, when there is one."""
        return self.tuner._load(cfg, self.target, prim)

    def own_hash(self, cfg: dict[str, Any]) -> str:
        """The hash of the PrimFunc the user's factory gives for ``cfg`` in this process."""
        return prim_hash(self.tuner._elaborate(cfg))

    def verified(self, jit: Any) -> str | None:
        """Check a kernel once in this process: ``None`` if it is right, else why not."""
        return self.tuner._verified(jit, self.spec)

    def result(self, jit: Any, best: Trial, ref_latency: float | None, trials: list[Trial],
               phases: dict[str, float], timeline: Timeline | None = None) -> TuneResult:
        """The cold run's result; ``jit`` ``None`` when the winner was not loaded here."""
        kernel = self.tuner._wrap(jit, self.target) if jit is not None else None
        return TuneResult(kernel, best.config, best.median_ms, ref_latency, trials, False, self.key,
                          time.perf_counter() - self.t_start, str(self.target.spec), phases=phases,
                          timeline=timeline)

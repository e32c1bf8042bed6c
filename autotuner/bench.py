"""The measuring half of tuning: load a compiled candidate, check it, time it.

A :class:`Bench` measures the candidates of one problem (one :class:`BenchSpec`) in this process. A
tuning job (:mod:`.job`: one problem, or many keys of a model) measures through a :class:`Measurer`,
which holds every problem's spec and names one by its position in the job (``sid``):

* :class:`Benches` measures in this process, one ``Bench`` per spec.
* :class:`IsolatedBench` (the default) runs a ``Benches`` in a spawned process that owns the GPU,
  one process for the whole job.
  A kernel that faults leaves a CUDA context unusable for the rest of the process ("sticky"
  errors such as an illegal address), and one that segfaults on the CPU takes its process with
  it. Isolated, that costs one trial (``runtime_error``) and a restart of the measuring process;
  a kernel that runs past ``run_timeout`` is killed (``timeout``). The process starts during the plan
  (:func:`prestart`, :mod:`.spares`), so that its imports and its GPU's start overlap the plan and
  compilation. It is forked from this process while that is safe (:mod:`.forking`: this process has not
  started CUDA), so it has torch and TileLang at once; otherwise (CUDA already started, as in model
  code or a notebook that used the GPU) it is a fresh interpreter, which imports them (4-6 s).
* Both it and a Ray measuring actor (:mod:`.ray_cluster`) are a :class:`ServedBench`: a ``Benches``
  on the other side of a channel, answering :func:`serve_one`'s requests.

A problem's inputs (generated tensors, their pristine copies, the reference's outputs) are made when its
first candidate arrives and freed by ``release(sid)`` when its last is recorded; re-timing its finalists
makes them again (same seed, same data), so a job keeps few problems' inputs on the device at once. The
job's first problem has them made ahead, while the measuring side waits for its first candidate
(``prepare``: the config elaborated, no compile), so that this candidate only loads its kernel.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from . import forking, procs, spares
from .check import (
    compare,
    make_args,
    manual_check,
    needs_second_poison,
    poison_,
    run_reference,
    same_bits,
    supplied_inputs,
    unwritten_under_both_poisons,
)
from .compile import (
    build,
    cloudpickle_module,
    elaborate_config,
    kernel_globals,
    kernel_sources,
    load_prim,
    restore_globals,
    seed_linecache,
)
from .config import config_label
from .errors import CudaContextLost, TuningInputError
from .scratch import input_positions
from .scratch import positions as scratch_positions
from .settings import CheckSettings, TimingSettings, resolve_out_idx
from .timing import Timing, l2_flush_buffer, time_callable
from .trial import Status, Trial, error_headline, format_error

__all__ = ["Bench", "BenchSpec", "Benches", "IsolatedBench", "Measurer", "ServedBench", "load_specs", "make_measurer",
           "param_names", "prestart", "raise_for_reply", "resolve_roles", "serve_one", "spec_payload", "start_device"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class BenchSpec:
    """Everything the measuring side needs; picklable (cloudpickle) so it can cross processes."""

    kernel: Callable[..., Any]
    target_spec: Any
    device: str  # "cuda" or "cpu"
    pass_configs: dict[str, Any] | None
    check: CheckSettings
    timing: TimingSettings


def param_names(jit: Any) -> list[str]:
    """The kernel's buffer names (``A``, ``B``, ``C``), for messages and for naming arguments."""
    try:
        func = jit.prim_func
        return [str(func.buffer_map[p].name) if p in func.buffer_map else str(p.name) for p in func.params]
    except Exception:  # noqa: BLE001 - a kernel object without a PrimFunc: fall back to positions
        return [f"arg{i}" for i in range(len(jit.params))]


def resolve_roles(out_idx: list[int] | None, reset_to_zero: tuple[int | str, ...], restore_value: tuple[int | str, ...],
                  names: list[str]) -> tuple[list[int], list[int], list[int]]:
    """``(outputs, reset-to-zero, restore-value)`` as parameter indices of a kernel with buffers ``names``;
    an index out of range or an unknown name is a :class:`TuningInputError`."""
    try:
        outs = resolve_out_idx(out_idx, len(names))
    except ValueError as e:
        raise TuningInputError(f"{e} (the kernel's arguments: {names})") from None
    zero = _resolve_names(reset_to_zero, names, "reset_to_zero")
    restore = _resolve_names(restore_value, names, "restore_value")
    if set(zero) & set(restore):
        raise TuningInputError(f"arguments {[names[i] for i in sorted(set(zero) & set(restore))]} are in both "
                               "reset_to_zero and restore_value; name each in one")
    return outs, zero, restore


def _resolve_names(wanted: tuple[int | str, ...], names: list[str], what: str) -> list[int]:
    out = []
    for w in wanted:
        if isinstance(w, str):
            if w not in names:
                raise TuningInputError(f"{what} names {w!r}, but the kernel's arguments are {names}")
            out.append(names.index(w))
        else:
            out.extend(resolve_out_idx([w], len(names), what))
    return sorted(set(out))


@dataclass
class _Case:
    """The buffers every candidate of one parameter signature runs on, and what may change in them.

    ``pristine`` holds a copy of every argument that is neither a pure output nor scratch: after each call the
    guarded ones are compared with it bit for bit (a candidate that writes to an input is a
    mismatch, and the input is restored before the next candidate), and ``restore`` arguments are
    copied back from it before every call.
    """

    args: list[Any]
    names: list[str]
    out_idx: list[int]
    zero: list[int]
    restore: list[int]
    guarded: list[int]
    pristine: dict[int, Any]
    scratch: list[int] = field(default_factory=list)  # poisoned like outputs, never compared (:mod:`.scratch`)
    refs: list[Any] | None = None  # the reference's outputs, made at the first check (re-timing needs none)
    ref_latency: float | None = None  # the reference timed on these inputs, when it was timed on them

    def prepare(self, poison: bool, second: bool = False) -> None:
        """Outputs poisoned (when checking; ``second``: with the second poison, :func:`.check.poison_`),
        reset-to-zero arguments zeroed, restored ones restored."""
        if poison:
            for i in self.out_idx + self.scratch:
                if i not in self.zero and i not in self.restore:
                    poison_(self.args[i], second)
        for i in self.zero:
            self.args[i].zero_()
        for i in self.restore:
            self.args[i].copy_(self.pristine[i])

    def written_inputs(self) -> list[int]:
        """Guarded arguments whose bits changed; each is restored from its pristine copy."""
        bad = [i for i in self.guarded if not same_bits(self.args[i], self.pristine[i])]
        for i in bad:
            self.args[i].copy_(self.pristine[i])
        return bad


class Measurer(Protocol):
    """What a tuning job asks of the measuring side, in this process (:class:`Benches`) or isolated
    (:class:`IsolatedBench`, :class:`.devices.DevicePool`). ``sid`` names one of the job's specs."""

    def measure(self, sid: int, index: int, cfg: dict[str, Any], compile_s: float | None,
                prim: bytes | None = None) -> Trial: ...

    def prepare(self, sid: int, config: dict[str, Any], elaborate_timeout: float) -> None: ...

    def retime(self, sid: int, index: int, cfg: dict[str, Any], prim: bytes | None = None) -> Timing | None: ...

    def fetch_ref_latency(self, sid: int) -> float | None: ...

    def local_kernel(self, sid: int, index: int) -> Any | None: ...

    def measured_hash(self, sid: int, index: int) -> str | None: ...

    def release(self, sid: int) -> None: ...

    def take_stamps(self) -> list[tuple[float, str]]: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class _Elaborated:
    """A config's PrimFunc, standing in for its compiled kernel where only its parameters are needed
    (:meth:`Bench.make_inputs`): ``params`` as TileLang gives a compiled kernel's (``KernelParam.from_buffer``
    for each buffer, as ``tilelang.engine.lower`` makes them), ``prim_func`` for their names."""

    prim_func: Any
    params: list[Any]

    @classmethod
    def of(cls, func: Any) -> _Elaborated:
        from tilelang.engine.param import KernelParam

        return cls(func, [KernelParam.from_buffer(func.buffer_map[v]) if v in func.buffer_map
                          else KernelParam.from_var(v) for v in func.params])


class Bench:
    """Measure candidates in this process. ``stamps``: ``(wall time, what)`` of its one-off steps (a
    problem's inputs made, its reference run and timed), named with ``tag``, for a job's timeline."""

    def __init__(self, spec: BenchSpec, tag: str = "") -> None:
        self.spec = spec
        self.tag = tag
        self.stamps: list[tuple[float, str]] = []
        self._cases: dict[tuple, _Case] = {}
        self._kernels: dict[int, Any] = {}
        self._hashes: dict[int, str] = {}
        self.ref_latency: float | None = None
        self._first: _Elaborated | None = None  # elaborate()'s config, for make_inputs()
        self._loaded = False  # a candidate's kernel has been loaded (the timeline's "first kernel loaded")
        self.launched = False  # a candidate's kernel was launched since :class:`Benches` last cleared it

    def elaborate(self, config: dict[str, Any]) -> None:
        """The first step of :meth:`make_inputs`, apart so that the caller can bound it as the user's kernel
        factory is bounded everywhere (``compile_timeout``): elaborate ``config`` (no compile)."""
        self._first = _Elaborated.of(elaborate_config(self.spec.kernel, config))
        self.stamps.append((time.time(), f"first config elaborated{self.tag}"))

    def make_inputs(self) -> None:
        """Make the problem's inputs and the reference's outputs (and time the reference) for the config
        :meth:`elaborate` elaborated, before its first candidate arrives: what the first check would make,
        made the same way (same parameters, seed and calls), so that a candidate only loads its kernel.
        A candidate whose parameters differ gets inputs of its own, as before."""
        first, self._first = self._first, None
        if first is not None:
            self._refs(self._case(first), adopt=False)

    def _case(self, jit: Any) -> _Case:
        """Inputs and pristine copies per distinct parameter signature, made at first use and kept until
        :meth:`release` (the reference's outputs are made by :meth:`_refs` at the first check)."""
        s = self.spec.check
        device = self.spec.device
        sig = tuple((tuple(map(str, p.shape)), str(p.dtype)) for p in jit.params)
        if sig in self._cases:
            return self._cases[sig]
        names = param_names(jit)
        out_idx, zero, restore = resolve_roles(s.out_idx, s.reset_to_zero, s.restore_value, names)
        scratch = scratch_positions(jit, out_idx)
        if set(scratch) & set(restore):
            raise TuningInputError(f"restore_value names {[names[i] for i in scratch if i in restore]}, a scratch "
                                   f"parameter (autotuner.scratch: working memory the caller allocates per call, "
                                   f"never an input); take it out of restore_value")
        try:
            args = make_args(jit.params, out_idx + scratch, s.supply_type, device)
        except (ValueError, TypeError) as e:
            raise TuningInputError(str(e)) from e
        ins = input_positions(len(args), out_idx, scratch)
        if s.supply_prog is not None:  # the user's inputs in place of generated ones; outputs stay poisoned
            for i, given in zip(ins, supplied_inputs(s.supply_prog, [jit.params[i] for i in ins], device)):
                args[i] = given
        for i in restore:  # restore_value outputs start from generated data, like inputs
            if i in out_idx:
                args[i] = make_args([jit.params[i]], [], s.supply_type, device, seed=1000 + i)[0]
        pristine = {i: a.clone() for i, a in enumerate(args) if i in ins or i in restore}
        guarded = [i for i in pristine if i not in zero and i not in restore]
        self._cases[sig] = _Case(args, names, out_idx, zero, restore, guarded, pristine, scratch)
        self.stamps.append((time.time(), f"inputs made{self.tag}"))
        return self._cases[sig]

    def _refs(self, case: _Case, adopt: bool = True) -> list[Any] | None:
        """The reference's outputs on ``case``'s inputs, computed once per case; the reference is timed
        once per problem, on the first case whose outputs are made, and becomes the problem's
        ``ref_latency`` when that case is first checked (``adopt``): one made ahead (:meth:`make_inputs`) and
        never checked leaves it unset, as when no candidate was checked."""
        s, t = self.spec.check, self.spec.timing
        if case.refs is None and s.ref_prog is not None:
            ref_in = [case.pristine[i].clone() for i in sorted(case.pristine) if i not in case.zero]
            refs = run_reference(s.ref_prog, ref_in, len(case.out_idx),
                                 [tuple(case.args[i].shape) for i in case.out_idx])
            # copies: a reference that updates an input in place returns it, and timing it below goes on changing it
            case.refs = [r.clone() if hasattr(r, "clone") else r for r in refs]
            self.stamps.append((time.time(), f"reference run{self.tag}"))
            if self.ref_latency is None:
                ref = s.ref_prog
                case.ref_latency = time_callable(lambda: ref(*ref_in), t.warmup, t.rep, self.spec.device,
                                                 mode=t.finalist_mode, sustain_s=t.sustain_s).median_ms
                self.stamps.append((time.time(), f"reference timed{self.tag}"))
        if adopt and self.ref_latency is None:
            self.ref_latency = case.ref_latency
        return case.refs

    def check(self, jit: Any) -> tuple[str, str] | None:
        """Run ``jit`` once on fresh buffers and check it: ``None`` when it passes, else ``(status, why)``.

        Raises :class:`TuningInputError` when the problem itself is wrong (the reference, out_idx).
        """
        case = self._case(jit)
        refs = self._refs(case)  # before the candidate runs: a wrong problem is found before any candidate
        outs = [case.args[i] for i in case.out_idx]
        unchecked = refs is None or self.spec.check.skip_check  # no reference to catch unwritten integers
        first: list[Any] = []
        for second in (False, True):  # the second poison only where the first could pass unwritten elements
            if second and not needs_second_poison(outs, refs):
                break
            case.prepare(poison=True, second=second)
            try:
                self.launched = True
                jit(*case.args)
                self._sync()
            except Exception as e:  # noqa: BLE001 - any launch failure is this config's runtime_error
                return Status.RUNTIME_ERROR, format_error(e)
            why = self._written_message(case, "")
            if why is None:
                why = self._check(outs, refs)
            if why is None and unchecked:
                if second:
                    why = unwritten_under_both_poisons(first, outs)
                else:
                    first = [None if o.is_floating_point() else o.clone() for o in outs]
            if why is not None:
                return Status.MISMATCH, why + (" (with the second poison: elements never written)" if second else "")
        return None

    @staticmethod
    def _written_message(case: _Case, when: str) -> str | None:
        written = case.written_inputs()
        if not written:
            return None
        which = ", ".join(f"argument {i} ({case.names[i]})" for i in written)
        if not case.out_idx:  # no output named at all: far likelier a forgotten out_idx than an in-place kernel
            return (f"the kernel wrote to its input {which}{when}, and out_idx names no output; pass the "
                    f"outputs' indices, e.g. out_idx=[-1] for the last argument (a kernel that updates an argument "
                    f"in place needs it in restore_value instead)")
        return (f"the kernel wrote to its input {which}{when}, which is not an output (out_idx={case.out_idx}); "
                "a kernel that updates an argument in place needs it in restore_value (or reset_to_zero)")

    def _time(self, jit: Any, case: _Case, mode: str) -> Timing:
        t = self.spec.timing
        prepare = (lambda: case.prepare(poison=False)) if case.zero or case.restore else None
        self.launched = True
        return time_callable(lambda: jit(*case.args), t.warmup, t.rep, self.spec.device, mode=mode,
                             backend=t.timing_backend, sustain_s=t.sustain_s, prepare=prepare)

    def measure(self, index: int, cfg: dict[str, Any], compile_s: float | None, prim: bytes | None = None) -> Trial:
        """Load ``cfg``'s kernel (compiled already: a disk-cache hit), check it, time it. ``prim``: the
        PrimFunc its compile built (:attr:`.compile.CompileOutcome.prim`), loaded rather than elaborated
        again; what is checked and timed, and hashed for the winner's check, is that PrimFunc's kernel."""
        s = self.spec
        try:
            jit, digest = build(s.kernel, cfg, s.target_spec, s.pass_configs, prim=load_prim(prim))
        except Exception as e:  # noqa: BLE001 - the worker compiled it; a failure to load is this config's
            return Trial(cfg, Status.COMPILE_ERROR, "load after compile failed: " + format_error(e), compile_s)
        if not self._loaded:  # the first kernel: what its load costs, apart from the inputs
            self._loaded = True
            self.stamps.append((time.time(), f"first kernel loaded{self.tag}"))
        failed = self.check(jit)
        if failed is not None:
            return Trial(cfg, failed[0], failed[1], compile_s)
        case = self._case(jit)
        try:
            timing = self._time(jit, case, s.timing.candidate_mode)
        except Exception as e:  # noqa: BLE001
            return Trial(cfg, Status.RUNTIME_ERROR, format_error(e), compile_s)
        why = self._written_message(case, " while being timed")
        if why is not None:
            return Trial(cfg, Status.MISMATCH, why, compile_s)
        self._kernels[index] = jit
        self._hashes[index] = digest
        return Trial(cfg, Status.OK, None, compile_s, timing.median_ms, timing.min_ms, timing.iqr_ms)

    def retime(self, index: int, cfg: dict[str, Any], prim: bytes | None = None) -> Timing | None:
        """Time a measured candidate again, as ``spec.timing`` says (finalists, once compilation no
        longer loads the CPU).

        After a restart of the measuring process, or on a device that did not measure it, the kernel is
        loaded again (a disk-cache hit) from ``prim``, the PrimFunc its compile built and that was checked
        and timed; the config is elaborated again only without one (a trial resumed from an earlier run),
        and then checked first, since the code it elaborates may have changed since that run.
        ``None`` when it cannot be loaded, fails that check, or cannot be run again (the caller drops it
        from the finalists).
        """
        try:
            if index not in self._kernels:
                s = self.spec
                jit, digest = build(s.kernel, cfg, s.target_spec, s.pass_configs, prim=load_prim(prim))
                if prim is None and index not in self._hashes:  # never checked in this run
                    failed = self.check(jit)
                    if failed is not None:
                        logger.warning("config %s, resumed from an interrupted run, fails its check now (%s: %s); "
                                       "not a finalist", config_label(cfg), failed[0], error_headline(failed[1]))
                        return None
                    self._hashes[index] = digest
                self._kernels[index] = jit
            jit = self._kernels[index]
            return self._time(jit, self._case(jit), self.spec.timing.finalist_mode)
        except TuningInputError:
            raise
        except Exception as e:  # noqa: BLE001 - the user's factory, or the kernel, failing now: not a winner
            logger.warning("config %s could not be re-timed: %s", config_label(cfg), error_headline(format_error(e)))
            return None

    def local_kernel(self, index: int) -> Any | None:
        """The loaded kernel of a candidate measured in this process, or ``None``."""
        return self._kernels.get(index)

    def measured_hash(self, index: int) -> str | None:
        """The PrimFunc hash of the kernel checked and timed as ``index`` in this run, or ``None``."""
        return self._hashes.get(index)

    def fetch_ref_latency(self) -> float | None:
        """The reference's latency: timed at the first check, or now, on the inputs in use, when no check
        ran in this process (the finalists of a resumed run); ``None`` without a reference or inputs."""
        if self.ref_latency is None and self._cases:
            self._refs(next(iter(self._cases.values())))
        return self.ref_latency

    def release(self) -> None:
        """Free the inputs (and the reference's outputs); the loaded kernels stay for re-timing."""
        self._cases.clear()
        self._first = None

    def close(self) -> None:
        self._kernels.clear()
        self._cases.clear()

    def _sync(self) -> None:
        if self.spec.device == "cuda":
            import torch

            torch.cuda.synchronize()

    def _check(self, outs: list[Any], refs: list[Any] | None) -> str | None:
        """``None`` when the outputs pass, else why not."""
        import torch

        s = self.spec.check
        if refs is None or s.skip_check:
            for j, o in enumerate(outs):  # still catch unwritten outputs
                if o.is_floating_point() and bool(torch.isnan(o).any()):
                    return f"output {j} still holds NaN poison: some elements were never written"
            return None
        if s.manual_check_prog is not None:  # replaces the element-wise comparison, for every candidate
            return manual_check(s.manual_check_prog, outs, refs)
        res = compare(outs, refs, s.atol, s.rtol, s.max_mismatched_ratio)
        return None if res.ok else res.detail


class Benches:
    """The measuring side of a job in this process: one :class:`Bench` per spec, made at its first use.

    A candidate can leave the process's CUDA context unusable (a sticky error: a device-side assert, an
    illegal address), after which every CUDA call fails, the next candidates' and the reference's alike.
    When a request whose candidate's kernel was launched fails on a GPU, the context is probed
    (:meth:`_context_lost`); if it is gone, :class:`.errors.CudaContextLost` names that candidate. A measuring
    process or Ray actor answers ``("lost", why)`` (:func:`serve_one`) and is replaced by the job; in the
    tuning process itself (``isolate=False``) the job stops with it."""

    def __init__(self, specs: list[BenchSpec]) -> None:
        self.specs = list(specs)
        self._benches: dict[int, Bench] = {}
        self.stamps: list[tuple[float, str]] = []  # the measuring side's own (its start), for take_stamps

    def bench(self, sid: int) -> Bench:
        if sid not in self._benches:
            self._benches[sid] = Bench(self.specs[sid], f" #{sid}")
        return self._benches[sid]

    def take_stamps(self) -> list[tuple[float, str]]:
        """The ``(wall time, what)`` stamps recorded since the last call (:mod:`.timeline`)."""
        out = self.stamps + [x for b in self._benches.values() for x in b.stamps]
        self.stamps = []
        for b in self._benches.values():
            b.stamps = []
        return sorted(out)

    def measure(self, sid: int, index: int, cfg: dict[str, Any], compile_s: float | None,
                prim: bytes | None = None) -> Trial:
        bench = self.bench(sid)
        trial = self._guarded(bench, cfg, lambda: bench.measure(index, cfg, compile_s, prim))
        if trial.status == Status.RUNTIME_ERROR:
            self._unless_lost(bench, cfg, trial.error)
        return trial

    def _guarded(self, bench: Bench, cfg: dict[str, Any], call: Callable[[], Any]) -> Any:
        """``call()`` for candidate ``cfg``; if it raises once its kernel was launched, first see whether
        the CUDA context is gone (:meth:`_unless_lost`). A wrong problem (:class:`TuningInputError`: the
        reference, the inputs) is the problem's, even when it broke the context: it is raised as it is."""
        bench.launched = False
        try:
            return call()
        except TuningInputError:
            raise
        except Exception as e:
            self._unless_lost(bench, cfg, format_error(e))
            raise

    def _unless_lost(self, bench: Bench, cfg: dict[str, Any], failure: str | None) -> None:
        """After candidate ``cfg`` failed (``failure``): raise :class:`.errors.CudaContextLost` if its kernel
        was launched and the CUDA context is now unusable; return when it is fine (the failure was the
        candidate's own) or when no kernel of it ran (not its doing)."""
        if not bench.launched:
            return
        why = self._context_lost()
        if why is not None:
            raise CudaContextLost(f"config {config_label(cfg)} left its process's CUDA context unusable ({why}); "
                                  f"its own failure: {error_headline(failure or '', 300)}")

    def _context_lost(self) -> str | None:
        """Why this process's CUDA context is unusable (a sticky error that every call now returns), or
        ``None``: fine, or no GPU in use."""
        if not any(s.device == "cuda" for s in self.specs):
            return None
        import torch

        try:
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - any error here is the context's
            return error_headline(format_error(e))
        return None

    def elaborate(self, sid: int, config: dict[str, Any]) -> bool:
        """:meth:`Bench.elaborate` ahead of spec ``sid``'s first candidate (:meth:`ahead` says how)."""
        return self.ahead(sid, lambda b: b.elaborate(config))

    def make_inputs(self, sid: int) -> bool:
        """:meth:`Bench.make_inputs` ahead of spec ``sid``'s first candidate (:meth:`ahead` says how)."""
        return self.ahead(sid, Bench.make_inputs)

    def prepare(self, sid: int, config: dict[str, Any], elaborate_timeout: float) -> None:
        """Nothing: in this process, inputs made before the first candidate arrives would delay the job
        as much as inputs made when it arrives (a measuring process makes them while it waits:
        :meth:`IsolatedBench.prepare`)."""

    def ahead(self, sid: int, step: Callable[[Bench], Any]) -> bool:
        """Run a step done ahead of a problem's first candidate; whether it succeeded. A step that fails
        is nobody's result: what it made is dropped and the first candidate makes it again, so that the
        problem fails (or not) as it would have without the step."""
        try:
            step(self.bench(sid))
        except Exception as e:  # noqa: BLE001 - made again, and reported, by the first candidate
            logger.debug("preparing problem %d ahead of its first candidate failed: %s", sid, format_error(e))
            self.release(sid)
            return False
        return True

    def retime(self, sid: int, index: int, cfg: dict[str, Any], prim: bytes | None = None) -> Timing | None:
        bench = self.bench(sid)
        timing = self._guarded(bench, cfg, lambda: bench.retime(index, cfg, prim))
        if timing is None:
            self._unless_lost(bench, cfg, "it could not be re-timed")
        return timing

    def fetch_ref_latency(self, sid: int) -> float | None:
        return self.bench(sid).fetch_ref_latency()

    def local_kernel(self, sid: int, index: int) -> Any | None:
        return self.bench(sid).local_kernel(index)

    def measured_hash(self, sid: int, index: int) -> str | None:
        return self.bench(sid).measured_hash(index)

    def release(self, sid: int) -> None:
        if sid in self._benches:
            self._benches[sid].release()

    def close(self) -> None:
        for b in self._benches.values():
            b.close()
        self._benches.clear()


# ---------------------------------------------------------------------------------------------
# isolation


def _create_context(done: list[float]) -> None:
    """Create the process's CUDA context for its GPU (the primary context of device 0, which torch uses)
    through the driver API, appending the time it was ready to ``done``. It runs on a thread while the
    main thread imports torch and TileLang: ``ctypes`` calls hold no GIL and import nothing, so the
    driver's start (1-2 s on an H200) overlaps the imports. Any failure is left to torch to meet and
    report."""
    import ctypes

    try:
        cuda = ctypes.CDLL("libcuda.so.1")
        dev, ctx = ctypes.c_int(), ctypes.c_void_p()
        if (cuda.cuInit(0) == 0 and cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
                and cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0):
            done.append(time.time())
    except OSError:  # no driver library: torch says so at the first candidate
        pass


def start_device(device: str) -> list[tuple[float, str]]:
    """What a measuring side can do before it has a job, done at once: on a GPU, create the CUDA context
    (:func:`_create_context`, on a thread: ``"context created"``) while importing torch (``"torch
    imported"``), then torch's CUDA start and the L2 flush buffer (``"device ready"``), then import
    TileLang (``"tilelang imported"``; before the context is waited for when torch was there already, as
    in a forked process); the timeline's stamps. A failure is left for the first candidate
    to meet and report."""
    made: list[float] = []
    ctx = threading.Thread(target=_create_context, args=(made,), name="tilecarve-context", daemon=True) \
        if device == "cuda" else None
    if ctx is not None:
        ctx.start()
    import torch

    stamps = [(time.time(), "torch imported")]
    early = ctx is not None and ctx.is_alive()  # torch came at once (forked): TileLang while the driver starts
    if early:
        import tilelang  # noqa: F401

        stamps.append((time.time(), "tilelang imported"))
    if ctx is not None:
        ctx.join()
        stamps += [(t, "context created") for t in made]
        try:
            torch.cuda.init()
            l2_flush_buffer(device)
        except Exception as e:  # noqa: BLE001 - met again, and reported, by the first candidate
            logger.debug("starting the GPU ahead failed: %s", format_error(e))
    stamps.append((time.time(), "device ready"))
    if not early:
        import tilelang  # noqa: F401 - every candidate's load needs it

        stamps.append((time.time(), "tilelang imported"))
    return sorted(stamps)


#: A measuring process's name (``ps -o comm``, ``/proc/<pid>/comm``), forked or spawned.
MEASURING_PROCESS_NAME = "tilecarve-bench"


def _serve(fd: int, device: str = "cpu") -> None:
    """Main of the measuring process (``python -c``): its device started (:func:`start_device`) while it
    waits for its job's specs (as a spare it quits if none come: :mod:`.spares`), then one request in,
    one reply out, over ``fd``."""
    from multiprocessing.connection import Connection

    up = time.time()
    procs.name_process(MEASURING_PROCESS_NAME)
    _report_crashes()
    conn = Connection(fd)
    job: list[Any] = []  # read at once, on a thread: a large payload would block the parent's send meanwhile
    reader = threading.Thread(target=lambda: job.append(_receive_job(conn)), name="tilecarve-job", daemon=True)
    reader.start()
    stamps = [(up, "process up"), *start_device(device)]
    reader.join()
    if not job or job[0] is None:
        return
    payload, scratch = job[0]
    if scratch is not None and os.path.isdir(scratch):  # spawned before the run's scratch directory existed
        procs.use_tempdir(scratch)
    benches = Benches(load_specs(*payload))
    benches.stamps += [*stamps, (time.time(), "imports done")]
    conn.send(("ready", None))
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg[0] not in _REQUESTS:
            return
        conn.send(serve_one(benches, msg))


def _report_crashes() -> None:
    """Have a crash of this measuring process (a kernel that segfaults on the CPU side) print its Python
    stack on stderr (:func:`.procs.report_crashes`)."""
    try:
        procs.report_crashes(sys.__stderr__)
    except (AttributeError, OSError, ValueError, RuntimeError):  # no usable stderr: no report
        pass


def _receive_job(conn: Any) -> tuple | None:
    """The job's ``(spec payload, scratch directory)``; ``None`` if the parent is gone or, for a spare no job
    took, none came in time."""
    try:
        return conn.recv() if conn.poll(spares.MAX_AGE_S + 60) else None
    except (EOFError, OSError):
        return None


#: What a measuring process (or a Ray measuring actor) answers; anything else ends it.
_REQUESTS = ("measure", "retime", "ref_latency", "release", "elaborate", "make_inputs")


def serve_one(benches: Benches, msg: tuple) -> tuple[str, Any]:
    """One request to a measuring process (or a Ray measuring actor), answered as
    :class:`ServedBench` reads it: ``("ok", reply)``, ``("input_error", ...)`` for a wrong problem,
    ``("error", text)`` for a bug on the measuring side. Each request names its spec (``sid``). A
    measure's reply carries the measuring side's new timeline stamps (:meth:`Benches.take_stamps`)."""
    op, args = msg[0], msg[1:]
    try:
        if op == "measure":
            return "ok", (benches.measure(*args), benches.measured_hash(*args[:2]), benches.take_stamps())
        if op == "retime":
            return "ok", benches.retime(*args)
        if op == "ref_latency":
            return "ok", benches.fetch_ref_latency(*args)
        if op == "release":
            return "ok", benches.release(*args)
        if op == "elaborate":
            return "ok", benches.elaborate(*args)
        if op == "make_inputs":
            return "ok", benches.make_inputs(*args)
        raise ValueError(f"unknown request {op!r} to the measuring process")
    except CudaContextLost as e:  # this process is of no more use: the job replaces it
        return "lost", str(e)
    except TuningInputError as e:
        return "input_error", (str(e), _portable(e.__cause__))
    except Exception as e:  # noqa: BLE001 - a bug on the measuring side: the parent raises it
        return "error", format_error(e)


def raise_for_reply(tag: str, reply: Any) -> None:
    """Raise what a :func:`serve_one` reply reports: the problem's error, or the measuring side's bug."""
    if tag == "input_error":
        text, cause = reply
        raise TuningInputError(text) from cause
    if tag == "error":
        raise RuntimeError(f"the measuring process failed (a tilecarve bug, please report it):\n{reply}")


def spec_payload(specs: list[BenchSpec]) -> tuple[bytes, list[bytes | None], dict[str, list[str]]]:
    """A job's specs as they travel to a measuring process, the way kernels travel to compile workers: by
    cloudpickle, with the globals each kernel needs and the source lines of kernels defined in a notebook."""
    return (cloudpickle_module().dumps(list(specs)), [kernel_globals(s.kernel) for s in specs],
            {name: lines for s in specs for name, lines in kernel_sources(s.kernel).items()})


def load_specs(blob: bytes, glbs: list[bytes | None], sources: dict[str, list[str]]) -> list[BenchSpec]:
    """The :class:`BenchSpec` list a measuring process receives (:func:`spec_payload`), unpickled with the
    kernels' globals and notebook sources in place."""
    seed_linecache(sources)
    specs: list[BenchSpec] = cloudpickle_module().loads(blob)
    for spec, glb in zip(specs, glbs):
        restore_globals(spec.kernel, glb)
    return specs


def _portable(exc: BaseException | None) -> BaseException | None:
    """``exc`` if it survives pickling (so the parent can chain it), else a RuntimeError with its text."""
    if exc is None:
        return None
    import pickle

    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001
        return RuntimeError(format_error(exc))


class ServedBench:
    """A :class:`Benches` served by another process (:func:`serve_one` answers there): what the tuner asks
    of the measuring side, on top of one method a subclass provides, ``_call(msg, timeout)``, which
    returns ``("ok", reply)``, ``("input_error", ...)``, ``("error", text)``, ``("died", why)`` or
    ``("timeout", why)``. A death or a timeout costs the candidate in flight, as a trial."""

    def __init__(self, specs: list[BenchSpec], run_timeout: float) -> None:
        self.specs = list(specs)
        self.run_timeout = run_timeout
        self._hashes: dict[tuple[int, int], str] = {}
        self.ref_latency: dict[int, float] = {}
        self._stamps: list[tuple[float, str]] = []  # the other side's, as measure replies bring them

    def _call(self, msg: tuple, timeout: float) -> tuple[str, Any]:
        raise NotImplementedError

    def _is_up(self) -> bool:
        """Whether the other side is up (a request that only frees memory need not start it)."""
        return True

    def measure(self, sid: int, index: int, cfg: dict[str, Any], compile_s: float | None,
                prim: bytes | None = None) -> Trial:
        tag, reply = self._call(("measure", sid, index, cfg, compile_s, prim), self.run_timeout)
        if tag == "ok":
            trial, phash, stamps = reply
            self._stamps += stamps
            if phash is not None:
                self._hashes[sid, index] = phash
            return trial
        raise_for_reply(tag, reply)
        return Trial(cfg, Status.RUNTIME_ERROR if tag == "died" else Status.TIMEOUT, reply, compile_s)

    def retime(self, sid: int, index: int, cfg: dict[str, Any], prim: bytes | None = None) -> Timing | None:
        tag, reply = self._call(("retime", sid, index, cfg, prim), self.run_timeout)
        raise_for_reply(tag, reply)
        return reply if tag == "ok" else None

    def release(self, sid: int) -> None:
        """Free a spec's inputs on the other side (nothing to do when it is not running)."""
        if self._is_up():
            tag, reply = self._call(("release", sid), 60)
            raise_for_reply(tag, reply)

    def fetch_ref_latency(self, sid: int) -> float | None:
        tag, reply = self._call(("ref_latency", sid), 60)
        raise_for_reply(tag, reply)
        if tag == "ok" and reply is not None:
            self.ref_latency[sid] = reply
        return self.ref_latency.get(sid)

    def take_stamps(self) -> list[tuple[float, str]]:
        """The other side's ``(wall time, what)`` stamps that arrived since the last call (:mod:`.timeline`)."""
        out, self._stamps = self._stamps, []
        return out

    def local_kernel(self, sid: int, index: int) -> Any | None:
        """Never: candidates live in the measuring process; the caller loads the winner itself."""
        return None

    def measured_hash(self, sid: int, index: int) -> str | None:
        """The PrimFunc hash of the kernel the measuring process checked and timed as ``index``."""
        return self._hashes.get((sid, index))


@dataclass
class _Process:
    """A measuring process (:func:`_serve`) and this side of its pipe; :mod:`.spares` keeps it until a job
    takes it."""

    proc: Any  # a subprocess.Popen, or a forking.ForkedProcess (handled alike)
    conn: Any
    spawned: float  # wall time

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        """Kill it (a spare holds nothing worth a clean exit) and reap it on a thread."""
        if self.alive():
            self.proc.kill()
        threading.Thread(target=_reap, args=(self.proc, self.conn), name="tilecarve-reap", daemon=True).start()


def _spawn(env: dict[str, str], device: str) -> _Process:
    """A measuring process for ``device`` (``"cuda"`` or ``"cpu"``) with ``env`` added to its environment.
    Forked when :func:`.forking.can_fork` allows it (and no forked one has failed to start), else a fresh
    interpreter rather than multiprocessing's spawn, which re-imports the user's ``__main__`` (re-running
    a script that lacks an ``if __name__ == "__main__"`` guard). Either dies with the thread that starts
    it, even if this process is SIGKILLed (:func:`.procs.python_child_argv`, :func:`.forking.fork_child`)."""
    parent, child = multiprocessing.Pipe()
    if forking.can_fork(device) and not _FORK_FAILED and forking.nvml_check():
        import tilelang  # noqa: F401 - here first (the plan needs it too): the child has it at once, and the two
        # do not import it side by side (1 s slower each on an H200 host, 2026-11-22). Safe only with torch's
        # NVML check: TileLang's import asks torch.cuda.is_available(), which otherwise starts CUDA
    spawned = time.time()
    if forking.can_fork(device) and not _FORK_FAILED:  # asked again: whatever the import started
        def main() -> None:
            parent.close()  # the child's copy: the parent's close must reach it as EOF
            _serve(child.fileno(), device)

        proc: Any = forking.fork_child(main, env, MEASURING_PROCESS_NAME)
    else:
        full = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), **env}
        with forking.FORK_LOCK:  # see forking.fork_child
            proc = subprocess.Popen(
                procs.python_child_argv(f"from autotuner.bench import _serve; _serve({child.fileno()}, {device!r})"),
                pass_fds=[child.fileno()], env=full, stdin=subprocess.DEVNULL)
    child.close()
    return _Process(proc, parent, spawned)


#: Set when a forked measuring process did not start (:data:`FORKED_READY_S`): from then on, spawn.
_FORK_FAILED: list[str] = []
#: Seconds a forked measuring process may take to be ready (the spawned one's bound is 600 s).
FORKED_READY_S = 120.0


def _spare_kind(env: dict[str, str], device: str) -> tuple:
    return ("process", tuple(sorted(env.items())), device)


def prestart(envs: list[dict[str, str]], device: str) -> None:
    """Start, now, the measuring processes that a job measuring on ``device`` with these environments
    (one per device; ``{}`` for one unpinned process) will take (:mod:`.spares`), unless they are waiting
    already: each imports torch and TileLang and starts its GPU while the job is planned. Call it from a
    thread that outlives them (the plan's: the job's own thread)."""
    for env, n in Counter(tuple(sorted(e.items())) for e in envs).items():
        kind = _spare_kind(dict(env), device)
        for _ in range(n - spares.count(kind)):
            spares.keep(kind, _spawn(dict(env), device))


class IsolatedBench(ServedBench):
    """A :class:`Benches` in a spawned process, restarted as soon as a candidate kills it or hangs (so the
    next one starts its imports while this device waits for its next candidate): one process for every spec
    of a job. ``env`` is added to its environment (``CUDA_VISIBLE_DEVICES`` pins it to one GPU). Its first
    process is one the plan started (:func:`prestart`) when one is waiting, else spawned now.
    """

    def __init__(self, specs: list[BenchSpec], run_timeout: float, env: dict[str, str] | None = None) -> None:
        super().__init__(specs, run_timeout)
        self._env = dict(env or {})
        self._device = self.specs[0].device
        self._payload = spec_payload(self.specs)
        self._proc: Any = None
        self._conn: Any = None
        self._owed: list[float] = []  # bounds (s) of the replies prepare's requests still owe, in order
        self._stopping = False  # set by abort(): a process killed then is not restarted
        self._answered = False  # whether a process of this bench has answered a request (the reference is made)
        self._start()

    def _start(self) -> None:
        """Take a waiting spare (or spawn a process) and send it the job's specs and scratch directory."""
        self._answered = False  # a new process makes (and times) the reference again at its first candidate
        while True:
            spare = spares.take(_spare_kind(self._env, self._device))
            p = spare or _spawn(self._env, self._device)
            try:
                p.conn.send((self._payload, procs.current_scratch()))
                break
            except OSError as e:  # a spare that died just now: the next one, or a new process
                if spare is None:  # one spawned just now: it will die again, so say so rather than loop
                    try:
                        code = p.proc.wait(5)
                    except subprocess.TimeoutExpired:
                        code = None
                    p.close()
                    raise RuntimeError(f"the measuring process exited as it started (exit code {code}); "
                                       "run `python3 -c 'import autotuner.bench'` with the same PYTHONPATH to "
                                       "see why") from e
                p.close()
        self._proc, self._conn = p.proc, p.conn
        self._stamps.append((p.spawned, "process spawned"))
        if isinstance(p.proc, forking.ForkedProcess):
            self._stamps.append((p.spawned, "process forked"))
        self._ready = False
        self._owed = []

    def _wait_ready(self) -> None:
        if not self._ready:
            forked = isinstance(self._proc, forking.ForkedProcess)
            if not self._conn.poll(FORKED_READY_S if forked else 600):
                if not forked:
                    raise RuntimeError("the measuring process did not start within 600 s")
                # a lock its parent's thread held at the fork, say: spawn this one and every later one
                _FORK_FAILED.append(f"a forked measuring process was not ready within {FORKED_READY_S:g} s")
                logger.warning("%s; measuring processes are started as fresh interpreters from now on",
                               _FORK_FAILED[-1])
                self._owed = []
                self._kill()
                self._start()
                return self._wait_ready()
            self._conn.recv()  # ("ready", None)
            self._ready = True

    def prepare(self, sid: int, config: dict[str, Any], elaborate_timeout: float) -> None:
        """Have the process make problem ``sid``'s inputs and reference outputs for ``config`` while it
        waits for its first candidate (:meth:`Bench.elaborate`, :meth:`Bench.make_inputs`); returns at
        once. The next call first waits for them (:meth:`_settle`)."""
        if self._proc is None or self._owed:
            return
        for msg, bound in ((("elaborate", sid, config), elaborate_timeout), (("make_inputs", sid), self.run_timeout)):
            try:
                self._conn.send(msg)
            except OSError:  # it died: the next call finds out
                return
            self._owed.append(bound)

    def _settle(self) -> None:
        """Wait for the replies :meth:`prepare`'s requests owe, each within its bound (the elaboration as
        the kernel factory is bounded everywhere, ``compile_timeout``; the inputs and the reference as a
        candidate, ``run_timeout``). A process that does not answer in time (a factory that hangs for that
        config) or dies meanwhile is replaced by a new one, and the call goes on there: no candidate pays."""
        while self._owed:
            try:
                if self._conn.poll(self._owed[0]):
                    self._conn.recv()
                    self._owed.pop(0)
                    continue
                why = f"took more than {self._owed[0]:g} s"
            except (EOFError, OSError):
                why = "died"
            logger.warning("the measuring process %s making its first problem's inputs ahead of its first "
                           "candidate; it was restarted, and the candidate runs in the new one", why)
            self._kill()
            self._start()
            self._wait_ready()
            return

    def _kill(self) -> None:
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.kill()
            self._proc.wait(10)
        self._proc = None

    def _call(self, msg: tuple, timeout: float) -> tuple[str, Any]:
        """``("ok", reply)``, ``("input_error", text)``, ``("died", why)`` or ``("timeout", why)``."""
        if self._proc is None:
            self._start()
        try:
            self._wait_ready()
            self._settle()
            self._conn.send(msg)
            if self._conn.poll(timeout):
                reply = self._conn.recv()
                if reply[0] == "lost":  # its context is gone: it is replaced, and the candidate counted as died
                    self._restart()
                    return "died", f"{reply[1]}; the measuring process was replaced for the remaining configs"
                self._answered = True
                return reply
        except (EOFError, BrokenPipeError, ConnectionResetError):
            pass
        else:
            first = not self._answered and any(s.check.ref_prog is not None for s in self.specs)
            self._restart()
            why = f"kernel ran past run_timeout={timeout:g} s; measuring process killed"
            if first:  # its first request also runs and times the reference: that may be what hangs
                why += ("; it was this process's first candidate, whose time also runs and times the reference "
                        "program (ref_prog): if every config times out so, the reference is too slow for "
                        "run_timeout: raise set_tuning(run_timeout=...) or speed up ref_prog")
            return "timeout", why
        try:
            code = self._proc.wait(10)
        except subprocess.TimeoutExpired:
            code = None
        self._restart()
        how = f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"
        return "died", (f"the measuring process died ({how}) while running this config: a crash or a sticky "
                        "CUDA error; it was restarted for the remaining configs")

    def _restart(self) -> None:
        """After a death or a hang: kill what is left and start the next process now, not at the next call,
        so its start overlaps this device's wait for work (unless the run is stopping: :meth:`abort`)."""
        self._kill()
        if not self._stopping:
            self._start()

    def _is_up(self) -> bool:
        """Whether a process that may hold a problem's inputs is running: one that has answered, or been
        asked to make them (:meth:`prepare`); one not yet called holds none."""
        return self._proc is not None and (self._ready or bool(self._owed))

    def abort(self) -> None:
        """Kill the measuring process now, from any thread: a call waiting on it returns at once as
        ``died``, and it is not restarted. For a run that stops while this process may be busy with a
        candidate."""
        self._stopping = True
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()

    def close(self) -> None:
        """Ask the measuring process to quit and return at once: tearing down its CUDA context takes
        about 0.8 s on an H200, which the run need not wait for. A thread reaps it, killing it if it
        has not quit within 10 s; it dies with this process in any case (``python_child_argv``)."""
        proc, conn = self._proc, self._conn
        self._proc = None
        if proc is None:
            return
        try:
            conn.send(("quit",))
        except (BrokenPipeError, OSError):
            pass
        threading.Thread(target=_reap, args=(proc, conn), name="tilecarve-reap", daemon=True).start()


def _reap(proc: subprocess.Popen, conn: Any) -> None:
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    conn.close()


def make_measurer(specs: list[BenchSpec], isolate: bool, run_timeout: float) -> Measurer:
    """One isolated measuring process for every spec of a job (the default), or measuring in this process."""
    return IsolatedBench(specs, run_timeout) if isolate else Benches(specs)

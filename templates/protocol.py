"""The template protocol: what every kernel family provides, and the one tuning flow they share.

A family lives in its own directory (``templates/matmul/`` is the example; ``docs/templates.md`` says
how to add one) and writes four things for its two types, a frozen problem dataclass and a frozen
config dataclass (a :class:`TemplateConfig`):

* ``program(problem, config)`` -- the ``T.prim_func`` for one config;
* ``reference(problem)`` -- the callable every candidate is checked against;
* ``space(problem)`` -- the exhaustive baseline, a list of configs;
* ``candidates(problem, arch, topk, variants=True)`` -- the carver's ranked configs for the GPU
  ``arch`` (``None`` for the CPU), best first, with the family's variants appended.

:class:`TemplateBase` turns those into the rest, once for every family: the target resolved once
(:meth:`TemplateBase.resolve`, which also picks the GPU the carver models), ``compile``, ``tuner``
(the configured :class:`autotuner.AutoTuner`), ``tune`` and ``tune_many`` (a list of problems as
one tuning job). What ``tune`` accepts beyond the problem is one :class:`TuneOptions`, shared by
every family, so a setting has one name and one default.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from carver.problem import flag, int_in_range

from .config import TemplateConfig, check_config_dict, elaborate

if TYPE_CHECKING:  # heavy imports stay lazy (STYLE.md 2)
    from tvm.tirx import PrimFunc

    from autotuner import AutoTuner
    from autotuner.target import ResolvedTarget
    from carver.arch import GPUArch

__all__ = [
    "CUDAUnavailableError",
    "Resolved",
    "Template",
    "TemplateBase",
    "TemplateConfig",
    "TuneOptions",
    "carver_arch_name",
    "check_config_dict",
    "elaborate",
    "target_spec",
]  # TemplateConfig, check_config_dict and elaborate live in templates/config.py

#: A bare CUDA arch ("sm_90a") stands for ``{"kind": "cuda", "arch": "sm_90a"}``: compile-only without such a GPU.
SM_ARCH = re.compile(r"^sm_\d{2,3}[af]?$")


class CUDAUnavailableError(RuntimeError):
    """The call must run on a CUDA GPU and none is visible (``torch.cuda.is_available()`` is False).

    Raised by a CUDA-only template's ``tune``, ``tuner`` and ``compile`` (with ``target="auto"`` or
    ``"cuda"``) before anything compiles. A RuntimeError, not a ValueError: the arguments are fine, the
    machine lacks a GPU. The message says what works offline.
    """


# --------------------------------------------------------------------------------------------------
# Options
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TuneOptions:
    """Everything ``tuner``/``tune`` accept beyond the problem, for every family, each with one default.

    * ``topk``: how many of the carver's ranked configs to measure (variants come on top).
    * ``arch``: the GPU the carver models (a name such as ``"H100"``, or a ``carver.arch.GPUArch``);
      ``None``: the GPU the target names, or the local one.
    * ``configs``: measure these instead of the carver's candidates (e.g. the family's ``space``).
    * ``split_k``, ``variants``: add the family's split-K and other variants (matmul: on Hopper, the
      row-wise warp split and the persistent kernel). A family without them ignores the flags.
    * ``validate_configs``: drop configs the carver's rules refuse on ``arch`` before they compile
      (an exhaustive baseline may want TileLang's behaviour: try everything).
    * ``target``: ``"auto"``, ``"cuda"``, ``"c"``, an arch such as ``"sm_90a"`` (compile-only), a dict
      such as ``{"kind": "cuda", "arch": "sm_90a"}`` or a ``tvm.target.Target``; resolved once.
    * ``supply_type``, ``atol``, ``rtol``: how inputs are made and outputs compared (no mismatch allowed);
      ``None``: the autotuner's defaults, 1e-2 each, with ``atol`` scaled down to outputs smaller than 1
      (``autotuner.check.tolerances``).
    * ``compile_timeout``: seconds one candidate's compile may take.
    * ``warmup``, ``rep``: numbers of calls (not ms) when timing.
    * ``n_jobs``, ``cache``, ``progress``, ``timing``: as in ``AutoTuner.set_tuning``.
    """

    topk: int = 8
    arch: Any = None
    configs: Any = None
    split_k: bool = True
    variants: bool = True
    validate_configs: bool = True
    target: Any = "auto"
    supply_type: Any = None
    atol: float | None = None
    rtol: float | None = None
    compile_timeout: float = 120.0
    warmup: int = 3
    rep: int = 20
    n_jobs: int | None = None
    cache: bool = True
    progress: bool = True
    timing: str = "burst"

    def __post_init__(self) -> None:
        from autotuner.settings import check_setting  # the autotuner's validator: one rule per setting

        set_ = functools.partial(object.__setattr__, self)
        set_("topk", int_in_range(self.topk, "topk", 1, 2**31 - 1, fix="use e.g. topk=8"))
        for name in ("split_k", "variants", "validate_configs"):
            set_(name, flag(getattr(self, name), name))
        for name in ("atol", "rtol", "compile_timeout", "warmup", "rep", "n_jobs", "cache", "progress", "timing"):
            set_(name, check_setting(name, getattr(self, name)))
        if self.arch is not None and not isinstance(self.arch, str) and not hasattr(self.arch, "sm_count"):
            raise TypeError(f"arch must be None, a GPU name such as 'H100' or a carver.arch.GPUArch, got "
                            f"{self.arch!r} of type {type(self.arch).__name__}")
        if self.configs is not None:
            if isinstance(self.configs, (str, bytes, Mapping)) or not isinstance(self.configs, Iterable):
                raise TypeError(f"configs must be a list of config dicts (or config objects), got {self.configs!r}; "
                                f"wrap a single config as [config]")
            set_("configs", tuple(self.configs))
            if not self.configs:
                raise ValueError("configs is empty; pass None for the carver's ranked candidates, or the "
                                 "template's space(problem) for the exhaustive baseline")


# --------------------------------------------------------------------------------------------------
# Targets
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Resolved:
    """A target resolved once: what to compile for, and the GPU the carver models (None on the CPU)."""

    target: ResolvedTarget
    arch: GPUArch | None


def target_spec(target: Any) -> Any:
    """"sm_90a" -> ``{"kind": "cuda", "arch": "sm_90a"}`` (compile-only without such a GPU); anything
    else as given."""
    if isinstance(target, str) and SM_ARCH.match(target):
        return {"kind": "cuda", "arch": target}
    return target


def carver_arch_name(arch: Any, target: Any, resolved: ResolvedTarget) -> Any:
    """Which GPU the carver models: ``arch`` when given; else, for a target written as "auto", "cuda" or
    None, the local GPU ("cuda": the driver's numbers); else the arch the target names; None on the CPU."""
    if arch is not None:
        return arch
    if resolved.kind != "cuda":
        return None
    if _wants_gpu(target):
        return "cuda"
    return resolved.arch


def _wants_gpu(target: Any) -> bool:
    """Whether ``target`` is written as "auto", "cuda" or None: the local GPU, not an arch it names."""
    return target is None or (isinstance(target, str) and target in ("auto", "cuda"))


def _check_arch_matches_target(arch: GPUArch, target: Any, resolved: ResolvedTarget) -> None:
    """A ValueError when the GPU the carver is told to model (``arch``) is not the one the explicit
    ``target`` compiles for (``arch="H100"`` with ``sm_80``): its rules would judge kernels built for
    another GPU (a config H100's shared memory holds does not launch on an sm_80 GPU)."""
    from autotuner.target import cuda_arch

    if resolved.arch is None or not hasattr(arch, "compute_capability"):
        return
    want = cuda_arch(*arch.compute_capability)
    if resolved.arch.rstrip("af") == want.rstrip("a"):  # sm_90a, sm_90, sm_100f: the same GPU's targets
        return
    raise ValueError(f"arch {arch.name!r} ({want.rstrip('a')}) and target {target!r} (compiles for "
                     f"{resolved.arch}) name different GPUs; pass the target of that GPU "
                     f"({{'kind': 'cuda', 'arch': '{want}'}}), or an arch "
                     f"for {resolved.arch} (or leave arch out: the target's arch is then the one modelled)")


def _accepted(kinds: tuple[str, ...]) -> str:
    auto = "'auto' (the local CUDA GPU)" if "c" not in kinds else "'auto' (the local CUDA GPU, else the CPU)"
    cpu = ", 'c' (TileLang's C target on the CPU)" if "c" in kinds else ""
    cuda = ("'cuda', an arch such as 'sm_90a' (compile-only, no GPU needed), a dict such as "
            "{'kind': 'cuda', 'arch': 'sm_90a'}, or a CUDA tvm.target.Target") if "cuda" in kinds else ""
    return f"{auto}{cpu}, {cuda}" if cuda else f"{auto}{cpu}"


# --------------------------------------------------------------------------------------------------
# The protocol, and the flow every family shares
# --------------------------------------------------------------------------------------------------
@runtime_checkable
class Template(Protocol):
    """What every kernel family is: its types, its four parts and the entry points built on them."""

    name: str
    problem_type: type
    config_type: type[TemplateConfig]
    target_kinds: tuple[str, ...]

    def program(self, problem: Any, config: Any) -> PrimFunc: ...
    def reference(self, problem: Any) -> Callable[..., Any]: ...
    def space(self, problem: Any) -> list[Any]: ...
    def candidates(self, problem: Any, arch: GPUArch | None, topk: int, variants: bool = True) -> list[Any]: ...
    def check(self, problem: Any, config: Any, arch: GPUArch | None = None) -> list[str]: ...
    def resolve(self, problem: Any, target: Any = "auto", arch: Any = None, *, what: str = "") -> Resolved: ...
    def compile(self, problem: Any, config: Any = None, target: Any = "auto", arch: Any = None) -> Any: ...
    def tuner(self, problem: Any, options: TuneOptions | None = None) -> AutoTuner: ...
    def tune(self, problem: Any, options: TuneOptions | None = None) -> Callable[..., Any]: ...
    def tune_many(self, problems: Iterable[Any], options: TuneOptions | None = None) -> list[Callable[..., Any]]: ...


class TemplateBase:
    """The shared half of :class:`Template`: a family subclasses it, sets its types and writes
    ``program``, ``reference``, ``space`` and ``candidates``; ``check`` and the hooks below are optional.
    Families are stateless: one instance per family (``templates.matmul.MATMUL``)."""

    name: ClassVar[str] = "template"
    problem_type: ClassVar[type] = object
    config_type: ClassVar[type[TemplateConfig]] = TemplateConfig
    #: What the program can be lowered for: ("cuda",) for T.gemm families, ("c",) or both for others.
    target_kinds: ClassVar[tuple[str, ...]] = ("cuda", "c")
    #: Why the program needs a GPU, for the message refusing the C target ("the GEMM's T.gemm").
    cuda_only_reason: ClassVar[str] = "its program"
    #: The outputs among the program's parameters (the autotuner allocates and returns them).
    out_idx: ClassVar[tuple[int, ...]] = (-1,)

    # ------------------------------------------------------------------ what a family writes
    def program(self, problem: Any, config: Any) -> PrimFunc:
        raise NotImplementedError

    def reference(self, problem: Any) -> Callable[..., Any]:
        raise NotImplementedError

    def space(self, problem: Any) -> list[Any]:
        raise NotImplementedError

    def candidates(self, problem: Any, arch: GPUArch | None, topk: int, variants: bool = True) -> list[Any]:
        raise NotImplementedError

    # ------------------------------------------------------------------ hooks with defaults
    def check(self, problem: Any, config: Any, arch: GPUArch | None = None) -> list[str]:
        """Why ``config`` cannot run for ``problem`` (on ``arch``; None: rules no GPU escapes). Empty: legal."""
        return []

    def as_problem(self, problem: Any) -> Any:
        """The problem, checked to be this family's type (built, and so validated, by its dataclass)."""
        if not isinstance(problem, self.problem_type):
            raise TypeError(f"the {self.name} template takes a {self.problem_type.__name__}, got {problem!r} of "
                            f"type {type(problem).__name__}; build one with {self.problem_type.__name__}(...)")
        return problem

    def proposals(self, problem: Any, arch: GPUArch | None, options: TuneOptions) -> list[Any]:
        """What ``tuner`` measures when ``options.configs`` is None: the ranked candidates."""
        return self.candidates(problem, arch, options.topk, variants=options.variants)

    def no_gpu_message(self, problem: Any, what: str) -> str:
        return (f"{what} needs a CUDA GPU and none is visible (torch.cuda.is_available() is False), so nothing "
                f"was compiled; compile without one with target={{'kind': 'cuda', 'arch': 'sm_90a'}}")

    # ------------------------------------------------------------------ shared flow
    def as_config(self, problem: Any, config: Any, arch: GPUArch | None = None) -> TemplateConfig:
        """One config (a dict or a config object) checked against the problem by the rules no GPU escapes,
        and with ``arch`` by that GPU's too (its shared memory, registers, instructions)."""
        cfg = config if isinstance(config, self.config_type) else self.config_type.from_dict(config)
        problems = self.check(problem, cfg, arch)
        if problems:
            raise ValueError("; ".join(problems))
        return cfg

    def as_configs(self, problem: Any, configs: Iterable[Any], what: str = "configs") -> list[TemplateConfig]:
        """Each of ``configs`` through :meth:`as_config`; the first bad one is an error that says which."""
        if isinstance(configs, (str, bytes, Mapping)) or not isinstance(configs, Iterable):
            raise TypeError(f"{what} must be a list of config dicts, got {configs!r}")
        out = []
        for i, config in enumerate(configs):
            try:
                out.append(self.as_config(problem, config))
            except (TypeError, ValueError) as e:
                raise type(e)(f"{what}[{i}]: {e}") from e
        return out

    def resolve(self, problem: Any, target: Any = "auto", arch: Any = None, *, what: str = "") -> Resolved:
        """``target`` resolved once (by :func:`autotuner.target.resolve_target`) and checked to be one this
        family compiles for, plus the GPU the carver models, derived from it (see :func:`carver_arch_name`).

        "auto", "cuda" or None for a CUDA-only family without a GPU is a :class:`CUDAUnavailableError`;
        any other target that cannot be resolved, or is of a kind the family cannot lower, a ValueError
        listing what is accepted. An already resolved target is taken as it is.
        """
        from autotuner.target import ResolvedTarget, resolve_target

        what = what or f"templates.{self.name}"
        accepted = _accepted(self.target_kinds)
        if isinstance(target, ResolvedTarget):
            resolved = target
        else:
            wants_gpu = _wants_gpu(target)
            try:
                resolved = resolve_target("auto" if wants_gpu else target_spec(target))
            except (TypeError, ValueError) as e:
                raise ValueError(f"target {target!r} is not one the {self.name} template accepts ({e}); it takes "
                                 f"{accepted}") from e
            if wants_gpu and resolved.kind != "cuda" and (target == "cuda" or "c" not in self.target_kinds):
                raise CUDAUnavailableError(self.no_gpu_message(problem, what))
        if resolved.kind not in self.target_kinds:
            if resolved.kind == "c":
                raise ValueError(f"target {target!r} is TileLang's C target on the CPU, which cannot lower "
                                 f"{self.cuda_only_reason}; the {self.name} template takes {accepted}")
            raise ValueError(f"target {target!r} is a {resolved.kind} target; the {self.name} template takes "
                             f"{accepted}")
        name = carver_arch_name(arch, target, resolved)
        if isinstance(name, str):
            from carver.arch import CUDA

            name = CUDA(name)
        if arch is not None and not _wants_gpu(target):
            _check_arch_matches_target(name, target, resolved)
        return Resolved(resolved, name)

    def validator(self, problem: Any, arch: GPUArch | None) -> Callable[[Mapping[str, Any]], list[str]]:
        """The autotuner's ``validate=``: :meth:`check` on ``arch`` for a config dict."""
        return functools.partial(check_config_dict, self.config_type, self.check, problem, arch)

    def compile(self, problem: Any, config: Any = None, target: Any = "auto", arch: Any = None) -> Any:
        """Compile one config (as given, or the carver's top-1 when None: no tuning, one compile) into a
        callable that allocates and returns the outputs (a :class:`autotuner.served.ServedKernel`).
        Everything is checked before anything compiles: a given config by :meth:`check` on the GPU the
        target compiles for (``arch``, else the target's arch), so one that GPU cannot launch is a
        ValueError with the check's reasons."""
        problem = self.as_problem(problem)
        where = self.resolve(problem, target, arch, what=f"templates.{self.name}.compile(target={target!r})")
        if config is None:
            cfg = self.candidates(problem, where.arch, 1, variants=False)[0]
        else:
            cfg = self.as_config(problem, config, where.arch)  # the rules of the GPU it is compiled for
        from autotuner.compile import tl_compile

        return tl_compile(self.program(problem, cfg), where.target.tvm(), dict(cfg.pass_configs) or None,
                          out_idx=self.out_idx, serve=True)

    def tuner(self, problem: Any, options: TuneOptions | None = None) -> AutoTuner:
        """The configured :class:`autotuner.AutoTuner` that :meth:`tune` runs (for callers that want the
        whole result: ``.config``, ``.latency``, ``.trials``, ``.from_cache``).

        Candidates: ``options.configs`` when given, else :meth:`candidates` for the resolved GPU. Every
        candidate is checked against :meth:`reference` with no mismatch allowed; with
        ``validate_configs``, ones :meth:`check` refuses on that GPU are dropped before they compile.
        Configs no GPU can run are refused here, with a ValueError, either way.
        """
        from autotuner import AutoTuner

        options = TuneOptions() if options is None else options
        if not isinstance(options, TuneOptions):
            raise TypeError(f"options must be a TuneOptions, got {options!r}")
        problem = self.as_problem(problem)
        where = self.resolve(problem, options.target, options.arch, what=f"templates.{self.name}.tuner/tune")
        if options.configs is not None:
            configs = self.as_configs(problem, options.configs)
        else:
            configs = self.proposals(problem, where.arch, options)
        kernel = functools.partial(elaborate, self.program, self.config_type, problem)
        kernel.kernel_name = f"templates.{self.name}"  # its name in logs and `tilecarve cache list`
        validate = self.validator(problem, where.arch) if options.validate_configs else None
        return (AutoTuner.from_kernel(kernel=kernel, configs=[c.to_dict() for c in configs], validate=validate)
                .set_compile_args(out_idx=list(self.out_idx), target=where.target, supply_type=options.supply_type,
                                  ref_prog=self.reference(problem), skip_check=False, atol=options.atol,
                                  rtol=options.rtol, max_mismatched_ratio=0.0,
                                  compile_timeout=options.compile_timeout)
                .set_tuning(n_jobs=options.n_jobs, cache=options.cache, progress=options.progress,
                            timing=options.timing))

    def tune(self, problem: Any, options: TuneOptions | None = None) -> Callable[..., Any]:
        """Tune ``problem`` and return the fastest checked kernel; a later call for the same problem, in
        any process, returns the stored winner without compiling or timing."""
        options = TuneOptions() if options is None else options
        if not isinstance(options, TuneOptions):
            raise TypeError(f"options must be a TuneOptions, got {options!r}")
        return self.tuner(problem, options).run(warmup=options.warmup, rep=options.rep).kernel

    def tune_many(self, problems: Iterable[Any], options: TuneOptions | None = None) -> list[Callable[..., Any]]:
        """:meth:`tune` for every problem, as one job (:func:`autotuner.tune_all`: one compile pool and one
        measuring process for all their candidates, one progress bar); the kernels, in order. Every
        problem is checked, and its tuner built, before anything compiles; stored winners are warm hits;
        a problem that fails does not stop the others (their winners are stored, then its error raised)."""
        from autotuner import tune_all

        options = TuneOptions() if options is None else options
        if not isinstance(options, TuneOptions):
            raise TypeError(f"options must be a TuneOptions, got {options!r}")
        problems = list(problems)
        plans = [self.tuner(p, options).plan(options.warmup, options.rep, label=self._label(p)) for p in problems]
        return [r.kernel for r in tune_all(plans, progress=options.progress)]

    def _label(self, problem: Any) -> str:
        """A problem's short name in a job's progress bar: the family and its sizes (``matmul 512x14336x4096``)."""
        import dataclasses

        sizes = [v for v in (dataclasses.astuple(problem) if dataclasses.is_dataclass(problem) else ())
                 if isinstance(v, int) and not isinstance(v, bool)]
        return f"{self.name} " + "x".join(map(str, sizes)) if sizes else f"{self.name} {problem!r}"

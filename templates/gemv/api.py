"""The GEMV family as a :class:`~templates.protocol.Template` (:data:`GEMV`), and the one-call entry points
with loose arguments (``kernel`` is in ``program.py``; ``compile``, ``tuner``, ``tune`` here)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar

from templates.protocol import TemplateBase, TuneOptions

from . import space as _space
from .config import GemvConfig, GemvProblem, make_problem
from .program import program
from .reference import reference

__all__ = ["GEMV", "Gemv", "compile", "tune", "tuner"]


class Gemv(TemplateBase):
    """``y = x @ W.T`` for 1 to 16 rows of x, fp32 accumulation: problem :class:`GemvProblem`, config
    :class:`GemvConfig`. CUDA only (warp shuffles)."""

    name: ClassVar[str] = "gemv"
    problem_type: ClassVar[type] = GemvProblem
    config_type: ClassVar[type[GemvConfig]] = GemvConfig
    target_kinds: ClassVar[tuple[str, ...]] = ("cuda",)
    cuda_only_reason: ClassVar[str] = "the GEMV's warp shuffles"

    program = staticmethod(program)
    reference = staticmethod(reference)
    space = staticmethod(_space.space)
    candidates = staticmethod(_space.candidates)
    check = staticmethod(_space.check)

    def no_gpu_message(self, problem: GemvProblem, what: str) -> str:
        return (f"{what} needs a CUDA GPU and none is visible (torch.cuda.is_available() is False), so nothing "
                f"was compiled. Offline: templates.gemv.candidates(problem, carver.arch.CUDA('H100'), 8) ranks "
                f"configs, and templates.gemv.compile({problem.M}, {problem.N}, {problem.K}, target='sm_90a') "
                f"checks that one compiles")


#: The GEMV template: ``GEMV.tune(GemvProblem(1, 4096, 4096), TuneOptions(topk=8))``.
GEMV = Gemv()
_DEFAULTS = TuneOptions()


def compile(M: int, N: int, K: int, config: Mapping[str, Any] | None = None, dtype: str = "float16",
            out_dtype: str | None = None, arch: Any = None, target: Any = "auto") -> Any:
    """One config (or the carver's top-1) compiled: ``y = k(x, W)``. "sm_90a" compiles without a GPU."""
    return GEMV.compile(make_problem(M, N, K, dtype, out_dtype), config, target=target, arch=arch)


def tuner(M: int, N: int, K: int, dtype: str = "float16", out_dtype: str | None = None,
          topk: int = _DEFAULTS.topk, arch: Any = _DEFAULTS.arch,
          configs: Iterable[Mapping[str, Any]] | None = _DEFAULTS.configs,
          validate_configs: bool = _DEFAULTS.validate_configs, target: Any = _DEFAULTS.target,
          supply_type: Any = _DEFAULTS.supply_type, atol: float | None = _DEFAULTS.atol,
          rtol: float | None = _DEFAULTS.rtol,
          compile_timeout: float = _DEFAULTS.compile_timeout, timing: str = _DEFAULTS.timing) -> Any:
    """The configured :class:`autotuner.AutoTuner` that :func:`tune` runs (``GEMV.tuner``)."""
    options = TuneOptions(topk=topk, arch=arch, configs=configs, validate_configs=validate_configs, target=target,
                          supply_type=supply_type, atol=atol, rtol=rtol, compile_timeout=compile_timeout,
                          timing=timing)
    return GEMV.tuner(make_problem(M, N, K, dtype, out_dtype), options)


def tune(M: int, N: int, K: int, dtype: str = "float16", out_dtype: str | None = None,
         topk: int = _DEFAULTS.topk, arch: Any = _DEFAULTS.arch, warmup: int = _DEFAULTS.warmup,
         rep: int = _DEFAULTS.rep, configs: Iterable[Mapping[str, Any]] | None = _DEFAULTS.configs,
         validate_configs: bool = _DEFAULTS.validate_configs, target: Any = _DEFAULTS.target,
         supply_type: Any = _DEFAULTS.supply_type, atol: float | None = _DEFAULTS.atol,
         rtol: float | None = _DEFAULTS.rtol,
         compile_timeout: float = _DEFAULTS.compile_timeout, timing: str = _DEFAULTS.timing) -> Callable[..., Any]:
    """Tune ``y = x @ W.T`` on the local GPU from the carver's top ``topk`` and return the fastest checked
    kernel, ``y = k(x, W)``; cached like every family. Without a GPU: ``CUDAUnavailableError``."""
    options = TuneOptions(topk=topk, arch=arch, configs=configs, validate_configs=validate_configs, target=target,
                          supply_type=supply_type, atol=atol, rtol=rtol, compile_timeout=compile_timeout,
                          warmup=warmup, rep=rep, timing=timing)
    return GEMV.tune(make_problem(M, N, K, dtype, out_dtype), options)

"""The attention family as a :class:`~templates.protocol.Template` (:data:`ATTENTION`), and the one-call
entry points with loose arguments (``kernel`` is in ``program.py``; ``compile``, ``tuner``, ``tune``
here). CUDA only: without a GPU, ``tune``, ``tuner`` and ``compile(target="auto")`` raise
:class:`~templates.protocol.CUDAUnavailableError` at once, saying what works offline."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar

from templates.protocol import TemplateBase, TuneOptions

from . import space as _space
from .config import AttentionConfig, AttentionProblem, make_problem
from .program import program
from .reference import reference

__all__ = ["ATTENTION", "Attention", "compile", "tune", "tuner"]


class Attention(TemplateBase):
    """Flash-attention forward, BSHD, MHA or GQA, causal or not: problem :class:`AttentionProblem`,
    config :class:`AttentionConfig`; ``O = k(Q, K, V)``. CUDA only (``T.gemm``)."""

    name: ClassVar[str] = "attention"
    problem_type: ClassVar[type] = AttentionProblem
    config_type: ClassVar[type[AttentionConfig]] = AttentionConfig
    target_kinds: ClassVar[tuple[str, ...]] = ("cuda",)
    cuda_only_reason: ClassVar[str] = "the attention's T.gemm"
    out_idx: ClassVar[tuple[int, ...]] = (3,)

    program = staticmethod(program)
    reference = staticmethod(reference)
    space = staticmethod(_space.space)
    candidates = staticmethod(_space.candidates)
    check = staticmethod(_space.check)

    def no_gpu_message(self, problem: AttentionProblem, what: str) -> str:
        p = problem
        args = f"{p.batch}, {p.heads}, {p.seq_len}, {p.dim}, kv_heads={p.kv_heads}, causal={p.causal}"
        return (f"{what} needs a CUDA GPU and none is visible (torch.cuda.is_available() is False), so nothing "
                f"was compiled. Offline: templates.attention.candidates(problem, carver.arch.CUDA('H100'), 8) "
                f"ranks configs, and templates.attention.compile({args}, target='sm_90a') checks that one compiles")


#: The attention template: ``ATTENTION.tune(AttentionProblem(1, 32, 4096, 128, kv_heads=8), TuneOptions(topk=8))``.
ATTENTION = Attention()
_DEFAULTS = TuneOptions()


def compile(batch: int, heads: int, seq_len: int, dim: int, kv_heads: int | None = None, causal: bool = False,
            dtype: str = "float16", config: Mapping[str, Any] | None = None, arch: Any = None,
            target: Any = "auto") -> Any:
    """One config (or the carver's top-1) compiled: ``O = k(Q, K, V)``. "sm_90a" compiles without a GPU."""
    problem = make_problem(batch, heads, seq_len, dim, kv_heads, causal, dtype)
    return ATTENTION.compile(problem, config, target=target, arch=arch)


def tuner(batch: int, heads: int, seq_len: int, dim: int, kv_heads: int | None = None, causal: bool = False,
          dtype: str = "float16", topk: int = _DEFAULTS.topk, arch: Any = _DEFAULTS.arch,
          configs: Iterable[Mapping[str, Any]] | None = _DEFAULTS.configs, variants: bool = _DEFAULTS.variants,
          validate_configs: bool = _DEFAULTS.validate_configs, target: Any = _DEFAULTS.target,
          supply_type: Any = _DEFAULTS.supply_type, atol: float | None = _DEFAULTS.atol,
          rtol: float | None = _DEFAULTS.rtol,
          compile_timeout: float = _DEFAULTS.compile_timeout, timing: str = _DEFAULTS.timing) -> Any:
    """The configured :class:`autotuner.AutoTuner` that :func:`tune` runs (``ATTENTION.tuner``)."""
    options = TuneOptions(topk=topk, arch=arch, configs=configs, variants=variants,
                          validate_configs=validate_configs, target=target, supply_type=supply_type, atol=atol,
                          rtol=rtol, compile_timeout=compile_timeout, timing=timing)
    return ATTENTION.tuner(make_problem(batch, heads, seq_len, dim, kv_heads, causal, dtype), options)


def tune(batch: int, heads: int, seq_len: int, dim: int, kv_heads: int | None = None, causal: bool = False,
         dtype: str = "float16", topk: int = _DEFAULTS.topk, arch: Any = _DEFAULTS.arch,
         warmup: int = _DEFAULTS.warmup, rep: int = _DEFAULTS.rep,
         configs: Iterable[Mapping[str, Any]] | None = _DEFAULTS.configs, variants: bool = _DEFAULTS.variants,
         validate_configs: bool = _DEFAULTS.validate_configs, target: Any = _DEFAULTS.target,
         supply_type: Any = _DEFAULTS.supply_type, atol: float | None = _DEFAULTS.atol,
         rtol: float | None = _DEFAULTS.rtol,
         compile_timeout: float = _DEFAULTS.compile_timeout, timing: str = _DEFAULTS.timing) -> Callable[..., Any]:
    """Tune attention on the local GPU from the carver's top ``topk`` and return the fastest checked
    kernel, ``O = k(Q, K, V)``; cached like every family."""
    options = TuneOptions(topk=topk, arch=arch, configs=configs, variants=variants,
                          validate_configs=validate_configs, target=target, supply_type=supply_type, atol=atol,
                          rtol=rtol, compile_timeout=compile_timeout, warmup=warmup, rep=rep, timing=timing)
    return ATTENTION.tune(make_problem(batch, heads, seq_len, dim, kv_heads, causal, dtype), options)

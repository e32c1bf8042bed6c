"""The matmul family as a :class:`~templates.protocol.Template` (:data:`MATMUL`), and the one-call entry
points with loose arguments (``compile(M, N, K, ...)``, ``tuner``, ``tune``) that build its problem and
its :class:`~templates.protocol.TuneOptions` and hand them to it.

The template takes CUDA targets only (T.gemm has no CPU lowering). Without a GPU, ``tune``, ``tuner``
and ``compile(target="auto")`` raise :class:`~templates.protocol.CUDAUnavailableError` at once, saying
what works offline.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar

from templates.protocol import TemplateBase, TuneOptions

from . import space as _space
from .config import MatmulConfig, MatmulProblem, check_problem, make_problem
from .program import program
from .reference import reference

__all__ = ["MATMUL", "Matmul", "compile", "tune", "tuner"]


class Matmul(TemplateBase):
    """``C = op(A) @ op(B)`` with fp32 accumulation: problem :class:`~carver.problem.MatmulProblem`
    (fp16/bf16/fp8 inputs, fp16/bf16/fp32 outputs), config :class:`MatmulConfig`."""

    name: ClassVar[str] = "matmul"
    problem_type: ClassVar[type] = MatmulProblem
    config_type: ClassVar[type[MatmulConfig]] = MatmulConfig
    target_kinds: ClassVar[tuple[str, ...]] = ("cuda",)
    cuda_only_reason: ClassVar[str] = "the GEMM's T.gemm"

    program = staticmethod(program)
    reference = staticmethod(reference)
    space = staticmethod(_space.space)
    candidates = staticmethod(_space.candidates)
    check = staticmethod(_space.check)

    def as_problem(self, problem: Any) -> MatmulProblem:
        return check_problem(problem)

    def proposals(self, problem: MatmulProblem, arch: Any, options: TuneOptions) -> list[MatmulConfig]:
        return _space.candidates(problem, arch, options.topk, variants=options.variants, split_k=options.split_k)

    def no_gpu_message(self, problem: MatmulProblem, what: str) -> str:
        M, N, K = problem.M, problem.N, problem.K
        return (f"{what} needs a CUDA GPU and none is visible (torch.cuda.is_available() is False), so nothing "
                f"was compiled; the GEMM has no CPU target. Without a GPU you can rank configs for a named GPU: "
                f"templates.matmul.carver_template({M}, {N}, {K}, arch=carver.arch.CUDA('H100')).recommend_hints(8) "
                f"(or carver.MatmulTemplate({M}, {N}, {K}).with_arch(carver.arch.CUDA('H100')).recommend_hints(8)), "
                f"and check that a config compiles (nvcc, no GPU): templates.matmul.compile({M}, {N}, {K}, config, "
                f"target={{'kind': 'cuda', 'arch': 'sm_90a'}})")


#: The matmul template: ``MATMUL.tune(MatmulProblem(4096, 4096, 4096), TuneOptions(topk=8))``.
MATMUL = Matmul()

_DEFAULTS = TuneOptions()  # the one place the entry points below take their defaults from


# --------------------------------------------------------------------------------------------------
# The entry points with loose arguments
# --------------------------------------------------------------------------------------------------
def compile(
    M: int,
    N: int,
    K: int,
    config: Mapping[str, Any] | None = None,
    dtype: str = "float16",
    trans_A: bool = False,
    trans_B: bool = True,
    out_dtype: str | None = None,
    arch: Any = None,
    target: Any = "auto",
) -> Any:
    """Compile one config into a callable ``kernel(A, B) -> C``: ``config`` as given, or, when None, the
    carver's top-1 hint (the no-tuning default: one compile, no GPU timing).

    ``target`` "auto" uses the local GPU; "sm_90a", ``{"kind": "cuda", "arch": "sm_90a"}`` (or a TVM
    target) compiles without one, for a check (the carver then models the GPU that arch names). Every
    argument, the config and the target are checked before anything compiles: a bad value is a
    ValueError (TypeError for a wrong type), "auto" or "cuda" without a GPU a ``CUDAUnavailableError``.
    """
    problem = make_problem(M, N, K, dtype, out_dtype, "float32", trans_A, trans_B, in_name="dtype")
    return MATMUL.compile(problem, config, target=target, arch=arch)


def tuner(
    M: int,
    N: int,
    K: int,
    dtype: str = "float16",
    trans_A: bool = False,
    trans_B: bool = True,
    topk: int = _DEFAULTS.topk,
    arch: Any = _DEFAULTS.arch,
    out_dtype: str | None = None,
    configs: Iterable[Mapping[str, Any]] | None = _DEFAULTS.configs,
    split_k: bool = _DEFAULTS.split_k,
    variants: bool = _DEFAULTS.variants,
    validate_configs: bool = _DEFAULTS.validate_configs,
    target: Any = _DEFAULTS.target,
    supply_type: Any = _DEFAULTS.supply_type,
    atol: float | None = _DEFAULTS.atol,
    rtol: float | None = _DEFAULTS.rtol,
    compile_timeout: float = _DEFAULTS.compile_timeout,
) -> Any:
    """The configured :class:`autotuner.AutoTuner` that :func:`tune` runs (for callers that want the full
    result: ``.config``, ``.latency``, ``.trials``, ``.from_cache``): ``MATMUL.tuner(problem, options)``.

    Candidates: ``configs`` when given (e.g. ``default_space`` for the exhaustive baseline), else the
    carver's top ``topk`` hints plus, with ``split_k``, split-K variants of the top two when their tiles
    fill less than one wave, and, with ``variants`` on a Hopper GPU, the Hopper variants of the top
    three (the row-wise warp split and, for short K, the persistent kernel). Every candidate is checked
    against the reference with no mismatches allowed, and illegal ones are dropped by the carver's rules
    before they reach nvcc (unless ``validate_configs`` is False: an exhaustive baseline should try
    everything, as TileLang does). Configs no GPU can run (bad keys or values, block_M=7, thread_num=4096)
    are refused here with a ValueError either way.

    ``target`` "auto" (or "cuda") needs a CUDA GPU: without one this raises ``CUDAUnavailableError``
    before anything compiles. A compile-only target (``"sm_90a"`` or ``{"kind": "cuda", "arch": "sm_90a"}``
    with no such GPU) gives a tuner whose candidates can be inspected and compiled, not run.
    """
    problem = make_problem(M, N, K, dtype, out_dtype, "float32", trans_A, trans_B, in_name="dtype")
    options = TuneOptions(topk=topk, arch=arch, configs=configs, split_k=split_k, variants=variants,
                          validate_configs=validate_configs, target=target, supply_type=supply_type, atol=atol,
                          rtol=rtol, compile_timeout=compile_timeout)
    return MATMUL.tuner(problem, options)


def tune(
    M: int,
    N: int,
    K: int,
    dtype: str = "float16",
    trans_A: bool = False,
    trans_B: bool = True,
    topk: int = _DEFAULTS.topk,
    arch: Any = _DEFAULTS.arch,
    warmup: int = _DEFAULTS.warmup,
    rep: int = _DEFAULTS.rep,
    out_dtype: str | None = None,
    configs: Iterable[Mapping[str, Any]] | None = _DEFAULTS.configs,
    split_k: bool = _DEFAULTS.split_k,
    variants: bool = _DEFAULTS.variants,
    validate_configs: bool = _DEFAULTS.validate_configs,
    target: Any = _DEFAULTS.target,
    supply_type: Any = _DEFAULTS.supply_type,
    atol: float | None = _DEFAULTS.atol,
    rtol: float | None = _DEFAULTS.rtol,
    compile_timeout: float = _DEFAULTS.compile_timeout,
) -> Callable[..., Any]:
    """Tune ``C = op(A) @ op(B)`` on the local GPU and return the fastest checked kernel: ``C = k(A, B)``.

    The carver proposes ``topk`` configs (plus split-K variants for few-wave shapes and, on Hopper, the
    Hopper variants), the autotuner compiles them in parallel, checks each against torch, times them
    (``warmup``/``rep`` are counts) and stores every trial; a later call for the same problem, in any
    process, returns the stored winner without compiling or timing. It takes what :func:`tuner` takes,
    with the same defaults (one :class:`~templates.protocol.TuneOptions`); use :func:`tuner` for the
    result object behind the kernel.

    Without a CUDA GPU it raises ``CUDAUnavailableError`` at once, before anything compiles; offline,
    use ``carver_template`` with a named arch for hints, or :func:`compile` with
    ``target={"kind": "cuda", "arch": "sm_90a"}`` to check that a config compiles.
    """
    problem = make_problem(M, N, K, dtype, out_dtype, "float32", trans_A, trans_B, in_name="dtype")
    options = TuneOptions(topk=topk, arch=arch, configs=configs, split_k=split_k, variants=variants,
                          validate_configs=validate_configs, target=target, supply_type=supply_type, atol=atol,
                          rtol=rtol, compile_timeout=compile_timeout, warmup=warmup, rep=rep)
    return MATMUL.tune(problem, options)

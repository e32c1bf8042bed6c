"""The drop-in op: ``matmul(x, weight, bias)`` and :class:`Linear`, a ``torch.nn.Linear`` whose fp16/bf16
CUDA forward runs tuned, bucketed TileLang kernels.

``y = x @ weight.T (+ bias)``, every leading dim of ``x`` flattened into the token count M. Two keyed
kernels (:class:`autotuner.KeyedKernel`, key ``M, N, K, dtype``) serve it:

* ``tilecarve.matmul`` for M > ``gemv_max_m`` (16): this family's GEMM, M bucketed in powers of two
  and compiled with a symbolic M (``T.dynamic``): one kernel per bucket serves every M in it (the
  program's loads and stores are bounded by M on every path, ``program.py``);
* ``tilecarve.matmul.gemv`` for 1 <= M <= 16, the decode path: ``templates.gemv``'s kernels, buckets
  1, 2, 4, 8, 16, compiled per exact M (its SIMT program unrolls over M) from the bucket's config.

Configs come from a loaded table, else the tuning database, else the carver's top-1 (logged once per
key): the op never tunes by itself, so nothing is timed inside a forward pass or a CUDA-graph capture.
Between two edges of a bucket the GEMM's tile grid can fall off a wave cliff: the down projection's
128x256 tiles, tuned at 2048 tokens, fill 1.09 waves of an H200's SMs at 1088 tokens and run 0.54x
cuBLAS there, where the carver's 192x192 for 1088 runs 1.00x (``benchmarks/data/wave-tail-2026-12-02-h200``).
So (``refine=True``, the default) a call whose M is not its bucket's edge is served the carver's top-1 for
its own M where the carver predicts the bucket's config more than ``REFINE_MIN_GAIN`` slower there
(:meth:`MatmulOp.refine_config`): no timing, the same choice on every rank, one more kernel per bucket
and config, checked like every served kernel.
Tune offline with ``autotuner.record()`` and ``Recording.tune`` (docs/deploy.md). Anything the kernels
do not take (CPU tensors, fp32, mixed dtypes, a non-contiguous weight, shapes the carver's rules
refuse) goes to ``torch.nn.functional.linear``, said once per reason at INFO.

The GPU path is the custom op ``torch.ops.tilecarve.matmul`` with a fake implementation and an
autograd formula (the backward is torch's), so ``torch.compile`` traces a model using it without a
graph break and training still works.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F

from autotuner import Buckets, KeyedKernel, KeyRefused
from autotuner.served import ALIGN, on_device
from carver.templates import GEMV_MAX_M
from templates.config import check_config_dict
from templates.gemv.api import GEMV
from templates.gemv.config import GemvConfig, GemvProblem
from templates.gemv.program import kernel as gemv_kernel

from .api import MATMUL
from .config import MatmulConfig, make_problem
from .program import program
from .reference import ref_program
from .space import predicted_ms

__all__ = ["FINALIST_MARGIN", "GEMM_NAME", "GEMV_EDGES", "GEMV_NAME", "KEY", "MAX_FINALISTS", "REFINE_MIN_GAIN",
           "Linear", "MatmulOp", "configure", "gemm", "get_op", "matmul"]

logger = logging.getLogger(__name__)

KEY = ("M", "N", "K", "dtype")
GEMM_NAME, GEMV_NAME = "tilecarve.matmul", "tilecarve.matmul.gemv"
#: The GEMV kernel's buckets of M (tokens decoded together); above the last, the GEMM serves.
GEMV_EDGES = (1, 2, 4, 8, GEMV_MAX_M)
#: Inside a bucket, serve the carver's config for the call's own M only where it predicts the bucket's config
#: more than this much slower at that M (the carver ranks configs, it does not time them: a margin above its
#: error). Nine H200 cases between two edges, each predicted 1.115-1.96x (2026-12-02, wave-tail-2026-12-02-h200,
#: inbucket/): refined, seven ran 1.09-1.84x faster, the two predicted 1.13 ran 1.03x and 0.98x.
REFINE_MIN_GAIN = 1.10
_DTYPES = (torch.float16, torch.bfloat16)
#: The op's finalist cut (:class:`autotuner.settings.TimingSettings`; the autotuner's default is 3% and 8). A
#: candidate's one timing back to back ran 6-10% faster than the same kernel in the finalist rounds on an
#: H200 (2026-12-02, ``benchmarks/data/splitk-cluster-2026-12-02-h200/mlp``: 2048 tokens' gate, finalists' round
#: medians 395.6-409.2 us, left-out candidates' single timings 380.0-380.7 us; the 128-token down projection,
#: 46.1-54.1 us against 44.5 us), and by how much depends on what ran before it: a 3% cut left out candidates the
#: rounds never compared. With this cut the 12 keys' rounds took 14.2 s against 13.6 s (``margin/`` there).
FINALIST_MARGIN, MAX_FINALISTS = 0.08, 6


def gemm(M: Any, N: int, K: int, dtype: str, block_M: int, block_N: int, block_K: int, num_stages: int,
         thread_num: int, enable_rasterization: bool, panel_size: int = 10, split_k: int = 1,
         warp_policy: str = "square", persistent: int = 0, variant: str = "pipelined", cluster: str = "1x1",
         split_reduce: str = "workspace") -> Any:
    """The op's GEMM factory: ``y = x @ W.T``, x ``(M, K)``, W ``(N, K)``, y ``(M, N)``, all ``dtype``.
    ``M`` is an int or a symbolic ``T.dynamic("M")``; then M = 1 stands in for it in the carver's rules
    (the config was checked at its bucket's edge when it was tuned)."""
    symbolic = not isinstance(M, int)
    problem = make_problem(1 if symbolic else M, N, K, dtype)
    config = MatmulConfig(block_M=block_M, block_N=block_N, block_K=block_K, num_stages=num_stages,
                          thread_num=thread_num, enable_rasterization=enable_rasterization, panel_size=panel_size,
                          split_k=split_k, warp_policy=warp_policy, persistent=persistent, variant=variant,
                          cluster=cluster, split_reduce=split_reduce)
    return program(problem, config, M_var=M if symbolic else None)


class MatmulOp:
    """The op's two keyed kernels and settings (one per process: :func:`get_op`, :func:`configure`).

    * ``topk``: carver candidates measured per key when tuning (plus the family's variants);
    * ``gemv_max_m``: M up to this goes to the GEMV kernels (0: the GEMM serves every M);
    * ``dynamic``: compile the GEMM with a symbolic M, one kernel per bucket (False: one per exact M);
    * ``target``: "auto" (the local GPU) or a compile-only CUDA target such as ``{"kind": "cuda", "arch": "sm_90a"}``;
    * ``tuning_args``: for ``AutoTuner.set_tuning`` (``n_jobs``, ``db_path``, ``progress``...). By default
      candidates and finalists are timed back to back in groups of calls between two events
      (``timing="batched"``, ``sustain_s=0.05``), the way a model's forward runs them, rather than each call
      alone after an L2 flush or between two events of its own.
    """

    def __init__(self, topk: int = 4, gemv_max_m: int = GEMV_MAX_M, dynamic: bool = True, target: Any = "auto",
                 tuning_args: Mapping[str, Any] | None = None, refine: bool = True) -> None:
        if isinstance(topk, bool) or not isinstance(topk, int) or topk < 1:
            raise ValueError(f"topk must be a positive int, got {topk!r}")
        if isinstance(gemv_max_m, bool) or gemv_max_m not in (0, *GEMV_EDGES):  # True == 1 would pass `in`
            raise ValueError(f"gemv_max_m must be 0 (no GEMV) or one of {list(GEMV_EDGES)}, got {gemv_max_m!r}")
        if not isinstance(dynamic, bool):
            raise ValueError(f"dynamic must be True (one symbolic-M GEMM per bucket) or False (one per exact M), "
                             f"got {dynamic!r}")
        if not isinstance(refine, bool):
            raise ValueError(f"refine must be True (inside a bucket, step off a wave cliff to the carver's config "
                             f"for the call's M) or False (the bucket's config for every M in it), got {refine!r}")
        self.topk, self.gemv_max_m, self.target = topk, gemv_max_m, target
        self._arch: dict[str, Any] = {}
        self._edge_times: dict[tuple, tuple[float, float]] = {}  # refine_config's predictions at a bucket's edge
        compile_args = {"out_idx": [-1], "target": target, "ref_prog": ref_program,
                        "max_mismatched_ratio": 0.0}
        # candidates and finalists timed back to back, as a model's forward runs them: on an H200 the 64x64
        # 7-stage kernel that wins the down projection at 128 rows when each call is timed after an L2
        # flush (1.01x cuBLAS) runs 0.88x cuBLAS back to back, where a split-K 64x128 runs 0.98x
        # (benchmarks/data/few-rows-2026-11-22-h200); the short heat is for the back-to-back, not the clock.
        # In groups of calls ("batched"), not each call between two events ("back_to_back"): per call, the 128-row
        # gate projection's plain 64x224 tile ranked 2% ahead of a 2-CTA cluster ws kernel that ran 4% faster in
        # a stream behind the MLP's gated product, where the picks of 50-call groups ran within 0.2% of the
        # stream's best on all three keys timed (H100, benchmarks/data/timing-methods-2026-12-07-h100); on an H200
        # a race of 50-call groups had the 128-row down projection's cluster-summed split-K fastest (39.5 us),
        # where the per-call rounds put it behind a workspace split (45.3 against 42.9 us;
        # splitk-cluster-2026-12-02-h200). The op's groups are 5 calls at rep=20 (autotuner.timing.batch_groups);
        # timed so, the picks ran 0.995, 1.000 and 1.000 of the stream's best on those keys (per call: 0.983,
        # 0.990, 1.000), and the MLP block tuned in 42.9 s (H100, benchmarks/data/batched-2026-12-07-h100).
        # FINALIST_MARGIN was set under the per-call timing.
        # finalists: every candidate within FINALIST_MARGIN of the fastest first timing, up to MAX_FINALISTS
        tuning = {"progress": False, "timing": "batched", "sustain_s": 0.05, "finalist_margin": FINALIST_MARGIN,
                  "max_finalists": MAX_FINALISTS, **(tuning_args or {})}
        self.gemm = KeyedKernel(gemm, KEY, self._gemm_configs, buckets={"M": Buckets.pow2()},
                                dynamic=["M"] if dynamic else (), name=GEMM_NAME, compile_args=compile_args,
                                tuning_args=tuning, validate=self._gemm_check,
                                refine=self.refine_config if refine else None)
        gemv_edges = tuple(e for e in GEMV_EDGES if e <= max(gemv_max_m, 1))
        self.gemv = KeyedKernel(gemv_kernel, KEY, self._gemv_configs, buckets={"M": gemv_edges}, name=GEMV_NAME,
                                compile_args=compile_args, tuning_args=tuning, validate=self._gemv_check)

    def kernel(self, M: int) -> KeyedKernel:
        """The keyed kernel that serves M rows."""
        return self.gemv if M <= self.gemv_max_m else self.gemm

    def arch(self) -> Any:
        """The GPU the carver ranks for (the target's), resolved once."""
        if "arch" not in self._arch:
            self._arch["arch"] = MATMUL.resolve(make_problem(16, 16, 16), self.target).arch
        return self._arch["arch"]

    @staticmethod
    def _matmul_problem(key: Mapping[str, Any]) -> Any:
        return make_problem(key["M"], key["N"], key["K"], key["dtype"])

    @staticmethod
    def _gemv_problem(key: Mapping[str, Any]) -> GemvProblem:
        return GemvProblem(key["M"], key["N"], key["K"], key["dtype"])

    def _gemm_configs(self, key: dict[str, Any]) -> list[dict[str, Any]]:
        return [c.to_dict() for c in MATMUL.candidates(self._matmul_problem(key), self.arch(), self.topk)]

    def _gemv_configs(self, key: dict[str, Any]) -> list[dict[str, Any]]:
        return [c.to_dict() for c in GEMV.candidates(self._gemv_problem(key), self.arch(), self.topk)]

    def refine_config(self, exact: dict[str, Any], bucket: dict[str, Any], config: Mapping[str, Any]
                      ) -> dict[str, Any] | None:
        """The GEMM's ``refine`` (:class:`autotuner.KeyedKernel`): the carver's top-1 for the exact M where it
        predicts the bucket's ``config`` more than ``REFINE_MIN_GAIN`` slower at that M, else None.

        The margin is multiplied by how much slower the carver predicts the bucket's config than its own top-1
        at the edge (a tuned winner predicted slower there has beaten that top-1 there, measured): predictions
        at M of both are compared, nothing is timed. The search at M (13-30 ms) runs only where the bucket's
        config is predicted above the edge's line, the larger of the two edge predictions scaled by M / edge
        (its tiles off a whole number of waves); elsewhere one prediction (under 1 ms) decides. Variants (the
        warp split, ws, persistent) are priced as the grid program of their tile (:func:`predicted_ms`). (A bound
        with the margin in it, skipping the search up to 1.1x the line, missed a case: at 3072 tokens the gate
        projection's 256x160 fills 8.2 waves, 9% above the line, and the carver's 192x256 for 3072 ran 1.09x
        faster.)"""
        arch = self.arch()
        here, edge = self._matmul_problem(exact), self._matmul_problem(bucket)
        cfg = MatmulConfig.from_dict(config)
        ident = (tuple(bucket.values()), tuple(sorted(cfg.carver_dict().items())))
        at_edge = self._edge_times.get(ident)
        if at_edge is None:  # the bucket's config and the carver's top-1 at the edge, predicted once per bucket
            top_edge = MATMUL.candidates(edge, arch, 1, variants=False, split_k=False)[0]
            at_edge = self._edge_times[ident] = (predicted_ms(edge, arch, cfg), predicted_ms(edge, arch, top_edge))
        mine = predicted_ms(here, arch, cfg)
        handicap = max(1.0, at_edge[0] / at_edge[1])
        if mine <= handicap * at_edge[1] * here.M / edge.M:  # on the edge's line or below it: no cliff
            return None
        best = MATMUL.candidates(here, arch, 1, variants=False, split_k=False)[0]
        if best.carver_dict() == cfg.carver_dict():
            return None
        return best.to_dict() if mine > REFINE_MIN_GAIN * handicap * predicted_ms(here, arch, best) else None

    def _gemm_check(self, key: dict[str, Any], config: Mapping[str, Any]) -> list[str]:
        return check_config_dict(MatmulConfig, MATMUL.check, self._matmul_problem(key), self.arch(), config)

    def _gemv_check(self, key: dict[str, Any], config: Mapping[str, Any]) -> list[str]:
        return check_config_dict(GemvConfig, GEMV.check, self._gemv_problem(key), self.arch(), config)

    def refusal(self, M: int, N: int, K: int, dtype: str) -> str | None:
        """Why the kernels cannot take this shape (the carver's problem rules), or None."""
        try:
            self._gemv_problem({"M": M, "N": N, "K": K, "dtype": dtype}) if M <= self.gemv_max_m else \
                self._matmul_problem({"M": M, "N": N, "K": K, "dtype": dtype})
        except (TypeError, ValueError) as e:
            return str(e)
        return None


_OP: list[MatmulOp | None] = [None]
_LOCK = threading.Lock()
_SAID: set[str] = set()
_DECIDED: dict[tuple, str | tuple] = {}  # a call signature -> its fallback reason or its kernel (see _forward)


def get_op() -> MatmulOp:
    """The process's op (built with the defaults on first use)."""
    if _OP[0] is None:
        with _LOCK:
            if _OP[0] is None:
                _OP[0] = MatmulOp()
    return _OP[0]


def configure(**settings: Any) -> MatmulOp:
    """Replace the process's op with ``MatmulOp(**settings)`` (before the first forward; a loaded
    ``autotuner.use_table`` applies to the new kernels too)."""
    with _LOCK:
        _OP[0] = MatmulOp(**settings)
        _DECIDED.clear()  # decisions name the old op's kernels: let them go
    return _OP[0]


def _fallback_reason(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> str | None:
    """Why this call goes to ``F.linear`` (None: the kernels may take it). Shape errors are F.linear's."""
    if not (x.is_cuda and weight.is_cuda):
        return f"tensors on {x.device.type}/{weight.device.type}, not CUDA"
    if x.dtype not in _DTYPES or weight.dtype != x.dtype:
        return f"dtypes {x.dtype}/{weight.dtype}; the kernels take float16 or bfloat16 for both"
    if x.device != weight.device:
        return f"x on {x.device} but weight on {weight.device}"
    if weight.dim() != 2 or x.dim() < 1 or x.shape[-1] != weight.shape[1] or weight.shape[1] == 0:
        return "shapes F.linear must judge"
    if not weight.is_contiguous():
        return "a non-contiguous weight (the kernels read it row-major, (N, K))"
    if bias is not None and (bias.dtype != x.dtype or bias.device != x.device or bias.shape != weight.shape[:1]):
        return f"a bias of {bias.dtype} {tuple(bias.shape)} on {bias.device} (expected the weight's dtype and rows)"
    return None


def _say_once(reason: str) -> None:
    if reason not in _SAID:
        _SAID.add(reason)
        logger.info("tilecarve matmul: falling back to torch.nn.functional.linear for %s (said once)", reason)


def _forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The op's implementation: a tuned kernel where one serves the call, else ``F.linear``.

    At decode sizes the host bounds a forward (a GEMV is done before Python issues the next call), so
    a call whose signature was judged before takes a short path: everything the decision depends on
    (shapes, dtypes, devices, the weight's layout, the bias's, the op in use) is the key of
    ``_DECIDED``, whose value is the keyed kernel and its key values. The kernel itself is still asked
    for per call (``kernel_for_values``), so a table loaded later, a tuned key or a recording is seen
    at once."""
    op = get_op()
    sig = (x.shape, x.dtype, x.device, weight.shape, weight.dtype, weight.device, weight.is_contiguous(),
           None if bias is None else (bias.shape, bias.dtype, bias.device), op)
    decided = _DECIDED.get(sig)
    if decided is None:
        decided = _decide(op, x, weight, bias)
        if len(_DECIDED) > 4096:
            _DECIDED.clear()
        _DECIDED[sig] = decided
    if isinstance(decided, str):
        _say_once(decided)
        return F.linear(x, weight, bias)
    kk, values = decided
    M, N, K = values[:3]
    try:
        kernel = kk.kernel_for_values(values)
    except KeyRefused as e:  # M beyond the last bucket, where the bucket's config cannot launch, or a wrong kernel
        if not getattr(e, "transient", False):  # a transient one (unchecked during a capture, no memory): ask again
            _DECIDED[sig] = str(e)
        _say_once(str(e))
        return F.linear(x, weight, bias)
    x2 = x if x.dim() == 2 and x.is_contiguous() else x.reshape(M, K).contiguous()
    if (x2.data_ptr() | weight.data_ptr()) % ALIGN:  # a view at an odd offset: TMA and cp.async need 16 bytes
        _say_once("an x or weight not on a 16-byte boundary (a view at an offset); the kernels load 16-byte "
                  "pieces, so such calls go to F.linear")
        return F.linear(x, weight, bias)
    # alignment checked above (a fallback, not the served kernel's error): the launch alone, on x's GPU
    y = on_device(x.device.index, kernel.launch_checked, x2, weight)
    if bias is not None:
        y.add_(bias)
    return y if x.dim() == 2 else y.view(*x.shape[:-1], N)


def _decide(op: MatmulOp, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> str | tuple:
    """For a call signature: why it goes to ``F.linear`` (said once), else ``(keyed kernel, key values)``,
    the values ``(M, N, K, dtype)``. Judged once per signature (``_DECIDED``), the carver's problem rules
    included."""
    reason = _fallback_reason(x, weight, bias)
    if reason is None:
        N, K = weight.shape
        M = x.numel() // K
        if M == 0:
            return "inputs with no rows"
        reason = op.refusal(M, N, K, str(x.dtype).removeprefix("torch."))
    if reason is not None:
        return reason
    return op.kernel(M), (M, N, K, x.dtype)


@torch.library.custom_op("tilecarve::matmul", mutates_args=())
def _matmul_op(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return _forward(x, weight, bias)


@_matmul_op.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    torch._check(x.shape[-1] == weight.shape[1], lambda: f"x has {x.shape[-1]} features, weight {weight.shape[1]}")
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    x, weight, bias = inputs
    ctx.save_for_backward(x, weight)
    ctx.has_bias = bias is not None


def _backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    x, weight = ctx.saved_tensors
    g2 = grad.reshape(-1, grad.shape[-1])
    grad_x = grad @ weight if ctx.needs_input_grad[0] else None
    grad_w = g2.T @ x.reshape(-1, x.shape[-1]) if ctx.needs_input_grad[1] else None
    grad_b = g2.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
    return grad_x, grad_w, grad_b


_matmul_op.register_autograd(_backward, setup_context=_setup_context)


def matmul(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``torch.nn.functional.linear(x, weight, bias)``: ``x @ weight.T + bias`` by the tuned kernels.

    In eager mode without autograd it calls the implementation directly (no dispatcher overhead);
    under ``torch.compile`` or when a gradient is needed it goes through ``torch.ops.tilecarve.matmul``.
    """
    compiling = torch.compiler.is_compiling()
    if compiling or (torch.is_grad_enabled() and (
            x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad))):
        if not compiling:
            reason = _fallback_reason(x, weight, bias)
            if reason is not None:  # F.linear itself: its autograd, torch.func transforms and views as in torch
                _say_once(reason)
                return F.linear(x, weight, bias)
        if x.dim() == 2:
            return torch.ops.tilecarve.matmul(x, weight, bias)
        # the op takes and returns 2-D tensors: a view made inside a custom op's output could not be changed
        # in place (ReLU(inplace=True) after a Linear of 3-D input), one made here can
        lead = x.shape[:-1]
        y = torch.ops.tilecarve.matmul(x.reshape(math.prod(lead), x.shape[-1]), weight, bias)
        return y.view(*lead, y.shape[-1])
    return _forward(x, weight, bias)


class Linear(torch.nn.Linear):
    """``torch.nn.Linear`` (same constructor, parameters, state dict and initialisation) whose forward is
    :func:`matmul`. ``Linear.from_linear(m)`` wraps an existing module's parameters without copying."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002 - torch.nn.Linear's name
        return matmul(input, self.weight, self.bias)

    @classmethod
    def from_linear(cls, module: torch.nn.Linear) -> Linear:
        if not isinstance(module, torch.nn.Linear):
            raise TypeError(f"from_linear takes a torch.nn.Linear, got {type(module).__name__}")
        new = cls(module.in_features, module.out_features, bias=False, device="meta")
        new.weight, new.bias = module.weight, module.bias
        return new

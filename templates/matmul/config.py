"""The matmul family's types: its problem (the carver's :class:`~carver.problem.MatmulProblem`, with the
dtypes and layouts this kernel takes) and its config (:class:`MatmulConfig`, every key with its default).

Every rule comes from the carver (``carver.problem`` for shapes, ``carver/validity.py`` for configs):
this module only says which of the carver's dtypes the kernel takes and converts between the config
dataclass and the dict form the autotuner and older callers use.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from carver.problem import MatmulProblem, canonical_dtype, default_out_dtype, dtype_bytes
from carver.validity import CONFIG_KEYS as MATMUL_CONFIG_KEYS
from carver.validity import KERNEL_KEYS, require_matmul_config
from carver.validity import OPTIONAL_KEYS as CARVER_OPTIONAL_KEYS
from templates.protocol import TemplateConfig

if TYPE_CHECKING:
    import torch

__all__ = [
    "ACCUM_DTYPES",
    "AUTO_WS",
    "CARVER_KEYS",
    "CONFIG_KEYS",
    "EXTRA_DEFAULTS",
    "IN_DTYPES",
    "OUT_DTYPES",
    "PASS_CONFIGS_KEY",
    "TUNABLE_KEYS",
    "MatmulConfig",
    "MatmulProblem",
    "check_config",
    "check_dtype",
    "check_problem",
    "checked_configs",
    "default_out",
    "k_per_split",
    "kernel_part",
    "make_problem",
    "normalize_config",
    "separate_c_smem_bytes",
    "torch_dtype",
]

#: The reserved parameters of TileLang's GEMM grid; every config has them (the carver's list).
TUNABLE_KEYS: tuple[str, ...] = MATMUL_CONFIG_KEYS
#: What this template adds to the six, with the value that leaves the grid's program unchanged.
EXTRA_DEFAULTS: dict[str, Any] = {**CARVER_OPTIONAL_KEYS, **KERNEL_KEYS}
#: Everything a config may set: the six above plus what this template adds.
CONFIG_KEYS: tuple[str, ...] = TUNABLE_KEYS + tuple(EXTRA_DEFAULTS)
#: A config may carry TileLang pass configs of its own (the autotuner hands them to the compiler).
PASS_CONFIGS_KEY = TemplateConfig.PASS_CONFIGS_KEY
#: TileLang's role-based warp specialisation: the C tile gets its own shared buffer and a store warp.
AUTO_WS = "tl.enable_auto_warp_specialization"
#: The keys the carver models (the rest change neither a config's tile nor its registers).
CARVER_KEYS: tuple[str, ...] = TUNABLE_KEYS + tuple(CARVER_OPTIONAL_KEYS)
#: Input dtypes. fp8 (e4m3) only on Hopper or newer, and only with K-major operands (the NT layout).
IN_DTYPES: tuple[str, ...] = ("float16", "bfloat16", "float8_e4m3")
OUT_DTYPES: tuple[str, ...] = ("float16", "bfloat16", "float32")
ACCUM_DTYPES: tuple[str, ...] = ("float32",)


# --------------------------------------------------------------------------------------------------
# The problem
# --------------------------------------------------------------------------------------------------
def check_dtype(value: object, allowed: Sequence[str], what: str) -> str:
    """Normalise a dtype name (``"fp16"``, ``torch.float16`` and ``"float16"`` are one dtype)."""
    try:
        name = canonical_dtype(value, what)  # the carver's aliases: one table for the project
    except ValueError:
        name = None
    if name not in allowed:
        raise ValueError(f"{what} must be one of {list(allowed)}, got {value!r}")
    return name


def default_out(in_dtype: str) -> str:
    """fp16/bf16 GEMMs return their input dtype; fp8 returns fp16 (an fp8 C loses most of the answer):
    :func:`carver.problem.default_out_dtype`, the one rule ``MatmulProblem(out_dtype=None)`` follows too."""
    return default_out_dtype(in_dtype)


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a dtype name (``"float8_e4m3"`` is torch's ``float8_e4m3fn``)."""
    import torch

    return torch.float8_e4m3fn if name == "float8_e4m3" else getattr(torch, name)


def check_problem(problem: MatmulProblem) -> MatmulProblem:
    """A carver problem this kernel takes: its dtypes, and fp8 only K-major (what wgmma reads)."""
    if not isinstance(problem, MatmulProblem):
        raise TypeError(f"the matmul template takes a carver.problem.MatmulProblem, got {problem!r} of type "
                        f"{type(problem).__name__}; build one with MatmulProblem(M, N, K, ...)")
    check_dtype(problem.in_dtype, IN_DTYPES, "in_dtype")
    check_dtype(problem.out_dtype, OUT_DTYPES, "out_dtype")
    check_dtype(problem.accum_dtype, ACCUM_DTYPES, "accum_dtype")
    if problem.in_dtype == "float8_e4m3" and (problem.trans_A or not problem.trans_B):
        # wgmma reads fp8 operands only K-major from shared memory.
        raise ValueError(
            f"float8_e4m3 needs A as (M, K) and B as (N, K) (trans_A=False, trans_B=True), got "
            f"trans_A={problem.trans_A}, trans_B={problem.trans_B}; transpose the operands in torch first"
        )
    return problem


def make_problem(
    M: object, N: object, K: object, in_dtype: object = "float16", out_dtype: object = None,
    accum_dtype: object = "float32", trans_A: object = False, trans_B: object = True, *, in_name: str = "in_dtype",
) -> MatmulProblem:
    """The loose arguments of the older entry points as one checked problem (``out_dtype`` None: the
    default for the input dtype). ``in_name`` is what the caller calls the input dtype."""
    in_dtype = check_dtype(in_dtype, IN_DTYPES, in_name)
    out_dtype = default_out(in_dtype) if out_dtype is None else check_dtype(out_dtype, OUT_DTYPES, "out_dtype")
    accum_dtype = check_dtype(accum_dtype, ACCUM_DTYPES, "accum_dtype")
    return check_problem(MatmulProblem(M, N, K, in_dtype, out_dtype, accum_dtype, trans_A, trans_B))


def k_per_split(K: int, block_K: int, split_k: int) -> int:
    """K elements per split: ceil(K / split_k), rounded up to whole K tiles."""
    return math.ceil(math.ceil(K / split_k) / block_K) * block_K


def separate_c_smem_bytes(cfg: Mapping[str, Any], in_dtype: str, out_dtype: str) -> int:
    """Shared memory when C's staging tile sits beside every A/B stage (persistent, role-based WS)."""
    stage = (cfg["block_M"] + cfg["block_N"]) * cfg["block_K"] * dtype_bytes(in_dtype)
    return max(cfg["num_stages"], 1) * stage + cfg["block_M"] * cfg["block_N"] * dtype_bytes(out_dtype) + 1024


# --------------------------------------------------------------------------------------------------
# The config
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class MatmulConfig(TemplateConfig):
    """One GEMM config: TileLang's six reserved keys, then what this kernel adds (defaults: the grid's
    program). Each value is checked on construction by the carver's per-key rules (the key, the value
    and the fix); rules between keys, the problem and the GPU are the template's ``check``.
    """

    block_M: int
    block_N: int
    block_K: int
    num_stages: int
    thread_num: int
    enable_rasterization: bool
    panel_size: int = CARVER_OPTIONAL_KEYS["panel_size"]  # tile rows per rasterization panel
    split_k: int = CARVER_OPTIONAL_KEYS["split_k"]  # K split over this many CTAs per tile, summed by a 2nd kernel
    warp_policy: str = KERNEL_KEYS["warp_policy"]  # "square", "full_row" or "full_col"
    persistent: int = KERNEL_KEYS["persistent"]  # n resident CTAs walking the tiles; 0: one CTA per tile
    variant: str = KERNEL_KEYS["variant"]  # "pipelined" (T.Pipelined), "ws" or "pingpong" (ws_program.py)
    cluster: str = KERNEL_KEYS["cluster"]  # ws only: "1x1", "2x1" (multicast B) or "1x2" (multicast A)
    split_reduce: str = KERNEL_KEYS["split_reduce"]  # split-K's sum: "workspace" (2nd kernel) or "cluster" (in smem)

    @classmethod
    def normalize(cls, values: Mapping[str, Any]) -> dict[str, Any]:
        return require_matmul_config(None, values, kernel_keys=True)

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> MatmulConfig:
        if isinstance(config, Mapping):  # the carver's messages for unknown and missing keys, word for word
            require_matmul_config(None, kernel_part(config), kernel_keys=True)
        return super().from_dict(config)  # type: ignore[return-value]

    def carver_dict(self) -> dict[str, Any]:
        """The keys the carver models (it judges the grid's program: warp_policy, persistent, variant and
        cluster change neither its tile nor its registers; the kernel-key rules judge the rest)."""
        return {k: getattr(self, k) for k in CARVER_KEYS}


def kernel_part(config: Mapping[str, Any]) -> dict[str, Any]:
    """A config dict without its pass configs: the kernel's keyword arguments."""
    return {k: v for k, v in config.items() if k != PASS_CONFIGS_KEY}


def normalize_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """Check a config dict once at the API edge: its keys, and each value on its own (the carver's
    :func:`carver.validity.normalize_config`); returns a plain dict in CONFIG_KEYS order, ints as ints,
    with the keys it was given (defaults are not filled in).

    Rules between keys and the problem (block_K against the dtype, split_k against K, ...) need the
    problem: :func:`checked_configs` and the template's ``check`` apply them.
    """
    if not isinstance(config, Mapping):
        raise TypeError(f"a config must be a dict, got {config!r}")
    if PASS_CONFIGS_KEY in config and not isinstance(config[PASS_CONFIGS_KEY], Mapping):
        raise TypeError(f"{PASS_CONFIGS_KEY} must be a dict of TileLang pass configs, got "
                        f"{config[PASS_CONFIGS_KEY]!r}")
    values = require_matmul_config(None, kernel_part(config), kernel_keys=True)
    out = {k: values[k] for k in CONFIG_KEYS if k in config}
    if PASS_CONFIGS_KEY in config:
        out[PASS_CONFIGS_KEY] = config[PASS_CONFIGS_KEY]
    return out


def checked_configs(problem: MatmulProblem, configs: Iterable[Mapping[str, Any]], what: str
                    ) -> list[dict[str, Any]]:
    """``configs`` normalised (dicts), each checked against the carver's rules no GPU escapes; the first
    bad one is a ValueError (or TypeError) that says which."""
    out = []
    if isinstance(configs, Mapping) or not isinstance(configs, Iterable):
        raise TypeError(f"{what} must be a list of config dicts, got {configs!r}")
    for i, config in enumerate(configs):
        try:
            cfg = normalize_config(config)
            require_matmul_config(problem, kernel_part(cfg), kernel_keys=True)
        except (TypeError, ValueError) as e:
            raise type(e)(f"{what}[{i}]: {e}") from e
        out.append(cfg)
    return out


def check_config(
    K: int, in_dtype: str, block_M: object, block_N: object, block_K: object, num_stages: object,
    thread_num: object, enable_rasterization: object, panel_size: object, split_k: object,
    warp_policy: object = "square", persistent: object = 0, variant: object = "pipelined", cluster: object = "1x1",
    split_reduce: object = "workspace",
) -> None:
    """The carver's config rules that need only K and the dtype (M = N = 1 stands in for the rest)."""
    config = dict(block_M=block_M, block_N=block_N, block_K=block_K, num_stages=num_stages, thread_num=thread_num,
                  enable_rasterization=enable_rasterization, panel_size=panel_size, split_k=split_k,
                  warp_policy=warp_policy, persistent=persistent, variant=variant, cluster=cluster,
                  split_reduce=split_reduce)
    require_matmul_config(MatmulProblem(1, 1, K, in_dtype), config, kernel_keys=True)

"""The attention family's types: its problem (:class:`AttentionProblem`, flash-attention forward in the
BSHD layout, MHA or GQA, causal or not) and its config (:class:`AttentionConfig`, the four reserved keys and
the ``variant``).

The problem is the carver's own (``carver.attention.AttentionProblem``, as matmul's is
``carver.problem.MatmulProblem``) and the per-key and per-GPU rules are the carver's
(``carver.attention``), so the carver never ranks what this kernel refuses (STYLE.md 4).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from carver.attention import ATTENTION_DIMS as DIMS
from carver.attention import ATTENTION_DTYPES as DTYPES
from carver.attention import ATTENTION_OPTIONAL_KEYS, AttentionProblem, normalize_attention_config
from templates.protocol import TemplateConfig

__all__ = ["DIMS", "DTYPES", "AttentionConfig", "AttentionProblem", "make_problem", "torch_dtype"]


def make_problem(batch: object, heads: object, seq_len: object, dim: object, kv_heads: object = None,
                 causal: object = False, dtype: object = "float16") -> AttentionProblem:
    return AttentionProblem(batch, heads, seq_len, dim, kv_heads, causal, dtype)


def torch_dtype(name: str) -> Any:
    import torch

    return getattr(torch, name)


@dataclass(frozen=True, kw_only=True)
class AttentionConfig(TemplateConfig):
    """One flash-attention kernel: ``block_M`` query rows per CTA, ``block_N`` keys per step of the loop
    over K/V, ``num_stages`` K/V tiles in flight, ``threads`` consumer threads (on Hopper TileLang adds a
    128-thread TMA producer when ``num_stages >= 1``); ``variant="ws"``: the hand-scheduled Hopper loop
    (``ws_program.py``), ``threads / 128`` consumer warpgroups (two or three) of 64 rows each and a TMA producer.
    """

    block_M: int
    block_N: int
    num_stages: int
    threads: int
    variant: str = ATTENTION_OPTIONAL_KEYS["variant"]  # "pipelined" (program.py) or "ws" (ws_program.py)
    persistent: int = ATTENTION_OPTIONAL_KEYS["persistent"]  # ws: n resident CTAs walking the tiles; 0: one per tile
    pack_gqa: bool = ATTENTION_OPTIONAL_KEYS["pack_gqa"]  # ws, GQA: a tile holds a KV head's query heads' rows

    @classmethod
    def normalize(cls, values: Any) -> dict[str, Any]:
        return normalize_attention_config(values)

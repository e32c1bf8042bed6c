"""The attention family's reference: torch's SDPA math in fp32 on the upcast inputs, in chunks.

The full score matrix of B=8, H=32, S=16384 is 275 GB in fp32, so the reference walks (batch, KV head)
and blocks of query rows, each a few hundred MB at most: peak extra memory stays under ~1 GB whatever
the problem. Causal is top-left aligned (torch's ``is_causal=True``): query ``i`` sees keys ``0..i``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .config import AttentionProblem

if TYPE_CHECKING:
    import torch

__all__ = ["CHUNK_BYTES", "ref_program", "reference"]

#: Bytes of fp32 scores one chunk may hold (the reference's peak is a small multiple of it).
CHUNK_BYTES = 64 * 2**20


def ref_program(Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, causal: bool = False) -> torch.Tensor:
    """``softmax(Q K^T / sqrt(D) [causal]) V`` for BSHD tensors (GQA when K/V have fewer heads), computed
    in fp32 by ``F.scaled_dot_product_attention``'s math path and returned in Q's dtype (BSHD). That path adds the
    causal mask as -inf, so a NaN or inf in a key a row does not see makes the row NaN; the kernels replace those
    scores (docs/attention.md, "NaN and inf in the inputs"). On inputs without them the two agree."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    B, S, H, D = Q.shape
    Hkv = K.shape[2]
    if H % Hkv or K.shape != V.shape or K.shape[0] != B or K.shape[3] != D:
        raise ValueError(f"Q {tuple(Q.shape)}, K {tuple(K.shape)}, V {tuple(V.shape)} are not BSHD attention "
                         f"inputs (K and V (B, S, H_kv, D) with H a multiple of H_kv)")
    groups = H // Hkv
    out = torch.empty_like(Q)
    rows = max(1, CHUNK_BYTES // (groups * S * 4))  # query rows per chunk: groups x rows x S fp32 scores
    with sdpa_kernel(SDPBackend.MATH):
        for b in range(B):
            for h in range(Hkv):
                k = K[b, :, h].float()  # (S, D), shared by the group's query heads
                v = V[b, :, h].float()
                for r0 in range(0, S, rows):
                    r1 = min(S, r0 + rows)
                    q = Q[b, r0:r1, h * groups:(h + 1) * groups].float().transpose(0, 1)  # (groups, rows, D)
                    mask = None
                    if causal:  # query r0 + i sees keys 0..r0 + i
                        mask = (torch.arange(r0, r1, device=Q.device)[:, None]
                                >= torch.arange(S, device=Q.device)[None, :])
                    o = F.scaled_dot_product_attention(q, k.expand(groups, S, D), v.expand(groups, S, D),
                                                       attn_mask=mask)
                    out[b, r0:r1, h * groups:(h + 1) * groups] = o.transpose(0, 1).to(Q.dtype)
    return out


def reference(problem: AttentionProblem) -> Callable[..., Any]:
    """:func:`ref_program` for ``problem``: ``ref(Q, K, V) -> O``."""
    return functools.partial(ref_program, causal=problem.causal)

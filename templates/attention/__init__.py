"""The TileLang flash-attention forward template: BSHD, MHA or GQA, causal or not (``docs/attention.md``).

A family of the template protocol (``docs/templates.md``): ``config.py`` (:class:`AttentionProblem`,
:class:`AttentionConfig`), ``program.py`` (the ``T.prim_func``), ``reference.py`` (fp32 SDPA, chunked),
``space.py`` (the grid, the carver's ranked candidates, the check), ``api.py`` (:data:`ATTENTION` and the
loose-argument entry points). The model and the rules are ``carver/attention.py``.

    from templates import attention
    k = attention.tune(1, 32, 4096, 128, kv_heads=8, causal=True, topk=8)    # O = k(Q, K, V), BSHD
"""

from templates.protocol import CUDAUnavailableError, TuneOptions

from .api import ATTENTION, Attention, compile, tune, tuner
from .config import DIMS, DTYPES, AttentionConfig, AttentionProblem, make_problem
from .program import kernel
from .reference import ref_program
from .space import candidates, carver_template, check, space

__all__ = [
    "ATTENTION",
    "DIMS",
    "DTYPES",
    "Attention",
    "AttentionConfig",
    "AttentionProblem",
    "CUDAUnavailableError",
    "TuneOptions",
    "candidates",
    "carver_template",
    "check",
    "compile",
    "kernel",
    "make_problem",
    "ref_program",
    "space",
    "tune",
    "tuner",
]

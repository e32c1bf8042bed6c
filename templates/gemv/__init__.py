"""The TileLang GEMV template for decoding: ``y = x @ W.T`` for 1 to 16 rows of x (``docs/gemv.md``).

A family of the template protocol (``docs/templates.md``): ``config.py`` (:class:`GemvProblem`,
:class:`GemvConfig`), ``program.py`` (the ``T.prim_func``), ``reference.py`` (the fp32 product),
``space.py`` (the grid, the carver's ranked candidates, the check), ``api.py`` (:data:`GEMV` and the
loose-argument entry points).

    from templates import gemv
    k = gemv.tune(1, 4096, 4096, dtype="float16", topk=8)    # y = k(x, W), x (1, 4096), W (4096, 4096)
"""

from templates.protocol import CUDAUnavailableError, TuneOptions

from .api import GEMV, Gemv, compile, tune, tuner
from .config import IN_DTYPES, OUT_DTYPES, GemvConfig, GemvProblem, make_problem, resolved_vec
from .program import kernel
from .reference import ref_program
from .space import candidates, carver_template, check, space

__all__ = [
    "GEMV",
    "IN_DTYPES",
    "OUT_DTYPES",
    "CUDAUnavailableError",
    "Gemv",
    "GemvConfig",
    "GemvProblem",
    "TuneOptions",
    "candidates",
    "carver_template",
    "check",
    "compile",
    "kernel",
    "make_problem",
    "ref_program",
    "resolved_vec",
    "space",
    "tune",
    "tuner",
]

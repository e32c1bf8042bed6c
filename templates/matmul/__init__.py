"""The TileLang GEMM template: ``C = op(A) @ op(B)`` with fp32 accumulation, plus the one-call tuner.

A family of the template protocol (``templates/protocol.py``, ``docs/templates.md``), one file per job:

The typed parts are :data:`MATMUL`'s methods (``MATMUL.program``, ``.reference``, ``.space``,
``.candidates``, ``.check``); the submodules keep their own names (``templates.matmul.space`` is the
module). Files:

* ``config.py`` -- the problem (the carver's ``MatmulProblem``, with the dtypes this kernel takes) and
  :class:`MatmulConfig`, every key with its default;
* ``program.py`` -- ``program``, the ``T.prim_func`` for one (problem, config), and :func:`kernel`,
  the same with loose arguments;
* ``reference.py`` -- :func:`ref_program`, the torch answer every candidate is checked against;
* ``space.py`` -- :func:`default_space` (TileLang's 288-config grid, the exhaustive baseline), the
  carver's ranked candidates with their split-K and Hopper variants, and the validity check;
* ``api.py`` -- :data:`MATMUL`, the template object, and ``compile``, ``tuner`` and ``tune`` with loose
  arguments.

    from templates import matmul as mm
    k = mm.tune(4096, 4096, 4096, dtype="float16", topk=8)        # loose arguments, as before
    k = mm.MATMUL.tune(mm.MatmulProblem(4096, 4096, 4096), TuneOptions(topk=8))   # the typed form

``op.py`` -- the drop-in op (``matmul(x, weight, bias)``, ``Linear``, ``torch.ops.tilecarve.matmul``):
imported on first use of ``templates.matmul.Linear`` or ``.matmul`` (it imports torch).
"""

from carver.validity import WARP_POLICIES, split_k_limit
from templates.protocol import CUDAUnavailableError, TuneOptions

from .api import MATMUL, Matmul, compile, tune, tuner
from .config import (
    ACCUM_DTYPES,
    AUTO_WS,
    CONFIG_KEYS,
    EXTRA_DEFAULTS,
    IN_DTYPES,
    OUT_DTYPES,
    PASS_CONFIGS_KEY,
    TUNABLE_KEYS,
    MatmulConfig,
    MatmulProblem,
    check_config,
    make_problem,
    normalize_config,
    separate_c_smem_bytes,
    torch_dtype,
)
from .program import kernel
from .reference import ref_program
from .space import (
    candidates,
    carver_template,
    check,
    default_space,
    hint_configs,
    hopper_variants,
    split_k_candidates,
    validate,
)

_OP_NAMES = ("Linear", "matmul")


def __getattr__(name: str):  # the op imports torch: only when asked for (STYLE.md 2)
    if name in _OP_NAMES:
        from . import op

        return getattr(op, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ACCUM_DTYPES",
    "AUTO_WS",
    "CONFIG_KEYS",
    "CUDAUnavailableError",
    "EXTRA_DEFAULTS",
    "IN_DTYPES",
    "Linear",
    "MATMUL",
    "OUT_DTYPES",
    "PASS_CONFIGS_KEY",
    "TUNABLE_KEYS",
    "WARP_POLICIES",
    "Matmul",
    "MatmulConfig",
    "MatmulProblem",
    "TuneOptions",
    "candidates",
    "carver_template",
    "check",
    "check_config",
    "compile",
    "default_space",
    "hint_configs",
    "hopper_variants",
    "kernel",
    "make_problem",
    "matmul",
    "normalize_config",
    "ref_program",
    "separate_c_smem_bytes",
    "split_k_candidates",
    "split_k_limit",
    "torch_dtype",
    "tune",
    "tuner",
    "validate",
]

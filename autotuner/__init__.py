"""tilecarve's autotuner: compile candidates in parallel, check, time, and cache every trial.

>>> from autotuner import AutoTuner
>>> result = (AutoTuner.from_kernel(kernel=kernel, configs=configs)
...           .set_compile_args(out_idx=[-1], ref_prog=ref_program, target="auto")
...           .run(warmup=3, rep=20))
>>> out = result.kernel(a, b)

TileLang's decorator form works too (``@autotune(configs=...)`` over ``@tilelang.jit(out_idx=...)``),
and so does ``with set_autotune_inputs(a, b):`` (docs/dropin.md).

Heavy modules (tilelang, torch) are imported only when a run needs them.
"""

from __future__ import annotations

__version__ = "0.1.0"

from .buckets import Buckets
from .capture import get_autotune_inputs, set_autotune_inputs
from .config import DuplicateConfigWarning
from .decorator import AutoTuneImpl, autotune
from .errors import TuningCacheError, TuningError, TuningInputError
from .keyed import KeyedKernel, keyed_kernel, untuned, use_table
from .record import Recording, record
from .table import TableError, TunedTable, load_table, write_table
from .trial import STATUSES, Status, Trial
from .tuner import AutoTuner, TunedKernel, TuneResult

__all__ = ["STATUSES", "AutoTuneImpl", "AutoTuner", "Buckets", "DuplicateConfigWarning", "KeyedKernel", "Recording",
           "Status", "TableError", "Trial", "TuneResult", "TunedKernel", "TunedTable", "TuningCacheError",
           "TuningError", "TuningInputError", "__version__", "autotune", "get_autotune_inputs", "keyed_kernel",
           "load_table", "record", "set_autotune_inputs", "untuned", "use_table", "write_table"]

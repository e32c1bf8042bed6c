"""tilecarve's autotuner: compile candidates in parallel, check, time, and cache every trial.

>>> from autotuner import AutoTuner
>>> result = (AutoTuner.from_kernel(kernel=kernel, configs=configs)
...           .set_compile_args(out_idx=[-1], ref_prog=ref_program, target="auto")
...           .run(warmup=3, rep=20))
>>> out = result.kernel(a, b)

Heavy modules (tilelang, torch) are imported only when a run needs them.
"""

from __future__ import annotations

__version__ = "0.1.0"

from .buckets import Buckets
from .errors import TuningCacheError, TuningError, TuningInputError
from .keyed import KeyedKernel, keyed_kernel, untuned, use_table
from .record import Recording, record
from .table import TableError, TunedTable, load_table, write_table
from .trial import STATUSES, Status, Trial
from .tuner import AutoTuner, TunedKernel, TuneResult

__all__ = ["STATUSES", "AutoTuner", "Buckets", "KeyedKernel", "Recording", "Status", "TableError", "Trial",
           "TuneResult", "TunedKernel", "TunedTable", "TuningCacheError", "TuningError", "TuningInputError",
           "__version__", "keyed_kernel", "load_table", "record", "untuned", "use_table", "write_table"]

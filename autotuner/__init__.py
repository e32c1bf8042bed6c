"""tilecarve's autotuner: compile candidates in parallel, check, time, and cache every trial.

>>> from autotuner import AutoTuner
>>> result = (AutoTuner.from_kernel(kernel=kernel, configs=configs)
...           .set_compile_args(out_idx=[-1], ref_prog=ref_program, target="auto")
...           .run(warmup=3, rep=20))
>>> out = result.kernel(a, b)

Many problems (a model's keys, a list of shapes) tune as one job, one compile pool and one progress bar
for all of them: ``tune_all([t.plan(3, 20) for t in tuners])``; a model's recorded keys:
``with record() as rec: model(x)`` then ``rec.tune("table.json")`` (docs/deploy.md).

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
from .errors import CudaContextLost, KernelFactoryWarning, KeyRefused, TuningCacheError, TuningError, TuningInputError
from .job import tune_all
from .keyed import KeyedKernel, keyed_kernel, tune_keys, untuned, use_table
from .record import Recording, record
from .table import TableError, TunedTable, load_table, write_table
from .trial import STATUSES, Status, Trial
from .tuner import AutoTuner, Plan, TunedKernel, TuneResult

__all__ = ["STATUSES", "AutoTuneImpl", "AutoTuner", "Buckets", "CudaContextLost", "DuplicateConfigWarning",
           "KernelFactoryWarning", "KeyRefused", "KeyedKernel", "Plan", "Recording", "Status", "TableError", "Trial",
           "TuneResult", "TunedKernel", "TunedTable", "TuningCacheError", "TuningError", "TuningInputError",
           "__version__", "autotune", "get_autotune_inputs", "keyed_kernel", "load_table", "record",
           "set_autotune_inputs", "tune_all", "tune_keys", "untuned", "use_table", "write_table"]

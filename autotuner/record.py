"""Recording: collect every (kernel, key) a forward pass meets, then tune them all offline.

>>> with autotuner.record() as rec:
...     model(x)                       # served by tables/fallbacks as usual; every key is noted
>>> rec.tune("model-h200.json")        # tunes every key in one job, writes a table

The table is then shipped with the model and loaded with :func:`autotuner.use_table` (docs/deploy.md).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from . import keyed
from .errors import TuningError
from .keyed import KeyedKernel, add_listener, remove_listener, tune_keys
from .table import typed_key, write_table

__all__ = ["Recording", "record"]

logger = logging.getLogger(__name__)


class Recording:
    """The (kernel, bucket key) pairs met while recording, in the order first met."""

    def __init__(self) -> None:
        self.seen: dict[tuple[int, tuple], tuple[KeyedKernel, dict[str, Any]]] = {}
        self.results: list[Any] = []  # the last tune()'s TuneResults, in the order of seen
        self._lock = threading.Lock()

    def _note(self, kernel: KeyedKernel, key: dict[str, Any]) -> None:
        ident = (id(kernel), typed_key(key.values()))  # N=True and N=1 are two keys
        if ident not in self.seen:
            with self._lock:
                self.seen.setdefault(ident, (kernel, dict(key)))

    @property
    def keys(self) -> list[tuple[str, dict[str, Any]]]:
        """``(kernel name, bucket key)`` for everything recorded."""
        return [(k.name, dict(key)) for k, key in self.seen.values()]

    def kernels(self) -> list[KeyedKernel]:
        return list({id(k): k for k, _ in self.seen.values()}.values())

    def tune(self, path: str | os.PathLike[str] | None = None, *, progress: bool | None = True) -> Path | None:
        """Tune every recorded key in one job (:func:`.keyed.tune_keys`: one compile pool, one measuring
        process, one progress bar over every candidate; stored winners are warm hits) and, given ``path``,
        write their table. A key that fails does not stop the others; the failures are raised once every
        key is done, and no table is written then. Refused inside CUDA-graph capture. Kernels in one table
        must share one target. ``progress``: the bar (``None``: as the kernels' ``tuning_args`` say).

        Returns the path of the table written, or ``None`` when no ``path`` was given or nothing was
        recorded (then no file is written, and a warning names the path)."""
        if keyed.capturing():
            raise TuningError("refusing to tune while a CUDA graph is being captured; call Recording.tune "
                              "outside the capture")
        kernels = self.kernels()
        targets = {str(k.target().spec) for k in kernels}
        if path is not None and len(targets) > 1:
            raise ValueError(f"the recorded kernels compile for different targets {sorted(targets)}; one table "
                             "holds one target: record them separately")
        logger.info("tuning %d recorded keys of %d kernels in one job", len(self.seen), len(kernels))
        self.results = []  # a tune that raises leaves none, not the previous tune's
        self.results = tune_keys(list(self.seen.values()), progress=progress)
        if path is not None and not kernels:
            logger.warning("nothing was recorded (no keyed kernel was called inside autotuner.record()), so no "
                           "table was written to %s; run the model inside the with-block, then call tune", path)
            return None
        if path is None:
            return None
        sections = [k.section([key for kk, key in self.seen.values() if kk is k]) for k in kernels]
        return write_table(path, sections, kernels[0].target())


@contextmanager
def record() -> Iterator[Recording]:
    """Collect the keys keyed kernels meet inside the ``with`` block (from every thread)."""
    rec = Recording()
    add_listener(rec._note)
    try:
        yield rec
    finally:
        remove_listener(rec._note)

"""TileLang's logging during a tuning run: above the progress bar, on stderr, without the per-kernel chatter.

TileLang 0.1.15 gives its ``tilelang`` logger a handler of its own (``propagate=False``, level INFO)
that prints every record with ``tqdm.write`` to *stdout*: two lines per compiled kernel ("begins /
completes to compile kernel", from every compile worker, 19 of them in a cold GEMM tune) and a
WARNING each time a kernel comes from its in-memory cache, advising ``@tilelang.jit`` (the autotuner
loads a winner that way on purpose). During a run they break up the bar and land on stdout, where a
``--json`` reader looks. For the run, :func:`tilelang_logs_for_run`:

* sets ``TILELANG_PRINT_ON_COMPILATION=0``, which TileLang reads at each compile and every worker
  inherits (forked or spawned): no compile lines anywhere;
* with the bar on, raises the ``tilelang`` logger to WARNING (a user's DEBUG level is kept with
  ``progress=False``);
* swaps TileLang's handlers for one that writes with ``tqdm.write`` to stderr, so what is left
  prints above the bar, and drops the in-memory-cache advice.

Everything is put back afterwards, on error or Ctrl-C too.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator

__all__ = ["MEMORY_CACHE_ADVICE", "tilelang_logs_for_run"]

#: The format string (``record.msg``, not the formatted text) of TileLang's in-memory-cache advice; a
#: log record has no other identity. If TileLang rewords it, the advice shows again, nothing breaks
#: (``tests/test_cli.py`` notices).
MEMORY_CACHE_ADVICE = "Found kernel '%s' in memory cache."
_PRINT_ON_COMPILATION = "TILELANG_PRINT_ON_COMPILATION"


class _AboveTheBar(logging.Handler):
    """Writes each record with ``tqdm.write`` to stderr: printed above the bar, never on stdout."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            from tqdm import tqdm

            tqdm.write(self.format(record), file=sys.stderr)
        except Exception:  # noqa: BLE001 - logging's contract: a handler reports, never raises
            self.handleError(record)


def _not_advice(record: logging.LogRecord) -> bool:
    return not (isinstance(record.msg, str) and record.msg.startswith(MEMORY_CACHE_ADVICE))


@contextlib.contextmanager
def tilelang_logs_for_run(progress: bool) -> Iterator[None]:
    """TileLang's logging arranged for one tuning run (see the module docstring), restored on exit."""
    import tilelang  # noqa: F401 - its logger gets its handler on import: arrange it after that

    log = logging.getLogger("tilelang")
    handlers, level, env = list(log.handlers), log.level, os.environ.get(_PRINT_ON_COMPILATION)
    handler = _AboveTheBar()
    if handlers and handlers[0].formatter is not None:
        handler.setFormatter(handlers[0].formatter)  # TileLang's own line format
    handler.addFilter(_not_advice)
    try:
        os.environ[_PRINT_ON_COMPILATION] = "0"
        if progress and log.getEffectiveLevel() < logging.WARNING:
            log.setLevel(logging.WARNING)
            handler.setLevel(logging.WARNING)  # also for children that set their own level (the kernel cache: DEBUG)
        for h in handlers:
            log.removeHandler(h)
        log.addHandler(handler)
        yield
    finally:
        log.removeHandler(handler)
        for h in handlers:
            log.addHandler(h)
        log.setLevel(level)
        if env is None:
            os.environ.pop(_PRINT_ON_COMPILATION, None)
        else:
            os.environ[_PRINT_ON_COMPILATION] = env

"""The exceptions the autotuner raises. A failing config is never one of them: it is a Trial."""

from __future__ import annotations

__all__ = ["TuningCacheError", "TuningError", "TuningInputError"]


class TuningError(RuntimeError):
    """No candidate survived; the message counts what failed and shows one error of each kind."""


class TuningInputError(ValueError):
    """The problem itself is wrong, whatever the config: the reference raises or returns nothing
    usable, ``out_idx`` does not fit the kernel, inputs cannot be made for its parameters. Raised
    once, at the first candidate that meets it; nothing of the run is cached."""


class TuningCacheError(OSError):
    """The tuning database cannot be used (an unwritable directory, a file that is not ours)."""

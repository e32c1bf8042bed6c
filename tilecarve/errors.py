"""The failures the command line reports in one message, without a traceback (``tilecarve/cli.py``)."""

from __future__ import annotations

__all__ = ["CommandError", "NeedsGPU", "UsageError"]


class NeedsGPU(RuntimeError):
    """The command must run on a CUDA GPU and none is visible (exit status 3)."""


class UsageError(ValueError):
    """A value the library refused before any work started (exit status 2, like argparse's own)."""


class CommandError(RuntimeError):
    """A failure the message explains in full (no such run, a file that is not an export): exit status 1."""

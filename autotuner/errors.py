"""The exceptions the autotuner raises. A failing config is never one of them: it is a Trial."""

from __future__ import annotations

__all__ = ["CudaContextLost", "KernelFactoryWarning", "KeyRefused", "TuningCacheError", "TuningError",
           "TuningInputError"]


class TuningError(RuntimeError):
    """No candidate survived; the message counts what failed and shows one error of each kind."""


class CudaContextLost(TuningError):
    """A candidate left its process's CUDA context unusable (a sticky error: a device-side assert, an
    illegal address). A measuring process or Ray actor is replaced and the candidate counts as died; in the
    tuning process itself (``isolate=False``) nothing more can run, and the whole job stops with this."""


class TuningInputError(ValueError):
    """The problem itself is wrong, whatever the config: the reference raises or returns nothing
    usable, ``out_idx`` does not fit the kernel, inputs cannot be made for its parameters. Raised
    once, at the first candidate that meets it; nothing of the run is cached."""


class TuningCacheError(OSError):
    """The tuning database cannot be used (an unwritable directory, a file that is not ours)."""


class KernelFactoryWarning(UserWarning):
    """The kernel factory gives a different PrimFunc for the winning config in the tuning process than where
    it was measured (it depends on its environment, a GPU it queries, global state or chance). The kernel
    returned is the one measured wherever its compiled PrimFunc was kept; what the factory gives here was
    not timed, a keyed kernel that builds the winner here would not run what was tuned, and a later run
    cannot take the stored result (it tunes again)."""


class KeyRefused(ValueError):
    """A keyed kernel's config for a key beyond its last bucket edge cannot run at that key (its ``validate``
    refuses it there: a launch grid over CUDA's limit, say). The matmul op answers such a call with F.linear."""

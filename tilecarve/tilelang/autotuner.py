"""``tilelang.autotuner`` as seen through :mod:`tilecarve.tilelang`: tilecarve's autotuner.

``AutoTuner``, ``autotune``, ``set_autotune_inputs`` and ``get_autotune_inputs`` (TileLang's four
public names) and the rest of :mod:`autotuner`'s public API. A name that only TileLang's autotuner
has is an ``AttributeError`` that says so, rather than a silent mix of the two tuners.
"""

from __future__ import annotations

from typing import Any

import autotuner as _tilecarve
from autotuner import *  # noqa: F403 - this module is that API under TileLang's name
from autotuner import __all__ as _names

__all__ = list(_names)


def __getattr__(name: str) -> Any:
    import tilelang.autotuner as theirs

    if hasattr(theirs, name):
        raise AttributeError(f"tilecarve's autotuner has no {name!r}: tilelang.autotuner.{name} belongs to "
                             f"TileLang's own autotuner, which tilecarve.tilelang replaces. tilecarve provides "
                             f"{sorted(__all__)}; import tilelang.autotuner for TileLang's")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}: neither tilecarve's autotuner "
                         f"({_tilecarve.__file__}) nor TileLang's defines it")

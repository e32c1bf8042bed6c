"""TileLang's namespace with tilecarve's autotuner: ``import tilecarve.tilelang as tilelang`` (or ``as tl``).

Code that reaches TileLang's autotuner through the module (``@tilelang.autotune(...)``,
``tilelang.autotuner.AutoTuner``) runs on tilecarve with only that import line changed. Every other
attribute is the real ``tilelang``'s own object (``jit``, ``compile``, ``language``, ``Profiler``,
``PassConfigKey``...), read from it on each access; only two names differ:

* ``autotune``: tilecarve's decorator (:func:`autotuner.autotune`);
* ``autotuner``: :mod:`tilecarve.tilelang.autotuner`, tilecarve's ``AutoTuner``, ``autotune``,
  ``set_autotune_inputs`` and ``get_autotune_inputs``.

The real ``tilelang`` module is not modified: ``import tilelang`` elsewhere is TileLang, unchanged.
``import tilelang.language as T`` lines stay as they are. docs/dropin.md has the whole mapping.
"""

# no other module-level names here (no `from __future__ import annotations` either): each would hide TileLang's
import importlib.util as _importlib_util
import typing as _typing

if __name__ == "tilelang":  # tilecarve/ is on sys.path, so this package would stand in for TileLang itself
    raise ImportError(f"{__file__} was imported as the top-level 'tilelang': the directory tilecarve/ is on "
                      "sys.path (a script run from inside it?); run from the repository root or install tilecarve")

import tilelang as _tilelang  # noqa: E402 - after the guard above

from autotuner import autotune as autotune  # noqa: E402

from . import autotuner as autotuner  # noqa: E402

__all__ = sorted({n for n in vars(_tilelang) if not n.startswith("_")} | {"autotune", "autotuner"})


def __getattr__(name: str) -> _typing.Any:
    """Every name but ``autotune`` and ``autotuner`` is TileLang's (PEP 562: called only for names
    this module does not define)."""
    try:
        return getattr(_tilelang, name)
    except AttributeError:
        pass
    if not name.startswith("_") and _importlib_util.find_spec(f"tilelang.{name}") is not None:
        why = (f"tilelang.{name} is a TileLang submodule not imported yet: put `import tilelang.{name}` before "
               f"`import tilecarve.tilelang as ...` (placed after it, it rebinds the name `tilelang` to TileLang's "
               "own module, autotuner included)")
    else:
        why = f"neither tilecarve nor TileLang {_tilelang.__version__} ({_tilelang.__file__}) defines it"
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}: {why}")


def __dir__() -> list[str]:
    return sorted(set(dir(_tilelang)) | set(globals()))


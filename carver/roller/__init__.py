"""TileLang's ``tilelang.carver.roller`` names (``Hint`` and the rasterization plans), so that a
TileLang user's import lines are the only change (docs/dropin.md). tilecarve's carver is not a
roller: the names lead to :mod:`carver.hint`."""

from ..hint import Hint, NoRasterization, Rasterization2DRow

__all__ = ["Hint", "NoRasterization", "Rasterization2DRow"]

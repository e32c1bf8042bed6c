"""``from carver.roller.hint import Hint``, as from TileLang's module of that name."""

from ..hint import Hint

__all__ = ["Hint"]

"""``from carver.roller.rasterization import NoRasterization``, as from TileLang's module of that name.

TileLang's examples test ``hint.rasterization_plan is not NoRasterization`` (the class); tilecarve's
plans are instances, as TileLang's are, so that test is true for every hint in both (the examples
then enable rasterization for every hint)."""

from ..hint import NoRasterization, Rasterization2DRow, RasterizationPlan

__all__ = ["NoRasterization", "Rasterization2DRow", "RasterizationPlan"]

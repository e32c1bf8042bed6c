"""TileLang's ``tilelang.carver.template`` names, so that a TileLang user's import line is the only
change: ``from carver.template import MatmulTemplate`` (docs/dropin.md)."""

from .matmul import MatmulTemplate
from .templates import ElementwiseTemplate, GEMVTemplate, GeneralReductionTemplate

__all__ = ["ElementwiseTemplate", "GEMVTemplate", "GeneralReductionTemplate", "MatmulTemplate"]

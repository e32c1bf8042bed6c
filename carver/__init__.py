"""Analytical, Hopper-aware tiling model that ranks TileLang hints without a GPU.

``MatmulTemplate(M, N, K).with_arch(CUDA("H100")).recommend_hints(topk=8)`` gives legal configs, best
first; ``validate`` is the one validity function the autotuner shares. Importing this package imports
neither torch nor tilelang.
"""

from .arch import CUDA, GPUArch
from .attention import AttentionTemplate
from .hint import Hint, NoRasterization, Rasterization2DRow
from .matmul import MatmulTemplate, Prediction, Ranking
from .problem import MatmulProblem
from .templates import ElementwiseTemplate, GEMVTemplate, GeneralReductionTemplate
from .validity import check_matmul_config

__all__ = [
    "AttentionTemplate",
    "CUDA",
    "ElementwiseTemplate",
    "GEMVTemplate",
    "GPUArch",
    "GeneralReductionTemplate",
    "Hint",
    "MatmulProblem",
    "MatmulTemplate",
    "NoRasterization",
    "Prediction",
    "Ranking",
    "Rasterization2DRow",
    "check_matmul_config",
]

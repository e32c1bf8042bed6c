"""A ranked tiling hint, with the fields TileLang's carver users read and the prediction behind it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Hint",
    "NoRasterization",
    "Rasterization2DRow",
    "RasterizationPlan",
]


@dataclass(frozen=True)
class NoRasterization:
    """CTAs launch in plain row-major order over (N tiles, M tiles)."""

    def __repr__(self) -> str:
        return "NoRasterization()"


@dataclass(frozen=True)
class Rasterization2DRow:
    """TileLang's ``T.use_swizzle(panel_size)``: columns of ``panel_size`` tile rows, serpentine, so a
    wave of CTAs shares A rows and B columns in L2."""

    panel_size: int = 10


RasterizationPlan = NoRasterization | Rasterization2DRow


@dataclass(frozen=True)
class Hint:
    """One recommended config. ``to_config()`` is what the kernel and the autotuner take.

    ``block`` is (block_M, block_N); ``warp`` the tile one warp owns under TileLang's partition;
    ``rstep`` the reduction step [block_K]; ``pipeline_stage`` num_stages; ``threads`` thread_num.
    ``prediction`` holds the model's latency and terms (see ``MatmulTemplate.predict``).
    """

    block: tuple[int, int]
    warp: tuple[int, int]
    rstep: tuple[int, ...]
    pipeline_stage: int
    threads: int
    rasterization_plan: RasterizationPlan
    split_k: int = 1
    prediction: Any = field(default=None, compare=False, repr=False)

    @property
    def predicted_ms(self) -> float | None:
        return None if self.prediction is None else self.prediction.latency_ms

    def to_config(self) -> dict[str, Any]:
        """The kernel's keyword config: exactly the six grid keys, plus ``panel_size`` / ``split_k`` only
        when they differ from the kernel's defaults (10 and 1)."""
        raster = isinstance(self.rasterization_plan, Rasterization2DRow)
        cfg: dict[str, Any] = dict(block_M=self.block[0], block_N=self.block[1], block_K=self.rstep[0],
                                   num_stages=self.pipeline_stage, thread_num=self.threads,
                                   enable_rasterization=raster)
        if raster and self.rasterization_plan.panel_size != 10:
            cfg["panel_size"] = self.rasterization_plan.panel_size
        if self.split_k != 1:
            cfg["split_k"] = self.split_k
        return cfg

    def __str__(self) -> str:
        c = self.to_config()
        pred = "" if self.prediction is None else f" ~{self.prediction.latency_ms * 1e3:.1f} us"
        return (f"{c['block_M']}x{c['block_N']}x{c['block_K']} stages={c['num_stages']} "
                f"threads={c['thread_num']} raster={c['enable_rasterization']}"
                f"{'' if self.split_k == 1 else f' split={self.split_k}'}{pred}")

"""The record of one candidate: what happened to it and how fast it ran."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["STATUSES", "Trial"]

STATUSES = ("ok", "compile_error", "resource_error", "mismatch", "runtime_error", "timeout")


@dataclass(frozen=True)
class Trial:
    """What happened to one candidate. Latencies are in milliseconds."""

    config: dict[str, Any]
    status: str  # one of STATUSES
    error: str | None = None
    compile_s: float | None = None
    median_ms: float | None = None
    min_ms: float | None = None
    iqr_ms: float | None = None

    @property
    def latency(self) -> float | None:
        """Median latency in ms (``None`` unless ``status == "ok"``)."""
        return self.median_ms

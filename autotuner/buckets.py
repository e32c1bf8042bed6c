"""Buckets for an integer key (a token count M): one tuned config serves every value in a bucket.

A bucketing is a strictly increasing tuple of *edges*. A value ``v`` falls in the bucket of the
smallest edge ``>= v``; a value above the last edge falls in the last bucket. A bucket is named,
tuned and stored by its edge: the kernel is tuned at ``M = edge`` (the upper end of the bucket, so
that the tuned config has seen the largest problem it will serve), and the table entry's key holds
the edge. With the default powers of two up to 65536, M = 100 is tuned as 128, and M = 100000 is
served by the config tuned at 65536.
"""

from __future__ import annotations

import bisect
import numbers
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["DEFAULT_MAX", "Buckets", "as_buckets"]

#: The last edge of the default power-of-two bucketing.
DEFAULT_MAX = 65536


def _positive_int(v: Any, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
        raise ValueError(f"{what} must be a positive int, got {v!r}")
    return int(v)


@dataclass(frozen=True)
class Buckets:
    """Bucket edges, strictly increasing positive ints: ``Buckets((1, 16, 128, 1024))``."""

    edges: tuple[int, ...]

    def __post_init__(self) -> None:
        if isinstance(self.edges, (str, bytes)) or not isinstance(self.edges, Iterable):
            raise TypeError(f"bucket edges must be a list of positive ints, got {self.edges!r}")
        edges = tuple(_positive_int(e, "a bucket edge") for e in self.edges)
        if not edges:
            raise ValueError("bucket edges are empty; give at least one edge, e.g. [1, 16, 128, 1024]")
        for a, b in zip(edges, edges[1:]):
            if b <= a:
                raise ValueError(f"bucket edges must be strictly increasing, got {a} then {b} in {list(edges)}")
        object.__setattr__(self, "edges", edges)

    @classmethod
    def pow2(cls, max: int = DEFAULT_MAX) -> Buckets:  # noqa: A002 - the name users read in docs
        """1, 2, 4, ... up to ``max`` (``max`` itself is the last edge, a power of two or not)."""
        top = _positive_int(max, "the largest bucket edge (max)")
        edges = [1 << i for i in range(top.bit_length()) if 1 << i < top]
        return cls((*edges, top))

    def bucket(self, value: Any, key: str | None = None, kernel: str | None = None) -> int:
        """The edge that stands for ``value``'s bucket: the smallest edge ``>= value``, else the last.
        ``key`` and ``kernel`` name the value in the error a bad value raises."""
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            who = f"{kernel}: " if kernel else ""
            what = f"key {key!r}" if key else "a bucketed key"
            raise ValueError(f"{who}{what} is bucketed, so its value must be a positive int, got {value!r} of type "
                             f"{type(value).__name__}; pass the size as an int >= 1 (e.g. x.shape[0]), or leave "
                             f"{key or 'the key'} out of buckets= if it is not a size")
        v = int(value)
        i = bisect.bisect_left(self.edges, v)
        return self.edges[min(i, len(self.edges) - 1)]

    def to_json(self) -> list[int]:
        return list(self.edges)


def as_buckets(name: str, spec: Any) -> Buckets:
    """A key's bucketing from what a user writes: ``"pow2"`` (or ``True``), a :class:`Buckets`, or a sequence
    of edges (a list, a tuple, a numpy array of ints)."""
    if isinstance(spec, Buckets):
        return spec
    if spec is True or isinstance(spec, str) and spec == "pow2":  # `spec == ...`: elementwise for a numpy array
        return Buckets.pow2()
    try:
        return Buckets(tuple(spec)) if isinstance(spec, Iterable) and not isinstance(spec, (str, bytes)) else \
            Buckets(spec)
    except (TypeError, ValueError) as e:
        raise type(e)(f"buckets[{name!r}]: {e}; use 'pow2', Buckets.pow2(max=8192) or a list of edges") from None

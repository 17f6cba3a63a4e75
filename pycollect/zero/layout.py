"""One flat buffer for a dict of parameters, padded so that N ranks hold equal shards.

Names keep the order of the dict they came from; name i occupies ``[offsets[i], offsets[i] + size_i)``
of a buffer of ``numel`` elements, padded with zeros to ``padded = N * shard`` (``shard`` =
ceil(numel / N)). Rank r owns ``[r * shard, (r + 1) * shard)``. Pure: no communication.
"""
from __future__ import annotations

import math

import numpy as np

__all__ = ["FlatLayout"]


class FlatLayout:
    def __init__(self, shapes: dict, world: int):
        if world < 1:
            raise ValueError(f"FlatLayout: world must be at least 1, got {world}")
        self.names = list(shapes)
        self.shapes = {n: tuple(int(d) for d in s) for n, s in shapes.items()}
        self.sizes = {n: math.prod(s) for n, s in self.shapes.items()}
        self.offsets, at = {}, 0
        for n in self.names:
            self.offsets[n] = at
            at += self.sizes[n]
        self.numel, self.world = at, world
        self.shard = max(1, -(-at // world))  # ceil; at least one element so every rank has a shard
        self.padded = self.shard * world

    def span(self, name: str) -> tuple[int, int]:
        lo = self.offsets[name]
        return lo, lo + self.sizes[name]

    def shard_span(self, rank: int) -> tuple[int, int]:
        return rank * self.shard, (rank + 1) * self.shard

    def counts(self, lo: int, hi: int) -> list[int]:
        """Elements of [lo, hi) in each rank's shard (what a reduce-scatter of that range gives each)."""
        return [max(0, min(hi, (r + 1) * self.shard) - max(lo, r * self.shard)) for r in range(self.world)]

    def flatten(self, arrays: dict, dtype, xp=np):
        """(padded,) of ``dtype``: the arrays in order, zeros in the padding."""
        flat = xp.zeros(self.padded, dtype=dtype)
        for n in self.names:
            lo, hi = self.span(n)
            flat[lo:hi] = arrays[n].reshape(-1)
        return flat

    def views(self, flat) -> dict:
        """Name -> view of ``flat`` (covering [0, numel)) in the parameter's shape."""
        return {n: flat[self.offsets[n]:self.offsets[n] + self.sizes[n]].reshape(self.shapes[n]) for n in self.names}

    def mask(self, names, rank: int, xp=np):
        """(shard,) bool: True where this rank's shard holds an element of one of ``names``."""
        lo, hi = self.shard_span(rank)
        out = xp.zeros(self.shard, dtype=bool)
        for n in names:
            a, b = self.span(n)
            a, b = max(a, lo), min(b, hi)
            if a < b:
                out[a - lo:b - lo] = True
        return out

    def describe(self) -> dict:
        """JSON-ready: names, shapes, offsets, numel, padded, shard, world."""
        return {"names": self.names, "shapes": {n: list(s) for n, s in self.shapes.items()},
                "offsets": self.offsets, "numel": self.numel, "padded": self.padded, "shard": self.shard,
                "world": self.world}

"""Inverted dropout whose mask is a pure function of (key, position in the full tensor).

A parallel model holds slices of its activations (a part of the sequence, some of the heads, some
rows of the batch). For its dropout to equal the single-process model's, each element's keep/drop
decision must depend on where the element sits in the full tensor, not on which rank draws it or
in what order: the mask here is ``uniform(key, global flat index) >= p``, with ``uniform`` a
counter-based hash (SplitMix64's finaliser over the key and the index, 53 bits to [0, 1)). The
same key and position give the same decision on every rank and in every process; ``key`` (a tuple
of integers: seed, step, layer, site) separates the calls. This plays the role of Megatron's
model-parallel RNG tracker, without any random state to keep in step.
"""
from __future__ import annotations

import math

import numpy as np

from ._base import Layer, array_module, check_float

__all__ = ["Dropout", "dropout_mask", "global_index"]

_M1, _M2, _GOLD = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB, 0x9E3779B97F4A7C15


def _mix(z, xp):
    """SplitMix64's finaliser on uint64 (wrapping arithmetic)."""
    z = (z ^ (z >> xp.uint64(30))) * xp.uint64(_M1)
    z = (z ^ (z >> xp.uint64(27))) * xp.uint64(_M2)
    return z ^ (z >> xp.uint64(31))


def _key_hash(key) -> int:
    """One 64-bit integer from a tuple of non-negative integers (each folded in by a SplitMix step)."""
    h = np.uint64(0)
    with np.errstate(over="ignore"):
        for part in key:
            if isinstance(part, bool) or not isinstance(part, (int, np.integer)) or part < 0:
                raise ValueError(f"dropout key parts must be non-negative integers, got {key!r}")
            h = _mix(np.uint64(h ^ np.uint64(int(part) % 2**64)) + np.uint64(_GOLD), np)
    return int(h)


def global_index(shape, offsets, full_shape, xp=np):
    """uint64 flat indices, in ``full_shape`` (row-major), of the block of ``shape`` at ``offsets``.

    ``full_shape[0]`` only bounds nothing: the strides come from the trailing dims, so a block of a
    batch of unknown size (rows ``offsets[0]`` onward) is indexed the same on every rank.
    """
    if not (len(shape) == len(offsets) == len(full_shape)):
        raise ValueError(f"global_index: shape {shape}, offsets {offsets} and full_shape {full_shape} differ in rank")
    for d in range(1, len(shape)):
        if offsets[d] < 0 or offsets[d] + shape[d] > full_shape[d]:
            raise ValueError(f"global_index: block {shape} at {offsets} does not fit in {full_shape} (axis {d})")
    index = xp.zeros(shape, dtype=xp.uint64)
    stride = 1
    for d in reversed(range(len(shape))):
        axis = xp.arange(offsets[d], offsets[d] + shape[d], dtype=xp.uint64) * xp.uint64(stride)
        index += axis.reshape((-1,) + (1,) * (len(shape) - d - 1))
        stride *= full_shape[d]
    return index


def dropout_mask(key, p: float, shape, offsets, full_shape, dtype, xp=np):
    """Keep mask scaled by 1/(1-p): (shape) array of 0 and 1/(1-p) in ``dtype``."""
    index = global_index(shape, offsets, full_shape, xp)
    with np.errstate(over="ignore"):
        bits = _mix(index ^ xp.uint64(_key_hash(key)), xp)
    uniform = (bits >> xp.uint64(11)).astype(xp.float64) * (1.0 / 2**53)  # [0, 1)
    return xp.where(uniform >= p, 1.0 / (1.0 - p), 0.0).astype(dtype)


def check_rate(where: str, p) -> float:
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not (0.0 <= p < 1.0) or math.isnan(p):
        raise ValueError(f"{where}: dropout rate must be a number in [0, 1), got {p!r}")
    return float(p)


class Dropout(Layer):
    """y = x * mask / (1 - p); ``forward(x, key, offsets, full_shape)``; key None (evaluation) or p = 0: identity.

    ``offsets``/``full_shape`` say where ``x`` sits in the full tensor (default: x is the full tensor).
    """

    def __init__(self, p: float):
        super().__init__({})
        self.p = check_rate("Dropout", p)

    def forward(self, x, key=None, offsets=None, full_shape=None):
        check_float("Dropout.forward", "x", x)
        if key is None or self.p == 0.0:
            self.cache = 1.0
            return x
        offsets = (0,) * x.ndim if offsets is None else tuple(offsets)
        full_shape = tuple(x.shape) if full_shape is None else tuple(full_shape)
        self.cache = dropout_mask(key, self.p, tuple(x.shape), offsets, full_shape, x.dtype, array_module(x))
        return x * self.cache

    def backward_input(self, dy):
        """dy * mask; no weights, so B is the whole backward and frees the mask."""
        mask = self._take_cache("Dropout.backward")
        self.cache = None
        return dy * mask

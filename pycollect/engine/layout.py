"""Block layouts: how element counts split into blocks, and where each block starts."""
from __future__ import annotations

from itertools import accumulate


def split_even(n: int, parts: int) -> tuple[int, ...]:
    """Split ``n`` into ``parts`` counts, the first ``n % parts`` one longer."""
    if parts <= 0:
        raise ValueError(f"split_even: parts must be positive, got {parts}")
    q, r = divmod(n, parts)
    return tuple(q + 1 if i < r else q for i in range(parts))


def offsets(counts) -> tuple[int, ...]:
    """Start of each block, plus the total at the end (``len(counts) + 1`` entries)."""
    return (0, *accumulate(counts))


def block_ranges(counts, base: int = 0) -> list[tuple[int, int]]:
    """``(start, stop)`` of each block, shifted by ``base``."""
    offs = offsets(counts)
    return [(base + offs[i], base + offs[i + 1]) for i in range(len(counts))]


def even_ranges(start: int, stop: int, parts: int) -> list[tuple[int, int]]:
    """``[start, stop)`` split into ``parts`` ranges as evenly as possible."""
    return block_ranges(split_even(stop - start, parts), start)


def pow2_floor(n: int) -> int:
    """Largest power of two not above ``n`` (``n >= 1``)."""
    return 1 << (n.bit_length() - 1)


def ceil_log2(n: int) -> int:
    return (n - 1).bit_length() if n > 1 else 0

"""Block layouts: how element counts split into blocks, and where each block starts."""
from __future__ import annotations

from functools import lru_cache
from itertools import accumulate


@lru_cache(maxsize=64)   # every rank's schedule of a call cuts the same vector: once, not N times
def split_even(n: int, parts: int) -> tuple[int, ...]:
    """Split ``n`` into ``parts`` counts, the first ``n % parts`` one longer."""
    if parts <= 0:
        raise ValueError(f"split_even: parts must be positive, got {parts}")
    q, r = divmod(n, parts)
    return tuple(q + 1 if i < r else q for i in range(parts))


def per_call(fn):
    """``fn(key, *rest)`` remembered for the last ``key`` object, compared by identity (and held, so its id stays
    its own): every rank's schedule of one call is built from the same counts or topology object, so what
    each needs of the whole (offsets of N blocks, a tree order of N ranks) is computed once, not N times."""
    last: list = [None, None, None]

    def remembered(key, *rest):
        if isinstance(key, list):   # may change in place under the same identity
            return fn(key, *rest)
        if last[0] is key and last[1] == rest:
            return last[2]
        value = fn(key, *rest)
        last[:] = [key, rest, value]
        return value
    remembered.__doc__, remembered.__name__ = fn.__doc__, fn.__name__
    return remembered


@per_call   # a call's schedules ask the same counts' offsets once per rank
def offsets(counts) -> tuple[int, ...]:
    """Start of each block, plus the total at the end (``len(counts) + 1`` entries)."""
    return (0, *accumulate(counts))


def extent(counts, displs) -> int:
    """How far the blocks reach: their sum packed (``displs`` None), else the furthest non-empty block's end (an
    empty block's displacement is not read, as MPI's are not)."""
    if displs is None:
        return sum(counts)
    return max((d + c for d, c in zip(displs, counts) if c), default=0)


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


# A message or tree cut finer than this gains nothing (a pipeline fills in log N segments) and costs a round or a
# request per piece: PYCOLLECT_SEGMENT_BYTES=1 meant for 1 MiB cut 64 MiB into 16 million (minutes, gigabytes).
MAX_PIECES = 4096


def pieces(n: int, seg: int) -> tuple[tuple[int, int], ...]:
    """``(start, stop)`` of ``n`` elements cut ``seg`` at a time (0: one piece), into at most ``MAX_PIECES``: a
    smaller ``seg`` is raised to ``ceil(n / MAX_PIECES)``. Both ends of a message cut it alike (same ``n``)."""
    if seg <= 0 or n <= seg:
        return ((0, n),)
    seg = max(seg, -(-n // MAX_PIECES))
    return tuple((a, min(a + seg, n)) for a in range(0, n, seg))

"""Ring allgather: N-1 rounds, each rank sends its block and forwards N-2 others.

Blocks may differ in length between ranks; the ring follows ``topology.ring_order``.
"""
from __future__ import annotations

from ..engine.layout import block_ranges
from ..engine.schedule import Copy, Problem, Round, Schedule, Slice
from . import _ring


def schedule(p: Problem) -> Schedule:

    ranges = block_ranges(p.counts)
    own_in = Slice("in", 0, p.counts[p.rank])
    place = Round(pre=(Copy(own_in, Slice("out", *ranges[p.rank])),))
    if p.size == 1:
        return Schedule((place,))
    ring = p.topology.ring_order
    pos = ring.index(p.rank)
    rounds = _ring.allgather(pos, ring, [ranges[r] for r in ring], "out", own=own_in)
    return Schedule((place, *rounds))

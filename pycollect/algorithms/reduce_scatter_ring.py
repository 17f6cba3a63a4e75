"""Ring reduce-scatter: N-1 rounds, each rank sends (N-1)/N of the vector.

Partial sums travel around the ring in a scratch copy of the vector; the last round
reduces straight into ``out``.
"""
from __future__ import annotations

from ..engine.layout import block_ranges
from ..engine.schedule import Copy, Problem, Round, Schedule, Slice
from . import _ring


def schedule(p: Problem) -> Schedule:
    ranges = block_ranges(p.counts)
    own = Slice("out", 0, p.counts[p.rank])
    if p.size == 1:
        return Schedule((Round(pre=(Copy(Slice("in", *ranges[0]), own),)),))
    ring = p.topology.ring_order
    pos = ring.index(p.rank)
    ring_ranges = [ranges[r] for r in ring]  # block i of the ring is rank ring[i]'s block
    rounds = _ring.reduce_scatter(pos, ring, ring_ranges, "in", "tmp", final=own)
    return Schedule(tuple(rounds), tmp=p.n)

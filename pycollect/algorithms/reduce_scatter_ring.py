"""Ring reduce-scatter: N-1 rounds, each rank sends (N-1)/N of the vector.

Partial sums travel around the ring in a scratch copy of the vector; the last round
reduces straight into ``out``.
"""
from __future__ import annotations

from ..engine.layout import block_ranges
from ..engine.schedule import Copy, Problem, Round, Schedule, Slice
from ..engine.summary import RankClasses
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


def summaries(p: Problem):
    """Every rank's rounds counted without building them (engine/summary.py): N-1 rounds that send every
    ring block but the rank's own position's (``_ring.Phase``: every block's round once for all ranks, less the
    one left out; O(N) for any counts)."""
    if p.size == 1:
        return None
    ring, where, size = p.topology.ring_order, p.topology.ring_position, p.size
    lengths = [p.counts[r] for r in ring]       # block i of the ring is rank ring[i]'s
    phase, classes = _ring.Phase(lengths, True), RankClasses(p.topology)
    build = _class_rounds(phase)
    for r in range(size):
        pos = where[r]
        # round 0 sends block pos-1 from the caller's input; the others partial sums of tmp
        key = ((lengths[pos], lengths[pos - 1]), classes.where(r, ring[(pos + 1) % size]),
               classes.where(r, ring[pos - 1]), (lengths[pos - 1], lengths[pos - 2]))
        classes.add_based(r, key, build)
    return classes


def _class_rounds(phase: _ring.Phase):
    return lambda key: phase.less(*key)

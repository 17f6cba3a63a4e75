"""Ring allgather: N-1 rounds, each rank sends its block and forwards N-2 others.

Blocks may differ in length between ranks; the ring follows ``topology.ring_order``.
"""
from __future__ import annotations

from ..engine.layout import block_ranges
from ..engine.schedule import Copy, Problem, Round, Schedule, Slice
from ..engine.summary import RankClasses, Shape
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


def summaries(p: Problem):
    """Every rank's rounds counted without building them (engine/summary.py): its block copied into place,
    then N-1 rounds that send every ring block but the next position's (``_ring.Phase``: every block's round once
    for all ranks, less the one left out; O(N) for any counts)."""
    if p.size == 1:
        return None
    ring, where, size = p.topology.ring_order, p.topology.ring_position, p.size
    lengths = [p.counts[r] for r in ring]
    phase, classes = _ring.Phase(lengths, False), RankClasses(p.topology)
    build = _class_rounds(phase)
    for r in range(size):
        pos = where[r]
        # round 0 sends the rank's own block from the caller's input; the others blocks received into out
        key = (p.counts[r], (lengths[(pos + 1) % size], lengths[pos]), classes.where(r, ring[(pos + 1) % size]),
               classes.where(r, ring[pos - 1]), (lengths[pos], lengths[pos - 1]))
        classes.add_based(r, key, build)
    return classes


def _class_rounds(phase: _ring.Phase):
    """A class: its block copied into place, then the ring's rounds less the one it does not run."""
    def rounds(key) -> tuple:
        own, pair, right, left, first = key
        base, less = phase.less(pair, right, left, first)
        return base, ((1, Shape(copied=own)),) + less
    return rounds

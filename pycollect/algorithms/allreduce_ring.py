"""Ring allreduce: ring reduce-scatter, then ring allgather.

Each rank sends 2(N-1)/N of the vector in 2(N-1) rounds: bandwidth-optimal, latency
linear in N. The ring follows ``topology.ring_order`` so it leaves each node once.
"""
from __future__ import annotations

from ..engine.layout import even_ranges, split_even
from ..engine.schedule import Copy, Problem, Round, Schedule, Slice
from ..engine.summary import RankClasses, ring_phases
from . import _ring


def schedule(p: Problem) -> Schedule:
    if p.size == 1 or p.n == 0:
        return Schedule((Round(pre=(Copy(Slice("in", 0, p.n), Slice("out", 0, p.n)),)),))
    ring = p.topology.ring_order
    pos = ring.index(p.rank)
    ranges = even_ranges(0, p.n, p.size)
    rounds = _ring.reduce_scatter(pos, ring, ranges, "in", "out")
    rounds += _ring.allgather(pos, ring, ranges, "out")
    return Schedule(tuple(rounds))


def summaries(p: Problem):
    """Every rank's rounds counted without building them (engine/summary.py): the reduce-scatter phase
    sends every block but the rank's own ring position's, the allgather phase every block but the next one's."""
    if p.size == 1 or p.n == 0:
        return None
    ring, where, size = p.topology.ring_order, p.topology.ring_position, p.size
    lengths = split_even(p.n, size)             # block i is ranges[i], as the schedule cuts it
    except_block, classes = ring_phases(lengths), RankClasses(p.topology)
    for r in range(size):
        pos = where[r]
        # the reduce-scatter's round 0 sends block pos-1 from the caller's input; every later round a block of out
        key = (except_block(pos), except_block(pos + 1), classes.where(r, ring[(pos + 1) % size]),
               classes.where(r, ring[pos - 1]), (lengths[pos - 1], lengths[pos - 2]))
        classes.add(r, key, _class_rounds, counted=True)
    return classes


def _class_rounds(key) -> tuple:
    reduced, gathered, right, left, first = key
    return _ring.counted_from(first, reduced, right, left, True) + _ring.counted(gathered, right, left, False)

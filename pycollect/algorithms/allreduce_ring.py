"""Ring allreduce: ring reduce-scatter, then ring allgather.

Each rank sends 2(N-1)/N of the vector in 2(N-1) rounds: bandwidth-optimal, latency
linear in N. The ring follows ``topology.ring_order`` so it leaves each node once.
"""
from __future__ import annotations

from ..engine.layout import even_ranges
from ..engine.schedule import Copy, Problem, Round, Schedule, Slice
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

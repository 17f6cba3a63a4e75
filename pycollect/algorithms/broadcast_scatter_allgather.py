"""Van de Geijn broadcast: binomial scatter of N blocks, then ring allgather.

Each rank sends and receives about 2(N-1)/N of the vector, against log2 N times the
vector for the root of a binomial tree: the choice for long vectors. Block v belongs
to relative rank v, so a subtree's blocks form one contiguous span (one message per
edge). Scatter and ring both follow ``_binomial.tree_order``, which keeps nodes contiguous.
"""
from __future__ import annotations

from ..engine.layout import even_ranges
from ..engine.schedule import EMPTY, Copy, Problem, Round, Schedule, Slice
from . import _binomial, _ring


def schedule(p: Problem) -> Schedule:
    src, out = Slice("in", 0, p.n), Slice("out", 0, p.n)
    if p.size == 1:
        return Schedule((Round(pre=(Copy(src, out),)),))
    if p.n == 0:
        return EMPTY
    group = _binomial.tree_order(p.topology, p.root)
    pos = group.index(p.rank)  # the root is at 0, so pos is the relative rank
    ranges = even_ranges(0, p.n, p.size)  # ranges[v]: block of relative rank v
    rounds = _binomial.compact(_binomial.scatter(group, pos, 0, src, out, ranges))
    if pos == 0:
        # the scatter sends from in; the ring needs the root's own block in out
        rounds.insert(0, Round(pre=(Copy(src.sub(*ranges[0]), out.sub(*ranges[0])),)))
    # every rank now holds its block in out; the ring brings it the other N-1
    rounds += _ring.allgather(pos, group, ranges, "out")
    return Schedule(tuple(rounds))

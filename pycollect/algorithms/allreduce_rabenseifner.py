"""Rabenseifner allreduce: recursive-halving reduce-scatter, then recursive-doubling allgather.

Each rank sends 2(p'-1)/p' of the vector in 2 log2 p' rounds: bandwidth-optimal like the
ring with logarithmic latency. Non-powers of two fold in and out (two more rounds, each
moving the whole vector between a pair, see _recursive).
"""
from __future__ import annotations

from ..engine.layout import offsets, split_even
from ..engine.schedule import Copy, Problem, Recv, Round, Schedule, Send, Slice
from ._recursive import Fold, allgather_rounds, distances, halving_steps, reduce_scatter_rounds


def schedule(p: Problem) -> Schedule:
    def whole(buf: str) -> Slice:
        return Slice(buf, 0, p.n)

    if p.size == 1 or p.n == 0:
        return Schedule((Round(pre=(Copy(whole("in"), whole("out")),)),))
    fold = Fold(p.size)
    if fold.sits_out(p.rank):
        return Schedule((Round(sends=(Send(p.rank + 1, whole("in")),)),
                         Round(recvs=(Recv(p.rank + 1, whole("out")),))))
    rounds, first = [], "in"
    if fold.absorbs(p.rank):
        rounds.append(Round(recvs=(Recv(p.rank - 1, whole("out"), acc=whole("in")),)))
        first = "out"
    # Ascending distances, as MPICH: the first, heaviest exchange (half the vector) is
    # between new-rank neighbours, which block placement puts on one node. Which block a
    # rank ends with does not matter here; the allgather walks the same steps back.
    steps = halving_steps(fold, fold.newrank(p.rank), distances(fold.p2, descending=False))
    bounds = offsets(split_even(p.n, fold.p2))  # (p'+1,) element offsets of the p' blocks
    # Everything is reduced into "out": kept and given halves never overlap, so reading
    # "in" while writing "out" is safe even when they alias.
    rounds += reduce_scatter_rounds(steps, bounds, first, "out")
    rounds += allgather_rounds(steps, bounds, "out")
    if fold.absorbs(p.rank):
        rounds.append(Round(sends=(Send(p.rank - 1, whole("out")),)))
    return Schedule(tuple(rounds))

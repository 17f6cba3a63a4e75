"""Rabenseifner allreduce: recursive-halving reduce-scatter, then recursive-doubling allgather.

Each rank sends 2(p'-1)/p' of the vector in 2 log2 p' rounds: bandwidth-optimal like the
ring with logarithmic latency. Non-powers of two fold in and out (two more rounds, each
moving the whole vector between a pair, see _recursive).
"""
from __future__ import annotations

from ..engine.layout import offsets, split_even
from ..engine.schedule import Problem, Schedule
from ._recursive import allgather_rounds, distances, folded_allreduce, halving_steps, reduce_scatter_rounds


def schedule(p: Problem) -> Schedule:
    def core(fold, first):
        # Ascending distances, as MPICH: the first, heaviest exchange (half the vector) is
        # between new-rank neighbours, which block placement puts on one node. Which block a
        # rank ends with does not matter here; the allgather walks the same steps back.
        steps = halving_steps(fold, fold.newrank(p.rank), distances(fold.p2, descending=False))
        bounds = offsets(split_even(p.n, fold.p2))  # (p'+1,) element offsets of the p' blocks
        # Everything is reduced into "out": kept and given halves never overlap, so reading
        # "in" while writing "out" is safe even when they alias.
        rounds = reduce_scatter_rounds(steps, bounds, first, "out")
        return rounds + allgather_rounds(steps, bounds, "out"), 0

    return folded_allreduce(p, core)

"""Rabenseifner allreduce: recursive-halving reduce-scatter, then recursive-doubling allgather.

Each rank sends 2(p'-1)/p' of the vector in 2 log2 p' rounds: bandwidth-optimal like the
ring with logarithmic latency. Non-powers of two fold in and out (two more rounds, each
moving the whole vector between a pair, see _recursive).
"""
from __future__ import annotations

from ..engine.layout import offsets, split_even
from ..engine.schedule import Problem, Schedule
from ._recursive import (Fold, allgather_rounds, allreduce_edges, butterfly, counted, distances, folded_allreduce,
                         halving_steps, reduce_scatter_rounds)


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


def summaries(p: Problem):
    """Every rank's rounds counted without building them (engine/summary.py): the halving steps (send the half
    given, reduce the half kept), then the same steps walked back (send what is held, receive the partner's as
    much), folded in and out where N is not a power of two. One rank, and an empty vector: None (walked)."""
    if not butterfly(p) or p.n == 0:
        return None

    def rounds(tiers, sizes, own):
        steps = tuple(zip(tiers, sizes))
        return ([(((q, given),), ((q, kept, True),), 0) for q, (kept, given) in steps]
                + [(((q, kept),), ((q, given, False),), 0) for q, (kept, given) in reversed(steps)])
    return counted(p, offsets(split_even(p.n, Fold(p.size).p2)), False, rounds, edges=allreduce_edges(p))


def in_step(p: Problem) -> bool:
    """Whether the counted form keeps every rank's round t with its peers' round t (the cluster simulator's
    lockstep): on a power of two, or with every rank on one node (its fold or missing children then cost what the
    walk charges them: tests/test_clustersim.py) (registry.counted_summaries)."""
    return p.size & (p.size - 1) == 0 or p.topology.num_nodes == 1

"""Recursive-halving reduce-scatter: log2 p' rounds, each rank sends (p'-1)/p' of the vector.

Blocks follow the original ranks' ``counts``. Non-powers of two fold in (even ranks below
2r send their whole input to rank+1) so that new rank j reduces the contiguous original
blocks it carries, and hand the even rank's block back at the end.
"""
from __future__ import annotations

from ..engine.schedule import Copy, Problem, Recv, Round, Schedule, Send, Slice
from ._recursive import Fold, block_bounds, butterfly, counted, distances, halving_steps, reduce_scatter_rounds


def schedule(p: Problem) -> Schedule:
    if len(p.counts) != p.size:
        raise ValueError(f"reduce_scatter: counts has {len(p.counts)} entries, expected {p.size} (one per rank)")
    offs = block_bounds(p.counts, p.size)[0]  # (N+1,) start of each rank's block in "in"
    total = offs[-1]
    own = Slice("out", 0, p.counts[p.rank])
    if p.size == 1:
        return Schedule((Round(pre=(Copy(Slice("in", 0, total), own),)),))
    fold = Fold(p.size)
    whole_in = Slice("in", 0, total)
    if fold.sits_out(p.rank):
        return Schedule((Round(sends=(Send(p.rank + 1, whole_in),)), Round(recvs=(Recv(p.rank + 1, own),))))
    me = fold.newrank(p.rank)
    assert me is not None, "a rank that sits out returned above"
    # Descending distances so that new rank j ends holding new block j (its own range).
    steps = halving_steps(fold, me, distances(fold.p2))
    bounds = block_bounds(p.counts, p.size)[1]  # (p'+1,)
    if not fold.absorbs(p.rank):
        # New block me is exactly this rank's block: reduce the last step straight into "out".
        return Schedule(tuple(reduce_scatter_rounds(steps, bounds, "in", "tmp", last=own)), tmp=total)
    # Sum the pair's inputs into tmp, halve over tmp, then split the pair's two blocks.
    rounds = [Round(recvs=(Recv(p.rank - 1, Slice("tmp", 0, total), acc=whole_in),))]
    rounds += reduce_scatter_rounds(steps, bounds, "tmp", "tmp")
    mine = Slice("tmp", offs[p.rank], offs[p.rank + 1])
    theirs = Slice("tmp", offs[p.rank - 1], offs[p.rank])
    rounds.append(Round(sends=(Send(p.rank - 1, theirs),), pre=(Copy(mine, own),)))
    return Schedule(tuple(rounds), tmp=total)


def summaries(p: Problem):
    """Every rank's rounds counted without building them (engine/summary.py): each step sends the half given away
    and reduces the half kept with what comes back; where N is not a power of two, folded in (the whole input,
    reduced by the partner) and out (the partner sends back the block of the rank that sat out, and copies its
    own). One rank: None (walked)."""
    if not butterfly(p) or len(p.counts) != p.size:
        return None
    fold, total = Fold(p.size), sum(p.counts)

    def rounds(tiers, sizes, own):
        return [(((q, given),), ((q, kept, True),), 0) for q, (kept, given) in zip(tiers, sizes)]

    def edges(r: int, q: int):
        if fold.sits_out(r):
            return ((((q, total),), (), 0),), (((), ((q, p.counts[r], False),), 0),)
        return (((), ((q, total, True),), 0),), ((((q, p.counts[r - 1]),), (), p.counts[r]),)
    return counted(p, block_bounds(p.counts, p.size)[1], True, rounds, edges=edges)


def in_step(p: Problem) -> bool:
    """Whether the counted form keeps every rank's round t with its peers' round t (the cluster simulator's
    lockstep): on a power of two, or with every rank on one node (its fold or missing children then cost what the
    walk charges them: tests/test_clustersim.py) (registry.counted_summaries)."""
    return p.size & (p.size - 1) == 0 or p.topology.num_nodes == 1

"""Recursive-doubling allgather: log2 p' rounds, the data held doubling each round.

Blocks may differ in length. Non-powers of two fold in (even ranks below 2r send their
block to rank+1) and out (rank+1 sends the whole result back in one message: this is
the latency algorithm, so one message beats skipping the block the even rank has).
"""
from __future__ import annotations

from dataclasses import replace

from ..engine.schedule import Copy, Problem, Recv, Round, Schedule, Send, Slice
from ..engine.summary import all_written, written_after_first
from ._recursive import Fold, block_bounds, allgather_rounds, butterfly, counted, distances, halving_steps


def schedule(p: Problem) -> Schedule:
    if len(p.counts) != p.size:
        raise ValueError(f"allgather: counts has {len(p.counts)} entries, expected {p.size} (one per rank)")
    offs = block_bounds(p.counts, p.size)[0]  # (N+1,) start of each rank's block in "out"
    whole = Slice("out", 0, offs[-1])
    own_in = Slice("in", 0, p.counts[p.rank])
    place = Copy(own_in, Slice("out", offs[p.rank], offs[p.rank + 1]))
    if p.size == 1:
        return Schedule((Round(pre=(place,)),))
    fold = Fold(p.size)
    if fold.sits_out(p.rank):
        return Schedule((Round(sends=(Send(p.rank + 1, own_in),)), Round(recvs=(Recv(p.rank + 1, whole),))))
    # Descending halving steps, walked back: new rank j starts holding new block j.
    me = fold.newrank(p.rank)
    assert me is not None, "a rank that sits out returned above"
    steps = halving_steps(fold, me, distances(fold.p2))
    bounds = block_bounds(p.counts, p.size)[1]  # (p'+1,)
    rounds = allgather_rounds(steps, bounds, "out")
    if fold.absorbs(p.rank):
        # The even neighbour's block sits just before this rank's; together they form new block me.
        take = Recv(p.rank - 1, Slice("out", offs[p.rank - 1], offs[p.rank]))
        rounds = [Round(recvs=(take,), pre=(place,)), *rounds, Round(sends=(Send(p.rank - 1, whole),))]
    else:
        rounds[0] = replace(rounds[0], pre=(place,))
    return Schedule(tuple(rounds))


def summaries(p: Problem):
    """Every rank's rounds counted without building them (engine/summary.py): the halving steps walked back, each
    sending what the rank holds and receiving its partner's as much; the first round also copies the rank's own
    block into place. Where N is not a power of two, folded in (the block of the rank that sits out comes to its
    partner, which copies its own then) and out (the partner sends back the whole result). One rank: None."""
    if not butterfly(p) or len(p.counts) != p.size:
        return None
    fold, total = Fold(p.size), sum(p.counts)

    def rounds(tiers, sizes, own):
        return [(((q, kept),), ((q, given, False),), own if i == 0 else 0)
                for i, (q, (kept, given)) in enumerate(reversed(tuple(zip(tiers, sizes))))]

    def edges(r: int, q: int):
        if fold.sits_out(r):
            return ((((q, p.counts[r]),), (), 0),), (((), ((q, total, False),), 0),)
        return (((), ((q, p.counts[r - 1], False),), p.counts[r]),), ((((q, total),), (), 0),)
    # a core rank sends from out from its first round (its block copied there); only a rank that sits out sends
    # its input, in the fold-in round
    return counted(p, block_bounds(p.counts, p.size)[1], True, rounds,
                   lambda r: 0 if fold.absorbs(r) else p.counts[r], edges,
                   lambda kind, rounds: all_written(rounds) if kind == "core" else written_after_first(rounds))


def in_step(p: Problem) -> bool:
    """Whether the counted form keeps every rank's round t with its peers' round t (the cluster simulator's
    lockstep): on a power of two, or with every rank on one node (its fold or missing children then cost what the
    walk charges them: tests/test_clustersim.py) (registry.counted_summaries)."""
    return p.size & (p.size - 1) == 0 or p.topology.num_nodes == 1

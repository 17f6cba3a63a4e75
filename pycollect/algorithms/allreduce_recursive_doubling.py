"""Recursive-doubling allreduce: log2 p' rounds, each exchanging the whole vector with rank XOR 2^k.

Latency-optimal (one message per round) at log2(p') times the vector per rank, so it
suits short vectors. Non-powers of two fold in and out (two more rounds, see _recursive).
"""
from __future__ import annotations

from dataclasses import replace

from ..engine.schedule import Copy, Problem, Recv, Round, Schedule, Send, Slice
from ._recursive import Fold, allreduce_edges, butterfly, counted, distances, folded_allreduce


def schedule(p: Problem) -> Schedule:
    def whole(buf: str) -> Slice:
        return Slice(buf, 0, p.n)

    def core(fold, cur):
        me, rounds = fold.newrank(p.rank), []
        for d in distances(fold.p2, descending=False):
            # The whole vector is sent and received in one round, so the sum lands in the other
            # buffer: ping-pong tmp/out ("in" is never written; it may alias "out"). Both partners compute
            # op(lower ranks, higher ranks), so they hold the same bits (a zero's sign under min, a NaN's
            # payload) and the ranks are reduced in order.
            nxt = "out" if cur == "tmp" else "tmp"
            peer = fold.rank_of(me ^ d)
            rounds.append(Round(sends=(Send(peer, whole(cur)),),
                                recvs=(Recv(peer, whole(nxt), acc=whole(cur), incoming_first=peer < p.rank),)))
            cur = nxt
        if cur != "out":
            rounds[-1] = replace(rounds[-1], post=(Copy(whole(cur), whole("out")),))
        return rounds, p.n

    return folded_allreduce(p, core)


def summaries(p: Problem):
    """Every rank's rounds counted without building them (engine/summary.py): one exchange of the whole vector a
    round, reduced, the last round copying the sum to ``out`` when an odd number of rounds left it in tmp, folded
    in and out where N is not a power of two. A rank's class: the tier of each partner. One rank, and an empty
    vector: None (walked; one copy each)."""
    if not butterfly(p) or p.n == 0:
        return None
    n = p.n
    last = n if (Fold(p.size).p2.bit_length() - 1) % 2 else 0

    def rounds(tiers, sizes, own):
        return [(((q, n),), ((q, n, True),), last if i == len(tiers) - 1 else 0) for i, q in enumerate(tiers)]
    return counted(p, None, False, rounds, edges=allreduce_edges(p))


def in_step(p: Problem) -> bool:
    """Whether the counted form keeps every rank's round t with its peers' round t (the cluster simulator's
    lockstep): on a power of two, or with every rank on one node (its fold or missing children then cost what the
    walk charges them: tests/test_clustersim.py) (registry.counted_summaries)."""
    return p.size & (p.size - 1) == 0 or p.topology.num_nodes == 1

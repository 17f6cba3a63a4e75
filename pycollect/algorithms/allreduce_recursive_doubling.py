"""Recursive-doubling allreduce: log2 p' rounds, each exchanging the whole vector with rank XOR 2^k.

Latency-optimal (one message per round) at log2(p') times the vector per rank, so it
suits short vectors. Non-powers of two fold in and out (two more rounds, see _recursive).
"""
from __future__ import annotations

from dataclasses import replace

from ..engine.schedule import Copy, Problem, Recv, Round, Schedule, Send, Slice
from ._recursive import Fold, distances


def schedule(p: Problem) -> Schedule:
    def whole(buf: str) -> Slice:
        return Slice(buf, 0, p.n)

    if p.size == 1 or p.n == 0:
        return Schedule((Round(pre=(Copy(whole("in"), whole("out")),)),))
    fold = Fold(p.size)
    if fold.sits_out(p.rank):
        # Hand the vector to rank+1, which reduces it for both, and take the result back.
        return Schedule((Round(sends=(Send(p.rank + 1, whole("in")),)),
                         Round(recvs=(Recv(p.rank + 1, whole("out")),))))
    rounds, cur = [], "in"
    if fold.absorbs(p.rank):
        rounds.append(Round(recvs=(Recv(p.rank - 1, whole("out"), acc=whole("in")),)))
        cur = "out"
    me = fold.newrank(p.rank)
    for d in distances(fold.p2):
        # The whole vector is sent and received in one round, so the sum lands in the other
        # buffer: ping-pong tmp/out ("in" is never written; it may alias "out").
        nxt = "out" if cur == "tmp" else "tmp"
        peer = fold.rank_of(me ^ d)
        rounds.append(Round(sends=(Send(peer, whole(cur)),), recvs=(Recv(peer, whole(nxt), acc=whole(cur)),)))
        cur = nxt
    if cur != "out":
        rounds[-1] = replace(rounds[-1], post=(Copy(whole(cur), whole("out")),))
    if fold.absorbs(p.rank):
        rounds.append(Round(sends=(Send(p.rank - 1, whole("out")),)))
    return Schedule(tuple(rounds), tmp=p.n)

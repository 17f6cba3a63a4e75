"""Pairwise reduce-scatter: N-1 rounds, round s trades blocks with ranks r+s and r-s.

Each rank sends every foreign block once, straight from ``in`` (no forwarding, unlike
the ring), so it sends (N-1)/N of the vector in N-1 rounds and the reduction order at
each rank is fixed by rank distance rather than by ring position.
"""
from __future__ import annotations

from ..engine.layout import block_ranges
from ..engine.schedule import Copy, Problem, Recv, Round, Schedule, Send, Slice


def schedule(p: Problem) -> Schedule:
    r, size = p.rank, p.size
    ranges = block_ranges(p.counts)  # in: block b is rank b's share of the vector
    mine = p.counts[r]
    out = Slice("out", 0, mine)
    if size == 1:
        return Schedule((Round(pre=(Copy(Slice("in", *ranges[r]), out),)),))
    # Partial sums live in tmp, not out: an in-place ``out`` is the head of ``in``, which
    # holds blocks still to be sent, so out is written once, after the last round.
    acc, rounds = Slice("in", *ranges[r]), []
    for s in range(1, size):
        to, frm = (r + s) % size, (r - s) % size
        # Both ends know both sizes from counts, so empty messages are skipped on both.
        sends = (Send(to, Slice("in", *ranges[to])),) if p.counts[to] else ()
        recvs = (Recv(frm, Slice("tmp", 0, mine), acc=acc),) if mine else ()
        rounds.append(Round(sends=sends, recvs=recvs))
        acc = Slice("tmp", 0, mine)  # from round 2 on, add to what has been gathered so far
    # Last round's post moves the result; a rank whose own block is empty copies nothing.
    rounds[-1] = Round(rounds[-1].sends, rounds[-1].recvs, post=(Copy(Slice("tmp", 0, mine), out),) if mine else ())
    return Schedule(tuple(rnd for rnd in rounds if rnd.communicates or rnd.post), tmp=mine)

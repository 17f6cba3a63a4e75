"""Shared-memory allreduce: a window reduce-scatter, then a window allgather of the reduced blocks.

Round 1: every rank publishes its input and reduces its block (an even split) from
every peer's window into ``out``. Round 2: it publishes that reduced block after the
input (window elements ``n`` on, so nothing a peer may still read in round 1 is
overwritten) and copies every other reduced block out of its owner's window. Every rank's
``out`` holds the same sums: each block is reduced once, by its owner. Without a window it
is the ring allreduce.
"""
from __future__ import annotations

from ..engine.layout import even_ranges
from ..engine.schedule import Problem, Recv, Round, Schedule, Send, Slice
from . import _window, allreduce_ring


def schedule(p: Problem) -> Schedule:
    if not p.windows or p.size == 1 or p.n == 0:
        return allreduce_ring.schedule(p)
    r, n = p.rank, p.n
    ranges = even_ranges(0, n, p.size)
    others = _window.peers(r, p.size)
    mine = Slice("out", *ranges[r])
    reduce = _window.reduce_scatter_round(r, ranges, mine)
    shared = tuple(Send(to, mine, at=n) for to in others if mine.n)
    gather = tuple(Recv(frm, Slice("out", *ranges[frm]), at=n) for frm in others if ranges[frm][1] > ranges[frm][0])
    block = ranges[0][1] - ranges[0][0]   # the largest block (even_ranges puts the longer ones first)
    return Schedule((reduce, Round(shared, gather, window=True)), win=n + block, lends=True)


summaries = _window.twin_summaries(allreduce_ring)

"""Shared-memory allgather: each rank publishes its block in its window once; every peer copies it out once.

One window round: a rank copies its block into its window and into ``out``, meets the
others at a fence, then copies every peer's block straight from the peer's window into
``out``. Each block is written into shared memory once and read by each peer once, where
MPI's shared-memory transport copies every message through its cells (in and out) per
peer. Without a window (ranks on several nodes, device buffers) it is the ring allgather.
"""
from __future__ import annotations

from ..engine.layout import block_ranges
from ..engine.schedule import Copy, Problem, Recv, Round, Schedule, Send, Slice
from . import _window, allgather_ring


def schedule(p: Problem) -> Schedule:
    if not p.windows or p.size == 1 or p.topology.num_nodes > 1:
        return allgather_ring.schedule(p)
    ranges = block_ranges(p.counts)
    mine = Slice("in", 0, p.counts[p.rank])
    others = _window.peers(p.rank, p.size)
    # One Send per reader names the same range: the executor publishes it once (at 0).
    sends = tuple(Send(peer, mine, at=0) for peer in others if mine.n)
    recvs = tuple(Recv(peer, Slice("out", *ranges[peer]), at=0) for peer in others if p.counts[peer])
    place = Copy(mine, Slice("out", *ranges[p.rank]))
    return Schedule((Round(sends, recvs, pre=(place,), window=True, from_input=True),), win=max(p.counts), lends=True)


summaries = _window.twin_summaries(allgather_ring, schedule, lambda p: p.counts)   # a rank's own block

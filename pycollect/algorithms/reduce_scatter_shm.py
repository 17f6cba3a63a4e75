"""Shared-memory reduce-scatter: each rank publishes its input; each block's owner reduces it from every window.

One window round: rank i publishes its input (block j at its offset), meets the others
at a fence, then adds block i of every peer, read straight from the peer's window, onto
its own block: no message, no staging copy on the receiving side. The reads run in the
order listed, peers from rank i+1 on. Without a window it is the ring reduce-scatter.
"""
from __future__ import annotations

from ..engine.layout import block_ranges
from ..engine.schedule import Problem, Recv, Round, Schedule, Send, Slice
from . import _window, reduce_scatter_ring


def schedule(p: Problem) -> Schedule:
    if not p.windows or p.size == 1:
        return reduce_scatter_ring.schedule(p)
    r = p.rank
    ranges = block_ranges(p.counts)
    others = _window.peers(r, p.size)
    mine, out = p.counts[r], Slice("out", 0, p.counts[r])
    sends = tuple(Send(to, Slice("in", *ranges[to]), at=ranges[to][0]) for to in others if p.counts[to])
    recvs, acc = [], Slice("in", *ranges[r])   # the first read adds onto this rank's own block
    for frm in others if mine else ():
        recvs.append(Recv(frm, out, acc=acc, at=ranges[r][0]))
        acc = out
    return Schedule((Round(sends, tuple(recvs), window=True),), win=p.n)


def summaries(p: Problem):
    """Without a window, the counted form of the schedule it runs instead (engine/summary.py); with one, walked."""
    return None if p.windows else reduce_scatter_ring.summaries(p)

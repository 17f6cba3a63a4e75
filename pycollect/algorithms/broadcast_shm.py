"""Shared-memory broadcast: the root publishes the vector in its window once; every rank copies it out once.

One window round; the root's copy into its window is the only extra copy, where a tree
of messages copies the vector through MPI's shared-memory cells at every hop. Without a
window it is the binomial broadcast.
"""
from __future__ import annotations

from ..engine.schedule import EMPTY, Copy, Problem, Recv, Round, Schedule, Send, Slice
from . import _window, broadcast_binomial


def schedule(p: Problem) -> Schedule:
    if not p.windows or p.size == 1 or p.topology.num_nodes > 1:
        return broadcast_binomial.schedule(p)
    if p.n == 0:
        return EMPTY
    out = Slice("out", 0, p.n)
    if p.rank == p.root:
        src = Slice("in", 0, p.n)
        sends = tuple(Send(peer, src, at=0) for peer in _window.peers(p.rank, p.size))
        return Schedule((Round(sends=sends, pre=(Copy(src, out),), window=True, from_input=True),), win=p.n, lends=True)
    return Schedule((Round(recvs=(Recv(p.root, out, at=0),), window=True, from_input=True),), win=p.n, lends=True)


summaries = _window.twin_summaries(broadcast_binomial, schedule, lambda p: [r == p.root for r in range(p.size)])
in_step = broadcast_binomial.in_step   # where it is its message twin

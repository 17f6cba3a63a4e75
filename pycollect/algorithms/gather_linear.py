"""Linear gather: every rank sends its block straight to the root, all in one round.

The root receives size - 1 messages at once (its link carries everything, the others one block
each): the fewest bytes moved, and the fewest rounds, at the cost of the root's receive queue.
Empty blocks send nothing.
"""
from __future__ import annotations

from ..engine.schedule import EMPTY, Copy, Problem, Recv, Round, Schedule, Send, Slice
from . import _rooted


def schedule(p: Problem) -> Schedule:
    mine = p.counts[p.rank]
    if p.rank != p.root:
        return Schedule((Round(sends=(Send(p.root, Slice("in", 0, mine)),)),)) if mine else EMPTY
    where = _rooted.blocks(p)
    a, b = where[p.rank]
    # the root's own block is a copy, made before the round (in place it lies there already: a no-op)
    own = (Copy(Slice("in", 0, mine), Slice("out", a, b)),) if mine else ()
    recvs = tuple(Recv(r, Slice("out", *where[r])) for r in range(p.size) if r != p.root and p.counts[r])
    return Schedule((Round(recvs=recvs, pre=own),)) if recvs or own else EMPTY

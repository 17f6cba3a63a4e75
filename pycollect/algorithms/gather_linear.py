"""Linear gather: every rank sends its block straight to the root, all in one round.

The root receives size - 1 messages at once (its link carries everything, the others one block
each): the fewest bytes moved, and the fewest rounds, at the cost of the root's receive queue.
Empty blocks send nothing.
"""
from __future__ import annotations

from ..engine.schedule import EMPTY, Copy, Problem, Recv, Round, Schedule, Send, Slice
from ..engine.summary import RankClasses, Shape, compress
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


def summaries(p: Problem):
    """Every rank's one round counted without building it: a rank's class is its block and the tier of the root;
    the root's receives are listed once. One rank: None (walked)."""
    if p.size == 1:
        return None
    classes = RankClasses(p.topology)
    for r in range(p.size):
        if r != p.root:
            classes.add(r, (p.counts[r], classes.where(r, p.root)), _one_send)
    classes.add_class(p.root, "root", compress(_root_rounds(p, classes)))
    return classes


def _one_send(key) -> list:
    n, tier = key
    return [(((tier, n),), (), 0)] if n else []


def _root_rounds(p: Problem, classes) -> list:
    """The root's round: a receive from every other rank with a block, its own block copied (if any)."""
    recvs = tuple((classes.where(p.root, r), p.counts[r], False) for r in range(p.size) if r != p.root and p.counts[r])
    own = p.counts[p.root]
    return [Shape((), recvs, own)] if recvs or own else []

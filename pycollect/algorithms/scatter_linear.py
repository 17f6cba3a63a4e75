"""Linear scatter: the root sends every rank its block straight from its buffer, all in one round.

The gather reversed: size - 1 messages leave the root at once, each rank receives one. Empty
blocks send nothing.
"""
from __future__ import annotations

from ..engine.schedule import EMPTY, Copy, Problem, Recv, Round, Schedule, Send, Slice
from ..engine.summary import RankClasses, Shape, compress
from . import _rooted


def schedule(p: Problem) -> Schedule:
    mine = p.counts[p.rank]
    if p.rank != p.root:
        return Schedule((Round(recvs=(Recv(p.root, Slice("out", 0, mine)),)),)) if mine else EMPTY
    where = _rooted.blocks(p)
    sends = tuple(Send(r, Slice("in", *where[r])) for r in range(p.size) if r != p.root and p.counts[r])
    # the root's own block after its sends: out may lie on the root's buffer (in place), not before they read it
    own = (Copy(Slice("in", *where[p.rank]), Slice("out", 0, mine)),) if mine else ()
    return Schedule((Round(sends=sends, post=own),)) if sends or own else EMPTY


def summaries(p: Problem):
    """Every rank's one round counted without building it: a rank's class is its block and the tier of the root;
    the root's sends are listed once. One rank: None (walked)."""
    if p.size == 1:
        return None
    classes = RankClasses(p.topology)
    for r in range(p.size):
        if r != p.root:
            classes.add(r, (p.counts[r], classes.where(r, p.root)), _one_receive)
    sends = tuple((classes.where(p.root, r), p.counts[r]) for r in range(p.size) if r != p.root and p.counts[r])
    own = p.counts[p.root]
    classes.add_class(p.root, "root", compress([Shape(sends, (), own)] if sends or own else []))
    return classes


def _one_receive(key) -> list:
    n, tier = key
    return [((), ((tier, n, False),), 0)] if n else []

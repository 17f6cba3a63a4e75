"""Binomial gather: ceil(log2 N) rounds; each rank sends its whole subtree's blocks up once.

Relative rank v of step k (``_binomial``: its lowest set bit, L at the root) receives child
v + 2^j's subtree in round j, each after the smaller ones, then sends its own subtree -- its
block first, the children's after it, in relative order -- to its parent in round k. The tree
follows ``_binomial.tree_order`` (it leaves each node once when nodes hold a power of two
ranks). Inner ranks collect in ``tmp``; the root receives a subtree straight into ``out`` where
its blocks lie there in that order (``_rooted``), else into ``tmp`` and copies each block to its
place. Empty subtrees send nothing.
"""
from __future__ import annotations

from ..engine.schedule import EMPTY, Copy, Problem, Recv, Round, Schedule, Send, Slice
from . import _rooted


def schedule(p: Problem) -> Schedule:
    group, v, levels, k, kids = _rooted.tree_place(p)
    mine = p.counts[p.rank]
    rounds: list[list[list]] = [[[], [], [], []] for _ in range(levels + 1)]   # [sends, recvs, pre, post], round t
    if v == 0:
        return _root(p, group, kids, rounds)
    total = _rooted.elements(p, _rooted.subtree(group, v, k))
    if kids:   # gather the subtree in tmp: this rank's block first, then each child's subtree after it
        if mine:
            rounds[0][2].append(Copy(Slice("in", 0, mine), Slice("tmp", 0, mine)))
        at = mine
        for j in kids:
            n = _rooted.elements(p, _rooted.subtree(group, v + (1 << j), j))
            if n:
                rounds[j][1].append(Recv(group[v + (1 << j)], Slice("tmp", at, at + n)))
            at += n
    if total:
        rounds[k][0].append(Send(group[v - (1 << k)], Slice("tmp" if kids else "in", 0, total)))
    return _schedule(rounds, total if kids else 0)


def _root(p: Problem, group, kids, rounds) -> Schedule:
    """The root: child j's subtree lands in round j, in ``out`` where it fits as it comes, else in ``tmp``."""
    a, b = _rooted.blocks(p)[p.rank]
    if b > a:   # its own block, before anything lands (in place it lies there already: a no-op)
        rounds[0][2].append(Copy(Slice("in", 0, b - a), Slice("out", a, b)))
    tmp = 0
    for j, child, ranks, n, start in _rooted.root_children(p, group, kids):
        if start is not None:
            rounds[j][1].append(Recv(child, Slice("out", start, start + n)))
        else:
            rounds[j][1].append(Recv(child, Slice("tmp", tmp, tmp + n)))
            rounds[j][3].extend(_rooted.packed(p, ranks, "tmp", tmp, "out", into_root=True))
            tmp += n
    return _schedule(rounds, tmp)


def _schedule(rounds, tmp: int) -> Schedule:
    """Aligned rounds without the empty ones (each pair's messages keep their order)."""
    made = [Round(tuple(s), tuple(r), tuple(pre), tuple(post)) for s, r, pre, post in rounds]
    kept = tuple(r for r in made if r.communicates or r.pre or r.post)
    return Schedule(kept, tmp=tmp) if kept else EMPTY

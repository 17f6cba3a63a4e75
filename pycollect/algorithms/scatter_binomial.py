"""Binomial scatter: ceil(log2 N) rounds; each rank receives its whole subtree's blocks once.

The gather reversed (``gather_binomial``): relative rank v of step k receives its subtree's
blocks -- its own first, then its children's in relative order -- from its parent in round
L-1-k, and passes child v + 2^j's part on in round L-1-j, the largest subtree first. Inner
ranks hold their subtree in ``tmp``; the root sends a subtree straight from ``in`` where its
blocks lie there in that order (``_rooted``), else packs it into ``tmp`` first. Empty subtrees
send nothing.
"""
from __future__ import annotations

from ..engine.schedule import Copy, Problem, Recv, Send, Slice
from . import _rooted
from .gather_binomial import _schedule


def schedule(p: Problem):
    group, v, levels, k, kids = _rooted.tree_place(p)
    mine = p.counts[p.rank]
    rounds: list[list[list]] = [[[], [], [], []] for _ in range(levels + 1)]   # [sends, recvs, pre, post], round t
    if v == 0:
        return _root(p, group, kids, rounds, levels)
    total = _rooted.elements(p, _rooted.subtree(group, v, k))
    if not kids:   # a leaf: its subtree is its own block
        if mine:
            rounds[levels - 1 - k][1].append(Recv(group[v - (1 << k)], Slice("out", 0, mine)))
        return _schedule(rounds, 0)
    if total:
        got = rounds[levels - 1 - k]
        got[1].append(Recv(group[v - (1 << k)], Slice("tmp", 0, total)))
        if mine:
            got[3].append(Copy(Slice("tmp", 0, mine), Slice("out", 0, mine)))
    at = mine
    for j in kids:
        n = _rooted.elements(p, _rooted.subtree(group, v + (1 << j), j))
        if n:
            rounds[levels - 1 - j][0].append(Send(group[v + (1 << j)], Slice("tmp", at, at + n)))
        at += n
    return _schedule(rounds, total)


def _root(p: Problem, group, kids, rounds, levels: int):
    """The root: child j's subtree leaves in round L-1-j, from ``in`` where it lies there in order, else packed
    into ``tmp`` before the first round; its own block is copied out last (``out`` may lie on ``in``)."""
    tmp = 0
    for j, child, ranks, n, start in _rooted.root_children(p, group, kids):
        if start is not None:
            rounds[levels - 1 - j][0].append(Send(child, Slice("in", start, start + n)))
        else:
            rounds[0][2].extend(_rooted.packed(p, ranks, "tmp", tmp, "in", into_root=False))
            rounds[levels - 1 - j][0].append(Send(child, Slice("tmp", tmp, tmp + n)))
            tmp += n
    a, b = _rooted.blocks(p)[p.rank]
    if b > a:
        rounds[levels][3].append(Copy(Slice("in", a, b), Slice("out", 0, b - a)))
    return _schedule(rounds, tmp)

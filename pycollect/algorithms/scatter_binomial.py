"""Binomial scatter: ceil(log2 N) rounds; each rank receives its whole subtree's blocks once.

The gather reversed (``gather_binomial``): relative rank v of step k receives its subtree's
blocks -- its own first, then its children's in relative order -- from its parent in round
L-1-k, and passes child v + 2^j's part on in round L-1-j, the largest subtree first. Inner
ranks hold their subtree in ``tmp``; the root sends a subtree straight from ``in`` where its
blocks lie there in that order (``_rooted``), else packs it into ``tmp`` first. Empty subtrees
send nothing.
"""
from __future__ import annotations

from dataclasses import replace

from ..engine.schedule import Copy, Problem, Recv, Send, Slice
from ..engine.summary import RankClasses, Shape, all_written, sent_written
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


# -- counted form (engine/summary.py) ----------------------------------------------------------------------
def summaries(p: Problem):
    """Every rank's rounds counted without building them: the tree's subtrees summed once (``_rooted.CountedTree``),
    each rank's class its rounds as numbers. A rank's sends run one a round once its receive is in, so the ranks
    are walked from the root down, each learning from its parent the round its subtree leaves in, and the rounds
    it waits are kept as idle rounds (``finish`` is then the walk's critical path). One rank, nothing to
    scatter: None (walked)."""
    if p.size == 1 or not any(p.counts):
        return None
    tree, classes = _rooted.CountedTree(p), RankClasses(p.topology)
    leaves = [0] * tree.m                     # leaves[v]: the round relative rank v's subtree leaves its parent in
    for v in range(tree.m):                   # a parent (v - 2^k) before its children
        rounds = _root_rounds(p, tree, leaves) if v == 0 else _inner_rounds(p, tree, v, leaves)
        if v:                                 # the root sends from its input, the others forward from tmp
            rounds = all_written(rounds)
        classes.add(tree.group[v], tuple(rounds), list)   # the key is the rounds themselves: list hands them back
    return classes


def _inner_rounds(p: Problem, tree, v: int, leaves: list[int]) -> list:
    """Rank v's rounds: its subtree from the parent (its own block copied out of tmp where it has children), then
    each child's part, the largest first, one a round."""
    k, kids, total = tree.k(v), tree.kids(v), tree.span(v)
    if not total:
        return []
    rounds: list = []
    at = _rooted.waited(rounds, leaves[v], 0)
    rounds.append(((), ((tree.tier(v, v - (1 << k)), total, False),), p.counts[tree.group[v]] if kids else 0))
    return rounds + _sends(tree, v, [(j, tree.span(v + (1 << j), j)) for j in reversed(kids)], at, leaves)


def _sends(tree, v: int, parts, at: int, leaves: list[int]) -> list:
    """Rank v's sends of ``(j, elements)`` to child v + 2^j, the non-empty ones one a round from round ``at``."""
    rounds = []
    for j, n in parts:
        if n:
            leaves[v + (1 << j)] = at
            rounds.append((((tree.tier(v, v + (1 << j)), n),), (), 0))
            at += 1
    return rounds


def _root_rounds(p: Problem, tree, leaves: list[int]) -> list:
    """The root's rounds: the subtrees whose blocks do not lie in order in ``in`` packed into tmp before the first
    send, each child's part from round 0 on, its own block copied out last."""
    leaving = list(_rooted.root_children(p, tree.group, tree.kids(0)))[::-1]     # the largest subtree first
    packed = sum(n for _, _, _, n, start in leaving if start is None)
    sent = _sends(tree, 0, [(j, n) for j, _, _, n, _ in leaving], 0, leaves)
    from_tmp = [start is None for _, _, _, n, start in leaving if n]   # a packed part is sent from what the call wrote
    rounds: list = [sent_written(rnd) if tmp else Shape(*rnd) for rnd, tmp in zip(sent, from_tmp)]
    if packed:
        if leaving[0][0] == tree.levels - 1:       # packed with the first send (round 0 of the aligned rounds)
            rounds[0] = replace(rounds[0], copied=packed)
        else:
            rounds.insert(0, ((), (), packed))
    a, b = _rooted.blocks(p)[p.root]
    return rounds + ([((), (), b - a)] if b > a else [])


def in_step(p: Problem) -> bool:
    """Whether the counted form keeps every rank's round t with its peers' round t (the cluster simulator's
    lockstep): on a power of two with no empty block, where no rank runs ahead of the aligned rounds
    (registry.counted_summaries)."""
    return p.size & (p.size - 1) == 0 and all(p.counts)

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
from ..engine.summary import RankClasses, all_written
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


# -- counted form (engine/summary.py) ----------------------------------------------------------------------
def summaries(p: Problem):
    """Every rank's rounds counted without building them: the tree's subtrees summed once (``_rooted.CountedTree``),
    each rank's class its rounds as numbers. A rank waits for a child until the child's own receives are done, so
    the ranks are walked from the leaves up, each child's finishing round known before its parent's, and the rounds
    a rank waits are kept as idle rounds (``finish`` is then the walk's critical path). One rank, nothing to
    gather: None (walked)."""
    if p.size == 1 or not any(p.counts):
        return None
    tree, classes = _rooted.CountedTree(p), RankClasses(p.topology)
    ends = [0] * tree.m                                    # ends[v]: the round relative rank v finishes in
    for v in range(tree.m - 1, -1, -1):                    # children (v + 2^j) before their parent
        rounds = _root_rounds(p, tree, ends) if v == 0 else _inner_rounds(p, tree, v, ends)
        if v and tree.kids(v):                             # a rank with children sends its subtree from tmp
            rounds = all_written(rounds)
        classes.add(tree.group[v], tuple(rounds), list)   # the key is the rounds themselves: list hands them back
    return classes


def _inner_rounds(p: Problem, tree, v: int, ends: list[int]) -> list:
    """Rank v's rounds: its block copied into tmp with the first child's arrival, each child's subtree as it comes
    (after the child's own last receive), its subtree up to the parent."""
    k, kids, total = tree.k(v), tree.kids(v), tree.span(v)
    if not total:
        return []
    mine, at = p.counts[tree.group[v]], 0
    rounds: list = []                                     # (sends, recvs, copied) or IDLE, as RankClasses.add takes
    copy = mine if kids else 0
    if copy and not tree.span(v + 1, 0):                  # no first child to arrive with: a round that only copies
        rounds.append(((), (), copy))
    for j in kids:
        if n := tree.span(v + (1 << j), j):
            at = _rooted.waited(rounds, ends[v + (1 << j)] - 1, at)
            rounds.append(((), ((tree.tier(v, v + (1 << j)), n, False),), copy if j == 0 else 0))
    rounds.append((((tree.tier(v, v - (1 << k)), total),), (), 0))
    ends[v] = at + 1
    return rounds


def _root_rounds(p: Problem, tree, ends: list[int]) -> list:
    """The root's rounds: its own block copied with the first arrival, each child's subtree as it comes, copied
    into place from tmp where its blocks do not lie in order in ``out``."""
    a, b = _rooted.blocks(p)[p.root]
    own, at = b - a, 0
    rounds: list = []
    arriving = list(_rooted.root_children(p, tree.group, tree.kids(0)))
    if own and not (arriving and arriving[0][0] == 0):
        rounds.append(((), (), own))
    for j, _, _, n, start in arriving:
        at = _rooted.waited(rounds, ends[1 << j] - 1, at)
        copied = (n if start is None else 0) + (own if j == 0 else 0)
        rounds.append(((), ((tree.tier(0, 1 << j), n, False),), copied))
    ends[0] = at
    return rounds


def in_step(p: Problem) -> bool:
    """Whether the counted form keeps every rank's round t with its peers' round t (the cluster simulator's
    lockstep): on a power of two with no empty block, where no rank runs ahead of the aligned rounds
    (registry.counted_summaries)."""
    return p.size & (p.size - 1) == 0 and all(p.counts)

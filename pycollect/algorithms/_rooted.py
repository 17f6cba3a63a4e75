"""What the gather and scatter schedules share: where each rank's block lies in the root's buffer.

The root's buffer (``out`` of a gather, ``in`` of a scatter) holds rank i's ``counts[i]`` elements at
``displs[i]`` (packed in rank order when ``displs`` is empty). A binomial tree moves a whole subtree's
blocks in one message, packed in the tree's relative order; at the root such a span goes straight to
or from the caller's buffer when the subtree's blocks lie there in that order, one after another, and
through ``tmp`` otherwise (a copy per block).
"""
from __future__ import annotations

from functools import lru_cache

from ..engine.layout import ceil_log2, offsets
from ..engine.schedule import Copy, Problem, Slice
from ..engine.summary import AWAY, IDLE, MATE
from . import _binomial


def blocks(p: Problem) -> tuple[tuple[int, int], ...]:
    """``(start, stop)`` of every rank's block in the root's buffer, by rank."""
    return _blocks(p.counts, p.displs)


@lru_cache(maxsize=64)
def _blocks(counts: tuple[int, ...], displs: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    starts = displs or offsets(counts)[:-1]
    return tuple((a, a + c) for a, c in zip(starts, counts))


def in_place_span(p: Problem, ranks) -> int | None:
    """The start of ``ranks``' blocks in the root's buffer when they lie there in the order of ``ranks``, one after
    another (empty blocks anywhere), so that one message moves them as they lie; else None."""
    where = blocks(p)   # once: each call hashes the counts
    spans = [b for b in (where[r] for r in ranks) if b[1] > b[0]]
    if not spans:
        return 0
    if any(spans[i][1] != spans[i + 1][0] for i in range(len(spans) - 1)):
        return None
    return spans[0][0]


def packed(p: Problem, ranks, buf: str, at: int, root_buf: str, into_root: bool) -> list[Copy]:
    """Copies between ``ranks``' blocks packed from element ``at`` of ``buf`` and their places in ``root_buf``:
    into the root's buffer (``into_root``: a gather's last step) or out of it (a scatter's first)."""
    copies, here, where = [], at, blocks(p)
    for r in ranks:
        a, b = where[r]
        if b > a:
            pair = (Slice(buf, here, here + b - a), Slice(root_buf, a, b))
            copies.append(Copy(*pair) if into_root else Copy(pair[1], pair[0]))
        here += b - a
    return copies


def tree_place(p: Problem):
    """This rank's place in the binomial tree rooted at ``p.root``: ``(group, v, levels, k, kids)`` -- the ranks in
    tree order, this rank's position there, the tree's rounds, the round it meets its parent in (``levels`` at
    the root), the rounds it meets its children in."""
    group = _binomial.tree_order(p.topology, p.root)
    v, levels = group.index(p.rank), ceil_log2(p.size)
    k = (v & -v).bit_length() - 1 if v else levels
    return group, v, levels, k, [j for j in range(k) if v + (1 << j) < p.size]


def root_children(p: Problem, group, kids):
    """The root's children with blocks to move: ``(j, child, ranks, n, start)`` -- the round index j, the child's
    rank, its subtree's ranks in tree order, their elements, and where they lie in order in the root's buffer
    (``in_place_span``; None: packed through ``tmp``)."""
    for j in kids:
        ranks = subtree(group, 1 << j, j)
        n = elements(p, ranks)
        if n:
            yield j, group[1 << j], ranks, n, in_place_span(p, ranks)


def subtree(group, v: int, k: int) -> tuple[int, ...]:
    """The ranks of relative rank v's subtree in a binomial tree over ``group`` (v's step k): relative ranks
    ``[v, v + 2^k)`` that exist, in relative order (the order their blocks travel in)."""
    return tuple(group[v:min(v + (1 << k), len(group))])


def elements(p: Problem, ranks) -> int:
    return sum(p.counts[r] for r in ranks)


# -- counted forms (engine/summary.py) ---------------------------------------------------------------------
class CountedTree:
    """The binomial tree of a gather or scatter as numbers, for the counted forms: relative rank v of step ``k(v)``
    (``levels`` at the root) has children ``kids(v)`` (steps j), its subtree holds ``span(v)`` elements (prefix
    sums over the tree order: O(1) a rank, where the schedules sum each subtree), and ``tier(v, u)`` is MATE or
    AWAY between relative ranks v and u."""

    def __init__(self, p: Problem) -> None:
        self.group = _binomial.tree_order(p.topology, p.root)
        self.m, self.levels = len(self.group), ceil_log2(len(self.group))
        self.node = [p.topology.node_of[r] for r in self.group]        # node of each relative rank
        self.below = [0] * (self.m + 1)                                   # elements of relative ranks < v
        for v, r in enumerate(self.group):
            self.below[v + 1] = self.below[v] + p.counts[r]

    def k(self, v: int) -> int:
        return (v & -v).bit_length() - 1 if v else self.levels

    def kids(self, v: int) -> list[int]:
        return [j for j in range(self.k(v)) if v + (1 << j) < self.m]

    def span(self, v: int, k: int | None = None) -> int:
        k = self.k(v) if k is None else k
        return self.below[min(v + (1 << k), self.m)] - self.below[v]

    def tier(self, v: int, u: int) -> int:
        return MATE if self.node[v] == self.node[u] else AWAY


def waited(rounds: list, ready: int, at: int) -> int:
    """Idle rounds before a receive that rank posts at round ``ready`` (the start of the sender's round), this rank
    being at round ``at``: appended to ``rounds``; the round after the receive is returned."""
    rounds.extend([IDLE] * max(0, ready - at))
    return max(at, ready) + 1

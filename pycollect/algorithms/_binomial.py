"""Binomial-tree pieces: pipelined reduce and broadcast, and scatter, over any group of ranks.

A group is a list of ranks; ``pos`` is this rank's place in it and ``root`` the root's
place. ``v = (pos - root) mod m`` is the relative rank. Rank v with lowest set bit k
(the root: k = L = ceil(log2 m)) has parent ``v - 2^k`` and children ``v + 2^j`` for
j < k that exist; its subtree is relative ranks ``[v, v + 2^k)``.

Every piece returns *aligned* rounds: round t of one rank meets round t of its peers,
so pieces can be overlaid round by round (``overlay``) and empty rounds dropped at the
end (``compact``). With S segments the pipelined pieces take S + L - 1 rounds instead
of S * L: round t carries segment t - j of step j.
"""
from __future__ import annotations

from ..engine.layout import ceil_log2, per_call, pieces
from ..engine.schedule import Copy, Recv, Round, Send, Slice
from ..engine.summary import AWAY, IDLE, MATE, RankClasses, Shape


@per_call
def tree_order(topology, root: int) -> tuple[int, ...]:
    """Ranks for a tree rooted at ``root``: root's node from the root on, then the other nodes.

    Nodes sit in aligned blocks of relative ranks when they all hold 2^a ranks, so the
    first a steps of every tree stay on a node and only one message per node crosses.
    On one node this is ``(root, root + 1, ..., root - 1)``: v = (rank - root) mod N.
    """
    nodes = topology.nodes
    home = topology.node_of[root]
    order: list[int] = []
    for i in range(len(nodes)):
        ranks = nodes[(home + i) % len(nodes)]
        if i == 0:
            at = ranks.index(root)
            ranks = ranks[at:] + ranks[:at]
        order.extend(ranks)
    return tuple(order)


def segments(n: int, seg: int) -> list[tuple[int, int]]:
    """``(start, stop)`` of the pipelined segments of n elements, ``seg`` each (0: one segment; at most
    ``layout.MAX_PIECES``)."""
    return list(pieces(n, seg)) if n else []


def _tree(m: int, pos: int, root: int):
    """(relative rank, its step k, the steps j of its existing children, L)."""
    levels = ceil_log2(m)
    v = (pos - root) % m
    k = (v & -v).bit_length() - 1 if v else levels
    kids = [j for j in range(k) if v + (1 << j) < m]
    return v, k, kids, levels


def _rounds(grid) -> list[Round]:
    return [Round(sends=tuple(s), recvs=tuple(r)) for s, r in grid]


def reduce(group, pos: int, root: int, src: Slice, work: Slice, segs) -> list[Round]:
    """Pipelined binomial reduce of every member's ``src`` into the root's ``work``.

    S + L - 1 aligned rounds. Partial sums build up in ``work`` (a leaf never touches it);
    segment s from child j arrives in round s + j and goes up in round s + k, after
    all children's copies of it (j < k) have arrived.
    """
    m = len(group)
    if m == 1:
        return [Round(pre=(Copy(src, work),))]
    v, k, kids, levels = _tree(m, pos, root)
    peer = lambda u: group[(u + root) % m]  # noqa: E731 (relative rank -> rank)
    grid: list[tuple[list, list]] = [([], []) for _ in range(len(segs) + levels - 1)]
    for s, (a, b) in enumerate(segs):
        for i, j in enumerate(kids):
            # the first child adds to our own input; later ones to the partial sum
            acc = (src if i == 0 else work).sub(a, b)
            grid[s + j][1].append(Recv(peer(v + (1 << j)), work.sub(a, b), acc=acc))
        if v:
            grid[s + k][0].append(Send(peer(v - (1 << k)), (work if kids else src).sub(a, b)))
    return _rounds(grid)


def broadcast(group, pos: int, root: int, buf: Slice, segs) -> list[Round]:
    """Pipelined binomial broadcast of the root's ``buf`` into every member's ``buf``.

    The reduce reversed: S + L - 1 aligned rounds; segment s reaches rank v (step k) in
    round s + L-1-k and leaves for child j in round s + L-1-j, later since j < k.
    """
    m = len(group)
    if m == 1:
        return []
    v, k, kids, levels = _tree(m, pos, root)
    peer = lambda u: group[(u + root) % m]  # noqa: E731
    grid: list[tuple[list, list]] = [([], []) for _ in range(len(segs) + levels - 1)]
    for s, (a, b) in enumerate(segs):
        if v:
            grid[s + levels - 1 - k][1].append(Recv(peer(v - (1 << k)), buf.sub(a, b)))
        for j in reversed(kids):
            grid[s + levels - 1 - j][0].append(Send(peer(v + (1 << j)), buf.sub(a, b)))
    return _rounds(grid)


def scatter(group, pos: int, root: int, src: Slice, dst: Slice, ranges) -> list[Round]:
    """Binomial scatter: relative rank v ends with ``dst.sub(*ranges[v])``; L aligned rounds.

    ``ranges`` (relative to the slices) must be contiguous in relative order, so a whole
    subtree's blocks form one span and each edge carries one message. The root sends
    from ``src`` and does not fill its own block; empty spans are not sent.
    """
    m = len(group)
    if m == 1:
        return []
    v, k, kids, levels = _tree(m, pos, root)
    peer = lambda u: group[(u + root) % m]  # noqa: E731

    def span(lo: int, hi: int) -> tuple[int, int]:
        return ranges[lo][0], ranges[min(hi, m) - 1][1]

    grid: list[tuple[list, list]] = [([], []) for _ in range(levels)]
    if v:
        a, b = span(v, v + (1 << k))
        if b > a:
            grid[levels - 1 - k][1].append(Recv(peer(v - (1 << k)), dst.sub(a, b)))
    for j in kids:
        a, b = span(v + (1 << j), v + (2 << j))
        if b > a:
            grid[levels - 1 - j][0].append(Send(peer(v + (1 << j)), (src if v == 0 else dst).sub(a, b)))
    return _rounds(grid)


def overlay(first: list[Round], second: list[Round], offset: int) -> list[Round]:
    """Aligned rounds running ``second`` from round ``offset`` of ``first`` on, in the same rounds."""
    length = max(len(first), offset + len(second))
    out = []
    for t in range(length):
        parts = [r for r in (first[t] if t < len(first) else None,
                             second[t - offset] if 0 <= t - offset < len(second) else None) if r is not None]
        out.append(Round(sends=sum((r.sends for r in parts), ()), recvs=sum((r.recvs for r in parts), ()),
                         pre=sum((r.pre for r in parts), ()), post=sum((r.post for r in parts), ())))
    return out


def compact(rounds: list[Round]) -> list[Round]:
    """Drop rounds that neither communicate nor copy; FIFO matching per pair keeps the order."""
    return [r for r in rounds if r.communicates or r.pre or r.post]


# -- counted forms (engine/summary.py) ---------------------------------------------------------------------
def counted(topology, root: int, rounds, extra=lambda v: None, starts=None) -> RankClasses:
    """Every rank's summary of a tree over ``tree_order(topology, root)``: rank r's class is its step k, the tier of
    its parent (None at the root), its children's steps j with their tiers, ``extra(v)`` of its relative rank
    v and the round it starts in (``starts[v]``, or None where the form keeps the aligned grid),
    ``(k, parent, ((j, tier), ...), extra, start)``; ``rounds(key)`` gives a class's rounds as
    ``RankClasses.add`` takes them (``as_rounds`` or ``shifted``), so that every rank's round t stays round t
    of the others."""
    group, classes, node_of = tree_order(topology, root), RankClasses(topology), topology.node_of
    m, levels = len(group), ceil_log2(len(group))
    for v, r in enumerate(group):
        home = node_of[r]
        k = (v & -v).bit_length() - 1 if v else levels
        parent = (MATE if node_of[group[v - (1 << k)]] == home else AWAY) if v else None
        kids = tuple((j, MATE if node_of[group[v + (1 << j)]] == home else AWAY) for j in range(k) if v + (1 << j) < m)
        classes.add(r, (k, parent, kids, extra(v), None if starts is None else starts[v]), rounds)
    return classes


def broadcast_starts(m: int, segments: int) -> list[int]:
    """``starts[v]``: the round relative rank v of a pipelined broadcast (a scatter: one segment) of m ranks starts
    in, on the critical path of its compacted rounds (``compact``), each message taking one round.

    On a power of two, L-1-k: the aligned grid. A rank missing its children j >= jmax leaves their sends out of its
    first rounds, so where its receives end before its sends begin (fewer than k-jmax+1 segments) it sends that
    many rounds early, and its whole subtree starts as much earlier; each rank's rounds then follow one a round
    (every receive waits on a parent whose sends run one a round)."""
    levels = ceil_log2(m)
    starts, ahead = [0] * m, [0] * m         # ahead[v]: rounds v's sends run ahead of the aligned grid
    for v in range(1, m):                    # a parent v - 2^k comes before its children
        k = (v & -v).bit_length() - 1
        behind = ahead[v - (1 << k)]
        starts[v] = levels - 1 - k - behind
        jmax = min(k, (m - 1 - v).bit_length())   # children v + 2^j exist for j < jmax
        ahead[v] = behind + (max(0, k - jmax + 1 - segments) if jmax else 0)
    return starts


def scatter_starts(m: int, spans) -> list[int]:
    """``starts[v]``: the idle rounds before relative rank v's busy ones in a scatter of m ranks whose ``spans(v)``
    are ``(elements v receives, elements it sends each child j < k that exists)``, on the critical path of its
    compacted rounds, each message taking one round: a parent sends one child a round, the last child first, and
    leaves an empty span out, so a child's span arrives one round after those sent before it. A rank with nothing to
    receive has no rounds (its whole subtree's span is empty): 0. With no span empty, ``broadcast_starts(m, 1)``."""
    levels = ceil_log2(m)
    got, starts = [0] * m, [0] * m           # got[v]: the round v's span has arrived (the root: its own, at 0)
    for v in range(m):                       # a parent v - 2^k comes before its children
        received, sent = spans(v)
        if v and not received:
            continue
        k = (v & -v).bit_length() - 1 if v else levels
        at = got[v]
        for j, n in reversed(list(zip([j for j in range(k) if v + (1 << j) < m], sent))):
            if n:
                at += 1
                got[v + (1 << j)] = at
        starts[v] = got[v] - 1 if v else 0
    return starts


def shifted(grid, start: int, copied: int = 0) -> list:
    """Rounds ``[sends, recvs]`` of a grid as ``compact`` leaves them (empty ones dropped), after ``start`` idle
    rounds; ``copied`` in the first (the root's own copy, taking no round of its own)."""
    busy = [(tuple(a), tuple(b)) for a, b in grid if a or b] or ([((), ())] if copied else [])   # else a lone copy
    return [IDLE] * start + [(a, b, copied if t == 0 else 0) for t, (a, b) in enumerate(busy)]


def reduce_counts(key, sizes, levels: int) -> list[list[list]]:
    """``reduce`` as numbers: per aligned round ``[sends, recvs]`` of rank class ``key`` (see ``counted``), segment
    s of ``sizes`` elements coming from child j in round s + j, reduced, and going up in round s + k."""
    k, parent, kids = key[:3]
    grid: list[list[list]] = [[[], []] for _ in range(len(sizes) + levels - 1)]
    for s, n in enumerate(sizes):
        for j, tier in kids:
            grid[s + j][1].append((tier, n, True))
        if parent is not None:
            grid[s + k][0].append((parent, n))
    return grid


def broadcast_counts(key, sizes, levels: int) -> list[list[list]]:
    """``broadcast`` as numbers: segment s arrives in round s + L-1-k and leaves for child j in round s + L-1-j."""
    k, parent, kids = key[:3]
    grid: list[list[list]] = [[[], []] for _ in range(len(sizes) + levels - 1)]
    for s, n in enumerate(sizes):
        if parent is not None:
            grid[s + levels - 1 - k][1].append((parent, n, False))
        for j, tier in reversed(kids):
            grid[s + levels - 1 - j][0].append((tier, n))
    return grid


def as_rounds(grid, copied: int = 0) -> list[tuple | Shape]:
    """Aligned ``[sends, recvs]`` as ``RankClasses.add`` rounds, ``copied`` in the first (the root's own copy:
    it takes no time of its own, as a round that only copies; the root sends in round 0), idle where empty."""
    return [(tuple(a), tuple(b), copied if t == 0 else 0) if a or b else IDLE for t, (a, b) in enumerate(grid)]


def scatter_counts(key, levels: int) -> list[list[list]]:
    """``scatter`` as numbers, for a class whose ``extra`` is ``(elements received, elements sent to each child)``:
    the span arrives in round L-1-k and child j's part leaves in round L-1-j; an empty span is not sent."""
    k, parent, kids, (got, sent) = key[:4]
    grid: list[list[list]] = [[[], []] for _ in range(levels)]
    if parent is not None and got:
        grid[levels - 1 - k][1].append((parent, got, False))
    for (j, tier), n in zip(kids, sent):
        if n:
            grid[levels - 1 - j][0].append((tier, n))
    return grid

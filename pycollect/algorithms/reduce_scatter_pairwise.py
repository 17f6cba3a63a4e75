"""Pairwise reduce-scatter: N-1 rounds, round s trades blocks with ranks r+s and r-s.

Each rank sends every foreign block once, straight from ``in`` (no forwarding, unlike
the ring), so it sends (N-1)/N of the vector in N-1 rounds and the reduction order at
each rank is fixed by rank distance rather than by ring position.
"""
from __future__ import annotations

from collections import Counter

import numpy as np

from ..engine.layout import block_ranges
from ..engine.schedule import Copy, Problem, Recv, Round, Schedule, Send, Slice
from ..engine.summary import AWAY, MATE, Deferred, RankClasses, Shape, Summary
from ..engine.traffic import tallied


def schedule(p: Problem) -> Schedule:
    r, size = p.rank, p.size
    ranges = block_ranges(p.counts)  # in: block b is rank b's share of the vector
    mine = p.counts[r]
    out = Slice("out", 0, mine)
    if size == 1:
        return Schedule((Round(pre=(Copy(Slice("in", *ranges[r]), out),)),))
    # Partial sums live in tmp, not out: an in-place ``out`` is the head of ``in``, which
    # holds blocks still to be sent, so out is written once, after the last round.
    acc, rounds = Slice("in", *ranges[r]), []
    for s in range(1, size):
        to, frm = (r + s) % size, (r - s) % size
        # Both ends know both sizes from counts, so empty messages are skipped on both.
        sends = (Send(to, Slice("in", *ranges[to])),) if p.counts[to] else ()
        recvs = (Recv(frm, Slice("tmp", 0, mine), acc=acc),) if mine else ()
        rounds.append(Round(sends=sends, recvs=recvs))
        acc = Slice("tmp", 0, mine)  # from round 2 on, add to what has been gathered so far
    # Last round's post moves the result; a rank whose own block is empty copies nothing.
    rounds[-1] = Round(rounds[-1].sends, rounds[-1].recvs, post=(Copy(Slice("tmp", 0, mine), out),) if mine else ())
    return Schedule(tuple(rnd for rnd in rounds if rnd.communicates or rnd.post), tmp=mine)


def summaries(p: Problem):
    """Every rank's rounds counted without building them (engine/summary.py), for any counts: round s sends block
    r+s where it holds anything and receives the rank's own where that does, a round with neither dropped; the last
    round also copies the result out of tmp (``counted``). One rank: None (walked)."""
    if p.size == 1:
        return None
    return counted(p.topology, p.counts, True, lambda r: p.counts[r])


def counted(topo, counts, reduces: bool, last_copied) -> RankClasses:
    """Every rank's summary of N-1 pairwise rounds (``reduces``: whether a receive reduces), shared with the pairwise
    all-to-all: rank r's round s sends ``counts[r+s]`` elements to r+s and receives ``counts[r]`` from r-s, either
    left out where empty and the round dropped where both are; the last round (s = N-1) copies ``last_copied(r)``.

    A round's cost depends only on the sizes it sends and receives and whether each of its two peers is on this
    rank's node, so rank r's rounds are counted by kind, not in order: a base shared by every rank whose own block
    is as large (a round to every block, both peers off its node), less the blocks it never sends in a middle round
    (its own, r-1's: the last round) and with the tiers of the rounds that its node-mates name (``_near``), then
    the last round: O(ranks a node) a rank. Every block its own size, the bases hold (distinct sizes)^2 rounds in
    all, so they and the classes' rounds are built only where they are read (the cost model, the simulator); the
    traffic counts them in closed form (``Deferred``): O(N x ranks a node) in all.
    """
    size, classes = topo.size, RankClasses(topo)
    tier = MATE if topo.num_nodes == 1 else AWAY      # a middle round's peers, unless a node-mate's offset names it
    every = tuple(sorted(Counter(counts).items()))    # (elements, blocks): a base's rounds, one kind a size
    made: dict = {}                                   # one Shape for equal rounds of all classes
    bases: dict = {}                                  # own block's elements -> its base

    def shape(*args) -> Shape:
        hit = made.get(args)
        if hit is None:
            hit = made[args] = _shape(*args)
        return hit

    def base(got: int) -> Deferred:
        hit = bases.get(got)
        if hit is None:
            hit = bases[got] = Deferred(lambda: tuple((k, shape(tier, n, tier, got, reduces)) for n, k in every
                                                      if n or got), lambda itemsize, start: None,
                                        lambda start: None)
        return hit

    def ends(r: int) -> tuple:
        """Rank r's last round: the tiers of r-1 and r+1, the block it sends, what it copies."""
        return classes.where(r, (r - 1) % size), classes.where(r, (r + 1) % size), counts[r - 1], copied[r]

    def own(r: int) -> Summary:
        """Rank r's rounds against its base (``_near``), then its last round."""
        got, (to, frm, sent, moved) = counts[r], ends(r)
        out = [(k, shape(send, n, recv, got, reduces)) for (send, recv, n), k in _near(topo, counts, r, tier)
               if n or got]
        last = shape(to, sent, frm, got, reduces, moved)
        return tuple(out + [(1, last)]) if last.communicates or moved else tuple(out)

    def build(r: int) -> tuple:
        """The class of rank r (its first): its rounds, counted as r's row of the closed form (its base not read)."""
        rounds = int(tallies[r][6])
        counted = Deferred(lambda: own(r), lambda itemsize, start: tallied(tallies[r], itemsize),
                           lambda start: (rounds, rounds))   # every round of the class moves something
        return base(counts[r]), counted
    copied = [last_copied(r) for r in range(size)]
    tallies, rows = _tallies(topo, counts, copied), _signatures(topo, counts, copied)
    for r in range(size):
        key = rows[r] if rows is not None else (counts[r], _near(topo, counts, r, tier), ends(r))
        classes.add_based(r, key, lambda key, r=r: build(r))
    return classes


def _shape(to: int, sent: int, frm: int, got: int, reduces: bool, copied: int = 0) -> Shape:
    """One pairwise round, a message left out where it would be empty (as ``schedule`` leaves it)."""
    return Shape(((to, sent),) if sent else (), ((frm, got, reduces),) if got else (), copied)


def _near(topo, counts, r: int, tier: int) -> tuple:
    """Rank r's rounds against its base, counted: ``(((to tier, from tier, elements sent), rounds), ...)``, a
    negative count taking back the base's: its own block and r-1's (sent in the last round) taken back, and each
    middle round s whose send or receive a node-mate's offset names moved from the base's tiers to its own."""
    size = topo.size
    out = {(tier, tier, counts[r]): -1}
    kind = (tier, tier, counts[r - 1])
    out[kind] = out.get(kind, 0) - 1
    if topo.num_nodes > 1:
        group = topo.nodes[topo.node_of[r]]
        near_send = {(m - r) % size for m in group if m != r} - {size - 1}   # rounds s whose send stays home
        near_recv = {(r - m) % size for m in group if m != r} - {size - 1}
        for s in near_send | near_recv:
            n = counts[(r + s) % size]
            out[(AWAY, AWAY, n)] = out.get((AWAY, AWAY, n), 0) - 1
            kind = (MATE if s in near_send else AWAY, MATE if s in near_recv else AWAY, n)
            out[kind] = out.get(kind, 0) + 1
    return tuple(sorted((kind, k) for kind, k in out.items() if k))


def _signatures(topo, counts, copied) -> list | None:
    """Each rank's class as a row of numbers, for all ranks at once (NumPy), where every node's ranks are one run
    (None elsewhere: ``_near`` a rank): its block, r-1's, the tiers of r-1 and r+1, what it copies, and for each
    offset d within a node's length whether r+d (1) and r-d (2) are its node-mates, with the block r+d then. Equal
    rows, equal rounds (``_near`` reads nothing else), so ``_near`` runs once a class."""
    node, size = np.asarray(topo.node_of), topo.size
    if topo.num_nodes == 1 or np.any(np.diff(node) < 0):
        return None
    c, r = np.asarray(counts, dtype=np.int64), np.arange(size)
    first = np.searchsorted(node, node)                                # (N,) the first rank of each rank's node
    end = np.searchsorted(node, node, side="right")                   # (N,) one past its last
    span = max(topo.node_sizes)
    d = np.arange(1 - span, span)                                     # (2L-1,) offsets to a node-mate
    ahead, behind = r[:, None] + d, r[:, None] - d                    # (N, 2L-1)
    code = (((ahead >= first[:, None]) & (ahead < end[:, None])) * 1
            + ((behind >= first[:, None]) & (behind < end[:, None])) * 2) * (d != 0)
    near = np.where(code > 0, c[ahead % size], 0)                     # (N, 2L-1) the blocks such rounds send
    ends = np.stack([c, np.roll(c, 1), node[r - 1] == node, node[(r + 1) % size] == node, copied], axis=1)
    return list(map(tuple, np.hstack([ends, code, near]).tolist()))


def _tallies(topo, counts, copied) -> np.ndarray:
    """``(N, 8)``: each rank's traffic in elements, in closed form, as ``engine.traffic.tallied`` reads it: ``(sent,
    messages sent, sent on its node, messages on its node, received, messages received, rounds, copied)``. Rank r
    sends every block but its own once (to the block's rank: on its node for its node-mates' blocks) and receives
    its own block from each of the N-1 others; a round moves something unless both blocks are empty. O(N)."""
    c = np.asarray(counts, dtype=np.int64)                            # (N,) every block
    node, size = np.asarray(topo.node_of), len(c)
    full = (c > 0).astype(np.int64)
    on_node, full_on_node = np.zeros((2, topo.num_nodes), dtype=np.int64)
    np.add.at(on_node, node, c)                                       # (nodes,) elements of each node's blocks
    np.add.at(full_on_node, node, full)
    on_node, full_on_node = on_node[node], full_on_node[node]         # (N,) those of each rank's node
    rounds = np.where(full > 0, size - 1, int(full.sum()))
    return np.stack([c.sum() - c, full.sum() - full, on_node - c, full_on_node - full, (size - 1) * c,
                     (size - 1) * full, rounds, np.asarray(copied, dtype=np.int64)], axis=1)


def in_step(p: Problem) -> bool:
    """Whether the counted form keeps every rank's round t with its peers' round t (the cluster simulator's
    lockstep): on equal non-empty blocks. Elsewhere a rank drops its empty rounds and the form counts rounds by
    kind, not in their order (registry.counted_summaries)."""
    return len(set(p.counts)) == 1 and p.counts[0] > 0

"""Pairwise reduce-scatter: N-1 rounds, round s trades blocks with ranks r+s and r-s.

Each rank sends every foreign block once, straight from ``in`` (no forwarding, unlike
the ring), so it sends (N-1)/N of the vector in N-1 rounds and the reduction order at
each rank is fixed by rank distance rather than by ring position.
"""
from __future__ import annotations

from collections import Counter

from ..engine.layout import block_ranges
from ..engine.schedule import Copy, Problem, Recv, Round, Schedule, Send, Slice
from ..engine.summary import AWAY, MATE, RankClasses, Shape


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

    A round's cost depends only on the size it sends and whether each of its two peers is on this rank's node: the
    rounds but the last are counted by ``(send tier, receive tier, elements sent)``, all of them of other nodes but
    those that the offsets of the rank's node-mates name (O(ranks a node + distinct counts) a rank); a rank's class is
    how many rounds of each kind it runs, with its last round (``RankClasses``).
    """
    size, classes = topo.size, RankClasses(topo)
    every = Counter(counts)       # elements sent in rounds 1..N-2: every block but r's own (s = 0) and r-1's (s = N-1)
    made: dict = {}               # one Shape for equal rounds of all classes

    def shape(*args) -> Shape:
        hit = made.get(args)
        if hit is None:
            hit = made[args] = _shape(*args)
        return hit

    def rounds(key) -> list:
        kinds, mine, (to, frm, sent, copied) = key
        out = [(k, shape(send, sent_k, recv, mine, reduces)) for (send, recv, sent_k), k in kinds]
        last = shape(to, sent, frm, mine, reduces, copied)
        return [(k, shape) for k, shape in out if shape.communicates] + ([(1, last)] if last.communicates or copied else [])
    for r in range(size):
        kinds = _kinds(topo, counts, every, r)
        last = (classes.where(r, (r - 1) % size), classes.where(r, (r + 1) % size), counts[r - 1], last_copied(r))
        classes.add(r, (kinds, counts[r], last), rounds, counted=True)
    return classes


def _shape(to: int, sent: int, frm: int, got: int, reduces: bool, copied: int = 0) -> Shape:
    """One pairwise round, a message left out where it would be empty (as ``schedule`` leaves it)."""
    return Shape(((to, sent),) if sent else (), ((frm, got, reduces),) if got else (), copied)


def _kinds(topo, counts, every: Counter, r: int) -> tuple:
    """Rank r's rounds but the last, counted: ``(((to tier, from tier, elements sent), rounds), ...)``."""
    size = topo.size
    left = dict(every)            # a dict, not a Counter: this runs once a rank
    left[counts[r]] -= 1
    left[counts[r - 1]] -= 1
    if topo.num_nodes == 1:   # every peer on this node
        return tuple(((MATE, MATE, n), k) for n, k in sorted(left.items()) if k)
    group = topo.nodes[topo.node_of[r]]
    near_send = {(m - r) % size for m in group if m != r} - {size - 1}   # rounds s whose send stays home
    near_recv = {(r - m) % size for m in group if m != r} - {size - 1}
    kinds = {(AWAY, AWAY, n): k for n, k in left.items()}
    for s in near_send | near_recv:
        n = counts[(r + s) % size]
        kinds[(AWAY, AWAY, n)] -= 1
        kind = (MATE if s in near_send else AWAY, MATE if s in near_recv else AWAY, n)
        kinds[kind] = kinds.get(kind, 0) + 1
    return tuple(sorted((kind, k) for kind, k in kinds.items() if k))


def in_step(p: Problem) -> bool:
    """Whether the counted form keeps every rank's round t with its peers' round t (the cluster simulator's
    lockstep): on equal non-empty blocks. Elsewhere a rank drops its empty rounds and the form counts rounds by
    kind, not in their order (registry.counted_summaries)."""
    return len(set(p.counts)) == 1 and p.counts[0] > 0

"""Pairwise reduce-scatter: N-1 rounds, round s trades blocks with ranks r+s and r-s.

Each rank sends every foreign block once, straight from ``in`` (no forwarding, unlike
the ring), so it sends (N-1)/N of the vector in N-1 rounds and the reduction order at
each rank is fixed by rank distance rather than by ring position.
"""
from __future__ import annotations

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
    """Every rank's rounds counted without building them (engine/summary.py), for equal non-empty blocks: the last
    round also copies the result out of tmp (``counted``). Anything else: None (walked)."""
    size, counts = p.size, p.counts
    if size == 1 or len(set(counts)) != 1 or not counts[0]:
        return None
    return counted(p.topology, counts[0], True, counts[0])


def counted(topo, c: int, reduces: bool, last_copied: int) -> RankClasses:
    """Every rank's summary of N-1 pairwise rounds of ``c`` elements each way (``reduces``: whether a receive
    reduces), the last copying ``last_copied`` elements; shared with the pairwise all-to-all.

    Round s sends to r+s and receives from r-s, so a round's cost depends only on whether each of the two
    is on this rank's node: the rounds are counted by those two tiers, from the offsets of the rank's
    node-mates (O(ranks a node) a rank): a rank's class is how many rounds of each kind it runs and the tiers of
    its last round's peers (``RankClasses``).
    """
    size, classes = topo.size, RankClasses(topo)

    def rounds(key) -> list:
        kinds, (to, frm) = key
        return [*((k, Shape(((send, c),), ((recv, c, reduces),))) for (send, recv), k in kinds),
                (1, Shape(((to, c),), ((frm, c, reduces),), copied=last_copied))]
    for r in range(size):
        if topo.num_nodes == 1:   # every peer on this node: the same two kinds of round for every rank
            kinds: tuple = (((MATE, MATE), size - 2),) if size > 2 else ()
        else:
            kinds = _kinds(topo, r)
        last = (classes.where(r, (r - 1) % size), classes.where(r, (r + 1) % size))   # round N-1's peers
        classes.add(r, (kinds, last), rounds, counted=True)
    return classes


def _kinds(topo, r: int) -> tuple:
    """Rank r's rounds but the last, counted by the tiers of their two peers: ``(((to, from), rounds), ...)``."""
    size, group = topo.size, topo.nodes[topo.node_of[r]]
    near_send = {(m - r) % size for m in group if m != r} - {size - 1}   # rounds s whose send stays home
    near_recv = {(r - m) % size for m in group if m != r} - {size - 1}
    both = len(near_send & near_recv)
    kinds = {(MATE, MATE): both, (MATE, AWAY): len(near_send) - both, (AWAY, MATE): len(near_recv) - both}
    kinds[(AWAY, AWAY)] = size - 2 - sum(kinds.values())
    return tuple((tiers, k) for tiers, k in kinds.items() if k)

"""Bruck allgather: ceil(log2 N) rounds for any N, each rank sends (N-1)/N of the result.

Latency-optimal where recursive doubling needs a power of two. Blocks are kept in tmp in
rotated order (position i holds rank r+i's block), so what a rank sends is always its
first m positions and what it receives always lands right after what it already has.
"""
from __future__ import annotations

from ..engine.layout import offsets
from ..engine.schedule import Copy, Problem, Recv, Round, Schedule, Send, Slice
from ..engine.summary import AWAY, MATE, RankClasses


def schedule(p: Problem) -> Schedule:
    r, size = p.rank, p.size
    offs = offsets(p.counts)  # (N+1,) out: rank b's block is [offs[b], offs[b+1])
    own_in = Slice("in", 0, p.counts[r])
    if size == 1:
        return Schedule((Round(pre=(Copy(own_in, Slice("out", offs[r], offs[r + 1])),)),))
    rot = _Rotated(offs, r)  # tmp: position i = rank r+i; rot[k] = elements of positions [0, k)
    # ``in`` is read once, into tmp, before out is touched, so in-place calls are safe.
    pre: tuple[Copy, ...] = (Copy(own_in, Slice("tmp", 0, rot[1])),)
    rounds, d = [], 1
    while d < size:
        m = min(d, size - d)  # positions held by both ends: d, unless that would pass N
        # My positions [0, m) are positions [d, d+m) of rank r-d; rank r+d's [0, m) are mine.
        send = Slice("tmp", 0, rot[m])
        recv = Slice("tmp", rot[d], rot[d + m])  # disjoint from send since m <= d
        rounds.append(Round(sends=(Send((r - d) % size, send),) if send.n else (),
                            recvs=(Recv((r + d) % size, recv),) if recv.n else (), pre=pre))
        pre, d = (), 2 * d
    # Undo the rotation: positions [0, N-r) are ranks r..N-1, the rest ranks 0..r-1.
    head, split = offs[r], rot[size - r]
    post = (Copy(Slice("tmp", 0, split), Slice("out", head, rot[size])),
            Copy(Slice("tmp", split, rot[size]), Slice("out", 0, head)))
    last = rounds[-1]
    rounds[-1] = Round(last.sends, last.recvs, last.pre, post)
    return Schedule(tuple(x for x in rounds if x.communicates or x.pre or x.post), tmp=rot[size])


class _Rotated:
    """``rot[k]``: elements in the first k blocks of the order r, r+1, ..., r-1, from the unrotated offsets
    (O(1) each: a rank asks for log N of them, not all N)."""

    def __init__(self, offs, r: int):
        self.offs, self.r, self.size = offs, r, len(offs) - 1

    def __getitem__(self, k: int) -> int:
        offs, r, size = self.offs, self.r, self.size
        if r + k <= size:
            return offs[r + k] - offs[r]
        return offs[size] - offs[r] + offs[r + k - size]


def summaries(p: Problem):
    """Every rank's rounds counted without building them (engine/summary.py): round d sends the first min(d, N-d)
    rotated blocks to r-d and receives as many after them from r+d; the first round copies the rank's block in,
    the last the whole result out. A rank's class: the tiers of its peers and the sizes (those of rank 0 for
    every rank on equal blocks). One rank, and a round with no message on some rank: None (walked; a round with
    nothing to move is dropped, or takes no round, so such a rank falls out of step with the others, which the
    forms' users assume it is not: ``counts`` counts it)."""
    return _form(p, in_step=True)


def counts(p: Problem):
    """``summaries`` with empty blocks too, for what reads a rank's rounds but not the round it finishes in (the
    traffic, the cost model's time): an empty message is left out and a round with neither message nor copy
    dropped, as ``schedule`` does."""
    return _form(p, in_step=False)


def _form(p: Problem, in_step: bool):
    size, counts = p.size, p.counts
    if size == 1 or len(counts) != size:
        return None
    offs, classes = offsets(counts), RankClasses(p.topology)
    dists = [1 << k for k in range((size - 1).bit_length())]
    even = len(set(counts)) == 1
    shared = _sizes(offs, 0, dists)
    node_of = p.topology.node_of
    for r in range(size):
        sizes = shared if even else _sizes(offs, r, dists)
        if in_step and not all(sent or got for sent, got in sizes[0]):
            return None
        home = node_of[r]   # classes.where of both peers, inline: N log N of them
        key = (tuple((MATE if node_of[(r - d) % size] == home else AWAY, MATE if node_of[(r + d) % size] == home
                      else AWAY) for d in dists), sizes, counts[r])
        classes.add(r, key, _rounds)
    return classes


def _sizes(offs, r: int, dists) -> tuple:
    """Per round: (elements sent, elements received), and the elements of the whole result."""
    rot, size = _Rotated(offs, r), len(offs) - 1
    return tuple((rot[min(d, size - d)], rot[d + min(d, size - d)] - rot[d]) for d in dists), rot[size]


def _rounds(key) -> list:
    tiers, (sizes, whole), own = key
    rounds = []   # an empty message is left out, a middle round with nothing to move dropped (the first and last copy)
    for i, ((to, frm), (sent, got)) in enumerate(zip(tiers, sizes)):
        first, last = i == 0, i == len(sizes) - 1
        copied = (own if first else 0) + (whole if last else 0)
        if sent or got or first or last:
            rounds.append((((to, sent),) if sent else (), ((frm, got, False),) if got else (), copied))
    return rounds

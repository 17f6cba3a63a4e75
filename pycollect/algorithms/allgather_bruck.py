"""Bruck allgather: ceil(log2 N) rounds for any N, each rank sends (N-1)/N of the result.

Latency-optimal where recursive doubling needs a power of two. Blocks are kept in tmp in
rotated order (position i holds rank r+i's block), so what a rank sends is always its
first m positions and what it receives always lands right after what it already has.
"""
from __future__ import annotations

import numpy as np

from ..engine.layout import offsets
from ..engine.schedule import Copy, Problem, Recv, Round, Schedule, Send, Slice
from ..engine.summary import AWAY, IDLE, MATE, Deferred, RankClasses, Shape, Summary, waits
from ..engine.traffic import tallied


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
    the last the whole result out. An empty message is left out and a middle round with nothing to move dropped,
    as ``schedule`` does: that rank runs ahead until a receive waits for its sender, the rounds it waits counted
    IDLE before it (``summary.waits``), so that it finishes where its compacted rounds do. A rank's class: the
    tiers of its peers, its sizes and waits each round, its block. Sizes for all ranks at once (NumPy, O(N log N)),
    and the traffic from them (``_tallies``); a class's rounds are built where they are read (``Deferred``: the
    cost model, the simulator), as every block its own size makes a class of every rank. One rank: None."""
    size, counts = p.size, p.counts
    if size == 1 or len(counts) != size:
        return None
    dists = [1 << k for k in range((size - 1).bit_length())]
    offs, ranks = np.asarray(offsets(counts), dtype=np.int64), np.arange(size)
    sent = np.array([_rotated(offs, min(d, size - d)) for d in dists])                       # (L, N)
    got = np.array([_rotated(offs, d + min(d, size - d)) - _rotated(offs, d) for d in dists])  # (L, N)
    idle = waits(sent, got, [(ranks + d) % size for d in dists])
    node = np.asarray(p.topology.node_of)
    to = [np.where(node[(ranks - d) % size] == node, MATE, AWAY) for d in dists]
    frm = [np.where(node[(ranks + d) % size] == node, MATE, AWAY) for d in dists]
    rows = np.vstack([to, frm, sent, got, idle, [counts]]).T.tolist()    # (N, 5L+1): each rank's class key
    classes, whole = RankClasses(p.topology), int(offs[-1])
    tallies = _tallies(np.array(to), sent, got, np.asarray(counts) + whole)
    ends = _finishes(sent, got, idle)

    made: dict = {}   # one Shape for equal rounds of all classes, so that equal neighbours are one object

    def rounds(key) -> Summary:
        """Per round: the rounds waited, then its messages (an empty one left out) and copies, as ``schedule``
        keeps them (a middle round with nothing to move dropped; the first and last copy); equal neighbours
        counted once, as ``compress`` does."""
        levels = len(dists)
        out: list[list] = []

        def put(k: int, shape: Shape) -> None:
            if out and out[-1][1] is shape:
                out[-1][0] += k
            else:
                out.append([k, shape])
        columns = [key[j * levels:(j + 1) * levels] for j in range(5)]   # to, frm, sent, got, wait: one a round
        for i, (to, frm, sent, got, wait) in enumerate(zip(*columns)):
            first, last = i == 0, i == levels - 1
            if wait:
                put(wait, IDLE)
            if sent or got or first or last:
                args = (to, sent, frm, got, (key[-1] if first else 0) + (whole if last else 0))
                put(1, made.get(args) or made.setdefault(args, _shape(*args)))
        return tuple((k, shape) for k, shape in out)

    def deferred(key, r: int) -> Deferred:
        """Class ``key``, its first rank r: its rounds built when read, counted as r's row of the closed form."""
        return Deferred(lambda: rounds(key), lambda itemsize, start: tallied(tallies[r], itemsize),
                        lambda start: (int(ends[r]), int(ends[r])))
    for r, row in enumerate(rows):   # every block its own size: a class a rank
        classes.add_deferred(r, tuple(row), lambda key, r=r: deferred(key, r))
    return classes


def _shape(to: int, sent: int, frm: int, got: int, copied: int) -> Shape:
    """One round, an empty message left out (as ``schedule`` leaves it); every send from tmp, which the call wrote."""
    return Shape(((to, sent),) if sent else (), ((frm, got, False),) if got else (), copied, written=sent)


def _finishes(sent: np.ndarray, got: np.ndarray, idle: np.ndarray) -> np.ndarray:
    """``(N,)``: the round each rank finishes in (``summary.finish`` of its rounds) from its rounds' ``(L, N)`` sizes
    and waits: each round's waits and, where it moves something, the round itself, up to the last that does."""
    moves = (sent > 0) | (got > 0)
    at = np.cumsum(idle + moves, axis=0)                              # (L, N) rounds so far, each round's end
    last = len(moves) - 1 - np.argmax(moves[::-1], axis=0)            # (N,) the last round that moves something
    return np.where(moves.any(0), at[last, np.arange(moves.shape[1])], 0)


def _tallies(to: np.ndarray, sent: np.ndarray, got: np.ndarray, copied: np.ndarray) -> np.ndarray:
    """``(N, 8)``: each rank's traffic in elements from its rounds' ``(L, N)`` peers' tiers (``to``) and sizes, as
    ``engine.traffic.tallied`` reads it; a round moves something where it sends or receives (``copied``: ``(N,)``).
    O(N log N)."""
    near = to == MATE
    return np.stack([sent.sum(0), (sent > 0).sum(0), (sent * near).sum(0), ((sent > 0) & near).sum(0), got.sum(0),
                     (got > 0).sum(0), ((sent > 0) | (got > 0)).sum(0), copied], axis=1)


def _rotated(offs: np.ndarray, k: int) -> np.ndarray:
    """``_Rotated(offs, r)[k]`` for every rank r at once: elements of blocks r, ..., r+k-1 (mod N)."""
    size = len(offs) - 1
    ranks = np.arange(size)
    ahead = ranks + k
    return np.where(ahead <= size, offs[np.minimum(ahead, size)] - offs[ranks],
                    offs[size] - offs[ranks] + offs[np.maximum(ahead - size, 0)])


def in_step(p: Problem) -> bool:
    """Whether the counted form keeps every rank's round t with its peers' round t (the cluster simulator's
    lockstep): no block empty, so that no rank has a round with nothing to move (registry.counted_summaries)."""
    return all(p.counts)

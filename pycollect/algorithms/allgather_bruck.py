"""Bruck allgather: ceil(log2 N) rounds for any N, each rank sends (N-1)/N of the result.

Latency-optimal where recursive doubling needs a power of two. Blocks are kept in tmp in
rotated order (position i holds rank r+i's block), so what a rank sends is always its
first m positions and what it receives always lands right after what it already has.
"""
from __future__ import annotations

from ..engine.layout import offsets
from ..engine.schedule import Copy, Problem, Recv, Round, Schedule, Send, Slice


def schedule(p: Problem) -> Schedule:
    r, size = p.rank, p.size
    offs = offsets(p.counts)  # (N+1,) out: rank b's block is [offs[b], offs[b+1])
    own_in = Slice("in", 0, p.counts[r])
    if size == 1:
        return Schedule((Round(pre=(Copy(own_in, Slice("out", offs[r], offs[r + 1])),)),))
    rot = _Rotated(offs, r)  # tmp: position i = rank r+i; rot[k] = elements of positions [0, k)
    # ``in`` is read once, into tmp, before out is touched, so in-place calls are safe.
    pre, rounds, d = (Copy(own_in, Slice("tmp", 0, rot[1])),), [], 1
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

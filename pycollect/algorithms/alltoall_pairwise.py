"""Pairwise all-to-all: N-1 rounds, round s sends to r+s and receives from r-s.

One message per peer, nothing forwarded: each rank sends exactly its foreign blocks,
the bandwidth-optimal choice for large blocks, at N-1 latencies.

``in`` and ``out`` may be one buffer with different layouts (row vs column sums), and no
order of pairwise rounds reads every ``in`` block before the ``out`` block over it is
written. So a received block goes straight to ``out`` unless it overlaps (if the buffers
were one) an ``in`` range still to be read; such blocks wait in tmp until the end. When the
caller says the buffers are apart (``Problem.aliased`` false) every block goes straight to ``out``.
"""
from __future__ import annotations

import bisect

import numpy as np

from ..engine.schedule import Copy, Problem, Recv, Round, Schedule, Send, Slice
from . import _alltoall, reduce_scatter_pairwise


class _Still:
    """The ``in`` ranges still to be read, as sorted disjoint [lo, hi) spans: ranges join it in reverse round
    order, and ``overlaps`` asks of one ``out`` range in O(log N) (a test against every later range made each
    rank's schedule O(N^2): 26 s for one rank at 16384)."""

    def __init__(self):
        self.starts: list[int] = []
        self.ends: list[int] = []

    def add(self, span: tuple[int, int]) -> None:
        lo, hi = span
        if lo >= hi:
            return   # an empty block is read from nowhere
        i = bisect.bisect_left(self.ends, lo)        # the first span that ends at or after lo
        j = bisect.bisect_right(self.starts, hi)     # past the last span that starts at or before hi
        if i < j:                                    # spans i..j-1 touch [lo, hi): merged into one
            lo, hi = min(lo, self.starts[i]), max(hi, self.ends[j - 1])
        self.starts[i:j], self.ends[i:j] = [lo], [hi]

    def overlaps(self, span: tuple[int, int]) -> bool:
        lo, hi = span
        if lo >= hi:
            return False
        i = bisect.bisect_right(self.ends, lo)       # the first span that ends after lo
        return i < len(self.starts) and self.starts[i] < hi


def schedule(p: Problem) -> Schedule:
    r, size = p.rank, p.size
    send, recv, own = _alltoall.layout(p)
    if size == 1:
        return Schedule((Round(pre=(own,)),))
    # Own block is copied last, so in[own] counts as read after every round: index size.
    read_at = [send[(r + t) % size] for t in range(size + 1)]  # in range read in round t
    # Round s itself counts: its sends read in while its receive writes out. still[s]: what rounds s.. read.
    still_read = _staged_rounds(read_at, recv, r, size) if p.aliased else set()
    rounds, late, tmp = [], [own], 0
    for s in range(1, size):
        to, frm = (r + s) % size, (r - s) % size
        sends = (Send(to, Slice("in", *send[to])),) if p.matrix[r][to] else ()
        dst, n = Slice("out", *recv[frm]), p.matrix[frm][r]
        if s in still_read:
            dst, tmp = Slice("tmp", tmp, tmp + n), tmp + n
            late.append(Copy(dst, Slice("out", *recv[frm])))
        rounds.append(Round(sends=sends, recvs=(Recv(frm, dst),) if n else ()))
    rounds = [x for x in rounds if x.communicates]
    # The own copy goes first: it reads in[own], which the staged copies may overwrite.
    if rounds:
        rounds[-1] = Round(rounds[-1].sends, rounds[-1].recvs, post=tuple(late))
    else:
        rounds = [Round(pre=tuple(late))]
    return Schedule(tuple(rounds), tmp=tmp)


def _staged_rounds(read_at: list, recv: list, r: int, size: int) -> set[int]:
    """The rounds s whose received block overlaps an ``in`` range read in round s or later (staged in tmp)."""
    still, staged = _Still(), set()
    still.add(read_at[size])
    for s in range(size - 1, 0, -1):
        still.add(read_at[s])
        if still.overlaps(recv[(r - s) % size]):
            staged.add(s)
    return staged


def summaries(p: Problem):
    """Every rank's rounds counted without building them (engine/summary.py), where every rank sends the same
    counts (``matrix[i][j] = c[j]``, as ``shapes.even_problem`` builds it): round s sends c[r+s] to r+s and receives
    c[r] from r-s (``reduce_scatter_pairwise.counted``). In place, a received block that lands on an input block
    still to be sent waits in tmp (``staged``); the last round copies those out, with the rank's own block.
    Anything else: None (walked)."""
    size, matrix = p.size, p.matrix
    if size == 1 or len(matrix) != size or not _alltoall.same_rows(matrix):
        return None
    c = matrix[0]
    waits = staged(c) if p.aliased else [0] * size
    return reduce_scatter_pairwise.counted(p.topology, c, False, lambda r: c[r] * (1 + waits[r]))


def staged(c) -> list[int]:
    """``waits[r]``: the blocks rank r stages in tmp in place, every rank sending ``c[j]`` to rank j.

    Round s writes r-s's block to out ``[(r-s) c[r], (r-s+1) c[r])`` while the input blocks of r+s, ..., r-1 and r
    (its own, copied last) are still to be read: a cyclic run of destinations whose non-empty blocks tile one or two
    spans of ``in``. Over each stretch of s where neither wraps, the out block falls as s grows while the span's
    start rises, so the rounds that overlap a span are one interval of s; its ends are found for every rank at once
    (a bisection over the ranks' offsets): O(N log N) for all ranks, not the walk's O(N^2)."""
    size = len(c)
    cr = np.asarray(c, dtype=np.int64)                       # (N,) what each rank receives from every peer
    offs = np.concatenate(([0], np.cumsum(cr)))              # (N+1,) input offsets, the same on every rank
    r = np.arange(size)
    whole, upto = offs[size], offs[r + 1]                    # in: the total, the end of blocks 0..r
    waits = np.zeros(size, dtype=np.int64)
    for lo, hi, base, wraps in ((1, np.minimum(r, size - 1 - r), r, True), (r + 1, size - 1 - r, size + r, True),
                                (size - r, r, r, False), (np.maximum(r + 1, size - r), size - 1, size + r, False)):
        lo, hi = np.broadcast_to(lo, (size,)), np.broadcast_to(hi, (size,))
        if wraps:   # destinations r+s..N-1 then 0..r: spans [offs[r+s], whole) and [0, upto)
            tail = _rounds_over(cr, offs, lo, hi, base, 0, whole)
            head = _rounds_over(cr, offs, lo, hi, base, 0, upto, start_is_zero=True)
            both = np.maximum(0, np.minimum(tail[1], head[1]) - np.maximum(tail[0], head[0]) + 1)
            waits += _width(tail) + _width(head) - both
        else:       # destinations r+s-N..r: the span [offs[r+s-N], upto)
            waits += _width(_rounds_over(cr, offs, lo, hi, base, -size, upto))
    return [int(w) if c[i] else 0 for i, w in enumerate(waits)]


def _width(interval) -> np.ndarray:
    first, last = interval
    return np.maximum(0, last - first + 1)


def _rounds_over(cr, offs, lo, hi, base, shift, end, start_is_zero: bool = False):
    """``(first, last)`` s in ``[lo, hi]`` of every rank r whose out block ``[(base-s) c[r], (base-s+1) c[r])``
    overlaps the span ``[offs[r+s+shift], end)`` (``start_is_zero``: the span ``[0, end)``): the block's start below
    ``end`` (true from some s on, the block falling), the span's start below the block's end and ``end`` (true up to
    some s, the span rising)."""
    size = len(cr)
    r, c = np.arange(size), np.maximum(cr, 1)                # a rank that receives nothing stages nothing (above)
    first = np.maximum(lo, base - (end + c - 1) // c + 1)    # (base - s) c < end
    if start_is_zero:
        return first, np.where(end > 0, hi, lo - 1)
    low, high = lo - 1, hi + 1                                # the last s with the span's start below both ends

    def starts_below(s):
        at = offs[np.clip(r + s + shift, 0, size)]
        return (at < (base - s + 1) * c) & (at < end)
    while np.any(high - low > 1):
        mid = (low + high) // 2
        ok = starts_below(mid)
        busy = high - low > 1
        low, high = np.where(busy & ok, mid, low), np.where(busy & ~ok, mid, high)
    return first, low


def in_step(p: Problem) -> bool:
    """As ``reduce_scatter_pairwise.in_step``: on equal non-empty blocks (registry.counted_summaries)."""
    return _alltoall.even(p.matrix)

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

from ..engine.schedule import Copy, Problem, Recv, Round, Schedule, Send, Slice
from . import _alltoall, reduce_scatter_pairwise


def _overlaps(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[1] and b[0] < a[1] and a[0] < a[1] and b[0] < b[1]


def schedule(p: Problem) -> Schedule:
    r, size = p.rank, p.size
    send, recv, own = _alltoall.layout(p)
    if size == 1:
        return Schedule((Round(pre=(own,)),))
    # Own block is copied last, so in[own] counts as read after every round: index size.
    read_at = [send[(r + t) % size] for t in range(size + 1)]  # in range read in round t
    rounds, late, tmp = [], [own], 0
    for s in range(1, size):
        to, frm = (r + s) % size, (r - s) % size
        sends = (Send(to, Slice("in", *send[to])),) if p.matrix[r][to] else ()
        dst, n = Slice("out", *recv[frm]), p.matrix[frm][r]
        # Round s itself counts: its sends read in while its receive writes out.
        if p.aliased and any(_overlaps(recv[frm], later) for later in read_at[s:]):
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


def summaries(p: Problem):
    """Every rank's rounds counted without building them (engine/summary.py), for equal non-empty blocks: N-1
    rounds of one block each way (``reduce_scatter_pairwise.counted``). In place, the block received in round
    s lands on the input block sent in round N-s, so for s <= N/2 it waits in tmp; the last round copies those
    out, with the rank's own block. Anything else: None (walked)."""
    size, matrix = p.size, p.matrix
    if size == 1 or len(matrix) != size or not _alltoall.even(matrix):
        return None
    c = matrix[0][0]
    return reduce_scatter_pairwise.counted(p.topology, c, False, c * (1 + (size // 2 if p.aliased else 0)))

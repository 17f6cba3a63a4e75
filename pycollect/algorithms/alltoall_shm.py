"""Shared-memory all-to-all: each rank publishes its input in its window; each block is read once, by its destination.

One window round: rank i publishes its whole input (block j at the offset it has in i's
input), meets the others at a fence, then copies the block meant for it out of every
peer's window. In place (``in`` and ``out`` one buffer with other layouts), the own block
waits in tmp: the reads overwrite ``in`` once it is published. Without a window (ranks on
several nodes, device buffers) it is the
pairwise all-to-all.
"""
from __future__ import annotations

from ..engine.layout import offsets
from ..engine.schedule import Copy, Problem, Recv, Round, Schedule, Send, Slice
from . import _alltoall, _window, alltoall_pairwise


def schedule(p: Problem) -> Schedule:
    if not p.windows or p.size == 1 or p.topology.num_nodes > 1:
        return alltoall_pairwise.schedule(p)
    r = p.rank
    send, recv, own = _alltoall.layout(p)
    others = _window.peers(r, p.size)
    sends = tuple(Send(to, Slice("in", *send[to]), at=send[to][0]) for to in others if p.matrix[r][to])
    # Rank i published its block for me where it sits in i's input.
    recvs = tuple(Recv(frm, Slice("out", *recv[frm]), at=offsets(p.matrix[frm])[r])
                  for frm in others if p.matrix[frm][r])
    pre: tuple[Copy, ...] = (own,)
    post: tuple[Copy, ...] = ()
    n_own, tmp = own.src.n, 0
    if p.aliased and n_own:
        held = Slice("tmp", 0, n_own)
        pre, post, tmp = (Copy(own.src, held),), (Copy(held, own.dst),), n_own
    win = max(sum(row) for row in p.matrix)
    # In place, the reads write over the input: its peers must read it from the window, where it is published.
    rnd = Round(sends, recvs, pre=pre, post=post, window=True, from_input=True)
    return Schedule((rnd,), tmp=tmp, win=win, lends=not p.aliased)


def _keys(p: Problem):
    """Every rank one class where every block is of one size (``pc.traffic``'s, the cost model's), a rank's own
    block aside; else None (walked: each rank's reads are its column of the matrix)."""
    row = p.matrix[0]
    if any(r is not row and r != row for r in p.matrix) or len(set(row)) > 1:
        return None
    return [0] * p.size


summaries = _window.twin_summaries(alltoall_pairwise, schedule, _keys)
in_step = alltoall_pairwise.in_step

"""Pieces the shared-memory window schedules share: the order a rank visits its peers, the window
reduce-scatter round, and the counted form of their message twins."""
from __future__ import annotations

from ..engine.schedule import Recv, Round, Send, Slice


def peers(rank: int, size: int) -> list[int]:
    """Every other rank, starting after this one: ranks reading at once start from different windows."""
    return [(rank + k) % size for k in range(1, size)]


def reduce_scatter_round(rank: int, ranges, dst: Slice) -> Round:
    """Every rank publishes its input, block j at its offset; this rank reduces its own block ``ranges[rank]``
    from every peer's window into ``dst``, the first read onto its own input, the others onto ``dst``."""
    others = peers(rank, len(ranges))
    sends = tuple(Send(to, Slice("in", *ranges[to]), at=ranges[to][0]) for to in others if ranges[to][1] > ranges[to][0])
    recvs, acc = [], Slice("in", *ranges[rank])
    for frm in others if dst.n else ():
        recvs.append(Recv(frm, dst, acc=acc, at=ranges[rank][0]))
        acc = dst
    return Round(sends, tuple(recvs), window=True, from_input=True)


def twin_summaries(twin):
    """The ``summaries`` of a window schedule: without a window, its message twin's counted form; with one, None
    (walked: its rounds are one or two)."""
    def summaries(p):
        return None if p.windows else twin.summaries(p)
    summaries.__doc__ = twin_summaries.__doc__
    return summaries

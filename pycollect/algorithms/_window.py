"""Pieces the shared-memory window schedules share: the order a rank visits its peers, the window
reduce-scatter round, and the counted form of their message twins."""
from __future__ import annotations

from ..engine.schedule import Recv, Round, Send, Slice


def peers(rank: int, size: int) -> list[int]:
    """Every other rank, starting after this one: ranks reading at once start from different windows."""
    return [(rank + k) % size for k in range(1, size)]


def reduce_scatter_round(rank: int, ranges, dst: Slice, group=None, puts: bool = False) -> Round:
    """Every rank of ``group`` (default: all, in rank order) publishes its input, block j at its offset; this rank
    reduces its own block (``ranges[j]`` is ``group[j]``'s) from every peer's window into ``dst``, the first read
    onto its own input, the others onto ``dst``; ``puts``: and writes it into the peers' ``out`` that lie in shared
    memory (engine/schedule.py)."""
    group = list(range(len(ranges))) if group is None else group
    me = group.index(rank)
    others = peers(me, len(group))          # indices into group
    sends = tuple(Send(group[j], Slice("in", *ranges[j]), at=ranges[j][0]) for j in others if ranges[j][1] > ranges[j][0])
    recvs, acc = [], Slice("in", *ranges[me])
    for j in others if dst.n else ():
        recvs.append(Recv(group[j], dst, acc=acc, at=ranges[me][0]))
        acc = dst
    return Round(sends, tuple(recvs), window=True, from_input=True, puts=puts)


def allgather_round(rank: int, ranges, at: int, group=None, puts: bool = False) -> Round:
    """Every rank of ``group`` publishes its block of ``out`` (``ranges[j]`` is ``group[j]``'s) at element ``at`` of
    its window; this rank copies every other block out of its owner's window. ``puts``: the blocks the round before
    put into the peers' ``out`` are neither published nor read again (engine/schedule.py)."""
    group = list(range(len(ranges))) if group is None else group
    me = group.index(rank)
    mine = Slice("out", *ranges[me])
    others = peers(me, len(group))
    sends = tuple(Send(group[j], mine, at=at) for j in others if mine.n)
    recvs = tuple(Recv(group[j], Slice("out", *ranges[j]), at=at) for j in others if ranges[j][1] > ranges[j][0])
    return Round(sends, recvs, window=True, puts=puts)


def twin_summaries(twin):
    """The ``summaries`` of a single-node window schedule: where it is its message twin (no windows, more than one
    node), the twin's counted form; with windows, None (walked: its rounds are one or two)."""
    def summaries(p):
        return None if p.windows and p.topology.num_nodes == 1 else twin.summaries(p)
    summaries.__doc__ = twin_summaries.__doc__
    return summaries

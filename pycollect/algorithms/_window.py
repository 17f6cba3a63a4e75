"""Pieces the shared-memory window schedules share: the order a rank visits its peers, the window
reduce-scatter round, and the counted form of their message twins."""
from __future__ import annotations

from dataclasses import replace

from ..engine.schedule import Recv, Round, Send, Slice
from ..engine.summary import MATE, RankClasses, shape_of


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


def twin_summaries(twin, schedule=None, keys=None):
    """The ``summaries`` of a single-node window schedule: where it is its message twin (no windows, more than one
    node), the twin's counted form; with windows on one node, ``one_node_classes`` where ``keys`` is given and
    answers, else None (walked)."""
    def summaries(p):
        if not (p.windows and p.topology.num_nodes == 1):
            return twin.summaries(p)
        if keys is None or p.size == 1:
            return None
        return one_node_classes(p, schedule, keys(p))
    summaries.__doc__ = twin_summaries.__doc__
    return summaries


def one_node_classes(p, schedule, keys):
    """Every rank of one node by class (``RankClasses``): ``keys[r]`` is what rank r's window rounds depend on beyond
    what all share (its own block's size, whether it is the root), None where some rank's rounds depend on more
    (then None: walked). A class's rounds are its first rank's schedule, each peer a ``MATE``, sends and reads in
    size order: a rank reads its peers in an order of its own (``peers``), which changes no count or time, and
    otherwise no two ranks of a node would share a class (a node of 4096 ranks took minutes to walk, O(N^2))."""
    if keys is None:
        return None
    classes, first = RankClasses(p.topology), {}

    def rounds(key):
        return tuple(_as_mates(shape_of(rnd)) for rnd in schedule(replace(p, rank=first[key])).rounds)
    for r, key in enumerate(keys):
        first.setdefault(key, r)
        classes.add(r, key, rounds)
    return classes


def _as_mates(shape):
    """``shape`` with every peer a ``MATE`` (one node), sends and reads sorted."""
    return replace(shape, sends=tuple(sorted((MATE, n) for _, n in shape.sends)),
                   recvs=tuple(sorted((MATE, n, red) for _, n, red in shape.recvs)))

"""Binomial broadcast: ceil(log2 N) rounds; every non-root receives the vector once.

Pipelined by ``Problem.tree_segment`` into S segments, it takes S + ceil(log2 N) - 1
rounds. The tree follows ``_binomial.tree_order`` so it enters each node once when
nodes hold a power of two ranks. Only the root's ``in`` is read.
"""
from __future__ import annotations

from ..engine.layout import ceil_log2
from ..engine.schedule import EMPTY, Copy, Problem, Round, Schedule, Slice
from ..engine.summary import all_written
from . import _binomial


def schedule(p: Problem) -> Schedule:
    out = Slice("out", 0, p.n)
    # the root sends from out, so it fills out first (a no-op copy when in place)
    place = Round(pre=(Copy(Slice("in", 0, p.n), out),))
    if p.size == 1:
        return Schedule((place,))
    if p.n == 0:
        return EMPTY
    group = _binomial.tree_order(p.topology, p.root)
    pos = group.index(p.rank)
    rounds = _binomial.broadcast(group, pos, 0, out, _binomial.segments(p.n, p.tree_segment))
    head = (place,) if p.rank == p.root else ()
    return Schedule(head + tuple(_binomial.compact(rounds)))


def summaries(p: Problem):
    """Every rank's rounds counted without building them (engine/summary.py): the pipelined tree's rounds, as
    ``compact`` leaves them, after the rounds a rank waits for its first segment (``_binomial.broadcast_starts``),
    the root's copy into ``out`` counted with its first send. One rank, an empty vector: None (walked)."""
    if p.size == 1 or p.n == 0:
        return None
    segs = _binomial.segments(p.n, p.tree_segment)
    sizes, levels = [b - a for a, b in segs], ceil_log2(p.size)
    return _binomial.counted(p.topology, p.root, lambda key: all_written(_binomial.shifted(   # every rank sends out
        _binomial.broadcast_counts(key, sizes, levels), key[4], p.n if key[1] is None else 0)),
        starts=_binomial.broadcast_starts(p.size, len(segs)))


def in_step(p: Problem) -> bool:
    """Whether the counted form keeps every rank's round t with its peers' round t (the cluster simulator's
    lockstep): on a power of two, or with every rank on one node (its fold or missing children then cost what the
    walk charges them: tests/test_clustersim.py) (registry.counted_summaries)."""
    return p.size & (p.size - 1) == 0 or p.topology.num_nodes == 1

"""Binomial reduce: ceil(log2 N) rounds; every non-root sends the vector once.

Pipelined by ``Problem.tree_segment`` into S segments, it takes S + ceil(log2 N) - 1
rounds. The tree follows ``_binomial.tree_order`` so it leaves each node once when
nodes hold a power of two ranks. Non-roots have no ``out``: partial sums live in ``tmp``.
"""
from __future__ import annotations

from ..engine.layout import ceil_log2
from ..engine.schedule import EMPTY, Copy, Problem, Round, Schedule, Slice
from ..engine.summary import all_written
from . import _binomial


def schedule(p: Problem) -> Schedule:
    src = Slice("in", 0, p.n)
    if p.size == 1:
        return Schedule((Round(pre=(Copy(src, Slice("out", 0, p.n)),)),))
    if p.n == 0:
        return EMPTY
    group = _binomial.tree_order(p.topology, p.root)
    pos = group.index(p.rank)
    segs = _binomial.segments(p.n, p.tree_segment)
    # the root reduces straight into out; a rank with children needs scratch for partial sums
    is_root = p.rank == p.root
    has_children = is_root or (pos % 2 == 0 and pos + 1 < p.size)
    work = Slice("out" if is_root else "tmp", 0, p.n)
    rounds = _binomial.reduce(group, pos, 0, src, work, segs)
    return Schedule(tuple(_binomial.compact(rounds)), tmp=p.n if has_children and not is_root else 0)


def summaries(p: Problem):
    """Every rank's rounds counted without building them (engine/summary.py): the pipelined tree's rounds, as
    ``compact`` leaves them. Each rank runs its rounds one a round from the start: it waits only on children,
    whose sends run no later than the aligned grid (a rank missing children sends early, ahead of its parent's
    receive, which waits on nothing else). One rank, an empty vector: None (walked)."""
    if p.size == 1 or p.n == 0:
        return None
    sizes, levels = [b - a for a, b in _binomial.segments(p.n, p.tree_segment)], ceil_log2(p.size)

    def rounds(key):   # a leaf sends its input; a rank with children the sums it reduced
        out = _binomial.shifted(_binomial.reduce_counts(key, sizes, levels), 0)
        return all_written(out) if key[2] else out
    return _binomial.counted(p.topology, p.root, rounds)


def in_step(p: Problem) -> bool:
    """Whether the counted form keeps every rank's round t with its peers' round t (the cluster simulator's
    lockstep): on a power of two, or with every rank on one node (its fold or missing children then cost what the
    walk charges them: tests/test_clustersim.py) (registry.counted_summaries)."""
    return p.size & (p.size - 1) == 0 or p.topology.num_nodes == 1

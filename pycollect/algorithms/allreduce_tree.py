"""Tree allreduce: pipelined binomial reduce to rank 0, then pipelined binomial broadcast.

2 ceil(log2 N) rounds unpipelined: the latency choice for short vectors. With S segments
the broadcast starts L = ceil(log2 N) rounds after the reduce, while later segments are
still being reduced, so the two phases of S + L - 1 rounds each overlap in S + 2L - 1
rounds. The tree follows ``_binomial.tree_order`` so it crosses each node boundary once.
"""
from __future__ import annotations

from ..engine.layout import ceil_log2
from ..engine.schedule import EMPTY, Copy, Problem, Round, Schedule, Slice
from . import _binomial


def schedule(p: Problem) -> Schedule:
    src, out = Slice("in", 0, p.n), Slice("out", 0, p.n)
    if p.size == 1:
        return Schedule((Round(pre=(Copy(src, out),)),))
    if p.n == 0:
        return EMPTY
    group = _binomial.tree_order(p.topology, 0)
    pos = group.index(p.rank)
    segs = _binomial.segments(p.n, p.tree_segment)
    # partial sums build up in out (everyone has one); a leaf sends from in and never writes out
    up = _binomial.reduce(group, pos, 0, src, out, segs)
    down = _binomial.broadcast(group, pos, 0, out, segs)
    # Offset L: rank v (step k) sends segment s up in round s + k and gets it back in
    # round L + s + L-1-k, later for every k <= L-1; no segment is sent and received in
    # one round, and the root has segment s complete (round s + L-1) before it sends it.
    rounds = _binomial.overlay(up, down, ceil_log2(p.size))
    return Schedule(tuple(_binomial.compact(rounds)))


def summaries(p: Problem):
    """Every rank's rounds counted without building them (engine/summary.py): the reduce's aligned rounds with the
    broadcast's laid over them from round L on, as ``schedule`` overlays them. Where N is not a power of two the
    aligned grid holds when there are at least 2L-1 segments: then no rank has an empty round between busy ones
    (a rank missing children runs its first sends early but waits on its parent's broadcast from then on). One
    rank, an empty vector, and fewer segments on other sizes: None (walked: a rank missing children runs ahead)."""
    sizes, levels = _binomial.segments(p.n, p.tree_segment), ceil_log2(p.size)
    if p.size & (p.size - 1) and len(sizes) < 2 * levels - 1:
        return None
    return counts(p)


def counts(p: Problem):
    """``summaries`` at any N, for what reads a rank's rounds but not the round it finishes in (the traffic, the
    cost model's time): ``schedule`` only drops the empty rounds of the same overlaid grid, so a rank runs the same
    rounds, but off powers of two with fewer than 2L-1 segments its finishing round is not its form's. One rank,
    an empty vector: None (walked)."""
    sizes, levels = [b - a for a, b in _binomial.segments(p.n, p.tree_segment)], ceil_log2(p.size)
    if p.size == 1 or p.n == 0:
        return None

    def rounds(key):
        grid = _binomial.reduce_counts(key, sizes, levels)
        grid += [[[], []] for _ in range(levels)]               # the broadcast ends L rounds after the reduce
        for t, (sends, recvs) in enumerate(_binomial.broadcast_counts(key, sizes, levels)):
            grid[levels + t][0] += sends
            grid[levels + t][1] += recvs
        return _binomial.as_rounds(grid)
    return _binomial.counted(p.topology, 0, rounds)


def in_step(p: Problem) -> bool:
    """Whether the counted form keeps every rank's round t with its peers' round t (the cluster simulator's
    lockstep): on a power of two (registry.counted_summaries)."""
    return p.size & (p.size - 1) == 0

"""Tree allreduce: pipelined binomial reduce to rank 0, then pipelined binomial broadcast.

2 ceil(log2 N) rounds unpipelined: the latency choice for short vectors. With S segments
the broadcast starts L = ceil(log2 N) rounds after the reduce, while later segments are
still being reduced, so the two phases of S + L - 1 rounds each overlap in S + 2L - 1
rounds. The tree follows ``_binomial.tree_order`` so it crosses each node boundary once.
"""
from __future__ import annotations

import numpy as np

from ..engine.layout import ceil_log2
from ..engine.schedule import EMPTY, Copy, Problem, Round, Schedule, Slice
from ..engine.summary import all_written
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
    (a rank missing children runs its first sends early but waits on its parent's broadcast from then on). With
    fewer, each rank's busy rounds follow one another after the idle rounds that make it finish where it does
    (``pipeline_starts``). One rank, an empty vector: None (walked)."""
    sizes, levels = _binomial.segments(p.n, p.tree_segment), ceil_log2(p.size)
    if p.size == 1 or p.n == 0:
        return None
    if p.size & (p.size - 1) and len(sizes) < 2 * levels - 1:
        return _counted(p, pipeline_starts(len(_binomial.tree_order(p.topology, 0)), len(sizes)))
    return counts(p)


def pipeline_starts(m: int, segments: int) -> list[int]:
    """``starts[v]``: the idle rounds before relative rank v's busy ones, ``segments`` segments on m ranks, so that it
    finishes on the critical path of its compacted rounds (each message one round; ``explain.critical_path``):
    round t of the overlaid grid (segment s from child j in round s + j, up in s + k, down from the parent in
    s + 2L-1-k, to child j in s + 2L-1-j) starts when the rank's busy rounds before it have ended and every peer
    it receives from has posted its own round t (after its busy rounds before t), and ends a round later; all
    ranks at once a round, O((S + L) x L x m) in NumPy."""
    levels = ceil_log2(m)
    v = np.arange(m)
    k = np.where(v > 0, np.log2(np.maximum(v & -v, 1)).astype(np.int64), levels)   # (m,) each rank's step
    parent = np.maximum(v - (1 << k), 0)
    kids = [(j, (j < k) & (v + (1 << j) < m), np.minimum(v + (1 << j), m - 1)) for j in range(levels)]
    time, busy = np.zeros(m, dtype=np.int64), np.zeros(m, dtype=np.int64)
    for t in range(segments + 2 * levels - 1):
        start, active = time.copy(), np.zeros(m, dtype=bool)
        for j, has, child in kids:
            if 0 <= t - j < segments:                          # segment t - j from child j, reduced
                start = np.where(has, np.maximum(start, time[child]), start)
                active |= has
            if 0 <= t - (2 * levels - 1 - j) < segments:       # a segment down to child j
                active |= has
        active |= (v > 0) & (t - k >= 0) & (t - k < segments)   # a segment up to the parent
        down = (v > 0) & (t - (2 * levels - 1 - k) >= 0) & (t - (2 * levels - 1 - k) < segments)
        start = np.where(down, np.maximum(start, time[parent]), start)
        active |= down
        time = np.where(active, start + 1, time)
        busy += active
    return (time - busy).tolist()


def counts(p: Problem):
    """``summaries`` at any N, for what reads a rank's rounds but not the round it finishes in (the traffic, the
    cost model's time): ``schedule`` only drops the empty rounds of the same overlaid grid, so a rank runs the same
    rounds, but off powers of two with fewer than 2L-1 segments its finishing round is not its form's. One rank,
    an empty vector: None (walked)."""
    if p.size == 1 or p.n == 0:
        return None
    return _counted(p, None)


def _counted(p: Problem, starts):
    """The overlaid grid of every rank's class: aligned (``starts`` None) or compacted after ``starts[v]`` idle
    rounds."""
    sizes, levels = [b - a for a, b in _binomial.segments(p.n, p.tree_segment)], ceil_log2(p.size)

    def rounds(key):
        grid = _binomial.reduce_counts(key, sizes, levels)
        grid += [[[], []] for _ in range(levels)]               # the broadcast ends L rounds after the reduce
        for t, (sends, recvs) in enumerate(_binomial.broadcast_counts(key, sizes, levels)):
            grid[levels + t][0] += sends
            grid[levels + t][1] += recvs
        out = _binomial.as_rounds(grid) if starts is None else _binomial.shifted(grid, key[4])
        return all_written(out) if key[2] else out   # a leaf sends its input; a rank with children sends out's sums
    return _binomial.counted(p.topology, 0, rounds, starts=starts)


def in_step(p: Problem) -> bool:
    """Whether the counted form keeps every rank's round t with its peers' round t (the cluster simulator's
    lockstep): on a power of two (registry.counted_summaries)."""
    return p.size & (p.size - 1) == 0

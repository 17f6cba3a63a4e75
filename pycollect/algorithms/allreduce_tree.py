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
    (a rank missing children runs its first sends early but waits on its parent's broadcast from then on). With one
    segment each rank's busy rounds follow one another after the idle rounds that make it finish where it does
    (``one_segment_starts``). One rank, an empty vector, and 2 to 2L-2 segments on other sizes: None (walked)."""
    sizes, levels = _binomial.segments(p.n, p.tree_segment), ceil_log2(p.size)
    if p.size & (p.size - 1) and len(sizes) < 2 * levels - 1:
        if len(sizes) != 1 or p.size == 1:
            return None
        return _counted(p, one_segment_starts(len(_binomial.tree_order(p.topology, 0))))
    return counts(p)


def one_segment_starts(m: int) -> list[int]:
    """``starts[v]``: the idle rounds before relative rank v's busy ones, one segment on m ranks, so that it finishes
    on the critical path of its compacted rounds (each message one round): v receives from its children in turn (a
    child sends once its own children's sums are in), sends up, gets the result from its parent (which sends to
    its children from the last down, once it has it) and sends it on to its children."""
    levels = ceil_log2(m)
    kids = [[j for j in range((v & -v).bit_length() - 1 if v else levels) if v + (1 << j) < m] for v in range(m)]
    summed = [0] * m                          # the round v's sum is in: its send up starts then
    for v in range(m - 1, -1, -1):            # children v + 2^j come after v
        t = 0
        for j in kids[v]:
            t = max(t, summed[v + (1 << j)]) + 1
        summed[v] = t
    got, starts = [summed[0]] * m, [0] * m    # got[v]: the round v has the result (the root: its own sum)
    for v in range(1, m):                     # a parent v - 2^k comes before its children
        k = (v & -v).bit_length() - 1
        parent = v - (1 << k)
        sent = got[parent] + sum(1 for j in kids[parent] if j > k)   # the parent sends to its last child first
        got[v] = max(summed[v] + 1, sent) + 1
    for v in range(m):
        finish = got[v] + len(kids[v])
        starts[v] = finish - 2 * len(kids[v]) - (2 if v else 0)
    return starts


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
        return _binomial.as_rounds(grid) if starts is None else _binomial.shifted(grid, key[4])
    return _binomial.counted(p.topology, 0, rounds, starts=starts)


def in_step(p: Problem) -> bool:
    """Whether the counted form keeps every rank's round t with its peers' round t (the cluster simulator's
    lockstep): on a power of two (registry.counted_summaries)."""
    return p.size & (p.size - 1) == 0

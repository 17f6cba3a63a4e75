"""Van de Geijn broadcast: binomial scatter of N blocks, then ring allgather.

Each rank sends and receives about 2(N-1)/N of the vector, against log2 N times the
vector for the root of a binomial tree: the choice for long vectors. Block v belongs
to relative rank v, so a subtree's blocks form one contiguous span (one message per
edge). Scatter and ring both follow ``_binomial.tree_order``, which keeps nodes contiguous.
"""
from __future__ import annotations

from ..engine.layout import ceil_log2, even_ranges
from ..engine.schedule import EMPTY, Copy, Problem, Round, Schedule, Slice
from ..engine.summary import IDLE, RankClasses, all_written, finish, join, ring_phases
from . import _binomial, _ring


def schedule(p: Problem) -> Schedule:
    src, out = Slice("in", 0, p.n), Slice("out", 0, p.n)
    if p.size == 1:
        return Schedule((Round(pre=(Copy(src, out),)),))
    if p.n == 0:
        return EMPTY
    group = _binomial.tree_order(p.topology, p.root)
    pos = group.index(p.rank)  # the root is at 0, so pos is the relative rank
    ranges = even_ranges(0, p.n, p.size)  # ranges[v]: block of relative rank v
    rounds = _binomial.compact(_binomial.scatter(group, pos, 0, src, out, ranges))
    if pos == 0:
        # the scatter sends from in; the ring needs the root's own block in out
        rounds.insert(0, Round(pre=(Copy(src.sub(*ranges[0]), out.sub(*ranges[0])),)))
    # every rank now holds its block in out; the ring brings it the other N-1
    rounds += _ring.allgather(pos, group, ranges, "out")
    return Schedule(tuple(rounds))


def summaries(p: Problem):
    """Every rank's rounds counted without building them (engine/summary.py): the scatter's rounds as ``compact``
    leaves them, after the rounds a rank waits for its span (``_binomial.scatter_starts``; the root's copy of its own
    block counted with its first send; with fewer elements than ranks an empty span is not sent, and a rank whose
    span is empty has no scatter rounds), then idle until the last rank's scatter ends (the ring's last round waits
    on every rank), then the ring allgather over the tree order, every block but the next position's (empty ones
    too: the ring sends them), counted by kind as ``allgather_ring``'s form. One rank, an empty vector: None."""
    size = p.size
    if size == 1 or p.n == 0:
        return None
    ranges, levels = even_ranges(0, p.n, size), ceil_log2(size)
    group = _binomial.tree_order(p.topology, p.root)

    def spans(v: int) -> tuple:
        """(elements v receives, elements it sends each child j < k that exists): its subtree's blocks, as
        ``scatter``."""
        k = (v & -v).bit_length() - 1 if v else levels
        return (ranges[min(v + (1 << k), size) - 1][1] - ranges[v][0] if v else 0,
                tuple(ranges[min(v + (2 << j), size) - 1][1] - ranges[v + (1 << j)][0]
                      for j in range(k) if v + (1 << j) < size))

    def rounds(key):   # the root sends from its input, the others forward what they received into out
        out = _binomial.shifted(_binomial.scatter_counts(key, levels), key[4], 0 if key[1] is not None else ranges[0][1])
        return out if key[1] is None else all_written(out)
    scattered = _binomial.counted(p.topology, p.root, rounds, spans, _binomial.scatter_starts(size, spans))
    ends = [finish(t) for t in scattered.templates]     # a class's finish: its peers do not change it
    last = max(ends[c] for c in scattered.class_of)
    except_block = ring_phases([b - a for a, b in ranges])   # block v is relative rank v's
    classes = RankClasses(p.topology)

    def joined(key) -> tuple:
        """A class: its scatter class's rounds, idle until the last scatter ends, then its ring's kinds."""
        c, ring, right, left = key
        return join(scattered.templates[c], ((last - ends[c], IDLE),) if last > ends[c] else (),
                    _ring.counted(ring, right, left, False))
    for v, r in enumerate(group):
        key = (scattered.class_of[r], except_block(v + 1), classes.where(r, group[(v + 1) % size]),
               classes.where(r, group[v - 1]))
        classes.add(r, key, joined, counted=True)
    return classes


def in_step(p: Problem) -> bool:
    """Whether the counted form keeps every rank's round t with its peers' round t (the cluster simulator's
    lockstep): no block empty, on a power of two or with every rank on one node (the missing children then cost what
    the walk charges them: tests/test_clustersim.py) (registry.counted_summaries)."""
    return (p.size & (p.size - 1) == 0 or p.topology.num_nodes == 1) and p.n >= p.size

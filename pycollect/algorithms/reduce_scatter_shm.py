"""Shared-memory reduce-scatter: each rank publishes its input; each block's owner reduces it from every window.

One window round: rank i publishes its input (block j at its offset), meets the others
at a fence, then adds block i of every peer, read straight from the peer's window, onto
its own block: no message, no staging copy on the receiving side. The reads run in the
order listed, peers from rank i+1 on. Without a window (ranks on several nodes, device buffers) it is the ring reduce-scatter.
"""
from __future__ import annotations

from ..engine.layout import block_ranges
from ..engine.schedule import Problem, Schedule, Slice
from . import _window, reduce_scatter_ring


def schedule(p: Problem) -> Schedule:
    if not p.windows or p.size == 1 or p.topology.num_nodes > 1:
        return reduce_scatter_ring.schedule(p)
    out = Slice("out", 0, p.counts[p.rank])
    return Schedule((_window.reduce_scatter_round(p.rank, block_ranges(p.counts), out),), win=p.n, lends=True)


summaries = _window.twin_summaries(reduce_scatter_ring, schedule, lambda p: p.counts)   # a rank's own block

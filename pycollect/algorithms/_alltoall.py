"""Where each all-to-all block sits in ``in`` and ``out``, shared by the all-to-all schedules."""
from __future__ import annotations

from ..engine.layout import block_ranges
from ..engine.schedule import Copy, Problem, Slice


def layout(p: Problem):
    """``(send, recv, own)``: in-ranges per destination, out-ranges per source, the copy of one's own block."""
    send = block_ranges(p.matrix[p.rank])                    # in: my block for each destination
    recv = block_ranges([row[p.rank] for row in p.matrix])   # out: the block from each source
    return send, recv, Copy(Slice("in", *send[p.rank]), Slice("out", *recv[p.rank]))

"""Where each all-to-all block sits in ``in`` and ``out``, shared by the all-to-all schedules."""
from __future__ import annotations

from ..engine.layout import block_ranges
from ..engine.schedule import Copy, Problem, Slice


def layout(p: Problem):
    """``(send, recv, own)``: in-ranges per destination, out-ranges per source, the copy of one's own block."""
    send = block_ranges(p.matrix[p.rank])                    # in: my block for each destination
    recv = block_ranges([row[p.rank] for row in p.matrix])   # out: the block from each source
    return send, recv, Copy(Slice("in", *send[p.rank]), Slice("out", *recv[p.rank]))


def even(matrix) -> bool:
    """Whether every block of ``matrix`` (N x N) holds the same number of elements, more than none: what the
    counted forms cover. One row object for every rank (as ``shapes.even_problem`` builds it) is checked in
    O(N), not O(N^2)."""
    first = matrix[0]
    return (len(first) == len(matrix) and len(set(first)) == 1 and first[0] > 0
            and all(row is first or row == first for row in matrix))


def same_rows(matrix) -> bool:
    """Whether every rank sends the same counts (``matrix[i]`` equal for every i: rank j gets ``matrix[0][j]`` from
    each), as ``shapes.even_problem`` builds it: one row object for every rank is checked in O(N)."""
    first = matrix[0]
    return len(first) == len(matrix) and all(row is first or row == first for row in matrix)

"""How many elements each collective's ``in`` and ``out`` buffers hold on one rank; nccl-tests' bus bandwidth factor."""
from __future__ import annotations

from .schedule import Problem

COLLECTIVES = ("allreduce", "reduce_scatter", "allgather", "alltoall", "broadcast", "reduce", "gather", "scatter",
               "scan", "exscan")
REDUCING = ("allreduce", "reduce_scatter", "reduce", "scan", "exscan")


def in_elems(collective: str, p: Problem) -> int:
    if collective in ("allreduce", "broadcast", "reduce", "scan", "exscan"):
        return p.n
    if collective in ("reduce_scatter", "reduce_scatter_block"):
        return sum(p.counts)
    if collective == "allgather":
        return p.counts[p.rank]
    if collective == "alltoall":
        return sum(p.matrix[p.rank])
    if collective == "gather":
        return p.counts[p.rank]
    if collective == "scatter":
        return p.n if p.rank == p.root else 0
    raise ValueError(f"unknown collective {collective!r}")


def out_elems(collective: str, p: Problem) -> int | None:
    """Elements of ``out``; None where the rank has no output (reduce off the root)."""
    if collective in ("allreduce", "broadcast", "scan"):
        return p.n
    if collective == "exscan":   # rank 0's result is undefined (MPI_Exscan): it has none
        return p.n if p.rank > 0 else None
    if collective == "reduce":
        return p.n if p.rank == p.root else None
    if collective in ("reduce_scatter", "reduce_scatter_block"):
        return p.counts[p.rank]
    if collective == "allgather":
        return sum(p.counts)
    if collective == "alltoall":
        return sum(row[p.rank] for row in p.matrix)
    if collective == "gather":
        return p.n if p.rank == p.root else None
    if collective == "scatter":
        return p.counts[p.rank]
    raise ValueError(f"unknown collective {collective!r}")


def segment_elements(nbytes: int, itemsize: int) -> int:
    """Elements per segment for a segment size in bytes (``segment_bytes``, ``tree_segment_bytes``): at least one;
    0 (no segmenting) for 0 bytes."""
    return max(1, nbytes // itemsize) if nbytes else 0


def even_problem(collective: str, rank: int, size: int, topology, n: int, root: int = 0,
                 tree_segment: int = 0) -> Problem:
    """The problem of a call with ``n`` elements in all, split evenly where blocks are needed.

    ``n`` is the vector length for allreduce, broadcast, reduce, scan, exscan and reduce_scatter (input; a
    multiple of ``size`` for reduce_scatter_block, whose blocks are equal), the gathered length for allgather
    and gather, the root's whole buffer for scatter, and each rank's send length for alltoall. The ranks of
    each node can share memory windows (host buffers), so the window schedules count as such.
    """
    from .layout import split_even
    if collective == "reduce_scatter_block" and n % size:
        raise ValueError(f"reduce_scatter_block: {n} elements do not split into {size} equal blocks "
                         "(reduce_scatter takes uneven ones)")
    counts = split_even(n, size)
    matrix = (counts,) * size if collective == "alltoall" else ()
    return Problem(rank, size, topology, n=n, counts=counts, matrix=matrix, root=root, tree_segment=tree_segment,
                   windows=True)


def bus_factor(collective: str, n: int) -> float:
    """nccl-tests' busbw / algbw: allreduce 2(n-1)/n; reduce_scatter(_block), allgather, alltoall, gather, scatter
    (n-1)/n (the root's link carries every block but its own); others 1."""
    if collective == "allreduce":
        return 2 * (n - 1) / n
    if collective in ("reduce_scatter", "reduce_scatter_block", "allgather", "alltoall", "gather", "scatter"):
        return (n - 1) / n
    return 1.0

"""Every algorithm of every collective through the grid, each result compared with MPI's own collective.

Inputs are integer-valued (exact in every dtype whatever the reduction order), so results
must be equal; ``test_float_tolerance`` covers random floats with a tolerance.
"""
import numpy as np
import pytest

import pycollect as pc
from helpers import (DTYPES, agree, integer_valued, mpi_allgather, mpi_allreduce, mpi_alltoall,
                     mpi_reduce_scatter, ops_for, same, verdicts)
from pycollect.engine.layout import split_even
from pycollect.engine.mpi_native import supports as mpi_supports


def lengths(size):
    """Vector lengths around the world size: 0, 1, primes, below and above it."""
    return sorted({0, 1, 2, max(size - 1, 0), size, size + 1, 7, 13, 97})


def cases(size):
    """(dtype, op, length): every dtype with sum, every op of a few dtypes at every length."""
    for dtype in DTYPES:
        for n in (1, size + 1, 13):
            yield dtype, "sum", n
    for dtype in (np.dtype("i4"), np.dtype("f8"), np.dtype("u1")):
        for op in ops_for(dtype):
            for n in lengths(size):
                yield dtype, op, n


def usable(algorithm, dtype):
    return algorithm != "mpi" or mpi_supports(dtype)


def algorithms(collective):
    return pc.algorithms(collective)


@pytest.mark.parametrize("algorithm", algorithms("allreduce"))
def test_allreduce(comm, algorithm):
    with verdicts(comm) as check:
        for seed, (dtype, op, n) in enumerate(cases(comm.size)):
            if not usable(algorithm, dtype):
                continue
            x = integer_valued((n,), dtype, op, seed * 31 + comm.rank)
            original = x.copy()
            expected = mpi_allreduce(comm.mpi, x, op)
            got = comm.allreduce(x, op=op, algorithm=algorithm)
            check(same(got, expected) and same(x, original), f"allreduce {algorithm} {dtype} {op} n={n}")
            comm.allreduce(x, op=op, algorithm=algorithm, out=x)
            check(same(x, expected), f"allreduce in place {algorithm} {dtype} {op} n={n}")


@pytest.mark.parametrize("algorithm", algorithms("allreduce"))
def test_allreduce_shapes_and_strides(comm, algorithm):
    """Multi-dimensional, non-contiguous input and a strided ``out``."""
    x = integer_valued((6, 5, 4), np.dtype("f4"), "sum", comm.rank)
    view = x[:, ::2, 1:]                               # (6, 3, 3), not contiguous
    expected = mpi_allreduce(comm.mpi, np.ascontiguousarray(view), "sum")
    got = comm.allreduce(view, algorithm=algorithm)
    out = np.zeros((6, 3, 6), np.float32)[:, :, ::2]   # strided out
    comm.allreduce(view, algorithm=algorithm, out=out)
    agree(comm, same(got, expected) and same(out, expected), f"strided allreduce {algorithm}")
    before = x.copy()
    comm.allreduce(view, algorithm=algorithm, out=view)  # in place on a strided view
    agree(comm, same(x[:, ::2, 1:], expected) and same(x[:, 1::2], before[:, 1::2]),
          f"strided in-place allreduce {algorithm}")


@pytest.mark.parametrize("algorithm", algorithms("reduce_scatter"))
def test_reduce_scatter(comm, algorithm):
    with verdicts(comm) as check:
        size = comm.size
        for seed, (dtype, op, n) in enumerate(cases(size)):
            if not usable(algorithm, dtype):
                continue
            x = integer_valued((n, 2), dtype, op, seed * 17 + comm.rank)
            original = x.copy()
            uneven = tuple((i * 7 + seed) % 3 for i in range(size))
            for counts in (None, uneven):
                rows = split_even(n, size) if counts is None else counts
                xs = x if counts is None else integer_valued((sum(counts), 2), dtype, op, seed + comm.rank)
                expected = mpi_reduce_scatter(comm.mpi, xs, op, rows)
                got = comm.reduce_scatter(xs, op=op, counts=counts, algorithm=algorithm)
                check(same(got, expected), f"reduce_scatter {algorithm} {dtype} {op} n={n} counts={counts}")
            check(same(x, original), f"reduce_scatter {algorithm} wrote its input")


@pytest.mark.parametrize("algorithm", algorithms("allgather"))
def test_allgather(comm, algorithm):
    with verdicts(comm) as check:
        size = comm.size
        for seed, (dtype, _, n) in enumerate(c for c in cases(size) if c[1] == "sum"):
            if not usable(algorithm, dtype):
                continue
            for rows in (n, (comm.rank * 5 + n) % 4):      # equal, then uneven (zeros included)
                x = integer_valued((rows, 3), dtype, "sum", seed * 13 + comm.rank)
                expected = mpi_allgather(comm.mpi, x)
                got = comm.allgather(x, algorithm=algorithm)
                check(same(got, expected), f"allgather {algorithm} {dtype} rows={rows}")


@pytest.mark.parametrize("algorithm", algorithms("alltoall"))
def test_alltoall(comm, algorithm):
    with verdicts(comm) as check:
        size = comm.size
        for seed, (dtype, _, n) in enumerate(c for c in cases(size) if c[1] == "sum"):
            if not usable(algorithm, dtype):
                continue
            x = integer_valued((n, 2), dtype, "sum", seed * 7 + comm.rank)
            expected = mpi_alltoall(comm.mpi, x, split_even(n, size))
            got = comm.alltoall(x, algorithm=algorithm)
            check(same(got, expected), f"alltoall {algorithm} {dtype} n={n}")
            counts = [(comm.rank + 2 * j + seed) % 4 for j in range(size)]
            xv = integer_valued((sum(counts), 2), dtype, "sum", seed + 1000 * comm.rank)
            expected = mpi_alltoall(comm.mpi, xv, counts)
            got = comm.alltoall(xv, counts=counts, algorithm=algorithm)
            check(same(got, expected), f"alltoallv {algorithm} {dtype} counts={counts}")
            matrix = [[(i + 2 * j + seed) % 4 for j in range(size)] for i in range(size)]  # every rank's counts
            got = comm.alltoall(xv, counts=np.array(matrix) if seed % 2 else matrix, algorithm=algorithm)
            check(same(got, expected), f"alltoallv {algorithm} {dtype} counts matrix={matrix}")


@pytest.mark.parametrize("algorithm", algorithms("broadcast"))
def test_broadcast(comm, algorithm):
    with verdicts(comm) as check:
        for root in sorted({0, comm.size - 1, comm.size // 2}):
            for seed, (dtype, _, n) in enumerate(c for c in cases(comm.size) if c[1] == "sum"):
                if not usable(algorithm, dtype):
                    continue
                x = integer_valued((n,), dtype, "sum", seed * 11 + comm.rank)
                original = x.copy()
                expected = comm.mpi.bcast(x, root=root)
                got = comm.broadcast(x, root=root, algorithm=algorithm)
                check(same(got, expected) and same(x, original), f"broadcast {algorithm} root={root} {dtype} n={n}")
                comm.broadcast(x, root=root, algorithm=algorithm, out=x)
                check(same(x, expected), f"broadcast in place {algorithm} root={root} {dtype} n={n}")


@pytest.mark.parametrize("algorithm", algorithms("reduce"))
def test_reduce(comm, algorithm):
    with verdicts(comm) as check:
        for root in sorted({0, comm.size - 1, comm.size // 2}):
            for seed, (dtype, op, n) in enumerate(cases(comm.size)):
                if not usable(algorithm, dtype):
                    continue
                x = integer_valued((n,), dtype, op, seed * 3 + comm.rank)
                original = x.copy()
                total = mpi_allreduce(comm.mpi, x, op)
                expected = total if comm.rank == root else None
                got = comm.reduce(x, root=root, op=op, algorithm=algorithm)
                check(same(got, expected) and same(x, original), f"reduce {algorithm} root={root} {dtype} {op} n={n}")


@pytest.mark.parametrize("collective", ["allreduce", "reduce_scatter"])
@pytest.mark.parametrize("dtype", ["f4", "f8", "c8", "c16", "f2"])
def test_float_tolerance(comm, collective, dtype):
    """Random floats: each algorithm within a tolerance of MPI's float64 result that scales with eps and size."""
    dtype = np.dtype(dtype)
    rng = np.random.default_rng(comm.rank)
    x = rng.uniform(-1, 1, (1000,)).astype(dtype)
    if dtype.kind == "c":
        x = x + 1j * rng.uniform(-1, 1, x.shape).astype(dtype)
    exact = np.empty(x.shape, np.complex128)
    comm.mpi.Allreduce(x.astype(np.complex128), exact)
    tol = 4 * comm.size * np.finfo(dtype).eps * comm.size  # partial sums stay below `size` in magnitude
    blocks = split_even(1000, comm.size)
    start = sum(blocks[:comm.rank])
    for algorithm in pc.algorithms(collective):
        if not usable(algorithm, dtype):
            continue
        got = getattr(comm, collective)(x, algorithm=algorithm)
        want = exact if collective == "allreduce" else exact[start:start + blocks[comm.rank]]
        agree(comm, got.dtype == dtype and np.allclose(got.astype(np.complex128), want, rtol=0, atol=tol),
              f"{collective} {algorithm} {dtype}: max error {np.abs(got.astype(np.complex128) - want).max()} > {tol}")


def test_accumulate_float32(comm):
    """2048 + 1 + 1 ... is 2048 in float16 partial sums but exact when accumulated in float32."""
    x = np.full(10, 2048.0 if comm.rank == 0 else 1.0, np.float16)
    expected = np.full(10, np.float16(2048.0 + comm.size - 1), np.float16)
    for algorithm in ("ring", "recursive_doubling", "tree", "auto"):
        got = comm.allreduce(x, algorithm=algorithm, accumulate="float32")
        agree(comm, got.dtype == np.float16 and np.array_equal(got, expected), f"accumulate {algorithm}: {got[:3]}")

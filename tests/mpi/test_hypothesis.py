"""Hypothesis draws shapes and counts; every rank draws the same examples (derandomized) and agrees on failure."""
import numpy as np
from hypothesis import given
from hypothesis import strategies as st

import pycollect as pc
from helpers import agree, integer_valued, mpi_allgather, mpi_allreduce, mpi_alltoall, mpi_reduce_scatter, same

shapes = st.lists(st.integers(0, 9), min_size=1, max_size=3).map(tuple)


@given(shape=shapes, algorithm=st.sampled_from(pc.algorithms("allreduce")), seed=st.integers(0, 99))
def test_allreduce_any_shape(comm, shape, algorithm, seed):
    x = integer_valued(shape, np.dtype("i8"), "sum", seed + comm.rank)
    agree(comm, same(comm.allreduce(x, algorithm=algorithm), mpi_allreduce(comm.mpi, x, "sum")), f"{shape} {algorithm}")


@given(data=st.data(), algorithm=st.sampled_from(pc.algorithms("reduce_scatter")), width=st.integers(0, 3))
def test_reduce_scatter_any_counts(comm, data, algorithm, width):
    counts = data.draw(st.lists(st.integers(0, 6), min_size=comm.size, max_size=comm.size))
    x = integer_valued((sum(counts), width), np.dtype("f8"), "sum", comm.rank)
    got = comm.reduce_scatter(x, counts=counts, algorithm=algorithm)
    agree(comm, same(got, mpi_reduce_scatter(comm.mpi, x, "sum", counts)), f"{counts} {algorithm}")


@given(data=st.data(), algorithm=st.sampled_from(pc.algorithms("allgather")))
def test_allgather_any_lengths(comm, data, algorithm):
    lengths = data.draw(st.lists(st.integers(0, 6), min_size=comm.size, max_size=comm.size))
    x = integer_valued((lengths[comm.rank], 2), np.dtype("i4"), "sum", comm.rank)
    agree(comm, same(comm.allgather(x, algorithm=algorithm), mpi_allgather(comm.mpi, x)), f"{lengths} {algorithm}")


@given(data=st.data(), algorithm=st.sampled_from(pc.algorithms("alltoall")))
def test_alltoall_any_matrix(comm, data, algorithm):
    matrix = data.draw(st.lists(st.lists(st.integers(0, 4), min_size=comm.size, max_size=comm.size),
                                min_size=comm.size, max_size=comm.size))
    counts = matrix[comm.rank]
    x = integer_valued((sum(counts),), np.dtype("u2"), "sum", comm.rank)
    got = comm.alltoall(x, counts=counts, algorithm=algorithm)
    agree(comm, same(got, mpi_alltoall(comm.mpi, x, counts)), f"{matrix} {algorithm}")

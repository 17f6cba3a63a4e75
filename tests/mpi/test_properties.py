"""Properties that hold for every input Hypothesis draws, on integer-valued data (exact in every dtype).

Settings come from the conftest profile (derandomized, no database); everything is drawn from
``st.data()`` without reference to the rank, so every rank draws the same example, and every
check goes through ``agree`` so all ranks pass, fail and shrink together.

- pycollect equals MPI's own collective for random counts, dtypes, ops and algorithms;
- allreduce(x) == allgather(reduce_scatter(x, counts)) along axis 0;
- alltoall, then alltoall of the result with the transposed counts, gives the input back;
- broadcast from any root gives the root's data (computed here from the root's seed);
- reduce to any root equals allreduce there (None elsewhere).
"""
from hypothesis import given, settings
from hypothesis import strategies as st

import pycollect as pc
from helpers import (DTYPES, agree, integer_valued, mpi_allgather, mpi_allreduce, mpi_alltoall,
                     mpi_reduce_scatter, ops_for, same)
from pycollect.engine.layout import split_even
from pycollect.engine.mpi_native import supports as mpi_supports

REDUCING = ("allreduce", "reduce_scatter", "reduce")


def algorithm_for(data, collective, dtype):
    """An algorithm that can run ``dtype`` ("mpi" cannot reduce or move float16 and bfloat16)."""
    names = [a for a in pc.algorithms(collective) if a != "mpi" or mpi_supports(dtype)]
    return data.draw(st.sampled_from(names), label=f"{collective} algorithm")


def draw_case(data, size, reducing=True):
    dtype = data.draw(st.sampled_from(DTYPES), label="dtype")
    op = data.draw(st.sampled_from(ops_for(dtype)), label="op") if reducing else "sum"
    tail = data.draw(st.lists(st.integers(0, 3), max_size=2).map(tuple), label="trailing shape")
    counts = data.draw(st.lists(st.integers(0, 5), min_size=size, max_size=size), label="rows per rank")
    seed = data.draw(st.integers(0, 10_000), label="seed")
    return dtype, op, tail, counts, seed


def unchanged(x, before) -> bool:
    return x.tobytes() == before.tobytes()


@settings(max_examples=150)
@given(data=st.data())
def test_pycollect_equals_mpi(comm, data):
    size, rank = comm.size, comm.rank
    collective = data.draw(st.sampled_from(("allreduce", "reduce_scatter", "allgather", "alltoall", "broadcast",
                                            "reduce")), label="collective")
    dtype, op, tail, counts, seed = draw_case(data, size, collective in REDUCING)
    algorithm = algorithm_for(data, collective, dtype)
    given_counts = data.draw(st.booleans(), label="pass counts")
    root = data.draw(st.integers(0, size - 1), label="root")
    rows = sum(counts)
    if collective == "allreduce":
        # float32 accumulation rounds an average differently from the float16 reference: sums and the like only
        accumulate = data.draw(st.sampled_from([None, "float32"] if op != "avg" else [None]), label="accumulate")
        x = integer_valued((rows, *tail), dtype, op, seed + rank)
        expected = mpi_allreduce(comm.mpi, x, op)
        got = comm.allreduce(x, op=op, algorithm=algorithm, accumulate=accumulate)
    elif collective == "reduce_scatter":
        x = integer_valued((rows, *tail), dtype, op, seed + rank)
        expected = mpi_reduce_scatter(comm.mpi, x, op, counts if given_counts else split_even(rows, size))
        got = comm.reduce_scatter(x, op=op, counts=counts if given_counts else None, algorithm=algorithm)
    elif collective == "allgather":
        x = integer_valued((counts[rank], *tail), dtype, op, seed + rank)
        expected = mpi_allgather(comm.mpi, x)
        got = comm.allgather(x, algorithm=algorithm, counts=counts if given_counts else None)
    elif collective == "alltoall":
        matrix = data.draw(st.lists(st.lists(st.integers(0, 4), min_size=size, max_size=size),
                                    min_size=size, max_size=size), label="rows rank i sends rank j")
        send = matrix[rank] if given_counts else split_even(rows, size)
        x = integer_valued((sum(send), *tail), dtype, op, seed + rank)
        expected = mpi_alltoall(comm.mpi, x, send)
        got = comm.alltoall(x, counts=send if given_counts else None, algorithm=algorithm)
    elif collective == "broadcast":
        x = integer_valued((rows, *tail), dtype, op, seed + rank)
        expected = integer_valued((rows, *tail), dtype, op, seed + root)
        got = comm.broadcast(x, root=root, algorithm=algorithm)
    else:
        x = integer_valued((rows, *tail), dtype, op, seed + rank)
        total = mpi_allreduce(comm.mpi, x, op)
        expected = total if rank == root else None
        got = comm.reduce(x, root=root, op=op, algorithm=algorithm)
    before = integer_valued(x.shape, dtype, op, seed + rank)
    agree(comm, same(got, expected) and unchanged(x, before),
          f"{collective} {algorithm} {dtype} {op} tail={tail} counts={counts} given={given_counts} root={root}")


@settings(max_examples=60)
@given(data=st.data())
def test_allreduce_is_allgather_of_reduce_scatter(comm, data):
    size, rank = comm.size, comm.rank
    dtype, op, tail, counts, seed = draw_case(data, size)
    rs, ag, ar = (algorithm_for(data, c, dtype) for c in ("reduce_scatter", "allgather", "allreduce"))
    gather_counts = data.draw(st.booleans(), label="allgather told the counts")
    x = integer_valued((sum(counts), *tail), dtype, op, seed + rank)
    block = comm.reduce_scatter(x, op=op, counts=counts, algorithm=rs)
    whole = comm.allgather(block, algorithm=ag, counts=counts if gather_counts else None)
    agree(comm, same(whole, comm.allreduce(x, op=op, algorithm=ar)),
          f"allgather[{ag}](reduce_scatter[{rs}]) != allreduce[{ar}]: {dtype} {op} counts={counts} tail={tail}")


@settings(max_examples=60)
@given(data=st.data())
def test_alltoall_with_transposed_counts_is_its_own_inverse(comm, data):
    size, rank = comm.size, comm.rank
    dtype, _, tail, _, seed = draw_case(data, size, reducing=False)
    matrix = data.draw(st.lists(st.lists(st.integers(0, 4), min_size=size, max_size=size),
                                min_size=size, max_size=size), label="rows rank i sends rank j")
    there, back = algorithm_for(data, "alltoall", dtype), algorithm_for(data, "alltoall", dtype)
    even = data.draw(st.booleans(), label="even split there")
    send = split_even(sum(matrix[0]), size) if even else matrix[rank]
    received = [split_even(sum(matrix[0]), size)[rank]] * size if even else [row[rank] for row in matrix]
    x = integer_valued((sum(send), *tail), dtype, "sum", seed + rank)
    y = comm.alltoall(x, counts=None if even else send, algorithm=there)
    z = comm.alltoall(y, counts=received, algorithm=back)
    agree(comm, y.shape[0] == sum(received) and same(z, x),
          f"alltoall {there} then {back}: {dtype} matrix={matrix} even={even} tail={tail}")


@settings(max_examples=50)
@given(data=st.data())
def test_broadcast_from_any_root(comm, data):
    size, rank = comm.size, comm.rank
    dtype, _, tail, counts, seed = draw_case(data, size, reducing=False)
    root = data.draw(st.integers(0, size - 1), label="root")
    algorithm = algorithm_for(data, "broadcast", dtype)
    in_place = data.draw(st.booleans(), label="in place")
    x = integer_valued((sum(counts), *tail), dtype, "sum", seed + rank)
    root_data = integer_valued(x.shape, dtype, "sum", seed + root)
    got = comm.broadcast(x, root=root, algorithm=algorithm, out=x if in_place else None)
    own = integer_valued(x.shape, dtype, "sum", seed + rank)
    ok = same(got, root_data) and (got is x if in_place else unchanged(x, own))
    agree(comm, ok, f"broadcast {algorithm} root={root} {dtype} shape={x.shape} in_place={in_place}")


@settings(max_examples=50)
@given(data=st.data())
def test_reduce_to_any_root_is_allreduce_there(comm, data):
    size, rank = comm.size, comm.rank
    dtype, op, tail, counts, seed = draw_case(data, size)
    root = data.draw(st.integers(0, size - 1), label="root")
    red, ar = algorithm_for(data, "reduce", dtype), algorithm_for(data, "allreduce", dtype)
    x = integer_valued((sum(counts), *tail), dtype, op, seed + rank)
    got = comm.reduce(x, root=root, op=op, algorithm=red)
    everywhere = comm.allreduce(x, op=op, algorithm=ar)
    agree(comm, same(got, everywhere if rank == root else None),
          f"reduce[{red}] to {root} != allreduce[{ar}]: {dtype} {op} shape={x.shape}")

"""What the lean paths remember between calls (comm.py: allreduce's last lookup and last (x, out) pair that passed
``mpi_native.lean_out``; reduce_scatter's, alltoall's and allgather's last call that went to MPI) never lets a call
through that the checks would refuse.

Each test first makes a call that passes and is remembered, then changes what a caller can change (the same
``out`` made read-only, reshaped, given another dtype; a freed ``out`` replaced by another array, possibly at
the same id; another op) and checks that the next call raises as the general path does, or gives MPI's result.
"""
import numpy as np
import pytest

from helpers import (agree, in_step, integer_valued, mpi_allgather, mpi_allreduce, mpi_alltoall, mpi_reduce_scatter,
                     raises, same)


def x_of(n=8, dtype="f4", seed=0):
    return integer_valued((n,), np.dtype(dtype), "sum", seed)


def remembered(comm, x, out):
    """A call that passes (and is remembered), checked against MPI's own."""
    got = comm.allreduce(x, out=out)
    agree(comm, got is out and same(out, mpi_allreduce(comm.mpi, x, "sum")), "the first call")


def test_same_out_made_read_only_raises(comm):
    x, out = x_of(seed=comm.rank), np.zeros(8, np.float32)
    remembered(comm, x, out)
    out.flags.writeable = False
    raises(comm, lambda: comm.allreduce(x, out=out), ValueError, ["allreduce: out is read-only"], [x, out])
    out.flags.writeable = True
    remembered(comm, x, out)


def test_same_out_reshaped_or_retyped_in_place_raises(comm):
    x, out = x_of(seed=comm.rank), np.zeros(8, np.float32)
    remembered(comm, x, out)
    out.shape = (2, 4)
    raises(comm, lambda: comm.allreduce(x, out=out), ValueError, ["allreduce: out has shape (2, 4), expected (8,)"],
           [x, out])
    out.shape = (8,)
    remembered(comm, x, out)
    out.dtype = np.int32   # same itemsize: the same bytes, another dtype
    raises(comm, lambda: comm.allreduce(x, out=out), TypeError, ["allreduce: out has dtype int32, expected float32"],
           [x, out])


def test_freed_out_replaced_at_the_same_id_raises(comm):
    """A freed ``out``'s id may come back for another array: the memory of the pair must not match it."""
    x = x_of(seed=comm.rank)
    out = np.zeros(8, np.float32)
    remembered(comm, x, out)
    freed = id(out)
    del out
    kept = []   # arrays that did not land at the freed id stay alive, so the next one may
    for _ in range(1000):
        other = np.zeros((2, 4), np.float32)
        if id(other) == freed:
            break
        kept.append(other)
    raises(comm, lambda: comm.allreduce(x, out=other), ValueError, ["allreduce: out has shape (2, 4), expected (8,)"],
           [x, other])
    remembered(comm, x, np.zeros(8, np.float32))   # a fresh, right out: the call goes through again


def test_remembered_out_with_another_x_that_overlaps_it(comm):
    """The pair is remembered, not ``out`` alone: an ``x`` that overlaps the remembered ``out`` is checked again."""
    buf = integer_valued((24,), np.dtype("i8"), "sum", comm.rank)
    x, out = buf[:8], buf[12:20]
    remembered(comm, x, out)
    overlapping = buf[8:16]                  # half of it is out's first half
    expected = mpi_allreduce(comm.mpi, overlapping.copy(), "sum")
    got = comm.allreduce(overlapping, out=out)
    agree(comm, got is out and same(out, expected), "an x overlapping the remembered out")
    in_step(comm)


def test_in_place_then_apart_then_strided(comm):
    x = x_of(seed=comm.rank)
    for _ in range(3):   # in place, repeated: each call reduces the last result
        expected = mpi_allreduce(comm.mpi, x.copy(), "sum")
        agree(comm, comm.allreduce(x, out=x) is x and same(x, expected), "in place")
    x = x_of(seed=comm.rank)
    out = np.zeros(8, np.float32)
    remembered(comm, x, out)
    strided = np.zeros(16, np.float32)[::2]
    got = comm.allreduce(x, out=strided)
    agree(comm, got is strided and same(strided, mpi_allreduce(comm.mpi, x, "sum")), "a strided out after a lean one")


@pytest.mark.parametrize("dtype", ["f4", "i8"])
def test_the_remembered_lookup_follows_op_and_dtype(comm, dtype):
    x = x_of(dtype=dtype, seed=comm.rank)
    for op in ("sum", "max", "sum", "min", "prod"):
        agree(comm, same(comm.allreduce(x, op=op), mpi_allreduce(comm.mpi, x, op)), f"op {op}")
    y = x.copy()
    y.dtype = np.float16 if dtype == "f4" else np.int32   # in place: another dtype (half, or a narrower int)
    agree(comm, same(comm.allreduce(y), comm.allreduce(y, algorithm="ring")), f"x retyped to {y.dtype}")
    raises(comm, lambda: comm.allreduce(x, op="bogus"), ValueError, ["allreduce: unknown op 'bogus'"], [x])
    raises(comm, lambda: comm.allreduce(x, op=["sum"]), ValueError, ["allreduce: unknown op"], [x])


# -- reduce_scatter, alltoall and allgather with counts: the last call that went to MPI is remembered too --------
ROWS = 2   # rows per rank of each block


def lean_call(comm, collective, x, out=None):
    """``collective`` on ``x`` (``ROWS`` rows a block) and its reference from MPI's own, as (got, expected)."""
    p = comm.size
    if collective == "reduce_scatter":
        return comm.reduce_scatter(x, out=out), mpi_reduce_scatter(comm.mpi, x, "sum", [x.shape[0] // p] * p)
    if collective == "alltoall":
        return comm.alltoall(x, out=out), mpi_alltoall(comm.mpi, x.copy(), [x.shape[0] // p] * p)
    return comm.allgather(x, out=out, counts=[x.shape[0]] * p), mpi_allgather(comm.mpi, x)


def input_of(comm, collective, dtype="f4", seed=0):
    rows = ROWS if collective == "allgather" else ROWS * comm.size
    return integer_valued((rows, 3), np.dtype(dtype), "sum", seed + comm.rank)


def out_of(comm, collective, x):
    rows = {"reduce_scatter": x.shape[0] // comm.size, "alltoall": x.shape[0], "allgather": x.shape[0] * comm.size}
    return np.zeros((rows[collective],) + x.shape[1:], x.dtype)


def repeated(comm, collective, x, out, what):
    got, expected = lean_call(comm, collective, x, out)
    agree(comm, (out is None or got is out) and same(got, expected), what)


@pytest.mark.parametrize("collective", ["reduce_scatter", "alltoall", "allgather"])
def test_the_remembered_call_checks_again_what_a_caller_changes(comm, collective):
    x = input_of(comm, collective)
    out = out_of(comm, collective, x)
    for _ in range(2):   # the second call repeats the first
        repeated(comm, collective, x, out, "the first and a repeated call")
    out.flags.writeable = False
    raises(comm, lambda: lean_call(comm, collective, x, out), ValueError, [f"{collective}: out is read-only"], [x, out])
    out.flags.writeable = True
    repeated(comm, collective, x, out, "writeable again")
    shape = out.shape
    out.shape = (out.size,)
    raises(comm, lambda: lean_call(comm, collective, x, out), ValueError, [f"{collective}: out has shape"], [x, out])
    out.shape = shape
    repeated(comm, collective, x, out, "reshaped back")
    out.dtype = np.int32   # same itemsize: the same bytes, another dtype
    raises(comm, lambda: lean_call(comm, collective, x, out), TypeError, [f"{collective}: out has dtype int32"], [x, out])


@pytest.mark.parametrize("collective", ["reduce_scatter", "alltoall", "allgather"])
def test_the_remembered_call_follows_x_reshaped_or_retyped_in_place(comm, collective):
    x = input_of(comm, collective, "i8")
    for _ in range(2):
        repeated(comm, collective, x, None, "a new result, repeated")
    x.shape = (x.shape[0] * 3 // ROWS, ROWS)    # the same bytes in other rows: blocks of 3 rows
    repeated(comm, collective, x, None, "x reshaped in place")
    x.dtype = np.float64                         # the same bytes as another dtype (integer-valued floats are tiny)
    x[...] = integer_valued(x.shape, x.dtype, "sum", comm.rank)
    repeated(comm, collective, x, None, "x retyped in place")
    out = out_of(comm, collective, x)
    repeated(comm, collective, x, out, "into out")
    freed = id(out)
    del out
    kept = []   # a freed out's id may come back for another array: the remembered pair must not match it
    for _ in range(1000):
        other = np.zeros(3, np.float64)
        if id(other) == freed:
            break
        kept.append(other)
    raises(comm, lambda: lean_call(comm, collective, x, other), ValueError, [f"{collective}: out has shape"], [x, other])


def test_alltoall_in_place_repeated(comm):
    x = input_of(comm, "alltoall", "i8")
    for _ in range(3):
        expected = mpi_alltoall(comm.mpi, x.copy(), [x.shape[0] // comm.size] * comm.size)
        agree(comm, comm.alltoall(x, out=x) is x and same(x, expected), "in place, repeated")


def test_a_freed_communicator_refuses_every_call_on_every_rank(comm):
    """After ``free()`` the lean paths (which remembered calls before), the general ones and the groups' makers
    raise, before MPI."""
    import pycollect as pc
    mine = pc.Communicator(comm.mpi)
    x, out = input_of(comm, "alltoall"), None
    out = out_of(comm, "alltoall", x)
    for _ in range(2):   # remembered by every lean path
        mine.allreduce(x, out=out)
        mine.alltoall(x, out=out)
        mine.reduce_scatter(x)
        mine.allgather(x, counts=[x.shape[0]] * comm.size)
    mine.free()
    calls = [lambda: mine.allreduce(x, out=out), lambda: mine.allreduce(x), lambda: mine.alltoall(x, out=out),
             lambda: mine.reduce_scatter(x), lambda: mine.allgather(x, counts=[x.shape[0]] * comm.size),
             lambda: mine.allgather(x), lambda: mine.broadcast(x), lambda: mine.barrier(),
             lambda: mine.iallreduce(x), lambda: mine.send(x, comm.rank), lambda: mine.irecv(out, comm.rank),
             lambda: mine.split(0), lambda: mine.sub([0]), lambda: mine.cartesian([comm.size]),
             lambda: mine.shared_empty(4)]
    for call in calls:
        raises(comm, call, RuntimeError, ["Communicator was freed"], [x, out])
    with mine.record():   # a recording's end rebuilt the lean paths: MPI's own then ran on the freed communicator
        pass
    for call in calls[:5]:
        raises(comm, call, RuntimeError, ["Communicator was freed"], [x, out])

"""Validation mode: ranks that pass different arguments all raise, with a message naming what differs.

Rank 0 is the odd one out in every mismatch, so the message reads the same at every world
size: "rank 0 passed dtype float32, ranks 1-3 passed float64" (at two ranks, "rank 1 passed
float64"). The validated Communicator also has a watchdog, so a mismatch that slipped
through ends the job in seconds instead of hanging it.
"""
import re

import numpy as np
import pytest

import pycollect as pc
from helpers import agree, integer_valued, mpi_allgather, mpi_allreduce, mpi_alltoall, mpi_reduce_scatter, same
from pycollect.engine.layout import split_even
from pycollect.engine.validate import ranks_text

MISMATCH = pc.CollectiveMismatchError


@pytest.fixture(scope="module")
def vcomm():
    c = pc.Communicator(validate=True, timeout=120)
    yield c
    c.free()


@pytest.fixture
def two(vcomm):
    if vcomm.size < 2:
        pytest.skip("a mismatch needs two ranks")
    return vcomm


def others(size: int) -> str:
    """How the message names ranks 1..size-1."""
    return "rank 1" if size == 2 else f"ranks 1-{size - 1}"


def raised(vcomm, call) -> Exception:
    with pytest.raises((ValueError, TypeError)) as info:
        call()
    return info.value


def expect_everywhere(vcomm, call, collective: str, detail: str, own=None) -> None:
    """Every rank raises; the message is "<collective> #<seq>: <detail>" with the same seq everywhere.

    ``own``: (rank, exception type, message) of a rank whose own argument check fails; it raises that.
    """
    err = raised(vcomm, call)
    if own is not None and vcomm.rank == own[0]:
        ok = type(err) is own[1] and str(err) == own[2]
        seq = -1
    else:
        m = re.fullmatch(rf"{collective} #(\d+): (.*)", str(err))
        ok = type(err) is MISMATCH and m is not None and m.group(2) == detail
        seq = int(m.group(1)) if m else -2
    seqs = {s for s in vcomm.mpi.allgather(seq) if s != -1}
    agree(vcomm, ok and len(seqs) == 1, f"rank {vcomm.rank} raised {type(err).__name__}: {err}")
    still_in_step(vcomm)


def still_in_step(vcomm) -> None:
    """After an error every rank is at the same call and the communicator works."""
    got = vcomm.allreduce(np.full(3, vcomm.rank, np.int64), algorithm="ring")
    agree(vcomm, same(got, np.full(3, sum(range(vcomm.size)), np.int64)), "allreduce after a mismatch")


# -- what differs ---------------------------------------------------------------------------------------
def test_dtype(two):
    dtype = np.float32 if two.rank == 0 else np.float64
    expect_everywhere(two, lambda: two.allreduce(np.ones(4, dtype)), "allreduce",
                      f"rank 0 passed dtype float32, {others(two.size)} passed float64")


def test_shape(two):
    shape = (3, 2) if two.rank == 0 else (2, 3)
    expect_everywhere(two, lambda: two.allreduce(np.ones(shape), algorithm="ring"), "allreduce",
                      f"rank 0 passed shape (3, 2), {others(two.size)} passed (2, 3)")


def test_shape_beyond_axis_0_for_allgather(two):
    """Allgather blocks may differ in rows, not in the other axes."""
    x = np.ones((two.rank + 1, 3 if two.rank == 0 else 2))
    expect_everywhere(two, lambda: two.allgather(x), "allgather",
                      f"rank 0 passed shape (*, 3), {others(two.size)} passed (*, 2)")


def test_op(two):
    op = "max" if two.rank == 0 else "sum"
    expect_everywhere(two, lambda: two.allreduce(np.ones(4), op=op), "allreduce",
                      f"rank 0 passed op max, {others(two.size)} passed sum")


def test_root(two):
    root = 1 if two.rank == 0 else 0
    expect_everywhere(two, lambda: two.broadcast(np.ones(4), root=root), "broadcast",
                      f"rank 0 passed root 1, {others(two.size)} passed 0")
    expect_everywhere(two, lambda: two.reduce(np.ones(4), root=np.int64(root), algorithm="binomial"), "reduce",
                      f"rank 0 passed root 1, {others(two.size)} passed 0")


def test_counts(two):
    n = two.size
    counts = [2] * n if two.rank == 0 else [1] * (n - 1) + [n + 1]
    expect_everywhere(two, lambda: two.reduce_scatter(np.ones(2 * n), counts=counts), "reduce_scatter",
                      f"rank 0 passed counts {[2] * n}, {others(n)} passed {[1] * (n - 1) + [n + 1]}")


def test_counts_given_on_some_ranks_only(two):
    """Alltoall counts differ between ranks by design, but every rank must give them or none."""
    n = two.size
    counts = [1] * n if two.rank == 0 else None
    expect_everywhere(two, lambda: two.alltoall(np.ones(n), counts=counts), "alltoall",
                      f"rank 0 passed counts {[1] * n}, {others(n)} passed None")


def test_count_matrices_differ(two):
    """A whole count matrix must be the same on every rank (a row of counts may differ)."""
    n = two.size
    ones, skewed = [[1] * n for _ in range(n)], [[0] * (n - 1) + [n]] + [[1] * n for _ in range(n - 1)]
    mine = ones if two.rank == 0 else skewed
    flat = lambda m: [c for row in m for c in row]  # noqa: E731
    expect_everywhere(two, lambda: two.alltoall(np.ones(n), counts=mine), "alltoall",
                      f"rank 0 passed counts {flat(ones)}, {others(n)} passed {flat(skewed)}")


def test_algorithm(two):
    algorithm = "ring" if two.rank == 0 else "auto"
    expect_everywhere(two, lambda: two.allreduce(np.ones(4), algorithm=algorithm), "allreduce",
                      f"rank 0 passed algorithm ring, {others(two.size)} passed auto")


def test_collective(two):
    x = np.ones(4)
    mine = "allgather" if two.rank == 0 else "allreduce"
    expect_everywhere(two, lambda: getattr(two, mine)(x), mine,
                      f"rank 0 called allgather, {others(two.size)} called allreduce")


def test_barrier_against_a_collective(two):
    mine = "barrier" if two.rank == 0 else "allreduce"
    call = two.barrier if two.rank == 0 else (lambda: two.allreduce(np.ones(2)))
    expect_everywhere(two, call, mine, f"rank 0 called barrier, {others(two.size)} called allreduce")


def test_nonblocking_mismatch_raises_from_wait_before_anything_moves(two):
    """A non-blocking call returns before the fingerprints are compared (it never blocks); the mismatch is raised
    by ``wait()`` on every rank, before the schedule starts."""
    dtype = np.float32 if two.rank == 0 else np.float64
    expect_everywhere(two, lambda: two.iallreduce(np.ones(4, dtype), algorithm="ring").wait(), "allreduce",
                      f"rank 0 passed dtype float32, {others(two.size)} passed float64")


FORMS = "(every rank makes a call in the same form: MPI's own do not match a blocking collective with a non-blocking one)"


@pytest.mark.parametrize("algorithm", ["auto", "binomial"])
def test_blocking_on_one_rank_non_blocking_on_the_others(two, algorithm):
    """Rank 0 broadcasts, the others ibroadcast: MPI's own do not match the two (a hang), and the details' exchange
    would run on a different communicator for each form, so every rank raises from the fingerprints alone (the
    non-blocking ones from wait()); with a dtype that differs too, and with rank 0's own arguments failing, which
    rank 0 raises."""
    x = np.arange(5.0)
    call = (lambda: two.broadcast(x, algorithm=algorithm)) if two.rank == 0 else \
        (lambda: two.ibroadcast(x, algorithm=algorithm).wait())
    expect_everywhere(two, call, "broadcast", f"rank 0 called it blocking, {others(two.size)} non-blocking {FORMS}")
    y, reducing = np.arange(5, dtype=np.float32 if two.rank == 0 else np.float64), algorithm.replace("binomial", "tree")
    call = (lambda: two.allreduce(y, algorithm=reducing)) if two.rank == 0 else \
        (lambda: two.iallreduce(y, algorithm=reducing).wait())
    expect_everywhere(two, call, "allreduce", f"rank 0 called it blocking, {others(two.size)} non-blocking {FORMS}; "
                      "their calls differ in dtype too")
    own = "allreduce: unknown op 'summ'; expected one of sum, avg, prod, min, max, band, bor, bxor, land, lor, lxor, " \
          "minloc, maxloc, a NumPy binary ufunc or a pycollect.Op"
    call = (lambda: two.allreduce(x, op="summ")) if two.rank == 0 else (lambda: two.iallreduce(x).wait())
    expect_everywhere(two, call, "allreduce", f"rank 0 called it blocking, {others(two.size)} non-blocking {FORMS}; "
                      "their calls differ in op too; rank 0 failed its argument checks", own=(0, ValueError, own))


def test_several_fields_at_once(two):
    x = np.ones(4, np.float32) if two.rank == 0 else np.ones(5)
    expect_everywhere(two, lambda: two.allreduce(x), "allreduce",
                      f"rank 0 passed dtype float32, {others(two.size)} passed float64; "
                      f"rank 0 passed shape (4,), {others(two.size)} passed (5,)")


# -- a check that fails on one rank only ----------------------------------------------------------------
def test_bad_out_on_one_rank(two):
    bad = two.size - 1
    out = np.empty(4) if two.rank == bad else None
    message = "allreduce: out has shape (4,), expected (3,)"
    expect_everywhere(two, lambda: two.allreduce(np.ones(3), out=out), "allreduce",
                      f"rank {bad} failed its argument checks: {message}", own=(bad, ValueError, message))


def test_bad_out_dtype_on_one_rank(two):
    out = np.empty(3, np.float32) if two.rank == 0 else None
    message = "broadcast: out has dtype float32, expected float64"
    expect_everywhere(two, lambda: two.broadcast(np.ones(3), out=out), "broadcast",
                      f"rank 0 failed its argument checks: {message}", own=(0, TypeError, message))


def test_allgather_out_rows_known_only_after_the_exchange(two):
    """Without counts the rows of ``out`` are checked from the fingerprints, on every rank at once."""
    total = sum(range(1, two.size + 1))
    out = np.empty((total + 1, 2)) if two.rank == 0 else None
    message = f"allgather: out has shape ({total + 1}, 2), expected ({total}, 2)"
    expect_everywhere(two, lambda: two.allgather(np.ones((two.rank + 1, 2)), out=out), "allgather",
                      f"rank 0 failed its argument checks: {message}", own=(0, ValueError, message))


def test_alltoall_out_rows_with_counts(two):
    n = two.size
    out = np.empty(n + 1) if two.rank == 0 else None
    message = f"alltoall: out has shape ({n + 1},), expected ({n},)"
    expect_everywhere(two, lambda: two.alltoall(np.ones(n), counts=[1] * n, out=out), "alltoall",
                      f"rank 0 failed its argument checks: {message}", own=(0, ValueError, message))


def test_same_bad_argument_everywhere_raises_it_everywhere(vcomm):
    err = raised(vcomm, lambda: vcomm.allreduce(np.ones(3), op="mean"))
    agree(vcomm, type(err) is ValueError and "mean" in str(err), str(err))
    still_in_step(vcomm)


# -- matching calls run as usual -------------------------------------------------------------------------
def test_matching_calls_pass_and_are_correct(vcomm):
    size, rank = vcomm.size, vcomm.rank
    x = integer_valued((2 * size + 1, 2), np.dtype("i8"), "sum", rank)
    ok = same(vcomm.allreduce(x, algorithm="ring"), mpi_allreduce(vcomm.mpi, x, "sum"))
    ok = ok and same(vcomm.allreduce(x), mpi_allreduce(vcomm.mpi, x, "sum"))
    half = np.ones(5, np.float16)
    ok = ok and same(vcomm.allreduce(half, accumulate="float32"), np.full(5, size, np.float16))
    part = integer_valued((rank + 1, 3), np.dtype("f4"), "sum", rank)
    ok = ok and same(vcomm.allgather(part, algorithm="bruck"), mpi_allgather(vcomm.mpi, part))
    ok = ok and same(vcomm.allgather(part, counts=list(range(1, size + 1))), mpi_allgather(vcomm.mpi, part))
    rows = [(rank + j) % 3 for j in range(size)]
    y = integer_valued((sum(rows), 2), np.dtype("f8"), "sum", rank)
    ok = ok and same(vcomm.alltoall(y, counts=rows, algorithm="pairwise"), mpi_alltoall(vcomm.mpi, y, rows))
    z = integer_valued((2 * size,), np.dtype("i4"), "sum", rank)
    ok = ok and same(vcomm.alltoall(z), mpi_alltoall(vcomm.mpi, z, split_even(2 * size, size)))
    root = size - 1
    b = vcomm.broadcast(np.full(4, rank, np.int32), root=root, algorithm="binomial")
    ok = ok and same(b, np.full(4, root, np.int32))
    r = vcomm.reduce(np.full(4, 1, np.int32), root=root)
    ok = ok and (same(r, np.full(4, size, np.int32)) if rank == root else r is None)
    vcomm.barrier()
    reqs = [vcomm.iallreduce(x, algorithm="tree"), vcomm.ireduce_scatter(x, algorithm="pairwise"),
            vcomm.iallgather(part), vcomm.ialltoall(z, algorithm="bruck")]
    results = pc.wait_all(reqs)
    ok = ok and same(results[0], mpi_allreduce(vcomm.mpi, x, "sum"))
    ok = ok and same(results[1], mpi_reduce_scatter(vcomm.mpi, x, "sum", split_even(x.shape[0], size)))
    ok = ok and same(results[2], mpi_allgather(vcomm.mpi, part))
    ok = ok and same(results[3], mpi_alltoall(vcomm.mpi, z, split_even(2 * size, size)))
    agree(vcomm, ok, "validated collectives")


def test_gather_scatter_validated(vcomm):
    """Validated and watched: rows read from the fingerprints (no exchange of their own) where counts are not
    given, blocking and not; counts and displs given; then displs that differ on rank 0 raise on every rank."""
    size, rank = vcomm.size, vcomm.rank
    root = size - 1
    part = integer_valued((rank % 3, 2), np.dtype("f8"), "sum", rank)
    whole = mpi_allgather(vcomm.mpi, part)
    got = [vcomm.gather(part, root=root), vcomm.igather(part, root=root, algorithm="binomial").wait(),
           vcomm.gather(part, root=root, algorithm="linear", counts=[r % 3 for r in range(size)])]
    ok = all(same(g, whole) if rank == root else g is None for g in got)
    even = np.arange(4 * size, dtype=np.int32).reshape(2 * size, 2)
    mine = even[2 * rank:2 * rank + 2]
    got = [vcomm.scatter(even if rank == root else None, root=root, out=None if rank == root else np.empty((2, 2),
                                                                                                      np.int32)),
           vcomm.iscatter(even, root=root, algorithm="binomial").wait(),
           vcomm.scatter(even, root=root, algorithm="linear", counts=[1] * size, displs=[2 * r for r in range(size)])]
    ok = ok and same(got[0], mine) and same(got[1], mine) and same(got[2], mine[:1])
    agree(vcomm, ok, "validated gather and scatter")
    if size > 1:
        displs = [2 * r + (rank == 0) for r in range(size)]
        err = raised(vcomm, lambda: vcomm.gather(np.ones((1, 2)), counts=[1] * size, displs=displs))
        agree(vcomm, type(err) is MISMATCH and "gather #" in str(err)
              and f"rank 0 passed counts {[1] * size} with displs {displs if rank == 0 else [d + 1 for d in displs]}"
              in str(err), str(err))
        still_in_step(vcomm)


def test_ranks_text():
    assert ranks_text([3]) == "rank 3"
    assert ranks_text([0, 1, 2]) == "ranks 0-2"
    assert ranks_text([0, 2, 3]) == "ranks 0, 2-3"
    assert ranks_text([1, 3, 5, 6, 7]) == "ranks 1, 3, 5-7"

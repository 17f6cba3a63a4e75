"""Every algorithm of every collective through the grid, each result compared with MPI's own collective.

Inputs are integer-valued (exact in every dtype whatever the reduction order), so results
must be equal; ``test_float_tolerance`` covers random floats with a tolerance.
"""
import ml_dtypes
import numpy as np
import pytest
from mpi4py import MPI

import pycollect as pc
from helpers import (DTYPES, MPI_OPS, agree, integer_valued, mpi_allgather, mpi_allreduce, mpi_alltoall,
                     mpi_reduce_scatter, ops_for, pairs_by_hand, raises, same, verdicts, wide)
from pycollect.algorithms.rank_order import in_rank_order, keeps_rank_order
from pycollect.engine import mpi_native
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


@pytest.mark.parametrize("algorithm", algorithms("allgather"))
def test_allgather_in_place_fills_out_where_it_lies(comm, algorithm):
    """The in-place allgather (``x`` is ``out``'s block ``rank``) with even, uneven and mostly empty blocks, with
    and without ``counts``, blocking and two non-blocking calls in flight completed last first, against MPI's
    Allgatherv: the result is ``out`` itself, and nothing beside ``out`` in its base array is written."""
    size, rank = comm.size, comm.rank
    with verdicts(comm) as check:
        for seed, rows in enumerate(([3] * size, [(i * 5 + 2) % 4 for i in range(size)],
                                     [2 if i == size - 1 else 0 for i in range(size)])):
            for dtype in (np.dtype("f8"), np.dtype("i2")):
                starts = np.cumsum([0, *rows])
                mine = integer_valued((rows[rank], 2), dtype, "sum", 40 + seed + rank)
                expected = mpi_allgather(comm.mpi, mine)
                bases, outs = [], []
                for k in range(2):
                    base = np.full((starts[-1] + 2, 2), -7, dtype)     # a guard row on each side of out
                    out = base[1:-1]
                    out[starts[rank]:starts[rank + 1]] = mine
                    bases.append(base)
                    outs.append(out)
                    counts = list(rows) if k else None
                    got = comm.allgather(out[starts[rank]:starts[rank + 1]], algorithm=algorithm, out=out,
                                         counts=counts)
                    check(got is out and same(out, expected), f"in place {algorithm} {dtype} rows={rows} counts={counts}")
                for out in outs:
                    out[...] = -1
                    out[starts[rank]:starts[rank + 1]] = mine
                first, second = (comm.iallgather(out[starts[rank]:starts[rank + 1]], algorithm=algorithm, out=out,
                                                 counts=list(rows)) for out in outs)
                done = [second.wait(), first.wait()]
                check(done[0] is outs[1] and done[1] is outs[0] and all(same(o, expected) for o in outs),
                      f"in place in flight {algorithm} {dtype} rows={rows}")
                check(all((b[0] == -7).all() and (b[-1] == -7).all() for b in bases),
                      f"in place {algorithm} wrote beside out")
                out = np.full((starts[-1], 2), -1, dtype)   # x inside out, but at block 0 on every rank
                out[:rows[rank]] = mine
                got = comm.allgather(out[:rows[rank]], algorithm=algorithm, out=out)
                check(got is out and same(out, expected), f"x at out's first block {algorithm} {dtype} rows={rows}")


@pytest.mark.parametrize("algorithm", algorithms("reduce_scatter"))
def test_reduce_scatter_in_place_fills_its_block_of_x(comm, algorithm):
    """The in-place reduce-scatter (``out`` is ``x``'s block ``rank``) with even, uneven and mostly empty blocks,
    sum and max, blocking and two non-blocking calls in flight completed last first, against MPI's
    Reduce_scatter: the result is ``out`` itself, ``x``'s other blocks and everything beside ``x`` keep what they
    held. And ``out`` at ``x``'s first block on every rank (MPI's in-place form, apart from ``rank`` 0's)."""
    size, rank = comm.size, comm.rank
    with verdicts(comm) as check:
        for seed, rows in enumerate(([3] * size, [(i * 5 + 2) % 4 for i in range(size)],
                                     [2 if i == size - 1 else 0 for i in range(size)])):
            starts = np.cumsum([0, *rows])
            mine = slice(starts[rank] + 1, starts[rank + 1] + 1)           # x's block rank, in the base
            for dtype, op in ((np.dtype("f8"), "sum"), (np.dtype("i2"), "max")):
                data = integer_valued((starts[-1], 2), dtype, op, 60 + seed + rank)
                expected = mpi_reduce_scatter(comm.mpi, data, op, rows)
                bases = [np.full((starts[-1] + 2, 2), -7, dtype) for _ in range(2)]   # a guard row each side of x
                for base, counts in zip(bases, (None if seed == 0 else list(rows), list(rows))):
                    base[1:-1] = data
                    got = comm.reduce_scatter(base[1:-1], op=op, counts=counts, out=base[mine], algorithm=algorithm)
                    check((got.size == 0 or np.shares_memory(got, base[mine])) and same(got, expected),
                          f"in place {algorithm} {dtype} {op} rows={rows} counts={counts}")
                    base[1:-1] = data
                first, second = (comm.ireduce_scatter(base[1:-1], op=op, counts=list(rows), out=base[mine],
                                                      algorithm=algorithm) for base in bases)
                done = [second.wait(), first.wait()]
                check(all(same(got, expected) for got in done), f"in place in flight {algorithm} {dtype} rows={rows}")
                for base in bases:
                    rest = np.delete(base, np.arange(mine.start, mine.stop), axis=0)
                    check(same(rest, np.concatenate([np.full((1, 2), -7, dtype), np.delete(data, np.arange(
                        starts[rank], starts[rank + 1]), axis=0), np.full((1, 2), -7, dtype)])),
                        f"in place {algorithm} {dtype} wrote beside its block")
                x = data.copy()
                got = comm.reduce_scatter(x, op=op, counts=list(rows), out=x[:rows[rank]], algorithm=algorithm)
                check(same(got, expected), f"out at x's first block {algorithm} {dtype} {op} rows={rows}")


def test_pipelined_schedules_take_their_scratch_from_the_pool(comm):
    """A pipelined tree of many rounds, each landing a segment in scratch, gives each round's buffer back as the
    round ends: once warm, repeated calls allocate nothing (held to the call's end, every round past the pool's
    few kept buffers was allocated afresh on every call, and large ones page-faulted each time)."""
    group = pc.Communicator(comm.mpi, tree_segment_bytes=1024)      # 64 KiB of float32: 64 segments
    x = integer_valued((1 << 14,), np.dtype("f4"), "sum", comm.rank)
    out = np.empty_like(x)
    expected = mpi_allreduce(comm.mpi, x, "sum")
    calls = [lambda: group.allreduce(x, algorithm="tree", out=out),
             lambda: group.reduce(x, root=0, algorithm="binomial", out=out),
             lambda: group.broadcast(x, root=0, algorithm="binomial", out=out)]
    for call in calls:
        call(), call()
    pool = group._runner.pool
    made = pool.made
    for call in calls:
        call(), call()
    group.allreduce(x, algorithm="tree", out=out)
    allocated = comm.mpi.allgather(pool.made - made)
    agree(comm, not any(allocated) and same(out, expected), f"arrays allocated once warm, by rank: {allocated}")
    group.free()


def test_one_byte_messages_cut_at_most_max_pieces(comm):
    """Segments of one byte (PYCOLLECT_SEGMENT_BYTES=1 meant for 1 MiB) cut a message into at most MAX_PIECES, the
    same on both ends: recursive doubling gives MPI's answer (the trees' own cut: test_engine)."""
    from pycollect.engine.layout import MAX_PIECES
    group = pc.Communicator(comm.mpi, segment_bytes=1)
    x = integer_valued((MAX_PIECES * 8 + 5,), np.dtype("f4"), "sum", comm.rank)
    expected = mpi_allreduce(comm.mpi, x, "sum")
    with verdicts(comm) as check:
        check(same(group.allreduce(x, algorithm="recursive_doubling"), expected), "allreduce")
    group.free()


def test_past_the_count_limit_of_an_mpi_3_library(comm, monkeypatch):
    """An MPI-3 library (Open MPI 5.0) takes at most 2**31-1 elements in one call; here the limit is lowered to 1000
    (engine/counts.py) and MPICH plays that library. Messages past it go as one element of a struct type of their
    bytes (send/recv, a shorter one still refused), a schedule's pieces stay within it, auto runs a schedule where
    MPI's own call would pass it and an explicit "mpi" is refused on every rank before anything is sent; below it MPI's
    own call runs as before. All against mpi4py's own calls (before 2026-12-05: MPI_ERR_ARG from mpi4py, or the job
    ended inside MPI's collective, under Open MPI at 2 GiB)."""
    from pycollect.engine import counts
    monkeypatch.setattr(counts, "LIMIT", 1000)
    monkeypatch.setattr(counts, "CHUNK", 256)
    r, p = comm.rank, comm.size
    c = pc.Communicator(comm.mpi, segment_bytes=0)   # whole messages but for the limit
    with verdicts(comm) as check:
        for n in (999, 1000, 1001, 4099):   # uint8 and float64: bytes past the limit; elements too from 1001
            for dtype in (np.uint8, np.float64):
                x = (np.arange(n) % 97 + r).astype(dtype)
                nxt, prv = (r + 1) % p, (r - 1) % p
                got = np.zeros(n, dtype)
                req = c.irecv(got, prv, tag=5)
                c.send(x, nxt, tag=5)
                check(same(req.wait(), (np.arange(n) % 97 + prv).astype(dtype)), f"send/recv {n} {dtype}")
                for collective, run, want in (
                        ("allreduce", lambda a: c.allreduce(x, algorithm=a), mpi_allreduce(comm.mpi, x, "sum")),
                        ("allgather", lambda a: c.allgather(x, algorithm=a), mpi_allgather(comm.mpi, x)),
                        ("broadcast", lambda a: c.broadcast(x, root=0, algorithm=a),
                         (np.arange(n) % 97).astype(dtype))):
                    check(same(run("auto"), want), f"{collective} auto {n} {dtype}")
                    total = n * (p if collective == "allgather" else 1)
                    try:
                        got, refused = run("mpi"), ""
                        check(total <= 1000 and same(got, want), f"{collective} mpi {n} {dtype}")
                    except ValueError as e:
                        refused = str(e)
                    check((total > 1000) == (f"{collective}: algorithm 'mpi' cannot take more than 1000 elements"
                                             in refused), f"{collective} mpi {n}: {refused!r}")
        short = np.zeros(1500, np.uint8)   # a shorter message past the limit: counted, refused
        req = c.irecv(short, (r - 1) % p, tag=6)
        c.send(np.ones(1200, np.uint8), (r + 1) % p, tag=6)
        try:
            req.wait()
            told = ""
        except ValueError as e:
            told = str(e)
        check("has 1200 bytes, but out (uint8(1500,)) has 1500" in told, f"short message: {told!r}")
        rows = [1000 if (i, j) == (0, p - 1) else 1 for i in range(p) for j in range(p)]   # one row past the limit
        matrix = [rows[i * p:(i + 1) * p] for i in range(p)]
        xv = np.arange(sum(matrix[r]), dtype=np.float32) + 10 * r
        check(same(c.alltoall(xv, counts=matrix), mpi_alltoall(comm.mpi, xv, matrix[r])), "uneven alltoall auto")
        # a non-commutative op past the limit: auto takes a schedule in rank order where one is, else says so
        first = pc.Op(lambda a, b, out: np.copyto(out, a), commute=False, name="first")
        xs = np.arange(1500.0) + r
        check(same(c.allreduce(xs, op=first), np.arange(1500.0)), "allreduce auto, non-commutative")
        try:
            c.reduce_scatter(xs, op=first)   # no schedule of reduce_scatter keeps rank order
            told = ""
        except ValueError as e:
            told = str(e)
        check("reduce_scatter: no algorithm here takes a non-commutative op on more than 1000 elements" in told,
              f"reduce_scatter: {told!r}")
    c.free()


class _CountSpy:
    """An MPI communicator's stand-in that notes the largest count or displacement handed to its v-calls."""

    V_CALLS = ("Allgatherv", "Iallgatherv", "Gatherv", "Igatherv", "Scatterv", "Iscatterv", "Alltoallv", "Ialltoallv")

    def __init__(self, inner):
        self.inner, self.largest = inner, 0

    def __getattr__(self, name):
        method = getattr(self.inner, name)
        if name not in self.V_CALLS:
            return method

        def noted(*args):
            for spec in args:
                if isinstance(spec, list) and len(spec) > 1 and isinstance(spec[1], tuple):
                    self.largest = max([self.largest, *spec[1][0], *spec[1][1]])
            return method(*args)
        return noted


def test_displacements_past_the_count_limit_go_packed(comm, monkeypatch):
    """Under an MPI-3 library (the limit lowered to 1000 here) displacements are C ints too: where a rank's blocks reach
    past the limit (blocks 1500 rows apart), MPI's own v-calls get them packed (placed, or gathered, by copies on this
    rank: the call and its pairing are the same), the results as the displacements say (before 2026-12-05 the
    displacements went to MPI as they were; found by a helper)."""
    from pycollect.engine import counts
    monkeypatch.setattr(counts, "LIMIT", 1000)
    r, p = comm.rank, comm.size
    c = pc.Communicator(comm.mpi)
    spy = _CountSpy(c._runner.lib)
    monkeypatch.setattr(c._runner, "lib", spy)
    rows = [1 + i % 2 for i in range(p)]
    displs = [1500 * i for i in range(p)]
    end = displs[-1] + rows[-1]
    x = np.full((rows[r], 2), r + 1.0)
    placed = np.zeros((end, 2))
    for i in range(p):
        placed[displs[i]:displs[i] + rows[i]] = i + 1.0
    with verdicts(comm) as check:
        for algorithm in ("mpi", "auto"):
            check(same(c.allgather(x, counts=rows, displs=displs, algorithm=algorithm), placed), f"allgather {algorithm}")
            got = c.gather(x, root=p - 1, counts=rows, displs=displs, algorithm=algorithm)
            check(r != p - 1 or same(got, placed), f"gather {algorithm}")
            got = c.scatter(placed if r == 0 else np.zeros((0, 2)), root=0, counts=rows, displs=displs,
                            algorithm=algorithm)
            check(same(got, np.full((rows[r], 2), r + 1.0)), f"scatter {algorithm}")
            sent = np.zeros((1500 * p, 2))
            for j in range(p):
                sent[1500 * j] = 10 * r + j
            got = c.alltoall(sent, counts=[1] * p, send_displs=[1500 * j for j in range(p)],
                             recv_displs=[1500 * j for j in range(p)], algorithm=algorithm)
            check(all(same(got[1500 * j], np.full(2, 10.0 * j + r)) for j in range(p)), f"alltoall {algorithm}")
        check(spy.largest <= 2 * 1000, f"MPI was handed a count or displacement of {spy.largest} elements")
    c.free()


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


def test_large_broadcast_of_mpis_own_on_mixed_paths(comm):
    """From 1 MiB MPI's own broadcast posts MPI_Ibcast on every rank, the root copying x into its ``out``
    meanwhile: a new result, ``out=``, in place, and ranks that take the lean path beside ranks that take the
    general one (a strided ``out`` or x on some ranks) all meet in the same call and get the root's x."""
    size, rank = comm.size, comm.rank
    n = (mpi_native.BCAST_OVERLAP_BYTES + 4096) // 8
    with verdicts(comm) as check:
        for root in sorted({0, size - 1}):
            x = integer_valued((n,), np.dtype("f8"), "sum", 7 + rank)
            original, expected = x.copy(), comm.mpi.bcast(x, root=root)
            for algorithm in ("mpi", "auto"):
                got = comm.broadcast(x, root=root, algorithm=algorithm)
                check(same(got, expected) and same(x, original), f"new result {algorithm} root={root}")
                out = np.zeros_like(x)
                got = comm.broadcast(x, root=root, algorithm=algorithm, out=out)
                check(got is out and same(out, expected) and same(x, original), f"out= {algorithm} root={root}")
                strided = np.zeros(2 * n)[::2]                   # the general path on odd ranks
                into = strided if rank % 2 else np.zeros_like(x)
                wide = np.repeat(x, 2)[::2] if rank % 3 == 1 else x     # a strided x: the general path too
                got = comm.broadcast(wide, root=root, algorithm=algorithm, out=into)
                check(got is into and same(into, expected), f"mixed paths {algorithm} root={root}")
                y = x.copy()
                comm.broadcast(y, root=root, algorithm=algorithm, out=y)
                check(same(y, expected), f"in place {algorithm} root={root}")


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


# -- gather and scatter: against MPI's own Gather(v) and Scatter(v) on the same bytes ------------------------
ROOTED_DTYPES = [np.dtype("f8"), np.dtype("i4"), np.dtype("c16"), DTYPES[-1]]   # the last: bfloat16


def rooted_layouts(size, seed):
    """(counts, displs) in rows: even; uneven with zeros; fewer rows than ranks; uneven with gaps between the
    blocks, in reverse rank order (displs None: packed in rank order)."""
    uneven = [(r * 5 + seed) % 4 for r in range(size)]
    yield [2] * size, None
    yield uneven, None
    yield [1 if r < size // 2 else 0 for r in range(size)], None
    displs, at = [0] * size, 1
    for r in reversed(range(size)):
        displs[r] = at if uneven[r] or r % 3 else at + 9   # an empty block past the others' end: not read (MPI)
        at += uneven[r] + r % 2
    yield uneven, displs


def _bytes(a):
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def _starts(counts, displs):
    return list(displs) if displs is not None else np.cumsum([0, *counts[:-1]]).tolist()


def mpi_gather(mpi, x, root, counts, displs=None, out=None):
    """MPI's own Gather (even blocks packed) or Gatherv on the bytes of ``x`` (any dtype, bfloat16 too): the root's
    result, from zeros or from a copy of ``out``; None elsewhere."""
    regular = displs is None and len(set(counts)) == 1
    send, row = _bytes(x), x.dtype.itemsize * int(np.prod(x.shape[1:]))
    if mpi.rank != root:
        mpi.Gather(send, None, root) if regular else mpi.Gatherv(send, None, root)
        return None
    starts = _starts(counts, displs)
    rows = max([d + c for d, c in zip(starts, counts) if c], default=0)
    result = np.zeros((rows,) + x.shape[1:], x.dtype) if out is None else np.array(out)
    recv = result.reshape(-1).view(np.uint8)
    if regular:
        mpi.Gather(send, recv, root)
    else:
        mpi.Gatherv(send, [recv, ([c * row for c in counts], [d * row for d in starts])], root)
    return result


def mpi_scatter(mpi, whole, root, counts, displs=None):
    """MPI's own Scatter (even blocks packed) or Scatterv on the bytes of the root's ``whole``: this rank's block."""
    regular = displs is None and len(set(counts)) == 1
    row = whole.dtype.itemsize * int(np.prod(whole.shape[1:]))
    block = np.empty((counts[mpi.rank],) + whole.shape[1:], whole.dtype)
    recv = block.reshape(-1).view(np.uint8)
    if regular:
        mpi.Scatter(_bytes(whole) if mpi.rank == root else None, recv, root)
    else:
        vector = ([c * row for c in counts], [d * row for d in _starts(counts, displs)])
        mpi.Scatterv([_bytes(whole), vector] if mpi.rank == root else None, recv, root)
    return block


def out_for(shape, dtype, strided):
    """An ``out`` of ``shape`` full of 7s, contiguous or a strided view."""
    if not strided:
        return np.full(shape, 7, dtype)
    return np.full(shape[:-1] + (2 * shape[-1],), 7, dtype)[..., ::2]


def rooted_cases(size, algorithm):
    """(root, seed, dtype, layout index, counts, displs) of the gather and scatter grids: roots 0 and the last,
    the dtypes the algorithm takes, every layout."""
    for root in sorted({0, size - 1}):
        for seed, dtype in enumerate(ROOTED_DTYPES):
            if usable(algorithm, dtype):
                for i, (counts, displs) in enumerate(rooted_layouts(size, seed)):
                    yield root, seed, dtype, i, counts, displs


@pytest.mark.parametrize("algorithm", algorithms("gather"))
def test_gather(comm, algorithm):
    """Roots 0 and the last, four dtypes, every layout; without counts (exchanged) and with them; then into an
    ``out`` (strided by turns, a row more than the blocks reach with displs) from a non-contiguous ``x``."""
    size, rank = comm.size, comm.rank
    with verdicts(comm) as check:
        for root, seed, dtype, i, counts, displs in rooted_cases(size, algorithm):
            what = f"gather {algorithm} root={root} {dtype} counts={counts} displs={displs}"
            x = integer_valued((counts[rank], 3), dtype, "sum", 100 * seed + 10 * i + rank)
            original = x.copy()
            expected = mpi_gather(comm.mpi, x, root, counts, displs)
            if displs is None:
                got = comm.gather(x, root=root, algorithm=algorithm)
                check(same(got, expected) and same(x, original), what + " without counts")
            got = comm.gather(x, root=root, algorithm=algorithm, counts=counts, displs=displs)
            check(same(got, expected) and same(x, original), what)
            rows = 0 if expected is None else expected.shape[0] + (displs is not None)
            out = out_for((rows, 3), dtype, strided=i % 2 == 1)
            want = mpi_gather(comm.mpi, x, root, counts, displs, out=out)
            strided_x = np.repeat(x, 2, axis=1)[:, ::2]
            got = comm.gather(strided_x, root=root, algorithm=algorithm, out=out, counts=counts, displs=displs)
            check(got is None if rank != root else got is out and same(out, want), what + " into out")
            out = out_for((rows, 3), dtype, strided=False)
            want = mpi_gather(comm.mpi, x, root, counts, displs, out=out)
            got = comm.gather(x, root=root, algorithm=algorithm, out=out, counts=counts, displs=displs)   # lean if even
            check(got is None if rank != root else got is out and same(out, want), what + " into out, x contiguous")
            if displs is None:   # in place on the root: its x already lies in its block of out
                starts = np.cumsum([0, *counts])
                base = np.full((starts[-1] + 2, 3), -7, dtype)          # a guard row on each side of out
                out, block = base[1:-1], slice(starts[root], starts[root + 1])
                if rank == root:
                    out[block] = x
                got = comm.gather(out[block] if rank == root else x, root=root, algorithm=algorithm,
                                  out=out if rank == root else None, counts=counts)
                check(got is None if rank != root else got is out and same(out, expected) and (base[0] == -7).all()
                      and (base[-1] == -7).all(), what + " in place")


@pytest.mark.parametrize("algorithm", algorithms("scatter"))
def test_scatter(comm, algorithm):
    """Roots 0 and the last, four dtypes, every layout; even blocks without counts too; off the root ``out=``, or
    an ``x`` that only describes the rows; the root's ``x`` non-contiguous by turns and never written."""
    size, rank = comm.size, comm.rank
    with verdicts(comm) as check:
        for root, seed, dtype, i, counts, displs in rooted_cases(size, algorithm):
            what = f"scatter {algorithm} root={root} {dtype} counts={counts} displs={displs}"
            rows = max([d + c for d, c in zip(_starts(counts, displs), counts) if c], default=0)
            whole = integer_valued((rows, 3), dtype, "sum", 100 * seed + 10 * i)   # the same on every rank
            if i % 2:
                whole = np.repeat(whole, 2, axis=1)[:, ::2]
            original = whole.copy()
            expected = mpi_scatter(comm.mpi, whole, root, counts, displs)
            x = whole if rank == root else np.empty((0, 3), dtype)   # off the root: the rows' description
            if displs is None and len(set(counts)) == 1:
                got = comm.scatter(x if rank == root else None, root=root, algorithm=algorithm,
                                   out=None if rank == root else out_for(expected.shape, dtype, False))
                check(same(got, expected), what + " without counts")
            got = comm.scatter(x, root=root, algorithm=algorithm, counts=counts, displs=displs)
            check(same(got, expected) and same(whole, original), what)
            out = out_for(expected.shape, dtype, strided=i % 2 == 0)
            got = comm.scatter(x, root=root, algorithm=algorithm, out=out, counts=counts, displs=displs)
            check(got is out and same(out, expected) and same(whole, original), what + " into out")
            if displs is None:   # in place on the root: its out is its block of x
                starts = np.cumsum([0, *counts])
                base = np.full((rows + 2, 3), -7, dtype)                # a guard row on each side of x
                base[1:-1] = original
                block = base[1 + starts[root]:1 + starts[root + 1]]
                got = comm.scatter(base[1:-1] if rank == root else x, root=root, algorithm=algorithm, counts=counts,
                                   out=block if rank == root else None)
                check((got is block or got.size == 0 if rank == root else True) and same(got, expected)
                      and same(base[1:-1], original) and (base[0] == -7).all() and (base[-1] == -7).all(),
                      what + " in place")


def test_lean_paths_of_broadcast_reduce_prefixes_and_scatter(comm, monkeypatch):
    """Host arrays whose calls go to MPI's own take the lean paths (the general ones are made to fail here) and give
    MPI's results: two roots, three dtypes and ops, 0 to 7 elements and 2-D rows, a new result, into ``out``, in
    place; exscan's rank 0 returns None with ``out`` and an in-place ``x`` as they were."""
    size, rank = comm.size, comm.rank

    def general(*_, **__):
        raise AssertionError("the general path")
    for name in ("_broadcast", "_reduce", "_scan", "_scatter"):
        monkeypatch.setattr(comm, name, general)
    with verdicts(comm) as check:
        for root in sorted({0, size - 1}):
            for seed, (dtype, op) in enumerate((("f4", "max"), ("i8", "sum"), ("c16", "prod"))):
                for shape in ((0,), (1,), (7,), (3, 4)):
                    what = f"root={root} {dtype} {op} {shape}"
                    x = integer_valued(shape, np.dtype(dtype), op, 10 * seed + rank)
                    original = x.copy()
                    lean_broadcast(comm, check, x, root, what)
                    lean_reduce(comm, check, x, root, op, what)
                    for collective in ("scan", "exscan"):
                        lean_prefix(comm, check, collective, x, op, what)
                    check(same(x, original), what + ": x kept")
                    rows = shape[0]
                    whole = integer_valued((rows * size,) + shape[1:], np.dtype(dtype), "sum", seed)
                    expected = mpi_scatter(comm.mpi, whole, root, [rows] * size)
                    mine = whole if rank == root else np.empty((0,) + shape[1:], dtype)
                    got = comm.scatter(mine, root=root, counts=[rows] * size)
                    out = np.full_like(expected, 7)
                    into = comm.scatter(mine, root=root, counts=[rows] * size, out=out)
                    check(same(got, expected) and into is out and same(out, expected), "scatter " + what)


def lean_broadcast(comm, check, x, root, what):
    expected = x.copy()
    comm.mpi.Bcast(expected, root)
    out, y = np.full_like(x, 7), x.copy()
    got, into = comm.broadcast(x, root=root), comm.broadcast(x, root=root, out=out)
    inplace = comm.broadcast(y, root=root, out=y)
    check(same(got, expected) and got is not x and into is out and same(out, expected) and inplace is y
          and same(y, expected), "broadcast " + what)


def lean_reduce(comm, check, x, root, op, what):
    expected = np.zeros_like(x) if comm.rank == root else None
    comm.mpi.Reduce(x, expected, MPI_OPS[op], root)
    out, y = np.full_like(x, 7), x.copy()
    got, into = comm.reduce(x, root=root, op=op), comm.reduce(x, root=root, op=op, out=out)
    inplace = comm.reduce(y, root=root, op=op, out=y)
    if comm.rank != root:
        check(got is None and into is None and inplace is None and same(out, np.full_like(x, 7)) and same(y, x),
              "reduce off the root " + what)
        return
    check(same(got, expected) and into is out and same(out, expected) and inplace is y and same(y, expected),
          "reduce " + what)


def lean_prefix(comm, check, collective, x, op, what):
    expected = mpi_prefix(comm.mpi, x, op, collective == "exscan")
    call = getattr(comm, collective)
    out, y = np.full_like(x, 7), x.copy()
    got, into, inplace = call(x, op=op), call(x, op=op, out=out), call(y, op=op, out=y)
    if expected is None:   # exscan's rank 0
        check(got is None and into is None and inplace is None and same(out, np.full_like(x, 7)) and same(y, x),
              "exscan's rank 0 " + what)
        return
    check(same(got, expected) and into is out and same(out, expected) and inplace is y and same(y, expected),
          f"{collective} {what}")


def test_gather_scatter_nonblocking(comm):
    """Two of each in flight, waited in call order: rows exchanged (without counts) and given, every algorithm."""
    size, rank = comm.size, comm.rank
    with verdicts(comm) as check:
        for algorithm in algorithms("gather"):
            counts = [(r + 1) % 3 for r in range(size)]
            x = integer_valued((counts[rank], 2), np.dtype("f8"), "sum", rank)
            whole = integer_valued((2 * size, 2), np.dtype("i4"), "sum", 5)
            first = mpi_gather(comm.mpi, x, 0, counts)
            backwards = [sum(counts[r + 1:]) for r in range(size)]   # the blocks in reverse rank order
            second = mpi_gather(comm.mpi, x, size - 1, counts, backwards)
            blocks = mpi_scatter(comm.mpi, whole, size - 1, [2] * size)
            started = [comm.igather(x, root=0, algorithm=algorithm),
                       comm.igather(x, root=size - 1, algorithm=algorithm, counts=counts, displs=backwards),
                       comm.iscatter(whole if rank == size - 1 else None, root=size - 1, algorithm=algorithm,
                                     out=None if rank == size - 1 else np.empty((2, 2), np.int32)),
                       comm.iscatter(whole, root=size - 1, algorithm=algorithm, counts=[2] * size)]
            got = [r.wait() for r in started]
            check(same(got[0], first) and same(got[1], second) and same(got[2], blocks) and same(got[3], blocks),
                  f"igather/iscatter {algorithm}")


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


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_accumulate_float32_in_reduce_scatter_and_reduce(comm, dtype):
    """The other reductions take accumulate too: 256 + 1 + 1 ... summed in float32, rounded once to the dtype (in
    bfloat16 partial sums 256 + 1 is 256), on every algorithm, blocking and not, into new arrays, out and in place."""
    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    big = 256.0 if dtype == "bfloat16" else 2048.0
    x = np.full(3 * comm.size, big if comm.rank == 0 else 1.0, dt)
    want = np.full(3, big + comm.size - 1, np.float64).astype(dt)
    for algorithm in ("auto",) + pc.algorithms("reduce_scatter"):
        outs = {"new": comm.reduce_scatter(x, algorithm=algorithm, accumulate="float32"),
                "i": comm.ireduce_scatter(x, algorithm=algorithm, accumulate="float32", counts=[3] * comm.size).wait()}
        o = np.zeros(3, dt)
        outs["out"] = o if comm.reduce_scatter_block(x, algorithm=algorithm, accumulate="float32", out=o) is o else None
        y = x.copy()
        block = y[3 * comm.rank:3 * comm.rank + 3]
        outs["in place"] = comm.ireduce_scatter_block(y, algorithm=algorithm, accumulate="float32", out=block).wait()
        for how, got in outs.items():
            agree(comm, got is not None and got.dtype == dt and np.array_equal(got, want),
                  f"reduce_scatter {algorithm} accumulate, {how}: {got}")
    for algorithm in ("auto",) + pc.algorithms("reduce"):
        root = comm.size - 1
        got = comm.reduce(x[:3], root=root, algorithm=algorithm, accumulate="float32")
        waited = comm.ireduce(x[:3], root=root, algorithm=algorithm, accumulate="float32", out=np.zeros(3, dt)).wait()
        ok = all(g is not None and g.dtype == dt and np.array_equal(g, want) for g in (got, waited)) \
            if comm.rank == root else got is None and waited is None
        agree(comm, ok, f"reduce {algorithm} accumulate on rank {comm.rank}: {got}, {waited}")


# -- ops and types beyond the arithmetic grid (issue 18): each against MPI's own call or a sequential reference --
def op_lengths(size):
    """0, below the world size, at it, above it."""
    return sorted({0, 1, max(size - 1, 0), size + 1})


def pick(collective):
    """MPI's own and two schedules: enough to catch a wrong op without running the whole grid again."""
    names = pc.algorithms(collective)
    return [n for n in ("mpi", "ring", "tree", "pairwise", "binomial") if n in names]


@pytest.mark.parametrize("op", ["land", "lor", "lxor"])
def test_logical_ops_against_mpi(comm, op):
    """Logical ops on bool and integers (any non-zero integer is true) against MPI.LAND/LOR/LXOR; in place too."""
    with verdicts(comm) as check:
        mpi_op = getattr(MPI, op.upper())
        for seed, (dtype, n) in enumerate((d, n) for d in ("?", "i4", "u1") for n in op_lengths(comm.size)):
            rng = np.random.default_rng(seed * 7 + comm.rank)
            x = rng.integers(0, 3, n).astype(dtype)          # zeros and non-zeros, 2 as true among integers
            expected = np.empty_like(x)
            comm.mpi.Allreduce(x, expected, mpi_op)
            for algorithm in pick("allreduce"):
                got = comm.allreduce(x, op=op, algorithm=algorithm)
                check(same(got, expected), f"allreduce {op} {algorithm} {dtype} n={n}")
            y = x.copy()
            comm.allreduce(y, op=op, algorithm="ring", out=y)
            root = comm.size - 1
            got = comm.reduce(x, root=root, op=op, algorithm="binomial")
            check(same(y, expected) and same(got, expected if comm.rank == root else None),
                  f"{op} in place and reduce {dtype} n={n}")


@pytest.mark.parametrize("dtype", ["g", "G", "f2"])
def test_long_double_and_half_against_mpi(comm, dtype):
    """long double and complex long double reduced by MPI's LONG_DOUBLE types; float16 by MPI's half type where
    the library has one (MPICH 4's MPIX_C_FLOAT16), else refused with algorithm 'mpi'."""
    n = comm.size + 3
    x = integer_valued((n,), np.dtype(dtype), "sum", comm.rank)
    if dtype == "G":
        x = x + np.clongdouble(1j) / 3          # a third: more digits than double holds
    elif dtype == "g":
        x = x + np.longdouble(1) / 3
    expected = np.empty_like(x)
    if dtype == "f2" and not mpi_supports(x.dtype):
        raises(comm, lambda: comm.allreduce(x, algorithm="mpi"), ValueError, ["algorithm 'mpi' cannot", "float16"], [x])
        return
    comm.mpi.Allreduce(x, expected, MPI.SUM)
    # sums in another order differ by a few ulps of the sum of magnitudes, which a cancelling sum (-1 + 3 x 1/3)
    # can leave far above the sum itself: 2 ulps of 1 against 8e-20 (3 ranks round robin on two nodes)
    magnitude = np.empty(n, np.float64)
    comm.mpi.Allreduce(np.abs(x).astype(np.float64), magnitude, MPI.SUM)
    for algorithm in ("mpi", "tree", "recursive_doubling"):
        got = comm.allreduce(x, algorithm=algorithm)
        close = np.abs(got - expected) <= 8 * np.finfo(x.dtype).eps * magnitude
        agree(comm, got.dtype == x.dtype and bool(close.all()),
              f"allreduce {algorithm} {dtype}: {got[:2]} against {expected[:2]}")
    op, mpi_op = ("prod", MPI.PROD) if dtype == "G" else ("max", MPI.MAX)
    reduced = np.empty_like(x)
    comm.mpi.Allreduce(x, reduced, mpi_op)
    got = comm.reduce_scatter(np.tile(x, comm.size), op=op, algorithm="mpi")
    agree(comm, np.allclose(got, reduced, rtol=8 * np.finfo(x.dtype).eps, atol=0), f"reduce_scatter {op} mpi {dtype}")


PAIR_TYPES = {"f8": MPI.DOUBLE_INT, "f4": MPI.FLOAT_INT, "i4": MPI.TWOINT, "g": MPI.LONG_DOUBLE_INT}


@pytest.mark.parametrize("op", ["minloc", "maxloc"])
def test_minloc_maxloc_against_mpi_pairs(comm, op):
    """Values and their rank, or a given index, against MPI_MINLOC/MAXLOC on MPI's pair types (ties: the lowest
    location); every algorithm of allreduce on doubles, MPI's own and a schedule otherwise and for reduce_scatter."""
    with verdicts(comm) as check:
        mpi_op = getattr(MPI, op.upper())
        for seed, (dtype, n) in enumerate((d, n) for d in PAIR_TYPES for n in op_lengths(comm.size)):
            rng = np.random.default_rng(seed * 5 + comm.rank)
            x = rng.integers(0, 3, n).astype(dtype)                       # few values: ties across ranks
            index = (rng.permutation(n) + 100 * comm.rank).astype(np.int32)
            for given in (None, index):
                pairs = pairs_by_hand(x, comm.rank if given is None else given)
                want = np.empty_like(pairs)
                comm.mpi.Allreduce([pairs, PAIR_TYPES[dtype]], [want, PAIR_TYPES[dtype]], mpi_op)
                arg = x if given is None else (x, given)
                for algorithm in pc.algorithms("allreduce") if dtype == "f8" else ("mpi", "tree"):
                    values, where = comm.allreduce(arg, op=op, algorithm=algorithm)
                    check(same(values, want["value"]) and same(where, want["location"]),
                          f"allreduce {op} {algorithm} {dtype} n={n} index={given is not None}")
                rows = split_even(n, comm.size)
                start = sum(rows[:comm.rank])
                block = want[start:start + rows[comm.rank]]
                for algorithm in ("mpi", "ring"):
                    values, where = comm.reduce_scatter(arg, op=op, algorithm=algorithm)
                    check(same(values, block["value"]) and same(where, block["location"]),
                          f"reduce_scatter {op} {algorithm} {dtype} n={n}")
            got = comm.reduce(x, op=op, root=0, algorithm="binomial")
            check((got is None) == (comm.rank != 0), "reduce minloc returns None off the root")


def test_minloc_in_place_out_and_nonblocking(comm):
    """``out=(x, locations)`` writes the values into x itself; ``iallreduce`` returns the pair from ``wait()``;
    a dtype without an MPI pair type (int8) is reduced by a schedule under ``auto``."""
    x = ((np.arange(comm.size + 2) * 7 + 3 * comm.rank) % 5).astype(np.int8)
    wide = x.astype(np.float64)
    mine = pairs_by_hand(wide, comm.rank)
    want = np.empty_like(mine)
    comm.mpi.Allreduce([mine, MPI.DOUBLE_INT], [want, MPI.DOUBLE_INT], MPI.MAXLOC)
    where = np.full(x.size, -1, np.int64)
    back = comm.allreduce(x, op="maxloc", out=(x, where))
    values, ranks = comm.iallreduce(np.asarray(wide), op=MPI.MAXLOC, algorithm="tree").wait()
    agree(comm, back[0] is x and back[1] is where and same(x, want["value"].astype(np.int8))
          and same(where, want["location"].astype(np.int64)) and same(ranks, want["location"]),
          "maxloc in place, into out, non-blocking")


def matrices(rank, n):
    """Each element a 2x2 integer matrix (exact in float64 over 8 ranks) that does not commute with its neighbours'."""
    m = np.zeros(n, [("m", "f8", (2, 2))])
    for i in range(n):
        m["m"][i] = [[(rank + i) % 3, 1], [1, (rank * i) % 2]]
    return m


MATMUL = pc.Op(lambda a, b, out: np.matmul(a["m"], b["m"], out=out["m"]), commute=False, name="matmul")


def test_user_ops(comm):
    """A commutative ufunc on every allreduce algorithm (np.gcd: exact), np.hypot within rounding, and a
    non-commutative matrix product in rank order on the schedules that keep it and on MPI's, against a sequential
    reference; reduce_scatter and reduce too."""
    with verdicts(comm) as check:
        x = (np.arange(comm.size + 2) + 1) * (comm.rank + 2) * 6
        everyone = comm.mpi.allgather(x)
        gcd = np.gcd.reduce(np.stack(everyone))
        for algorithm in pc.algorithms("allreduce"):
            check(same(comm.allreduce(x, op=np.gcd, algorithm=algorithm), gcd), f"gcd {algorithm}")
        h = np.sqrt(sum(np.square(e.astype(np.float64)) for e in everyone))
        check(np.allclose(comm.allreduce(x.astype(np.float64), op=np.hypot), h, rtol=1e-13), "hypot")
        for n in op_lengths(comm.size):
            mine = matrices(comm.rank, n)
            product = matrices(0, n)["m"]
            for r in range(1, comm.size):
                product = product @ matrices(r, n)["m"]
            for algorithm in ["auto", "mpi"] + in_rank_order("allreduce", pc.algorithms("allreduce"), comm.topology):
                got = comm.allreduce(mine, op=MATMUL, algorithm=algorithm)
                check(np.array_equal(got["m"], product), f"matmul allreduce {algorithm} n={n}")
            rows = split_even(n, comm.size)
            start = sum(rows[:comm.rank])
            got = comm.reduce_scatter(mine, op=MATMUL)
            root = comm.size - 1
            at_root = comm.reduce(mine, op=MATMUL, root=root)
            tree = "binomial" if keeps_rank_order("reduce", "binomial", comm.topology) else "auto"   # auto: MPI's
            at_zero = comm.reduce(mine, op=MATMUL, root=0, algorithm=tree)
            check(np.array_equal(got["m"], product[start:start + rows[comm.rank]])
                  and (comm.rank != root or np.array_equal(at_root["m"], product))
                  and (comm.rank != 0 or np.array_equal(at_zero["m"], product)), f"matmul reduce_scatter, reduce n={n}")


def test_every_rank_holds_the_same_bits(comm):
    """Where IEEE leaves a result's bits to the operands' order (a zero's sign under min and max, which NaN's
    payload a sum keeps), every schedule still hands every rank the same bits: each block is reduced once, or both
    partners of an exchange put the lower ranks first."""
    signed_zeros = np.array([-0.0 if comm.rank % 2 else 0.0] * 3)
    nans = (np.full(2, 0x7FF8000000000000, np.uint64) + np.uint64(comm.rank + 1)).view(np.float64)
    with verdicts(comm) as check:
        for algorithm in pc.algorithms("allreduce"):
            if algorithm in ("auto", "mpi"):   # MPI's own may differ (MPICH's recursive doubling does)
                continue
            for x, op in ((signed_zeros, "min"), (signed_zeros, "max"), (nans, "sum")):
                got = comm.allreduce(x, op=op, algorithm=algorithm).tobytes()
                check(all(g == got for g in comm.mpi.allgather(got)), f"{algorithm} {op}: the ranks' bits differ")


def test_the_two_ranks_exchange_gives_the_recursive_doublings_bits(comm, monkeypatch):
    """At two ranks the recursive-doubling allreduce of a host array runs its one round straight on MPI
    (engine/lean_exchange.py; the general path is made to fail here): the bits of the schedule run by the executor
    (a Communicator under validation, which takes the general path) for every dtype and op, a new result, ``out=``,
    in place; a rank on the general path (a strided ``out``) meets the other's exchange; with a call in flight the
    general path runs."""
    if comm.size != 2:
        pytest.skip("the exchange runs at two ranks")
    rank = comm.rank
    checked = pc.Communicator(comm.mpi, validate=True)
    calls = {"general": 0}
    general = comm._allreduce

    def refused(*args):
        raise AssertionError("the general path")
    with verdicts(comm) as check:
        for seed, (dtype, op) in enumerate((("f4", "sum"), ("f8", "min"), ("f8", "max"), ("i8", "prod"),
                                            ("c16", "sum"), ("u1", "bxor"), ("?", "lor"))):
            for shape in ((1,), (7,), (3, 4), (1000,)):
                what = f"{dtype} {op} {shape}"
                x = integer_valued(shape, np.dtype(dtype), op, 10 * seed + rank)
                if dtype == "f8":   # a zero's sign: the lower rank's operand first, as the schedule has it
                    x[: shape[0] // 2] = -0.0 if rank else 0.0
                original = x.copy()
                expected = checked.allreduce(x, op=op, algorithm="recursive_doubling")
                monkeypatch.setattr(comm, "_allreduce", refused)
                got = comm.allreduce(x, op=op, algorithm="recursive_doubling")
                out = np.full_like(x, 3)
                into = comm.allreduce(x, op=op, algorithm="recursive_doubling", out=out)
                y = x.copy()
                comm.allreduce(y, op=op, algorithm="recursive_doubling", out=y)
                monkeypatch.setattr(comm, "_allreduce", general)
                check(got.tobytes() == expected.tobytes() and into is out and out.tobytes() == expected.tobytes()
                      and y.tobytes() == expected.tobytes() and same(x, original), what)
                into = np.zeros(shape + (2,), dtype)[..., 0] if rank else np.zeros(shape, dtype)   # rank 1: general
                got = comm.allreduce(x, op=op, algorithm="recursive_doubling", out=into)
                check(got.tobytes() == expected.tobytes(), what + ": one rank on the general path")
        x = np.arange(5.0) + rank
        pending = comm.iallreduce(np.ones(3), algorithm="ring")

        def counted(*args):
            calls["general"] += 1
            return general(*args)
        monkeypatch.setattr(comm, "_allreduce", counted)
        got = comm.allreduce(x, algorithm="recursive_doubling")
        monkeypatch.setattr(comm, "_allreduce", general)
        check(same(got, 2 * np.arange(5.0) + 1) and calls["general"] == 1 and same(pending.wait(), np.full(3, 2.0)),
              f"with a call in flight: {got}, general path {calls['general']} times")
    checked.free()


def test_the_two_ranks_reduce_scatter_exchange_gives_the_rings_bits(comm, monkeypatch):
    """At two ranks the ring reduce-scatter of a host array runs its one round straight on MPI (the general path is
    made to fail here): the bits of the ring run by the executor (under validation) for even and uneven default
    blocks, two counts, reduce_scatter_block, a new result, ``out=``, in place (``out`` x's own block); one rank on
    the general path (a strided ``out``) meets the other's exchange. Non-blocking calls resolve auto apart: they
    cannot run the round straight on MPI and keep MPI's own where the blocking calls exchange."""
    if comm.size != 2:
        pytest.skip("the exchange runs at two ranks")
    rank = comm.rank
    checked = pc.Communicator(comm.mpi, validate=True)
    general = comm._reduce_scatter

    def refused(*args):
        raise AssertionError("the general path")
    with verdicts(comm) as check:
        for seed, (dtype, op) in enumerate((("f4", "sum"), ("f8", "min"), ("i8", "prod"), ("c16", "sum"))):
            for rows, counts in ((2, None), (7, None), (1000, None), (9, [2, 7]), (1000, [500, 500])):
                what = f"{dtype} {op} rows={rows} counts={counts}"
                x = integer_valued((rows, 3), np.dtype(dtype), op, 10 * seed + rank)
                if dtype == "f8":   # a zero's sign: the rank's own block first, as the ring has it
                    x[:] = -0.0 if rank else 0.0
                original = x.copy()
                expected = checked.reduce_scatter(x, op=op, counts=counts, algorithm="ring")
                first = (rows + 1) // 2 if counts is None else counts[0]
                start, stop = (0, first) if rank == 0 else (first, rows)
                monkeypatch.setattr(comm, "_reduce_scatter", refused)
                got = comm.reduce_scatter(x, op=op, counts=counts, algorithm="ring")
                out = np.full_like(expected, 3)
                into = comm.reduce_scatter(x, op=op, counts=counts, algorithm="ring", out=out)
                y = x.copy()
                comm.reduce_scatter(y, op=op, counts=counts, algorithm="ring", out=y[start:stop])
                block = comm.reduce_scatter_block(x, op=op, algorithm="ring") if rows % 2 == 0 else expected
                monkeypatch.setattr(comm, "_reduce_scatter", general)
                check(got.tobytes() == expected.tobytes() and into is out and out.tobytes() == expected.tobytes()
                      and y[start:stop].tobytes() == expected.tobytes() and block.tobytes() == expected.tobytes()
                      and same(x, original), what)
                into = np.zeros(expected.shape + (2,), dtype)[..., 0] if rank else None   # rank 1: general path
                got = comm.reduce_scatter(x, op=op, counts=counts, algorithm="ring", out=into)
                check(got.tobytes() == expected.tobytes(), what + ": one rank on the general path")
        if comm.topology.num_nodes == 1 and not comm._selector.forced:
            for collective, exchanged, sizes in (("allreduce", "recursive_doubling", (64 << 10, 256 << 10)),
                                                 ("reduce_scatter", "ring", (64 << 10, 1 << 20))):
                for nbytes in sizes:
                    blocking, nonblocking = (comm.auto_algorithm(collective, nbytes, blocking=b) for b in (True, False))
                    check(blocking == exchanged and nonblocking != exchanged,
                          f"{collective} {nbytes} B: auto {blocking} blocking, {nonblocking} non-blocking")
        with pytest.raises(TypeError, match="blocking must be True or False, got 1"):
            comm.auto_algorithm("allreduce", 8, blocking=1)
    checked.free()


def test_the_two_ranks_allgather_exchange_gathers_as_mpi(comm, monkeypatch):
    """At two ranks the ring allgather of a host array runs its one round straight on MPI, with ``counts`` and
    without them (the rows exchanged first, then the round): MPI's own result for several dtypes and shapes, a new
    result and ``out=``, the general path made to fail; one rank on the general path (a strided ``out``) meets the
    other's exchange; repeated on the same arrays (the remembered call) it gathers their new values; with a call in
    flight, or uneven rows, the general path runs. auto takes it above 16 KiB for blocking calls only (non-blocking
    ones cannot run the round straight: MPI's own)."""
    if comm.size != 2:
        pytest.skip("the exchange runs at two ranks")
    rank = comm.rank
    general, run = comm._allgather, comm._runner.run

    def refused(*args):
        raise AssertionError("the general path")
    with verdicts(comm) as check:
        for dtype in ("f4", "c16", "u1", "?", "i8"):
            for shape in ((1,), (7,), (3, 4), (1000, 2)):
                what = f"{dtype} {shape}"
                x = integer_valued(shape, np.dtype(dtype), "sum", rank + 1)
                original, expected = x.copy(), mpi_allgather(comm.mpi, x)
                counts = [shape[0]] * 2
                monkeypatch.setattr(comm, "_allgather", refused)
                monkeypatch.setattr(comm._runner, "run", refused)
                got = comm.allgather(x, algorithm="ring", counts=counts)
                out = np.full_like(expected, 3)
                into = comm.allgather(x, algorithm="ring", counts=counts, out=out)
                free = comm.allgather(x, algorithm="ring")
                out_free = np.full_like(expected, 3)
                into_free = comm.allgather(x, algorithm="ring", out=out_free)
                monkeypatch.setattr(comm, "_allgather", general)
                monkeypatch.setattr(comm._runner, "run", run)
                check(same(got, expected) and into is out and same(out, expected) and same(free, expected)
                      and into_free is out_free and same(out_free, expected) and same(x, original), what)
                for given in (counts, None):   # rank 1 on the general path: its out strided
                    into = np.zeros(expected.shape + (2,), dtype)[..., 0] if rank else None
                    got = comm.allgather(x, algorithm="ring", counts=given, out=into)
                    check(same(got, expected), f"{what} counts={given}: one rank on the general path")
        x = np.arange(6.0 + 2 * rank)   # uneven rows: the general path, whatever runs
        check(same(comm.allgather(x, algorithm="ring"), np.concatenate([np.arange(6.0), np.arange(8.0)])), "uneven")
        x, out = np.zeros(4), np.zeros(8)   # repeated on the same arrays (the remembered call), values changed
        for value in (1.0, 2.0):
            x[:] = value + rank
            check(comm.allgather(x, counts=[4, 4], algorithm="ring", out=out) is out
                  and same(out, np.repeat([value, value + 1], 4)), f"repeated, {value}: {out}")
        pending = comm.iallgather(np.ones(3), algorithm="ring")
        calls = {"general": 0}

        def counted(*args):
            calls["general"] += 1
            return general(*args)
        monkeypatch.setattr(comm, "_allgather", counted)
        x[:] = rank + 1.0
        got = [comm.allgather(np.full(4, rank + 1.0), algorithm="ring", counts=given) for given in ([4, 4], None)]
        again = comm.allgather(x, counts=[4, 4], algorithm="ring", out=out)   # the remembered call, now in flight
        monkeypatch.setattr(comm, "_allgather", general)
        check(all(same(g, np.repeat([1.0, 2.0], 4)) for g in got + [again]) and calls["general"] == 3
              and same(pending.wait(), np.ones(6)), f"with a call in flight: {got}, general path {calls['general']}")
        if comm.topology.num_nodes == 1 and not comm._selector.forced:
            for nbytes, exchanged in ((16 << 10, False), (32 << 10, True), (1 << 20, True), (16 << 20, False)):
                blocking, nonblocking = (comm.auto_algorithm("allgather", nbytes, blocking=b) for b in (True, False))
                check((blocking == "ring") == exchanged and nonblocking == "mpi",
                      f"allgather {nbytes} B: auto {blocking} blocking, {nonblocking} non-blocking")


# -- scan, exscan, reduce_scatter_block -----------------------------------------------------------------------
def mpi_prefix(mpi, x, op, exclusive):
    """MPI_Scan or MPI_Exscan of ``x`` (widened where MPI cannot reduce its dtype); None on exscan's rank 0."""
    w = np.ascontiguousarray(x, wide(x.dtype))
    r = np.zeros_like(w)
    (mpi.Exscan if exclusive else mpi.Scan)(w, r, MPI_OPS[op])
    return None if exclusive and mpi.rank == 0 else r.astype(x.dtype)


def scan_cases(size):
    """(dtype, op, rows): a few dtypes with sum (MPI's half and bfloat16 among them), every op but avg (which has
    no prefix) of two dtypes, at 0 rows, 1 and more than the world size."""
    for dtype in ("i1", "u8", "f2", ml_dtypes.bfloat16, "f4", "c16"):
        yield np.dtype(dtype), "sum", size + 1
    for dtype in (np.dtype("i4"), np.dtype("f8")):
        for op in ops_for(dtype):
            for n in (0, 1, size + 1) if op != "avg" else ():
                yield dtype, op, n


@pytest.mark.parametrize("algorithm", [a for a in algorithms("scan") if a != "auto"])
def test_scan_and_exscan(comm, algorithm):
    """Inclusive and exclusive prefixes against MPI_Scan and MPI_Exscan on the same data, returned, into ``out`` and
    in place, and both non-blocking at once; exscan's rank 0 gets None and its ``out`` stays as it was. ("auto":
    test_scan_logical_locating_and_user_ops.)"""
    with verdicts(comm) as check:
        for seed, (dtype, op, n) in enumerate(scan_cases(comm.size)):
            if not usable(algorithm, dtype):
                continue
            x = integer_valued((n, 2), dtype, op, seed * 13 + comm.rank)
            original = x.copy()
            for collective in ("scan", "exscan"):
                expected = mpi_prefix(comm.mpi, x, op, collective == "exscan")
                call = getattr(comm, collective)
                got = call(x, op=op, algorithm=algorithm)
                out, y = np.full_like(x, 5), x.copy()
                into = call(x, op=op, algorithm=algorithm, out=out)
                call(y, op=op, algorithm=algorithm, out=y)
                kept = (out, original) if expected is None else (into, expected)   # rank 0 of exscan: untouched
                check(same(got, expected) and same(x, original) and (into is None) == (expected is None)
                      and same(out, np.full_like(x, 5) if expected is None else expected) and same(y, kept[1]),
                      f"{collective} {algorithm} {dtype} {op} n={n}")
            started = comm.iscan(x, op=op, algorithm=algorithm), comm.iexscan(x, op=op, algorithm=algorithm)
            ex, inc = started[1].wait(), started[0].wait()   # in flight together, waited out of order
            check(same(inc, mpi_prefix(comm.mpi, x, op, False)) and same(ex, mpi_prefix(comm.mpi, x, op, True)),
                  f"iscan and iexscan {algorithm} {dtype} {op} n={n}")


def test_scan_logical_locating_and_user_ops(comm):
    """Prefixes of land/lor/lxor on bool and integers against MPI's logical ops; minloc and maxloc (by rank and by a
    given index) against MPI_MINLOC/MAXLOC on MPI's pair types; a non-commutative 2x2 matrix product in rank order
    against a sequential fold; on every algorithm."""
    rank, size = comm.rank, comm.size
    with verdicts(comm) as check:
        x = integer_valued((size + 1,), np.dtype(ml_dtypes.bfloat16), "sum", rank)   # auto: a schedule, not MPI's
        check(same(comm.exscan(x), mpi_prefix(comm.mpi, x, "sum", True)), "exscan auto bfloat16")
        for algorithm in algorithms("scan"):
            for seed, (op, dtype) in enumerate((o, d) for o in ("land", "lor", "lxor") for d in ("?", "i4")):
                x = np.random.default_rng(seed * 7 + rank).integers(0, 3, size + 2).astype(dtype)
                for collective, mpi_call in (("scan", comm.mpi.Scan), ("exscan", comm.mpi.Exscan)):
                    want = np.zeros_like(x)
                    mpi_call(x, want, getattr(MPI, op.upper()))
                    got = getattr(comm, collective)(x, op=op, algorithm=algorithm)
                    check(same(got, None if collective == "exscan" and rank == 0 else want),
                          f"{collective} {op} {algorithm} {dtype}")
            for op, (dtype, pair) in ((o, t) for o in ("minloc", "maxloc") for t in (("f8", MPI.DOUBLE_INT),
                                                                                    ("i4", MPI.TWOINT))):
                x = np.random.default_rng(rank).integers(0, 3, size + 2).astype(dtype)   # few values: ties
                index = (np.arange(size + 2)[::-1] + 10 * rank).astype(np.int32)
                for arg in (x, (x, index)):
                    pairs = pairs_by_hand(x, rank if arg is x else index)
                    for collective, mpi_call in (("scan", comm.mpi.Scan), ("exscan", comm.mpi.Exscan)):
                        want = np.zeros_like(pairs)
                        mpi_call([pairs, pair], [want, pair], getattr(MPI, op.upper()))
                        got = getattr(comm, collective)(arg, op=op, algorithm=algorithm)
                        ok = got is None if collective == "exscan" and rank == 0 else \
                            same(got[0], want["value"]) and same(got[1], want["location"])
                        check(ok, f"{collective} {op} {algorithm} {dtype} index={arg is not x}")
            for n in (0, 1, size + 1):
                chain = [matrices(r, n)["m"] for r in range(rank + 1)]
                for collective, upto in (("scan", chain), ("exscan", chain[:-1])):
                    got = getattr(comm, collective)(matrices(rank, n), op=MATMUL, algorithm=algorithm)
                    if not upto:
                        check(got is None, f"exscan matmul {algorithm} rank 0")
                        continue
                    product = upto[0]
                    for m in upto[1:]:
                        product = product @ m
                    check(np.array_equal(got["m"], product), f"{collective} matmul {algorithm} n={n}")


def test_reduce_scatter_block(comm):
    """Equal blocks against MPI_Reduce_scatter_block on the same data, on every reduce_scatter algorithm: dtypes and
    ops, 0 rows and more, into ``out``, non-blocking; the input untouched."""
    size = comm.size
    with verdicts(comm) as check:
        for algorithm in algorithms("reduce_scatter"):
            for seed, (dtype, op) in enumerate((("i4", "sum"), ("f8", "max"), ("u1", "bxor"), ("c8", "prod"))):
                for rows in (0, 3 * size):
                    x = integer_valued((rows, 3), np.dtype(dtype), op, seed * 11 + comm.rank)
                    original = x.copy()
                    want = np.zeros((rows // size, 3), x.dtype)
                    comm.mpi.Reduce_scatter_block(x, want, MPI_OPS[op])
                    got = comm.reduce_scatter_block(x, op=op, algorithm=algorithm)
                    out = np.zeros_like(want)
                    into = comm.reduce_scatter_block(x, op=op, algorithm=algorithm, out=out)
                    later = comm.ireduce_scatter_block(x, op=op, algorithm=algorithm).wait()
                    check(same(got, want) and into is out and same(out, want) and same(later, want)
                          and same(x, original), f"reduce_scatter_block {algorithm} {dtype} {op} rows={rows}")


def test_allgather_displacements(comm):
    """Blocks placed at ``displs`` (in reverse rank order, gaps between, empty blocks among them) against MPI's
    Allgatherv with the same displacements, on every algorithm: into an ``out`` with more rows (its other rows
    kept), a strided ``out``, a new result (zeros between the blocks), non-blocking."""
    size = comm.size
    counts = [(i * 5 + 1) % 3 for i in range(size)]          # 1, 0, 2, 1, ...: empty blocks too
    displs, at = [0] * size, 1
    for i in reversed(range(size)):
        displs[i], at = at, at + counts[i] + 1
    with verdicts(comm) as check:
        for dtype in ("i4", "c16"):
            x = integer_valued((counts[comm.rank], 3), np.dtype(dtype), "sum", comm.rank)
            want = np.full((at + 2, 3), -100, x.dtype)   # -100: no value of x's
            comm.mpi.Allgatherv(x, [want, ([c * 3 for c in counts], [d * 3 for d in displs])])
            fresh = np.where(want[:at - 1] == -100, 0, want[:at - 1])   # a new result: as many rows as the last block
            for algorithm in algorithms("allgather"):
                out, wide_out = np.full_like(want, -100), np.full((at + 2, 6), -100, x.dtype)
                into = comm.allgather(x, algorithm=algorithm, counts=counts, displs=displs, out=out)
                comm.allgather(x, algorithm=algorithm, counts=counts, displs=displs, out=wide_out[:, ::2])
                later = comm.iallgather(x, algorithm=algorithm, counts=counts, displs=displs).wait()
                check(into is out and same(out, want) and same(wide_out[:, ::2], want) and same(later, fresh),
                      f"allgather displs {algorithm} {dtype}")


def test_alltoall_displacements(comm):
    """``send_displs`` (blocks of x in reverse rank order, rows left out) and ``recv_displs`` (gaps between) against
    MPI's Alltoallv with the same displacements, on every algorithm, with a row of counts and with the matrix: both,
    into an ``out`` with more rows; one side only, new results and non-blocking."""
    rank, size = comm.rank, comm.size
    matrix = [[(i + 2 * j + 1) % 3 for j in range(size)] for i in range(size)]   # rows rank i sends rank j, 0 among
    sends, received = matrix[rank], [row[rank] for row in matrix]
    send_displs, at = [0] * size, 1
    for j in reversed(range(size)):
        send_displs[j], at = at, at + sends[j]
    recv_displs, end = [0] * size, 2
    for i in range(size):
        recv_displs[i], end = end, end + received[i] + 1
    x = integer_valued((at + 1, 2), np.dtype("i8"), "sum", rank)
    want = np.full((end + 1, 2), -100, x.dtype)   # -100: no value of x's
    comm.mpi.Alltoallv([x, ([n * 2 for n in sends], [d * 2 for d in send_displs])],
                       [want, ([n * 2 for n in received], [d * 2 for d in recv_displs])])
    packed_in = np.concatenate([x[d:d + n] for n, d in zip(sends, send_displs)])
    packed_out = np.concatenate([want[d:d + n] for n, d in zip(received, recv_displs)])
    fresh = want[:max((d + n for n, d in zip(received, recv_displs) if n), default=0)].copy()
    fresh[fresh == -100] = 0
    with verdicts(comm) as check:
        for algorithm in algorithms("alltoall"):
            for counts in (sends, matrix):
                out = np.full_like(want, -100)
                into = comm.alltoall(x, counts, algorithm, out, send_displs=send_displs, recv_displs=recv_displs)
                sent = comm.ialltoall(x, counts, algorithm, send_displs=send_displs).wait()
                placed = comm.alltoall(packed_in, counts, algorithm, recv_displs=recv_displs)
                check(into is out and same(out, want) and same(sent, packed_out) and same(placed, fresh),
                      f"alltoall displs {algorithm} counts {'matrix' if counts is matrix else 'row'}")


def test_displacements_are_each_ranks_own(comm):
    """MPI's receive displacements are local: rank 0 lays out its result packed (no displs) while the others place
    the blocks in reverse with gaps; likewise alltoall's displacements on rank 0 only, even blocks and all-zero
    counts among them. Every algorithm, blocking and not, validated too, against MPI's own call made per rank;
    then a plain call. Before, MPI's own algorithm ran MPI_Allgather (Alltoall) on the ranks without
    displacements and the v-call on the others: the job hung, and validation refused the legal call."""
    rank, size = comm.rank, comm.size
    reverse = [2 * (size - 1 - i) for i in range(size)]          # gaps between, in reverse rank order
    with pc.Communicator(comm.mpi, validate=True) as checked, verdicts(comm) as check:
        for c in (comm, checked):
            for algorithm in algorithms("allgather"):
                x = np.full((1, 2), 10 * (rank + 1), np.int64)
                displs = None if rank == 0 else reverse
                want = np.zeros((size if rank == 0 else 2 * size - 1, 2), np.int64)
                comm.mpi.Allgatherv(x, [want, ([2] * size, [2 * d for d in (displs or range(size))])])
                got = c.allgather(x, algorithm=algorithm, counts=[1] * size, displs=displs)
                later = c.iallgather(x, algorithm=algorithm, counts=[1] * size, displs=displs).wait()
                check(same(got, want) and same(later, want), f"allgather {algorithm} validate={c.validate}")
            for algorithm in algorithms("alltoall"):
                for per in (0, 2):
                    x = np.arange(2 * per * size, dtype=np.int64).reshape(per * size, 2) + 100 * rank
                    spread = rank == 0 and size > 1
                    sd = [per * (size - 1 - j) for j in range(size)] if spread else None   # blocks reversed in x
                    rd = [(per + 1) * i for i in range(size)] if spread else None          # a row between
                    rows = max([d + per for d in rd if per], default=0) if rd else per * size
                    want = np.zeros((rows, 2), np.int64)
                    send_at = sd or [per * j for j in range(size)]
                    comm.mpi.Alltoallv([x, ([2 * per] * size, [2 * d for d in send_at])],
                                       [want, ([2 * per] * size, [2 * d for d in (rd or [per * i for i in range(size)])])])
                    got = c.alltoall(x, [per] * size, algorithm, send_displs=sd, recv_displs=rd)
                    later = c.ialltoall(x, [per] * size, algorithm, send_displs=sd, recv_displs=rd).wait()
                    check(same(got, want) and same(later, want),
                          f"alltoall {algorithm} {per} rows each validate={c.validate}")
            plain = c.allgather(np.full(2, rank))
            check(same(plain, np.repeat(np.arange(size), 2)), "a plain allgather after")

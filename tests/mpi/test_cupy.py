"""The collectives on CuPy arrays, each result compared with MPI on host copies (or with the NumPy path).

Every result must be a CuPy array on device 0 with the expected dtype and shape. The module runs
each test in two staging modes, each with its own fresh Communicator:

- ``default``: the environment as launched (``PYCOLLECT_CUDA_AWARE`` if set, else MPI's own query);
- ``host``: ``PYCOLLECT_CUDA_AWARE=0``, device buffers staged through host memory;
- ``aware`` (only with ``PYCOLLECT_TEST_CUDA_AWARE=1``): ``PYCOLLECT_CUDA_AWARE=1``, device
  pointers handed to MPI. Only for an MPI built with CUDA support (the PyPI MPICH wheel is not).

Ranks share one device (device 0). Without a usable GPU every rank skips the whole module.
``PYCOLLECT_TEST_CUPY_STANDIN=numpy`` runs the same tests with NumPy standing in for CuPy, which
checks the tests' own expectations on a machine without a GPU (it does not exercise CuPy code).
"""
import os
import types

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")

STANDIN = os.environ.get("PYCOLLECT_TEST_CUPY_STANDIN") == "numpy"
if STANDIN:
    xp = types.SimpleNamespace(ndarray=np.ndarray, asarray=lambda a: np.array(a, copy=True),
                               asnumpy=np.asarray, empty=np.empty, zeros=np.zeros, full=np.full)
else:
    if not cupy.cuda.is_available():
        pytest.skip("CuPy is installed but no CUDA device is usable", allow_module_level=True)
    cupy.cuda.Device(0).use()
    xp = cupy

import pycollect as pc  # noqa: E402
from helpers import (agree, integer_valued, mpi_allgather, mpi_allreduce, mpi_alltoall,  # noqa: E402
                     mpi_reduce_scatter, same)
from pycollect.engine import backend  # noqa: E402
from pycollect.engine.layout import split_even  # noqa: E402
from pycollect.engine.mpi_native import supports as mpi_supports  # noqa: E402
from mpi4py import MPI  # noqa: E402

F2, F4, F8, I4 = (np.dtype(t) for t in ("f2", "f4", "f8", "i4"))
DTYPES = (F4, F8, I4, F2)
MODES = ("default", "host") + (("aware",) if os.environ.get("PYCOLLECT_TEST_CUDA_AWARE") == "1" else ())
MODE_ENV = {"default": None, "host": "0", "aware": "1"}


@pytest.fixture(scope="module", params=MODES)
def gcomm(request):
    """A fresh Communicator whose staging mode is fixed by the environment at its first device call."""
    with pytest.MonkeyPatch.context() as mp:
        if MODE_ENV[request.param] is not None:
            mp.setenv("PYCOLLECT_CUDA_AWARE", MODE_ENV[request.param])
        c = pc.Communicator()
        c.stages_through_host(xp)  # read the environment now, while it is patched
        yield c
        c.free()


def cases(size):
    """(dtype, op, length): sum and max of every dtype at lengths around the world size, avg of two."""
    for dtype in DTYPES:
        for op in ("sum", "max") + (("avg",) if dtype in (F4, I4) else ()):
            for n in sorted({0, 1, size + 1, 13, 97}):
                yield dtype, op, n


def usable(algorithm, dtype):
    return algorithm != "mpi" or mpi_supports(dtype)


def on_device(got, dtype, shape) -> bool:
    """A device array of ``dtype`` and ``shape`` (on device 0 when CuPy is real)."""
    if not isinstance(got, xp.ndarray) or got.dtype != dtype or tuple(got.shape) != tuple(shape):
        return False
    return STANDIN or got.device.id == 0


def matches(got, expected) -> bool:
    """``got`` is on the device and equals the host array ``expected`` exactly (None matches None)."""
    if expected is None or got is None:
        return got is None and expected is None
    return on_device(got, expected.dtype, expected.shape) and same(xp.asnumpy(got), expected)


# -- staging ------------------------------------------------------------------------------------------------
def test_staging_mode(gcomm, request):
    if STANDIN:
        pytest.skip("NumPy stand-in: there is no device to stage")
    mode = request.node.callspec.params["gcomm"]
    expected = {"host": True, "aware": False}.get(mode, not backend.cuda_aware(MPI))
    agree(gcomm, gcomm.stages_through_host(cupy) is expected, f"mode {mode}: staging is {gcomm.stages_through_host(cupy)}")


# -- allreduce ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("algorithm", pc.algorithms("allreduce"))
def test_allreduce(gcomm, algorithm):
    for seed, (dtype, op, n) in enumerate(cases(gcomm.size)):
        if not usable(algorithm, dtype):
            continue
        x = integer_valued((n,), dtype, op, seed * 31 + gcomm.rank)
        expected = mpi_allreduce(gcomm.mpi, x, op)
        xd = xp.asarray(x)
        got = gcomm.allreduce(xd, op=op, algorithm=algorithm)
        agree(gcomm, matches(got, expected) and same(xp.asnumpy(xd), x),
              f"allreduce {algorithm} {dtype} {op} n={n}")
        back = gcomm.allreduce(xd, op=op, algorithm=algorithm, out=xd)
        agree(gcomm, back is xd and matches(xd, expected), f"allreduce in place {algorithm} {dtype} {op} n={n}")


@pytest.mark.parametrize("algorithm", pc.algorithms("allreduce"))
def test_allreduce_strided(gcomm, algorithm):
    """Non-contiguous input, a strided ``out`` and in place on a strided view."""
    x = integer_valued((6, 5, 4), F4, "sum", gcomm.rank)
    expected = mpi_allreduce(gcomm.mpi, np.ascontiguousarray(x[:, ::2, 1:]), "sum")
    xd = xp.asarray(x)
    view = xd[:, ::2, 1:]                                   # (6, 3, 3), not contiguous
    got = gcomm.allreduce(view, algorithm=algorithm)
    out = xp.zeros((6, 3, 6), F4)[:, :, ::2]                # strided out
    back = gcomm.allreduce(view, algorithm=algorithm, out=out)
    agree(gcomm, matches(got, expected) and back is out and matches(out, expected),
          f"strided allreduce {algorithm}")
    gcomm.allreduce(view, algorithm=algorithm, out=view)
    host = xp.asnumpy(xd)
    agree(gcomm, same(host[:, ::2, 1:], expected) and same(host[:, 1::2], x[:, 1::2]),
          f"strided in-place allreduce {algorithm}")


@pytest.mark.parametrize("algorithm", ["ring", "recursive_doubling", "rabenseifner", "tree", "hierarchical"])
def test_allreduce_segmented(gcomm, algorithm):
    """Messages split into many segments and pipelined pieces: 64-byte segments over 3000 elements."""
    small = pc.Communicator(segment_bytes=64, tree_segment_bytes=128)
    try:
        for dtype in (F4, F2):
            x = integer_valued((3000,), dtype, "sum", 7 * gcomm.rank + dtype.itemsize)
            got = small.allreduce(xp.asarray(x), algorithm=algorithm)
            agree(gcomm, matches(got, mpi_allreduce(gcomm.mpi, x, "sum")), f"segmented {algorithm} {dtype}")
    finally:
        small.free()


@pytest.mark.parametrize("algorithm", pc.algorithms("allreduce"))
def test_allreduce_random_floats_match_numpy(gcomm, algorithm):
    """Random floats: the device result is the NumPy path's result (same algorithm) within rounding."""
    rng = np.random.default_rng(gcomm.rank)
    for dtype in (F4, F8, F2):
        if not usable(algorithm, dtype):
            continue
        x = rng.uniform(-1, 1, (1001,)).astype(dtype)
        want = gcomm.allreduce(x, algorithm=algorithm)
        got = gcomm.allreduce(xp.asarray(x), algorithm=algorithm)
        tol = 4 * gcomm.size * gcomm.size * np.finfo(dtype).eps
        ok = on_device(got, dtype, x.shape) and np.allclose(xp.asnumpy(got).astype(np.float64), want, rtol=0, atol=tol)
        agree(gcomm, ok, f"random {dtype} allreduce {algorithm} against the NumPy path")


def test_accumulate_float32(gcomm):
    """float16 on the device accumulated in float32: 2048 + 1 + 1 ... stays exact."""
    x = xp.asarray(np.full(10, 2048.0 if gcomm.rank == 0 else 1.0, np.float16))
    expected = np.full(10, np.float16(2048.0 + gcomm.size - 1), np.float16)
    for algorithm in ("ring", "recursive_doubling", "tree", "auto"):
        got = gcomm.allreduce(x, algorithm=algorithm, accumulate="float32")
        agree(gcomm, matches(got, expected), f"accumulate {algorithm}")


# -- reduce_scatter, allgather, alltoall ----------------------------------------------------------------------
@pytest.mark.parametrize("algorithm", pc.algorithms("reduce_scatter"))
def test_reduce_scatter(gcomm, algorithm):
    size = gcomm.size
    for seed, (dtype, op, n) in enumerate(cases(size)):
        if not usable(algorithm, dtype):
            continue
        uneven = tuple((i * 7 + seed) % 3 for i in range(size))
        for counts in (None, uneven):
            rows = split_even(n, size) if counts is None else counts
            x = integer_valued((sum(rows), 2), dtype, op, seed * 17 + gcomm.rank)
            expected = mpi_reduce_scatter(gcomm.mpi, x, op, rows)
            xd = xp.asarray(x)
            got = gcomm.reduce_scatter(xd, op=op, counts=counts, algorithm=algorithm)
            agree(gcomm, matches(got, expected) and same(xp.asnumpy(xd), x),
                  f"reduce_scatter {algorithm} {dtype} {op} n={n} counts={counts}")


@pytest.mark.parametrize("algorithm", pc.algorithms("allgather"))
def test_allgather(gcomm, algorithm):
    """Equal and uneven lengths (zeros included), counts exchanged or given."""
    size = gcomm.size
    for seed, dtype in enumerate(DTYPES):
        if not usable(algorithm, dtype):
            continue
        for n in (1, size + 1, 13):
            for rows in (n, (gcomm.rank * 5 + n) % 4):
                x = integer_valued((rows, 3), dtype, "sum", seed * 13 + gcomm.rank)
                expected = mpi_allgather(gcomm.mpi, x)
                got = gcomm.allgather(xp.asarray(x), algorithm=algorithm)
                counts = gcomm.mpi.allgather(rows)
                given = gcomm.allgather(xp.asarray(x), algorithm=algorithm, counts=counts)
                agree(gcomm, matches(got, expected) and matches(given, expected),
                      f"allgather {algorithm} {dtype} rows={rows}")


@pytest.mark.parametrize("algorithm", pc.algorithms("alltoall"))
def test_alltoall(gcomm, algorithm):
    """Even blocks, then uneven ``counts=`` (MPI_Alltoallv)."""
    size = gcomm.size
    for seed, dtype in enumerate(DTYPES):
        if not usable(algorithm, dtype):
            continue
        for n in (0, size, 2 * size + 1, 13):
            x = integer_valued((n, 2), dtype, "sum", seed * 7 + gcomm.rank)
            expected = mpi_alltoall(gcomm.mpi, x, split_even(n, size))
            got = gcomm.alltoall(xp.asarray(x), algorithm=algorithm)
            agree(gcomm, matches(got, expected), f"alltoall {algorithm} {dtype} n={n}")
            counts = [(gcomm.rank + 2 * j + seed + n) % 4 for j in range(size)]
            xv = integer_valued((sum(counts), 2), dtype, "sum", seed + 1000 * gcomm.rank)
            expected = mpi_alltoall(gcomm.mpi, xv, counts)
            got = gcomm.alltoall(xp.asarray(xv), counts=counts, algorithm=algorithm)
            agree(gcomm, matches(got, expected), f"alltoallv {algorithm} {dtype} counts={counts}")


@pytest.mark.parametrize("algorithm", pc.algorithms("alltoall"))
def test_alltoall_in_place(gcomm, algorithm):
    """``out=x``: even blocks, then circulant counts whose own block sits at different offsets in
    ``x`` and in the result (a copy between overlapping ranges of one device buffer)."""
    size, rank = gcomm.size, gcomm.rank
    base = [(3 * k + 1) % 5 for k in range(size)]
    counts = [base[(j - rank) % size] for j in range(size)]   # every rank receives sum(base) rows too
    for rows, given in ((2 * size, None), (sum(counts), counts)):
        x = integer_valued((rows, 2), F4, "sum", 40 + rank)
        expected = mpi_alltoall(gcomm.mpi, x, split_even(rows, size) if given is None else given)
        xd = xp.asarray(x)
        back = gcomm.alltoall(xd, counts=given, algorithm=algorithm, out=xd)
        agree(gcomm, back is xd and matches(xd, expected), f"alltoall in place {algorithm} counts={given}")


# -- broadcast and reduce -------------------------------------------------------------------------------------
@pytest.mark.parametrize("algorithm", pc.algorithms("broadcast"))
def test_broadcast(gcomm, algorithm):
    for root in sorted({0, gcomm.size - 1, gcomm.size // 2}):
        for seed, dtype in enumerate(DTYPES):
            if not usable(algorithm, dtype):
                continue
            for n in (0, 1, 13, 97):
                x = integer_valued((n,), dtype, "sum", seed * 11 + gcomm.rank)
                expected = gcomm.mpi.bcast(x, root=root)
                xd = xp.asarray(x)
                got = gcomm.broadcast(xd, root=root, algorithm=algorithm)
                agree(gcomm, matches(got, expected) and same(xp.asnumpy(xd), x),
                      f"broadcast {algorithm} root={root} {dtype} n={n}")
                back = gcomm.broadcast(xd, root=root, algorithm=algorithm, out=xd)
                agree(gcomm, back is xd and matches(xd, expected),
                      f"broadcast in place {algorithm} root={root} {dtype} n={n}")


@pytest.mark.parametrize("algorithm", pc.algorithms("reduce"))
def test_reduce(gcomm, algorithm):
    for root in sorted({0, gcomm.size - 1, gcomm.size // 2}):
        for seed, (dtype, op, n) in enumerate(cases(gcomm.size)):
            if not usable(algorithm, dtype):
                continue
            x = integer_valued((n,), dtype, op, seed * 3 + gcomm.rank)
            total = mpi_allreduce(gcomm.mpi, x, op)
            expected = total if gcomm.rank == root else None
            xd = xp.asarray(x)
            got = gcomm.reduce(xd, root=root, op=op, algorithm=algorithm)
            agree(gcomm, matches(got, expected) and same(xp.asnumpy(xd), x),
                  f"reduce {algorithm} root={root} {dtype} {op} n={n}")
            out = xp.zeros(x.shape, dtype) if gcomm.rank == root else None
            back = gcomm.reduce(xd, root=root, op=op, algorithm=algorithm, out=out)
            agree(gcomm, back is out and matches(out, expected), f"reduce out= {algorithm} root={root} {dtype} {op}")


# -- non-blocking calls -------------------------------------------------------------------------------------
@pytest.mark.parametrize("algorithm", pc.algorithms("allreduce"))
def test_iallreduce(gcomm, algorithm):
    """Started, tested a few times, waited: the same result as MPI; ``test()`` True after ``wait()``."""
    for seed, (dtype, op, n) in enumerate(cases(gcomm.size)):
        if not usable(algorithm, dtype) or n not in (1, 97):
            continue
        x = integer_valued((n,), dtype, op, seed * 5 + gcomm.rank)
        expected = mpi_allreduce(gcomm.mpi, x, op)
        req = gcomm.iallreduce(xp.asarray(x), op=op, algorithm=algorithm)
        for _ in range(3):
            req.test()
        got = req.wait()
        agree(gcomm, req.test() and req.wait() is got and matches(got, expected),
              f"iallreduce {algorithm} {dtype} {op} n={n}")


@pytest.mark.parametrize("algorithm", ["mpi", "ring", "auto"])
def test_nonblocking_together(gcomm, algorithm):
    """ireduce_scatter, iallgather, ialltoall and iallreduce (in place) in flight at once, tested round-robin."""
    size, rank = gcomm.size, gcomm.rank
    ar = integer_valued((3 * size + 1,), I4, "sum", rank)
    rs = integer_valued((3 * size + 1, 2), F8, "sum", rank + 10)
    ag = integer_valued((rank + 1, 2), F4, "sum", rank + 20)
    a2a = integer_valued((2 * size, 3), I4, "sum", rank + 30)
    rows = split_even(rs.shape[0], size)
    expected = [mpi_allreduce(gcomm.mpi, ar, "sum"), mpi_reduce_scatter(gcomm.mpi, rs, "sum", rows),
                mpi_allgather(gcomm.mpi, ag), mpi_alltoall(gcomm.mpi, a2a, split_even(a2a.shape[0], size))]
    ard = xp.asarray(ar)
    other = "pairwise" if algorithm == "ring" else algorithm
    reqs = [gcomm.iallreduce(ard, algorithm=algorithm, out=ard),
            gcomm.ireduce_scatter(xp.asarray(rs), algorithm=algorithm),
            gcomm.iallgather(xp.asarray(ag), algorithm=algorithm),
            gcomm.ialltoall(xp.asarray(a2a), algorithm=other)]
    while not all([r.test() for r in reqs]):
        pass
    got = pc.wait_all(reqs)
    ok = got[0] is ard and all(matches(g, e) for g, e in zip(got, expected))
    agree(gcomm, ok, f"non-blocking collectives together ({algorithm})")


# -- point to point -----------------------------------------------------------------------------------------
def test_isend_irecv_ring(gcomm):
    """Each rank sends to its right and receives from its left (itself at one rank)."""
    size, rank = gcomm.size, gcomm.rank
    right, left = (rank + 1) % size, (rank - 1) % size
    for seed, dtype in enumerate(DTYPES):
        x = integer_valued((5, 3), dtype, "sum", 100 * seed + rank)
        expected = integer_valued((5, 3), dtype, "sum", 100 * seed + left)
        box = xp.zeros((5, 3), dtype)
        rreq = gcomm.irecv(box, left, tag=3)
        sreq = gcomm.isend(xp.asarray(x), right, tag=3)
        got = rreq.wait()
        sreq.wait()
        agree(gcomm, got is box and matches(box, expected), f"isend/irecv {dtype}")


def test_send_recv_strided(gcomm):
    """Blocking pairs (0,1), (2,3), ...: a non-contiguous device array sent, received into a contiguous one."""
    rank = gcomm.rank
    partner = rank ^ 1
    ok = True
    if partner < gcomm.size:
        x = integer_valued((6, 4), F4, "sum", rank)
        mine, theirs = x[:, ::2], integer_valued((6, 4), F4, "sum", partner)[:, ::2]
        box = xp.empty((6, 2), F4)
        if rank % 2 == 0:
            gcomm.send(xp.asarray(x)[:, ::2], partner, tag=5)
            got = gcomm.recv(box, partner, tag=5)
        else:
            got = gcomm.recv(box, partner, tag=5)
            gcomm.send(xp.asarray(x)[:, ::2], partner, tag=5)
        ok = got is box and matches(box, np.ascontiguousarray(theirs)) and mine.shape == (6, 2)
    agree(gcomm, ok, "strided send / recv")

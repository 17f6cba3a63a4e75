"""The ``"mpi"`` algorithm: MPI's own collectives on the same buffers, the baseline everything is measured against.

Even blocks go to MPI's regular call (``MPI_Allgather``, ``MPI_Reduce_scatter_block``,
``MPI_Alltoall``), uneven ones to its v-form: MPICH runs other, slower algorithms for the
v-forms. Which one, and its count and displacement lists, is decided once per shape.

Under the watchdog (``comm._watch``, PYCOLLECT_TIMEOUT) every call starts the non-blocking
twin of its MPI collective and polls it to the deadline instead of blocking in MPI.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np
from mpi4py import MPI

from . import ops
from .abort import collective_failed
from .backend import flat, sync
from .layout import offsets
from .request import Request

_MPI_OPS = {"sum": MPI.SUM, "avg": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX,
            "band": MPI.BAND, "bor": MPI.BOR, "bxor": MPI.BXOR}
# Dtypes MPI reduces natively (MPI has no float16 or bfloat16 reductions).
_NATIVE = {np.dtype(t) for t in ("i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f4", "f8", "c8", "c16")}


def mpi_op(op: str):
    """MPI's op for an op name (``avg`` is a sum, divided afterwards)."""
    return _MPI_OPS[op]


def supports(dtype) -> bool:
    return np.dtype(dtype) in _NATIVE


def lean_table(selector, collective: str = "allreduce") -> dict:
    """``{(dtype, op, algorithm): (MPI op, largest nbytes)}`` for calls that go straight to MPI's regular call.

    ``"auto"`` qualifies up to the size where the selector stops choosing ``"mpi"``; ``avg``
    needs a division afterwards and takes the general path. For alltoall (no op) the key's op is None.
    """
    limit = selector.mpi_limit(collective)
    table = {}
    for dtype in _NATIVE:
        for op, mpi_op in (_MPI_OPS.items() if collective in ("allreduce", "reduce_scatter") else [(None, None)]):
            if op == "avg" or (op in ("band", "bor", "bxor") and dtype.kind not in "iu") \
                    or (op in ("min", "max") and dtype.kind == "c"):
                continue
            table[(dtype, op, "mpi")] = (mpi_op, float("inf"))
            if limit:
                table[(dtype, op, "auto")] = (mpi_op, limit)
    return table


class _Host:
    """Buffers MPI may touch: device arrays as-is when MPI is CUDA-aware, else host copies."""

    def __init__(self, comm, xp):
        self.xp, self.staging = xp, comm._staging(xp)

    def ready(self) -> None:
        """Finish the copies queued on the device before MPI reads or writes its memory."""
        if self.xp is not np and not self.staging:
            sync(self.xp)

    def arg(self, a):
        return self.xp.asnumpy(a) if self.staging else a

    def send_buffer(self, x):
        """``x`` as MPI reads it: contiguous (MPI takes a contiguous array of any shape as its bytes in order)."""
        a = self.arg(x)
        return a if a.flags.c_contiguous else a.ravel()

    def result(self, host, out, shape, dtype):
        """Return ``host`` as the caller's backend, written into ``out`` when given."""
        if host is out:   # MPI wrote into out itself: nothing to copy
            return out
        dev = self.xp.asarray(host) if self.staging else host
        if dev.shape != shape:
            dev = dev.reshape(shape)
        if out is not None:
            if dev is not out:
                out[...] = dev
            return out
        return dev


def _empty(xp, shape, dtype, out, staging, x):
    """The receive buffer: ``out`` itself when MPI may write it directly (contiguous, on a
    reachable device, apart from the send buffer ``x``, since MPI forbids aliasing)."""
    if out is not None and out.flags.c_contiguous and not staging and not xp.may_share_memory(out, x):
        return out
    return np.empty(shape, dtype) if staging else xp.empty(shape, dtype)


def allreduce(comm, x, op, out, xp, blocking):
    h = _Host(comm, xp)
    if out is x and x.flags.c_contiguous and not h.staging:
        send, recv = MPI.IN_PLACE, x
    else:
        send, recv = flat(h.arg(x)), _empty(xp, x.shape, x.dtype, out, h.staging, x)

    def finish():
        result = h.result(recv, out, x.shape, x.dtype)
        if op == "avg":
            ops.finish_avg(result, comm.size, xp)
        return result
    h.ready()
    return _call(comm, "allreduce", x, blocking, comm._lib.Allreduce, comm._lib.Iallreduce,
                 (send, recv, _MPI_OPS[op]), finish)


def reduce_scatter(comm, x, op, elems, shape, out, xp, blocking):
    h = _Host(comm, xp)
    recv = _empty(xp, shape, x.dtype, out, h.staging, x)

    def finish():
        result = h.result(recv, out, shape, x.dtype)
        if op == "avg":
            ops.finish_avg(result, comm.size, xp)
        return result
    vector = _vector(elems)
    if vector is None:   # even blocks: MPI's regular call (MPICH runs slower algorithms for the v-form)
        run, start, args = comm._lib.Reduce_scatter_block, comm._lib.Ireduce_scatter_block, (flat(h.arg(x)), recv,
                                                                                            _MPI_OPS[op])
    else:
        run, start, args = comm._lib.Reduce_scatter, comm._lib.Ireduce_scatter, (flat(h.arg(x)), recv, vector[0],
                                                                                _MPI_OPS[op])
    h.ready()
    return _call(comm, "reduce_scatter", x, blocking, run, start, args, finish)


def allgather(comm, x, elems, shape, out, xp, blocking):
    h = _Host(comm, xp)
    recv = _empty(xp, shape, x.dtype, out, h.staging, x)
    vector = _vector(elems)
    if vector is None:   # even blocks: MPI_Allgather
        run, start, args = comm._lib.Allgather, comm._lib.Iallgather, (h.send_buffer(x), recv)
    else:
        run, start, args = comm._lib.Allgatherv, comm._lib.Iallgatherv, (h.send_buffer(x), [recv, vector])
    h.ready()
    return _call(comm, "allgather", x, blocking, run, start, args, lambda: h.result(recv, out, shape, x.dtype))


def alltoall(comm, x, matrix, shape, out, xp, blocking):
    h = _Host(comm, xp)
    recv = _empty(xp, shape, x.dtype, out, h.staging, x)
    vectors = _alltoall_vectors(matrix, comm.rank)
    if vectors is None:  # every block of every rank the same size: MPI_Alltoall
        run, start, args = comm._lib.Alltoall, comm._lib.Ialltoall, (flat(h.arg(x)), recv)
    else:
        send, received = vectors
        run, start, args = comm._lib.Alltoallv, comm._lib.Ialltoallv, ([flat(h.arg(x)), send], [recv, received])
    h.ready()
    return _call(comm, "alltoall", x, blocking, run, start, args, lambda: h.result(recv, out, shape, x.dtype))


# -- which MPI call: the regular one for even blocks, computed once per shape ---------------------------------
_REGULAR = {"reduce_scatter": ("Reduce_scatter_block", "Reduce_scatter"), "allgather": ("Allgather", "Allgatherv"),
            "alltoall": ("Alltoall", "Alltoallv"), "allreduce": ("Allreduce",) * 2, "broadcast": ("Bcast",) * 2,
            "reduce": ("Reduce",) * 2}


def mpi_call(collective: str, even: bool = True) -> str:
    """The name of the MPI collective the ``"mpi"`` algorithm calls (``Allgather`` for even blocks, ``Allgatherv``
    otherwise): what the benchmarks compare with."""
    return _REGULAR[collective][0 if even else 1]


@lru_cache(maxsize=256)
def _vector(elems: tuple) -> tuple | None:
    """None when every block has the same size (MPI's regular call), else ``(counts, displacements)``."""
    if len(set(elems)) <= 1:
        return None
    return list(elems), list(offsets(elems)[:-1])


@lru_cache(maxsize=256)
def _alltoall_vectors(matrix: tuple, rank: int) -> tuple | None:
    """None when every entry of ``matrix`` is the same, else this rank's (send, receive) ``(counts, displacements)``."""
    if len({c for row in matrix for c in row}) <= 1:
        return None
    send_counts = list(matrix[rank])
    recv_counts = [row[rank] for row in matrix]
    return (send_counts, list(offsets(send_counts)[:-1])), (recv_counts, list(offsets(recv_counts)[:-1]))


def broadcast(comm, x, root, out, xp):
    h = _Host(comm, xp)
    in_place = out is x and x.flags.c_contiguous and not h.staging   # Bcast works in place anyway
    buf = x if in_place else _empty(xp, x.shape, x.dtype, out, h.staging, x)
    if comm.rank == root and buf is not x:
        buf[...] = h.arg(x)
    h.ready()
    return _call(comm, "broadcast", x, True, comm._lib.Bcast, comm._lib.Ibcast, (buf, root),
                 lambda: h.result(buf, out, x.shape, x.dtype))


def reduce(comm, x, root, op, out, xp):
    h = _Host(comm, xp)
    at_root = comm.rank == root
    if at_root and out is x and x.flags.c_contiguous and not h.staging:
        send, recv = MPI.IN_PLACE, x
    else:
        send = flat(h.arg(x))
        recv = _empty(xp, x.shape, x.dtype, out, h.staging, x) if at_root else None
    h.ready()

    def finish():
        if not at_root:
            return None
        result = h.result(recv, out, x.shape, x.dtype)
        if op == "avg":
            ops.finish_avg(result, comm.size, xp)
        return result
    return _call(comm, "reduce", x, True, comm._lib.Reduce, comm._lib.Ireduce, (send, recv, _MPI_OPS[op], root), finish)


def _call(comm, collective: str, x, blocking: bool, run, start, args, finish):
    """``run(*args)`` then ``finish()``; non-blocking, a Request on ``start(*args)``; under the watchdog, polled.

    MPI raising inside its collective ends the job naming the call (engine/abort.py): the other
    ranks may be inside it too.
    """
    if comm._watch is not None:
        return _watched(comm, collective, x, start(*args), finish, blocking)
    try:
        if blocking:
            run(*args)
            return finish()
        request = start(*args)
    except MPI.Exception as e:
        collective_failed(f"{collective} #{comm._seq} (mpi)", comm.rank, e)
    return Request.of_mpi(request, finish, None, f"{collective} #{comm._seq} (mpi)", comm.rank)


def _watched(comm, collective: str, x, request, finish, blocking: bool = True):
    """Under the watchdog: the started ``request`` waited to its deadline here, or by ``Request.wait()``."""
    watch = comm._watch.call(collective, comm._seq, "mpi", x.nbytes, x.dtype)
    if not blocking:
        return Request.of_mpi(request, finish, watch, f"{collective} #{comm._seq} (mpi)", comm.rank)
    watch.finish([request])
    return finish()

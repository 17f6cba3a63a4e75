"""The face: mpi4py's upper-case collectives, each read into arrays and handed to the Communicator."""
from __future__ import annotations

import numpy as np
from mpi4py import MPI

from ..comm import Communicator
from . import buffers
from .buffers import Block, Vector, in_place
from .reductions import UserOps, reduction
from .requests import Request


class Face:
    """mpi4py's buffer collectives over pycollect's algorithms; anything else is the wrapped communicator's.

        comm = pc.mpi4py(MPI.COMM_WORLD)   # was: comm = MPI.COMM_WORLD

    ``Allreduce``, ``Reduce``, ``Bcast``, ``Gather(v)``, ``Scatter(v)``, ``Allgather(v)``, ``Alltoall(v)``,
    ``Reduce_scatter(_block)``, ``Scan``, ``Exscan``, ``Barrier`` and their ``I``-forms take every buffer
    specification mpi4py takes (an array, ``[buf, MPI.DOUBLE]``, ``[buf, count, type]``,
    ``[buf, (counts, displs), type]``, ``MPI.IN_PLACE``) and ops (predefined, ``MINLOC``/``MAXLOC`` on pair
    types, ``MPI.Op.Create``), write the result into the caller's recvbuf and return None (the ``I``-forms a
    Request with ``Wait``, ``Test``, ``Request.Waitall``). Each runs as the Communicator's method of the same
    collective (``face.pycollect``, built on ``comm`` with ``settings``: tuning, validate, timeout, ...).
    Every other attribute (``Get_rank``, ``rank``, ``Split``, ``Send``, lower-case pickling calls) is the
    wrapped communicator's. Blocks at displacements that are not back to back are gathered or scattered
    through a contiguous temporary and copied into place. Send and receive sides name elements of one
    NumPy dtype (MPI allows any two of one type signature).
    """

    Request = Request   # pc.mpi4py.Request.Waitall(requests), as MPI.Request.Waitall reads

    def __init__(self, comm: MPI.Intracomm, **settings):
        if not isinstance(comm, MPI.Intracomm):
            raise TypeError(f"mpi4py: comm must be an MPI.Intracomm (MPI.COMM_WORLD, ...), got {type(comm).__name__}")
        self.mpi, self.pycollect = comm, Communicator(comm, **settings)
        self._user_ops = UserOps()

    def __getattr__(self, name: str):
        if name in ("mpi", "pycollect", "_user_ops"):   # not set yet: no wrapped communicator to ask
            raise AttributeError(name)
        return getattr(self.mpi, name)

    def __repr__(self) -> str:
        return f"pycollect.mpi4py({self.pycollect!r})"

    # -- reductions -------------------------------------------------------------------------------------
    def Allreduce(self, sendbuf, recvbuf, op=MPI.SUM) -> None:
        self._allreduce(sendbuf, recvbuf, op, True)

    def Iallreduce(self, sendbuf, recvbuf, op=MPI.SUM) -> Request:
        return self._allreduce(sendbuf, recvbuf, op, False)

    def Reduce(self, sendbuf, recvbuf, op=MPI.SUM, root: int = 0) -> None:
        self._reduce(sendbuf, recvbuf, op, root, True)

    def Ireduce(self, sendbuf, recvbuf, op=MPI.SUM, root: int = 0) -> Request:
        return self._reduce(sendbuf, recvbuf, op, root, False)

    def Scan(self, sendbuf, recvbuf, op=MPI.SUM) -> None:
        self._prefix("scan", sendbuf, recvbuf, op, True)

    def Iscan(self, sendbuf, recvbuf, op=MPI.SUM) -> Request:
        return self._prefix("scan", sendbuf, recvbuf, op, False)

    def Exscan(self, sendbuf, recvbuf, op=MPI.SUM) -> None:
        """MPI_Exscan: rank 0's recvbuf is left as it was (MPI leaves it undefined)."""
        self._prefix("exscan", sendbuf, recvbuf, op, True)

    def Iexscan(self, sendbuf, recvbuf, op=MPI.SUM) -> Request:
        return self._prefix("exscan", sendbuf, recvbuf, op, False)

    def Reduce_scatter_block(self, sendbuf, recvbuf, op=MPI.SUM) -> None:
        self._reduce_scatter_block(sendbuf, recvbuf, op, True)

    def Ireduce_scatter_block(self, sendbuf, recvbuf, op=MPI.SUM) -> Request:
        return self._reduce_scatter_block(sendbuf, recvbuf, op, False)

    def Reduce_scatter(self, sendbuf, recvbuf, recvcounts=None, op=MPI.SUM) -> None:
        """MPI_Reduce_scatter; without ``recvcounts`` the ranks' recvbuf counts are gathered first, as mpi4py does."""
        self._reduce_scatter(sendbuf, recvbuf, recvcounts, op, True)

    def Ireduce_scatter(self, sendbuf, recvbuf, recvcounts=None, op=MPI.SUM) -> Request:
        return self._reduce_scatter(sendbuf, recvbuf, recvcounts, op, False)

    # -- data movement ----------------------------------------------------------------------------------
    def Bcast(self, buf, root: int = 0) -> None:
        self._bcast(buf, root, True)

    def Ibcast(self, buf, root: int = 0) -> Request:
        return self._bcast(buf, root, False)

    def Gather(self, sendbuf, recvbuf, root: int = 0) -> None:
        self._gather("Gather", sendbuf, recvbuf, root, True)

    def Igather(self, sendbuf, recvbuf, root: int = 0) -> Request:
        return self._gather("Igather", sendbuf, recvbuf, root, False)

    def Gatherv(self, sendbuf, recvbuf, root: int = 0) -> None:
        self._gather("Gatherv", sendbuf, recvbuf, root, True)

    def Igatherv(self, sendbuf, recvbuf, root: int = 0) -> Request:
        return self._gather("Igatherv", sendbuf, recvbuf, root, False)

    def Scatter(self, sendbuf, recvbuf, root: int = 0) -> None:
        self._scatter("Scatter", sendbuf, recvbuf, root, True)

    def Iscatter(self, sendbuf, recvbuf, root: int = 0) -> Request:
        return self._scatter("Iscatter", sendbuf, recvbuf, root, False)

    def Scatterv(self, sendbuf, recvbuf, root: int = 0) -> None:
        self._scatter("Scatterv", sendbuf, recvbuf, root, True)

    def Iscatterv(self, sendbuf, recvbuf, root: int = 0) -> Request:
        return self._scatter("Iscatterv", sendbuf, recvbuf, root, False)

    def Allgather(self, sendbuf, recvbuf) -> None:
        self._allgather("Allgather", sendbuf, recvbuf, True)

    def Iallgather(self, sendbuf, recvbuf) -> Request:
        return self._allgather("Iallgather", sendbuf, recvbuf, False)

    def Allgatherv(self, sendbuf, recvbuf) -> None:
        self._allgather("Allgatherv", sendbuf, recvbuf, True)

    def Iallgatherv(self, sendbuf, recvbuf) -> Request:
        return self._allgather("Iallgatherv", sendbuf, recvbuf, False)

    def Alltoall(self, sendbuf, recvbuf) -> None:
        self._alltoall("Alltoall", sendbuf, recvbuf, True)

    def Ialltoall(self, sendbuf, recvbuf) -> Request:
        return self._alltoall("Ialltoall", sendbuf, recvbuf, False)

    def Alltoallv(self, sendbuf, recvbuf) -> None:
        self._alltoall("Alltoallv", sendbuf, recvbuf, True)

    def Ialltoallv(self, sendbuf, recvbuf) -> Request:
        return self._alltoall("Ialltoallv", sendbuf, recvbuf, False)

    def Barrier(self) -> None:
        self.pycollect.barrier()

    def Ibarrier(self) -> Request:
        """A non-blocking barrier: an allreduce of one byte (no rank's completes before every rank has started
        it), as the Communicator has no non-blocking barrier of its own."""
        return Request(self.pycollect.iallreduce(np.zeros(1, np.int8)))

    # -- routes -----------------------------------------------------------------------------------------
    def _allreduce(self, sendbuf, recvbuf, op, blocking):
        where = "Allreduce" if blocking else "Iallreduce"
        r = buffers.simple(recvbuf, where, "recvbuf", True)
        x, op, out = reduction(op, self._input(sendbuf, r, where), r.data, r.datatype, self._user_ops, where)
        return self._done(self._start("allreduce", where, blocking)(x, op=op, out=out), blocking)

    def _reduce(self, sendbuf, recvbuf, op, root, blocking):
        where = "Reduce" if blocking else "Ireduce"
        if self.pycollect.rank == root:
            r = buffers.simple(recvbuf, where, "recvbuf", True)
            x, out, datatype = self._input(sendbuf, r, where), r.data, r.datatype
        else:   # recvbuf is not read off the root, as in MPI
            s = buffers.simple(sendbuf, where, "sendbuf", False)
            x, out, datatype = s.data, None, s.datatype
        x, op, out = reduction(op, x, out, datatype, self._user_ops, where)
        return self._done(self._start("reduce", where, blocking)(x, root=root, op=op, out=out), blocking)

    def _prefix(self, name, sendbuf, recvbuf, op, blocking):
        """Scan and Exscan (``name`` says which): a prefix reduction into recvbuf."""
        where = ("" if blocking else "I") + name.capitalize()
        r = buffers.simple(recvbuf, where, "recvbuf", True)
        x, op, out = reduction(op, self._input(sendbuf, r, where), r.data, r.datatype, self._user_ops, where)
        return self._done(self._start(name, where, blocking)(x, op=op, out=out), blocking)

    def _reduce_scatter_block(self, sendbuf, recvbuf, op, blocking):
        """Even blocks: the Communicator's reduce_scatter_block, or its reduce_scatter with no counts (even
        blocks too) where it has none. IN_PLACE: recvbuf holds every rank's block, the result lands in its first."""
        where, size = ("Reduce_scatter_block" if blocking else "Ireduce_scatter_block"), self.pycollect.size
        if in_place(sendbuf):
            r = buffers.simple(recvbuf, where, "recvbuf", True, size)
            x, out = r.data.copy(), r.block(0)
        else:
            r = buffers.simple(recvbuf, where, "recvbuf", True)
            s = buffers.simple(sendbuf, where, "sendbuf", False, size)
            _same_reduction(s, r, where)
            x, out = s.data, r.data
        x, op, out = reduction(op, x, out, r.datatype, self._user_ops, where)
        name = "reduce_scatter_block" if hasattr(self.pycollect, "reduce_scatter_block") else "reduce_scatter"
        return self._done(self._start(name, where, blocking)(x, op=op, out=out), blocking)

    def _reduce_scatter(self, sendbuf, recvbuf, recvcounts, op, blocking):
        where = "Reduce_scatter" if blocking else "Ireduce_scatter"
        r = buffers.simple(recvbuf, where, "recvbuf", True)
        if in_place(sendbuf):
            if recvcounts is None:
                raise ValueError(f"{where}: MPI.IN_PLACE needs recvcounts (recvbuf holds every rank's block)")
            counts = buffers._per_rank(recvcounts, self.pycollect.size, where, "recvcounts", "counts")
            _fits(r.count, sum(counts), where, "recvbuf", "sum(recvcounts)")
            x, out = r.data[:sum(counts)].copy(), r.data[:counts[self.pycollect.rank]]
        else:
            s = buffers.simple(sendbuf, where, "sendbuf", False)
            counts = (self.mpi.allgather(r.count) if recvcounts is None   # as mpi4py: every rank's recvbuf count
                      else buffers._per_rank(recvcounts, self.pycollect.size, where, "recvcounts", "counts"))
            _same_type(s, r, where)
            _fits(s.count, sum(counts), where, "sendbuf", "sum(recvcounts)")
            _fits(r.count, counts[self.pycollect.rank], where, "recvbuf", f"recvcounts[{self.pycollect.rank}]")
            x, out = s.data, r.data
        x, op, out = reduction(op, x, out, r.datatype, self._user_ops, where)
        return self._done(self._start("reduce_scatter", where, blocking)(x, op=op, counts=counts, out=out), blocking)

    def _bcast(self, buf, root, blocking):
        where = "Bcast" if blocking else "Ibcast"
        rooted = self.pycollect.rank == root
        b = buffers.simple(buf, where, "buf", not rooted)   # the root's buffer is only read
        x = b.data
        out = x if not rooted or x.flags.writeable else None
        return self._done(self._start("broadcast", where, blocking)(x, root=root, out=out), blocking)

    def _gather(self, where, sendbuf, recvbuf, root, blocking):
        rank, size, v = self.pycollect.rank, self.pycollect.size, where.endswith("v")
        if rank == root:
            r = _vector(buffers.vector(recvbuf, where, "recvbuf", True, size) if v
                        else buffers.simple(recvbuf, where, "recvbuf", True, size), size)
            x = r.block(rank) if in_place(sendbuf) else _sent(sendbuf, r, where)
            counts = r.counts
        else:   # recvbuf is not read off the root; Gather's counts are every rank's own
            x, r = buffers.simple(sendbuf, where, "sendbuf", False).data, None
            counts = None if v else (len(x),) * size
        return self._placed("gather", where, blocking, x, r, root=root, counts=counts)

    def _scatter(self, where, sendbuf, recvbuf, root, blocking):
        rank, size, v = self.pycollect.rank, self.pycollect.size, where.endswith("v")
        if rank == root:
            s = _vector(buffers.vector(sendbuf, where, "sendbuf", False, size) if v
                        else buffers.simple(sendbuf, where, "sendbuf", False, size), size)
            x, counts = _packed(s), s.counts
            out = s.block(rank).copy() if in_place(recvbuf) else _received(recvbuf, s, where)
        else:   # sendbuf is not read off the root
            x, out = None, buffers.simple(recvbuf, where, "recvbuf", True).data
            counts = None if v else (len(out),) * size
        return self._done(self._start("scatter", where, blocking)(x, root=root, out=out, counts=counts), blocking)

    def _allgather(self, where, sendbuf, recvbuf, blocking):
        rank, size = self.pycollect.rank, self.pycollect.size
        r = _vector(buffers.vector(recvbuf, where, "recvbuf", True, size) if where.endswith("v")
                    else buffers.simple(recvbuf, where, "recvbuf", True, size), size)
        x = r.block(rank) if in_place(sendbuf) else _sent(sendbuf, r, where)
        return self._placed("allgather", where, blocking, x, r, counts=r.counts)

    def _alltoall(self, where, sendbuf, recvbuf, blocking):
        size, v = self.pycollect.size, where.endswith("v")
        r = _vector(buffers.vector(recvbuf, where, "recvbuf", True, size) if v
                    else buffers.simple(recvbuf, where, "recvbuf", True, size), size)
        if in_place(sendbuf):   # what goes to rank j lies where rank j's block arrives
            s = r
        else:
            s = _vector(buffers.vector(sendbuf, where, "sendbuf", False, size) if v
                        else buffers.simple(sendbuf, where, "sendbuf", False, size), size)
            _same_dtype(s.data, r.data, where)
        x = _packed(s)
        if s is r and x.base is not None:   # a view of recvbuf: read it before the results land there
            x = x.copy()
        return self._placed("alltoall", where, blocking, x, r, counts=s.counts if v else None)

    # -- helpers ----------------------------------------------------------------------------------------
    def _input(self, sendbuf, r: Block, where: str) -> np.ndarray:
        """A reduction's input: recvbuf's own elements for IN_PLACE or a sendbuf at recvbuf's address (mpi4py
        takes that for IN_PLACE), else sendbuf, of recvbuf's datatype and count as mpi4py checks."""
        if in_place(sendbuf):
            return r.data
        s = buffers.simple(sendbuf, where, "sendbuf", False)
        _same_reduction(s, r, where)
        if s.data.size and s.data.ctypes.data == r.data.ctypes.data:
            return r.data
        return s.data

    def _start(self, name: str, where: str, blocking: bool):
        """The Communicator's ``name`` (or its ``i``-form), or NotImplementedError naming the method it lacks."""
        method = getattr(self.pycollect, name if blocking else "i" + name, None)
        if method is None:
            raise NotImplementedError(f"{where}: routes to pycollect's Communicator.{name if blocking else 'i' + name}, "
                                      f"which this version of pycollect does not have")
        return method

    def _placed(self, name, where, blocking, x, r: Vector | None, **kw):
        """A gathering collective into ``r``: straight into recvbuf when its blocks lie back to back, else into a
        contiguous temporary copied block by block into place once the call completes."""
        if r is None:
            return self._done(self._start(name, where, blocking)(x, out=None, **kw), blocking)
        total = sum(r.counts)
        if r.packed():
            return self._done(self._start(name, where, blocking)(x, out=r.data[:total], **kw), blocking)
        staged = np.empty((total,) + r.data.shape[1:], r.data.dtype)
        starts = np.cumsum((0,) + r.counts).tolist()

        def land():
            for i in range(len(r.counts)):
                r.block(i)[...] = staged[starts[i]:starts[i + 1]]
        return self._done(self._start(name, where, blocking)(x, out=staged, **kw), blocking, land)

    @staticmethod
    def _done(started, blocking: bool, after=None):
        """None for a blocking call (``after`` run), else the Request whose Wait finishes it."""
        if blocking:
            if after is not None:
                after()
            return None
        return Request(started if after is None else started.then(lambda _: after()))


def _vector(spec: Block | Vector, size: int) -> Vector:
    """A Block of ``size`` equal blocks as the Vector it is."""
    if isinstance(spec, Vector):
        return spec
    return Vector(spec.data, (spec.count,) * size, tuple(i * spec.count for i in range(size)), spec.datatype)


def _packed(s: Vector) -> np.ndarray:
    """The blocks of ``s`` back to back in rank order: a view where they already lie so, else a copy."""
    total = sum(s.counts)
    if s.packed():
        return s.data[:total]
    return np.concatenate([s.block(i) for i in range(len(s.counts))]) if total else s.data[:0]


def _sent(sendbuf, r: Vector, where: str) -> np.ndarray:
    s = buffers.simple(sendbuf, where, "sendbuf", False)
    _same_dtype(s.data, r.data, where)
    return s.data


def _received(recvbuf, s: Vector, where: str) -> np.ndarray:
    r = buffers.simple(recvbuf, where, "recvbuf", True)
    _same_dtype(s.data, r.data, where)
    return r.data


def _same_dtype(s: np.ndarray, r: np.ndarray, where: str) -> None:
    if s.dtype != r.dtype or s.shape[1:] != r.shape[1:]:
        raise TypeError(f"{where}: sendbuf has elements of {s.dtype}{list(s.shape[1:]) or ''} and recvbuf of "
                        f"{r.dtype}{list(r.shape[1:]) or ''}; the face moves elements of one NumPy dtype")


def _same_type(s: Block, r: Block, where: str) -> None:
    if s.datatype != r.datatype:   # mpi4py's check, on the MPI datatypes themselves
        raise ValueError(f"{where}: mismatch in send and receive MPI datatypes (sendbuf {buffers.type_name(s.datatype)}, "
                         f"recvbuf {buffers.type_name(r.datatype)})")


def _same_reduction(s: Block, r: Block, where: str) -> None:
    _same_type(s, r, where)
    _fits(s.count, r.count, where, "sendbuf", "recvbuf's count")


def _fits(count: int, expected: int, where: str, name: str, what: str) -> None:
    if count != expected:
        raise ValueError(f"{where}: {name} has count {count}, but {what} is {expected}")

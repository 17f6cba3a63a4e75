"""The face: mpi4py's upper-case collectives, each read into arrays and handed to the Communicator."""
from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np
from mpi4py import MPI

from ..comm import Communicator
from . import buffers
from .buffers import Block, Vector, in_place
from .reductions import UserOps, reduction
from . import requests


class Face:
    """mpi4py's buffer collectives over pycollect's algorithms; anything else is the wrapped communicator's.

        comm = pc.mpi4py(MPI.COMM_WORLD)   # was: comm = MPI.COMM_WORLD

    ``Allreduce``, ``Reduce``, ``Bcast``, ``Gather(v)``, ``Scatter(v)``, ``Allgather(v)``, ``Alltoall(v)``,
    ``Reduce_scatter(_block)``, ``Scan``, ``Exscan``, ``Barrier`` and their ``I``-forms take every buffer
    specification mpi4py takes (an array, ``[buf, MPI.DOUBLE]``, ``[buf, count, type]``,
    ``[buf, (counts, displs), type]``, ``MPI.IN_PLACE``) and ops (predefined, ``MINLOC``/``MAXLOC`` on pair
    types, ``MPI.Op.Create``), write the result into the caller's recvbuf and return None (the ``I``-forms a
    Request with ``Wait``, ``Test``, ``Request.Waitall``, ``Waitany``, ...). Each runs as the Communicator's
    method of the same collective (``face.pycollect``, built on ``comm`` with ``settings``: tuning, validate,
    timeout, ...). ``Free`` frees both. Every other attribute (``Get_rank``, ``rank``, ``Split``, ``Send``,
    lower-case pickling calls) is the wrapped communicator's. Blocks at displacements that are not back to
    back go to the Communicator's ``displs=`` (``send_displs``, ``recv_displs``) forms, straight from and
    into the caller's buffers. Send and receive sides name elements of one NumPy dtype (MPI allows any two of
    one type signature). Buffers are host memory (NumPy arrays, bytearray, any object exposing a buffer); a
    device array is refused with TypeError rather than moved by MPI alone.
    """

    Request = requests.Request   # pc.mpi4py.Request.Waitall(requests), as MPI.Request.Waitall reads

    def __init__(self, comm: MPI.Intracomm, **settings):
        if not isinstance(comm, MPI.Intracomm):
            raise TypeError(f"mpi4py: comm must be an MPI.Intracomm (MPI.COMM_WORLD, ...), got {type(comm).__name__}")
        self.mpi, self.pycollect = comm, Communicator(comm, **settings)
        self._user_ops = UserOps()

    def __getattr__(self, name: str):
        if name in ("mpi", "pycollect", "_user_ops"):   # not set yet: no wrapped communicator to ask
            raise AttributeError(name)
        return getattr(self.mpi, name)

    def Free(self) -> None:
        """Free the wrapped communicator, as mpi4py's ``Free`` (collective; a predefined one is refused as mpi4py
        refuses it, and then nothing is freed), and the face's pycollect Communicator with it; with a face call still
        in flight, pycollect's RuntimeError and nothing freed (its Request waited first, ``Free`` then works)."""
        if self.mpi == MPI.COMM_WORLD or self.mpi == MPI.COMM_SELF:
            self.mpi.Free()   # refused as mpi4py's own is, before anything of pycollect's is freed
        if self.pycollect.in_flight():
            self.pycollect.free()   # raises (calls in flight), before either communicator is freed
        self.mpi.Free()
        self.pycollect.free()

    def __repr__(self) -> str:
        return f"pycollect.mpi4py({self.pycollect!r})"

    # -- reductions -------------------------------------------------------------------------------------
    def Allreduce(self, sendbuf, recvbuf, op=MPI.SUM) -> None:
        self._run("Allreduce", self._allreduce, sendbuf, recvbuf, op)

    def Iallreduce(self, sendbuf, recvbuf, op=MPI.SUM) -> requests.Request:
        return self._run("Iallreduce", self._allreduce, sendbuf, recvbuf, op)

    def Reduce(self, sendbuf, recvbuf, op=MPI.SUM, root: int = 0) -> None:
        self._run("Reduce", self._reduce, sendbuf, recvbuf, op, root)

    def Ireduce(self, sendbuf, recvbuf, op=MPI.SUM, root: int = 0) -> requests.Request:
        return self._run("Ireduce", self._reduce, sendbuf, recvbuf, op, root)

    def Scan(self, sendbuf, recvbuf, op=MPI.SUM) -> None:
        self._run("Scan", self._prefix, sendbuf, recvbuf, op)

    def Iscan(self, sendbuf, recvbuf, op=MPI.SUM) -> requests.Request:
        return self._run("Iscan", self._prefix, sendbuf, recvbuf, op)

    def Exscan(self, sendbuf, recvbuf, op=MPI.SUM) -> None:
        """MPI_Exscan: rank 0's recvbuf is left as it was (MPI leaves it undefined)."""
        self._run("Exscan", self._prefix, sendbuf, recvbuf, op)

    def Iexscan(self, sendbuf, recvbuf, op=MPI.SUM) -> requests.Request:
        return self._run("Iexscan", self._prefix, sendbuf, recvbuf, op)

    def Reduce_scatter_block(self, sendbuf, recvbuf, op=MPI.SUM) -> None:
        self._run("Reduce_scatter_block", self._reduce_scatter_block, sendbuf, recvbuf, op)

    def Ireduce_scatter_block(self, sendbuf, recvbuf, op=MPI.SUM) -> requests.Request:
        return self._run("Ireduce_scatter_block", self._reduce_scatter_block, sendbuf, recvbuf, op)

    def Reduce_scatter(self, sendbuf, recvbuf, recvcounts=None, op=MPI.SUM) -> None:
        """MPI_Reduce_scatter; without ``recvcounts`` the ranks' recvbuf counts are gathered first, as mpi4py does."""
        self._run("Reduce_scatter", self._reduce_scatter, sendbuf, recvbuf, recvcounts, op)

    def Ireduce_scatter(self, sendbuf, recvbuf, recvcounts=None, op=MPI.SUM) -> requests.Request:
        return self._run("Ireduce_scatter", self._reduce_scatter, sendbuf, recvbuf, recvcounts, op)

    # -- data movement ----------------------------------------------------------------------------------
    def Bcast(self, buf, root: int = 0) -> None:
        self._run("Bcast", self._bcast, buf, root)

    def Ibcast(self, buf, root: int = 0) -> requests.Request:
        return self._run("Ibcast", self._bcast, buf, root)

    def Gather(self, sendbuf, recvbuf, root: int = 0) -> None:
        self._run("Gather", self._gather, sendbuf, recvbuf, root)

    def Igather(self, sendbuf, recvbuf, root: int = 0) -> requests.Request:
        return self._run("Igather", self._gather, sendbuf, recvbuf, root)

    def Gatherv(self, sendbuf, recvbuf, root: int = 0) -> None:
        self._run("Gatherv", self._gather, sendbuf, recvbuf, root)

    def Igatherv(self, sendbuf, recvbuf, root: int = 0) -> requests.Request:
        return self._run("Igatherv", self._gather, sendbuf, recvbuf, root)

    def Scatter(self, sendbuf, recvbuf, root: int = 0) -> None:
        self._run("Scatter", self._scatter, sendbuf, recvbuf, root)

    def Iscatter(self, sendbuf, recvbuf, root: int = 0) -> requests.Request:
        return self._run("Iscatter", self._scatter, sendbuf, recvbuf, root)

    def Scatterv(self, sendbuf, recvbuf, root: int = 0) -> None:
        self._run("Scatterv", self._scatter, sendbuf, recvbuf, root)

    def Iscatterv(self, sendbuf, recvbuf, root: int = 0) -> requests.Request:
        return self._run("Iscatterv", self._scatter, sendbuf, recvbuf, root)

    def Allgather(self, sendbuf, recvbuf) -> None:
        self._run("Allgather", self._allgather, sendbuf, recvbuf)

    def Iallgather(self, sendbuf, recvbuf) -> requests.Request:
        return self._run("Iallgather", self._allgather, sendbuf, recvbuf)

    def Allgatherv(self, sendbuf, recvbuf) -> None:
        self._run("Allgatherv", self._allgather, sendbuf, recvbuf)

    def Iallgatherv(self, sendbuf, recvbuf) -> requests.Request:
        return self._run("Iallgatherv", self._allgather, sendbuf, recvbuf)

    def Alltoall(self, sendbuf, recvbuf) -> None:
        self._run("Alltoall", self._alltoall, sendbuf, recvbuf)

    def Ialltoall(self, sendbuf, recvbuf) -> requests.Request:
        return self._run("Ialltoall", self._alltoall, sendbuf, recvbuf)

    def Alltoallv(self, sendbuf, recvbuf) -> None:
        self._run("Alltoallv", self._alltoall, sendbuf, recvbuf)

    def Ialltoallv(self, sendbuf, recvbuf) -> requests.Request:
        return self._run("Ialltoallv", self._alltoall, sendbuf, recvbuf)

    def Barrier(self) -> None:
        self.pycollect.barrier()

    def Ibarrier(self) -> requests.Request:
        """A non-blocking barrier: an allreduce of one byte (no rank's completes before every rank has started
        it), as the Communicator has no non-blocking barrier of its own."""
        return requests.Request(self.pycollect.iallreduce(np.zeros(1, np.int8)))

    # -- routes: each reads its buffers into the Communicator's call, a Plan ------------------------------
    def _allreduce(self, where, sendbuf, recvbuf, op) -> Plan:
        r = buffers.simple(recvbuf, where, "recvbuf", True)
        x, op, out = reduction(op, self._input(sendbuf, r, where), r.data, r.datatype, self._user_ops, where)
        return Plan("allreduce", x, dict(op=op, out=out))

    def _reduce(self, where, sendbuf, recvbuf, op, root) -> Plan:
        if self.pycollect.rank == root:
            r = buffers.simple(recvbuf, where, "recvbuf", True)
            x, out, datatype = self._input(sendbuf, r, where), r.data, r.datatype
        else:   # recvbuf is not read off the root, as in MPI
            s = buffers.simple(sendbuf, where, "sendbuf", False)
            x, out, datatype = s.data, None, s.datatype
        x, op, out = reduction(op, x, out, datatype, self._user_ops, where)
        return Plan("reduce", x, dict(root=root, op=op, out=out))

    def _prefix(self, where, sendbuf, recvbuf, op) -> Plan:
        """Scan and Exscan: a prefix reduction into recvbuf (Exscan leaves rank 0's as it was)."""
        r = buffers.simple(recvbuf, where, "recvbuf", True)
        x, op, out = reduction(op, self._input(sendbuf, r, where), r.data, r.datatype, self._user_ops, where)
        return Plan("exscan" if "exscan" in where.lower() else "scan", x, dict(op=op, out=out))

    def _reduce_scatter_block(self, where, sendbuf, recvbuf, op) -> Plan:
        """Even blocks: the Communicator's reduce_scatter_block, or where it has none its reduce_scatter without
        counts (even blocks too). IN_PLACE: recvbuf holds every rank's block, the result lands in its first."""
        if in_place(sendbuf):
            r = buffers.simple(recvbuf, where, "recvbuf", True, self.pycollect.size)
            x, out = r.data.copy(), r.block(0)
        else:
            r = buffers.simple(recvbuf, where, "recvbuf", True)
            s = buffers.simple(sendbuf, where, "sendbuf", False, self.pycollect.size)
            _same_reduction(s, r, where)
            x, out = s.data, r.data
        x, op, out = reduction(op, x, out, r.datatype, self._user_ops, where)
        name = "reduce_scatter_block" if hasattr(self.pycollect, "reduce_scatter_block") else "reduce_scatter"
        return Plan(name, x, dict(op=op, out=out))

    def _reduce_scatter(self, where, sendbuf, recvbuf, recvcounts, op) -> Plan:
        """Blocks of ``recvcounts``; without them every rank's recvbuf count, gathered first as mpi4py does (that
        gathering tells every rank whether any rank's recvbuf failed to read, so none waits for it)."""
        rank, size = self.pycollect.rank, self.pycollect.size
        if recvcounts is None and not in_place(sendbuf):
            r, counts = self._counted(where, recvbuf)
        else:
            r = buffers.simple(recvbuf, where, "recvbuf", True)
            if recvcounts is None:
                raise ValueError(f"{where}: MPI.IN_PLACE needs recvcounts (recvbuf holds every rank's block)")
            counts = buffers.per_rank(recvcounts, size, where, "recvcounts", "counts")
        if in_place(sendbuf):
            _fits(r.per_block, sum(counts), where, "recvbuf", "sum(recvcounts)")
            x, out = r.data[:sum(counts)].copy(), r.data[:counts[rank]]
        else:
            s = buffers.simple(sendbuf, where, "sendbuf", False)
            _same_type(s, r, where)
            _fits(s.per_block, sum(counts), where, "sendbuf", "sum(recvcounts)")
            _fits(r.per_block, counts[rank], where, "recvbuf", f"recvcounts[{rank}]")
            x, out = s.data, r.data
        x, op, out = reduction(op, x, out, r.datatype, self._user_ops, where)
        return Plan("reduce_scatter", x, dict(op=op, counts=counts, out=out))

    def _bcast(self, where, buf, root) -> Plan:
        rooted = self.pycollect.rank == root
        b = buffers.simple(buf, where, "buf", not rooted)   # the root's buffer is only read
        return Plan("broadcast", b.data, dict(root=root, out=b.data if not rooted or b.data.flags.writeable else None))

    def _gather(self, where, sendbuf, recvbuf, root) -> Plan:
        """Gather's counts are every rank's own; Gatherv's counts and displacements only the root knows: it hands them
        to every rank in one small exchange with every rank's own count (``_root_layout``), so the blocks land where
        recvbuf's displacements put them, and a count that differs from the root's raises on every rank."""
        rank, size = self.pycollect.rank, self.pycollect.size
        x = r = err = None
        try:
            if rank == root:
                r = _blocks(recvbuf, where, "recvbuf", True, size)
                x = r.block(rank) if in_place(sendbuf) else _sent(sendbuf, r, rank, where)
            else:   # recvbuf is not read off the root
                x = buffers.simple(sendbuf, where, "sendbuf", False).data
        except (TypeError, ValueError, BufferError) as e:
            if not where.endswith("v"):
                raise
            err = e
        if not where.endswith("v"):
            assert x is not None, "read above, or raised"
            return _placed("gather", x, r, root=root, counts=(len(x),) * size)
        counts, displs = self._root_layout(where, root, x, r, _root_first(where, root, size) or err)   # every rank's
        out = None if r is None else r.data if displs else r.data[:sum(counts)]
        return Plan("gather", x, dict(root=root, out=out, counts=counts, displs=displs))

    def _scatter(self, where, sendbuf, recvbuf, root) -> Plan:
        """Scatter's counts are every rank's own; Scatterv's counts and displacements only the root knows: it hands
        them to every rank with every rank's own recvbuf count in one small exchange (``_root_layout``, as Gatherv),
        so a count that differs from the root's raises on every rank. (A broadcast of the root's counts alone let a
        rank whose recvbuf did not fit raise by itself, its next call pairing with the scatter the others went on to:
        it returned that call's block.)"""
        rank, size = self.pycollect.rank, self.pycollect.size
        s = out = err = None
        try:
            if rank == root:
                s = _blocks(sendbuf, where, "sendbuf", False, size)
                out = s.block(rank).copy() if in_place(recvbuf) else _received(recvbuf, s, where)
            else:   # sendbuf is not read off the root
                out = buffers.simple(recvbuf, where, "recvbuf", True).data
        except (TypeError, ValueError, BufferError) as e:
            if not where.endswith("v"):
                raise
            err = e
        if where.endswith("v"):
            counts, displs = self._root_layout(where, root, out, s, _root_first(where, root, size) or err,
                                               "receives into recvbuf of", "sendbuf")
        else:
            assert out is not None, "read above, or raised"
            counts, displs = (len(out),) * size, None
        x = None if s is None else s.data if displs else s.data[:sum(counts)]
        return Plan("scatter", x, dict(root=root, out=out, counts=counts, displs=displs))

    def _allgather(self, where, sendbuf, recvbuf) -> Plan:
        r = _blocks(recvbuf, where, "recvbuf", True, self.pycollect.size)
        x = r.block(self.pycollect.rank) if in_place(sendbuf) else _sent(sendbuf, r, self.pycollect.rank, where)
        return _placed("allgather", x, r, counts=r.counts)

    def _alltoall(self, where, sendbuf, recvbuf) -> Plan:
        """IN_PLACE: what goes to rank j lies where rank j's block arrives (a copy, read before any lands). Alltoallv's
        blocks at their displacements on both sides (``send_displs``, ``recv_displs``)."""
        if not where.endswith("v"):   # equal blocks, back to back
            r = _blocks(recvbuf, where, "recvbuf", True, self.pycollect.size)
            s = r if in_place(sendbuf) else _blocks(sendbuf, where, "sendbuf", False, self.pycollect.size)
            _same_dtype(s.data, r.data, where)
            return _placed("alltoall", s.data[:sum(s.counts)].copy() if s is r else s.data[:sum(s.counts)], r)
        err = None
        try:
            r = _blocks(recvbuf, where, "recvbuf", True, self.pycollect.size)
            s = r if in_place(sendbuf) else _blocks(sendbuf, where, "sendbuf", False, self.pycollect.size)
            _same_dtype(s.data, r.data, where)
        except (TypeError, ValueError, BufferError) as e:
            err = e
        matrix = self._count_matrix(where, None if err else (s.counts, r.counts), err)   # the same on every rank
        x = s.data.copy() if s is r else s.data
        spread = not s.packed()
        return _placed("alltoall", x if spread else x[:sum(s.counts)], r, counts=matrix,
                       send_displs=s.displs if spread else None)

    def _count_matrix(self, where: str, counts, err) -> tuple[tuple[int, ...], ...]:
        """Alltoallv's counts of every rank, from one allgather of each rank's sendcounts and recvcounts: what rank i
        sends rank j must be what j's recvbuf counts from i, checked on every rank (a recvcount that differed was
        taken without a word, and the block written past it or short of it; found by a helper). A rank whose
        buffers failed to read raises its error and the others name it; no rank waits in the call."""
        size = self.pycollect.size
        mine = np.full(2 * size, -1, np.int64)   # (2 size,): sendcounts, then recvcounts
        if err is None:
            mine[:] = counts[0] + counts[1]
        table = self._exchanged(where, mine, err, "a buffer that could not be read")   # (size, 2 size)
        sends, recvs = table[:, :size], table[:, size:]
        wrong = np.argwhere(sends != recvs.T)   # (k, 2): rank i sends j other than j's recvcounts from i
        if len(wrong):
            said = "; ".join(f"rank {i} sends rank {j} {sends[i, j]} elements, rank {j}'s recvbuf counts {recvs[j, i]} "
                             f"from it" for i, j in wrong[:4].tolist())
            raise ValueError(f"{where}: {said}{' ...' if len(wrong) > 4 else ''}")
        return tuple(tuple(row) for row in sends.tolist())

    # -- helpers ----------------------------------------------------------------------------------------
    def _run(self, where: str, route, *args):
        """``route`` reads the arguments into a Plan, which runs as the Communicator's call: blocking (None
        returned) unless ``where`` is an I-form (its Request returned). In validation mode every rank's reading
        is agreed first, so a bad buffer on one rank raises on every rank and none waits in the collective."""
        blocking, validate = not where.startswith("I"), self.pycollect.validate
        err = plan = method = None
        try:
            plan = _keeping_padding(route(where, *args))
            method = self._method(plan.method, where, blocking)
        except (TypeError, ValueError, BufferError, NotImplementedError) as e:
            if not validate:
                self.pycollect.refused_arguments()   # numbered as a refused call of the Communicator's own
                raise
            err = e
        if validate:
            self.pycollect.agree_arguments(where, err)
        assert plan is not None and method is not None, "agree_arguments raised this rank's error"
        started = method(plan.x, **plan.kwargs)
        if blocking:
            if plan.after is not None:
                plan.after()
            return None
        return requests.Request(started if plan.after is None else started.then(lambda _: plan.after()))

    def _input(self, sendbuf, r: Block, where: str) -> np.ndarray:
        """A reduction's input: recvbuf's own elements for IN_PLACE or a sendbuf at recvbuf's address (MPI forbids
        aliased buffers and MPICH refuses them, "Buffers must not be aliased"; the face reads them as IN_PLACE,
        which every rank can then agree on), else sendbuf, of recvbuf's datatype and count as mpi4py checks."""
        if in_place(sendbuf):
            return r.data
        s = buffers.simple(sendbuf, where, "sendbuf", False)
        _same_reduction(s, r, where)
        if s.data.size and s.data.ctypes.data == r.data.ctypes.data:
            return r.data
        return s.data

    def _counted(self, where: str, recvbuf) -> tuple[Block, list[int]]:
        """recvbuf read, and every rank's recvbuf count gathered (-1 from a rank whose recvbuf failed to read)."""
        r = err = None
        try:
            r = buffers.simple(recvbuf, where, "recvbuf", True)
        except (TypeError, ValueError, BufferError) as e:
            err = e
        mine = np.array([-1 if r is None else r.per_block], np.int64)   # one int per rank
        counts = self._exchanged(where, mine, err, "a recvbuf that could not be read")[:, 0].tolist()
        assert r is not None
        return r, counts

    def _exchanged(self, where: str, mine: np.ndarray, err, what: str) -> np.ndarray:
        """Every rank's ``mine`` (ints; -1 first where the rank's arguments failed, with ``err``) in one allgather
        through the Communicator, as a (size, len(mine)) array. Every rank takes part, so none waits in the call;
        then a rank whose arguments failed raises ``err``, and every other one names it (it passed ``what``)."""
        size = self.pycollect.size
        table = self.pycollect.allgather(mine, counts=[len(mine)] * size).reshape(size, len(mine))
        if err is not None:
            raise err
        failed = [q for q in range(size) if table[q, 0] < 0]
        if failed:
            raise ValueError(f"{where}: rank(s) {', '.join(map(str, failed))} passed {what}; no rank went on")
        return table

    def _root_layout(self, where: str, root: int, x, r: Vector | None, err, own: str = "sends",
                     roots: str = "recvbuf") -> tuple[tuple[int, ...], tuple | None]:
        """Gatherv's (Scatterv's) counts and displacements from the root's recvbuf (sendbuf) on every rank, and every
        rank's own count (``x``'s, its sendbuf's or recvbuf's) and root, in one exchange of 2 + 2 size ints a rank
        (``_exchanged``); a rank whose buffer failed to read raises its error and the others name it, and a count
        that differs from the root's, or roots that differ, raise on every rank: no rank waits in the call, and none
        goes on a call behind."""
        size = self.pycollect.size
        mine = np.full(2 + 2 * size, -1, np.int64)   # (2 + 2 size,): own count, root, the root's counts and displs
        if err is None:
            mine[:2] = len(x), root
            if r is not None:
                mine[2:] = r.counts + r.displs
        table = self._exchanged(where, mine, err, "bad arguments (a root out of range, a buffer that could not be "
                                                  "read)").tolist()
        if len({row[1] for row in table}) > 1:   # each rank would read the layout of the root it names
            raise ValueError(f"{where}: the ranks passed other roots: "
                             f"{', '.join(f'rank {q} root {row[1]}' for q, row in enumerate(table))}")
        counts = table[root][2:2 + size]
        wrong = [f"rank {q} {own} {table[q][0]}" for q in range(size) if table[q][0] != counts[q]]
        if wrong:
            raise ValueError(f"{where}: {', '.join(wrong)} elements, but the root's {roots} counts {counts}")
        return _layout(counts, table[root][2 + size:])

    def _method(self, name: str, where: str, blocking: bool):
        """The Communicator's ``name`` (or its ``i``-form), or NotImplementedError naming the method it lacks."""
        method = getattr(self.pycollect, name if blocking else "i" + name, None)
        if method is None:
            raise NotImplementedError(f"{where}: routes to pycollect's Communicator.{name if blocking else 'i' + name}, "
                                      f"which this version of pycollect does not have")
        return method


def _root_first(where: str, root, size: int) -> ValueError | None:
    """Gatherv's and Scatterv's root, checked before the exchange that reads the root's layout on every rank (an
    out-of-range one raised IndexError on that rank alone, -1 read the last rank's row, and the others waited)."""
    if isinstance(root, bool) or not isinstance(root, (int, np.integer)) or not 0 <= root < size:
        return ValueError(f"{where}: root must be a rank in [0, {size}), got {root!r}")
    return None


class Plan(NamedTuple):
    """One face call as the Communicator's: ``method(x, **kwargs)``, then ``after()`` once it completes."""
    method: str
    x: object
    kwargs: dict
    after: Callable[[], None] | None = None


def _keeping_padding(plan: Plan) -> Plan:
    """``plan`` leaving the padding bytes of its recvbuf's elements as they were: a pair type's (MPI_DOUBLE_INT,
    MPI_LONG_INT: 4 bytes an element) are no part of MPI's type map, so MPI never writes them, while pycollect moves
    whole NumPy elements and wrote them from the senders' padding or from scratch memory (a helper's fuzzing against
    mpi4py found stale and uninitialised bytes there). Saved before the call, put back once it completes."""
    out = plan.kwargs.get("out")
    if not isinstance(out, np.ndarray) or not out.size:
        return plan
    padding = _padding(out.dtype)
    if padding is None:
        return plan
    raw = out.reshape(-1).view(np.uint8).reshape(out.size, out.dtype.itemsize)   # (elements, itemsize): a view
    kept = raw[:, padding].copy()
    after = plan.after

    def restore() -> None:
        if after is not None:
            after()
        raw[:, padding] = kept
    return plan._replace(after=restore)


def _padding(dtype: np.dtype) -> np.ndarray | None:
    """Which bytes of one element of ``dtype`` no field covers (a bool mask of itemsize), or None where every byte
    is a field's."""
    if dtype.fields is None:
        return None
    mask = np.ones(dtype.itemsize, bool)
    for field, offset, *_ in dtype.fields.values():
        mask[offset:offset + field.itemsize] = False
    return mask if mask.any() else None


def _placed(name: str, x, r: Vector | None, **kwargs) -> Plan:
    """A gathering collective straight into ``r``: its first sum(counts) elements when its blocks lie back to back,
    else the whole recvbuf with the displacements (``displs``; the all-to-all's ``recv_displs``)."""
    if r is None:
        return Plan(name, x, dict(out=None, **kwargs))
    if r.packed():
        return Plan(name, x, dict(out=r.data[:sum(r.counts)], **kwargs))
    key = "recv_displs" if name == "alltoall" else "displs"
    return Plan(name, x, dict(out=r.data, **{key: r.displs}, **kwargs))


def _layout(counts, displs) -> tuple[tuple[int, ...], tuple[int, ...] | None]:
    """``(counts, displs)`` as tuples, displs None where the blocks lie back to back from the start."""
    counts, displs = tuple(counts), tuple(displs)
    return counts, None if displs == tuple(np.cumsum((0,) + counts[:-1]).tolist()) else displs


def _blocks(spec, where: str, name: str, writable: bool, size: int) -> Vector:
    """A buffer of one block per rank: a v-collective's vector spec, else ``size`` equal blocks."""
    if where.endswith("v"):
        return buffers.vector(spec, where, name, writable, size)
    return _vector(buffers.simple(spec, where, name, writable, size), size)


def _vector(spec: Block | Vector, size: int) -> Vector:
    """A Block of ``size`` equal blocks as the Vector it is."""
    if isinstance(spec, Vector):
        return spec
    return Vector(spec.data, (spec.per_block,) * size, tuple(i * spec.per_block for i in range(size)), spec.datatype)


def _sent(sendbuf, r: Vector, rank: int, where: str) -> np.ndarray:
    """A gathering collective's sendbuf: this rank's block of ``r``, in elements of its dtype and count."""
    s = buffers.simple(sendbuf, where, "sendbuf", False)
    _same_dtype(s.data, r.data, where)
    _fits(s.per_block, r.counts[rank], where, "sendbuf", f"recvbuf's count for rank {rank}")
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
    _fits(s.per_block, r.per_block, where, "sendbuf", "recvbuf's count")


def _fits(count: int, expected: int, where: str, name: str, what: str) -> None:
    if count != expected:
        raise ValueError(f"{where}: {name} has count {count}, but {what} is {expected}")

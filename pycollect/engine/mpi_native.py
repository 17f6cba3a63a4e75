"""The ``"mpi"`` algorithm: MPI's own collectives on the same buffers, the baseline everything is measured against.

Even blocks go to MPI's regular call (``MPI_Allgather``, ``MPI_Reduce_scatter_block``,
``MPI_Alltoall``), uneven ones to its v-form: MPICH runs other, slower algorithms for the
v-forms. Which one, and its count and displacement lists, is decided once per shape.

Each collective takes the runner (pycollect/runner.py: ``lib``, ``later``, ``rank``, ``size``, ``watch``,
``staging(xp)``) and the checked call (engine/call.py), and returns the result, or a Request when
the call is non-blocking. Under the watchdog (``runner.watch``, PYCOLLECT_TIMEOUT) every call starts
the non-blocking twin of its MPI collective and polls it to the deadline instead of blocking in MPI.
"""
from __future__ import annotations

import functools
import math
from functools import lru_cache

import numpy as np
from mpi4py import MPI

from . import counts, ops
from .abort import collective_failed
from .backend import flat, is_block_of, sync
from .layout import extent, offsets
from .shapes import REDUCING
from .request import Request

_MPI_OPS = {"sum": MPI.SUM, "avg": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX,
            "band": MPI.BAND, "bor": MPI.BOR, "bxor": MPI.BXOR, "land": MPI.LAND, "lor": MPI.LOR, "lxor": MPI.LXOR,
            "minloc": MPI.MINLOC, "maxloc": MPI.MAXLOC}
# Dtypes MPI reduces natively: long double and its complex, and bool (C_BOOL, under the logical ops only,
# which ops.check_op enforces); float16 where the library has a half-precision type (MPICH 4's
# MPIX_C_FLOAT16, which mpi4py names FLOAT16_T and maps float16 arrays to). MPI has no bfloat16.
_NATIVE = {np.dtype(t) for t in ("i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f4", "f8", "c8", "c16",
                                  "g", "G", "?")}
if getattr(MPI, "FLOAT16_T", MPI.DATATYPE_NULL) != MPI.DATATYPE_NULL:
    _NATIVE.add(np.dtype("f2"))
# MPI's (value, int) pair types for minloc and maxloc, by the value's dtype (engine/locations.py builds the pairs)
_PAIRS = {np.dtype(t): getattr(MPI, name) for t, name in (("f4", "FLOAT_INT"), ("f8", "DOUBLE_INT"),
                                                           ("g", "LONG_DOUBLE_INT"), ("i2", "SHORT_INT"),
                                                           ("i4", "TWOINT"))}
if MPI.LONG.Get_size() == 8:
    _PAIRS[np.dtype("i8")] = MPI.LONG_INT


def mpi_op(op):
    """MPI's op for an op name (``avg`` is a sum, divided afterwards)."""
    return _MPI_OPS[op]


# The schedule that stands in for MPI's own call where "auto" may not take it: dtypes MPI cannot reduce (float16,
# bfloat16), more elements than one MPI call takes (comm.Communicator._resolve).
STAND_IN = {"allreduce": "ring", "reduce_scatter": "ring", "allgather": "ring",
            "alltoall": "pairwise", "broadcast": "binomial", "reduce": "binomial", "gather": "binomial",
            "scatter": "binomial", "scan": "recursive_doubling", "exscan": "recursive_doubling"}


def supports(dtype, op=None) -> bool:
    """Whether MPI's own collectives can reduce ``dtype`` under ``op``: a user's op reduces any fixed-size dtype
    (as bytes MPI hands to it), minloc and maxloc need one of MPI's pair types."""
    dtype = np.dtype(dtype)
    if isinstance(op, ops.Op):
        return True
    if op in ops.LOCATING:
        return dtype.names == ("value", "location") and dtype["value"] in _PAIRS
    return dtype in _NATIVE


def lean_table(selector, collective: str = "allreduce") -> dict:
    """``{(dtype, op, algorithm): (MPI op, largest nbytes)}`` for calls that go straight to MPI's regular call.

    ``"auto"`` qualifies up to the size where the selector stops choosing ``"mpi"``; ``avg``
    needs a division afterwards, and minloc and maxloc pairs, so both take the general path. For alltoall (no op)
    the key's op is None.
    """
    limit = selector.mpi_limit(collective)
    table = {}
    reducing = collective in REDUCING
    for dtype in _NATIVE:
        for op in (ops.OPS + ops.LOGICAL if reducing else (None,)):
            if op == "avg" or (op is not None and not _fits(op, dtype)):
                continue
            mpi_op = None if op is None else _MPI_OPS[op]
            most = float("inf") if counts.LIMIT is None else counts.LIMIT * dtype.itemsize   # MPI-3: int counts
            table[(dtype, op, "mpi")] = (mpi_op, most)
            if limit:
                table[(dtype, op, "auto")] = (mpi_op, min(limit, most))
    return table


def lean_out(out, shape, x) -> bool:
    """Whether MPI may write ``out`` directly: the expected host array, contiguous, writable, and either ``x``
    itself (in place) or apart from it. Anything else takes the general path, which says what is wrong."""
    if type(out) is not np.ndarray or out.shape != shape or out.dtype != x.dtype:
        return False
    flags = out.flags
    if not (flags.c_contiguous and flags.writeable):
        return False
    # Two arrays that each allocated their own memory are apart: the common case, at a fraction of
    # np.may_share_memory's cost (views, and memory NumPy did not allocate, take the full test).
    return out is x or (flags.owndata and x.flags.owndata) or not np.may_share_memory(out, x)


def even_counts(counts, rows: int, size: int) -> bool:
    """``counts`` is a list of ``size`` Python ints, each ``rows`` (anything else: the general path checks it)."""
    if type(counts) is not list or len(counts) != size:
        return False
    for c in counts:   # a loop, not all() over a generator: a third of the time on a lean path's few counts
        if type(c) is not int or c != rows:
            return False
    return True


def _fits(op: str, dtype) -> bool:
    try:
        ops.check_op(op, dtype, "")
    except (TypeError, ValueError):
        return False
    return True


def _typed(buf, call):
    """``buf`` as MPI is handed it: as it is where mpi4py knows its type, else with its MPI type (minloc's pairs;
    a user's op sees elements as bytes of the dtype's size). MPI.IN_PLACE and None pass through."""
    if buf is None or buf is MPI.IN_PLACE:
        return buf
    op = call.op
    if isinstance(op, ops.Op):
        return [buf, _bytes_type(call.dtype.itemsize)]
    if op in ops.LOCATING:
        return [buf, _PAIRS[call.dtype["value"]]]
    return buf


@lru_cache(maxsize=None)
def _bytes_type(itemsize: int):
    """A contiguous type of ``itemsize`` bytes: one element of any dtype, for a user's op (committed once, kept)."""
    return MPI.BYTE.Create_contiguous(itemsize).Commit()


def _mpi_op_of(call):
    """MPI's op for the call: a predefined one, or a user's op made once per (op, dtype) with ``MPI.Op.Create``."""
    op = call.op
    return _user_op(op, call.dtype) if isinstance(op, ops.Op) else _MPI_OPS[op]


@lru_cache(maxsize=64)
def _user_op(op, dtype):
    """``MPI.Op.Create`` over ``op``: MPI hands the function ``in`` (lower ranks) and ``inout``, and wants
    ``inout = in op inout``, elements of ``dtype``.

    The function raising inside MPI's reduction ends the job here (``collective_failed``): mpi4py's own handler
    calls ``MPI_Abort``, which in MPICH returns while the launcher ends the job, and MPI then went on with the
    reduction and handed its callers a result without this rank's part (a wrong answer, on every rank)."""
    combine = op.combine(np)

    def apply(inbuf, inoutbuf, datatype):
        try:
            a, b = np.frombuffer(inbuf, dtype), np.frombuffer(inoutbuf, dtype)
            combine(a, b, out=b)
        except BaseException as e:  # noqa: BLE001 (whatever it is, nothing may come back from this reduction)
            collective_failed(f"MPI's own reduction with op {op.name}", MPI.COMM_WORLD.Get_rank(), e)
    return MPI.Op.Create(apply, commute=op.commute)


class _Host:
    """Buffers MPI may touch: device arrays as-is when MPI is CUDA-aware, else host copies."""

    def __init__(self, runner, xp):
        self.xp, self.staging = xp, runner.staging(xp)

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
    reachable device, apart from the send buffer ``x``, since MPI forbids aliasing). Never an empty ``out``: a view
    of none of ``x``'s bytes shares no memory with it, yet may start where ``x`` starts, and MPI refuses a receive
    buffer at the send buffer's address (MPICH's Reduce_scatter: "Invalid buffer pointer")."""
    if out is not None and out.size and out.flags.c_contiguous and not staging and not xp.may_share_memory(out, x):
        return out
    return np.empty(shape, dtype) if staging else xp.empty(shape, dtype)


def _averaged(h: _Host, recv, call, size: int):
    """The finish of a reduction: the result in the caller's backend, divided by ``size`` for ``avg``."""
    def finish():
        result = h.result(recv, call.out, call.shape, call.dtype)
        if call.op == "avg":
            ops.finish_avg(result, size, call.xp)
        return result
    return finish


def allreduce(runner, call):
    x, out, xp = call.x, call.out, call.xp
    h = _Host(runner, xp)
    if out is x and x.flags.c_contiguous and not h.staging:
        send, recv = MPI.IN_PLACE, x
    else:
        send, recv = flat(h.arg(x)), _empty(xp, x.shape, x.dtype, out, h.staging, x)
    h.ready()
    lib = _lib(runner, call)
    return _call(runner, call, lib.Allreduce, lib.Iallreduce,
                 (_typed(send, call), _typed(recv, call), _mpi_op_of(call)), _averaged(h, recv, call, runner.size))


def reduce_scatter(runner, call):
    x, xp, lib = call.x, call.xp, _lib(runner, call)
    h = _Host(runner, xp)
    recv = _empty(xp, call.shape, x.dtype, call.out, h.staging, x)
    vector = _vector(call.counts)
    if vector is None:   # even blocks: MPI's regular call (MPICH runs slower algorithms for the v-form)
        run, start, args = lib.Reduce_scatter_block, lib.Ireduce_scatter_block, (
            _typed(flat(h.arg(x)), call), _typed(recv, call), _mpi_op_of(call))
    else:
        run, start, args = lib.Reduce_scatter, lib.Ireduce_scatter, (
            _typed(flat(h.arg(x)), call), _typed(recv, call), vector[0], _mpi_op_of(call))
    h.ready()
    return _call(runner, call, run, start, args, _averaged(h, recv, call, runner.size))


def allgather(runner, call):
    x, xp, lib = call.x, call.xp, _lib(runner, call)
    h = _Host(runner, xp)
    if call.displs is not None:
        return _allgather_displaced(runner, call, h, lib)
    vector, out = _vector(call.counts), call.out
    if out is not None and not h.staging and out.flags.c_contiguous and not xp.may_share_memory(out, x):
        recv = out   # MPI writes out itself (settled here: _empty would ask may_share_memory again)
    elif vector is None and not h.staging and is_block_of(x, out, runner.rank):
        # in place: x already lies in this rank's slot of out, which is where MPI_IN_PLACE expects it
        run, start, args = lib.Allgather, lib.Iallgather, (MPI.IN_PLACE, out)
        h.ready()
        return _call(runner, call, run, start, args, lambda: out)
    else:
        recv = _empty(xp, call.shape, x.dtype, out, h.staging, x)
    if vector is None:   # even blocks: MPI_Allgather
        run, start, args = lib.Allgather, lib.Iallgather, (h.send_buffer(x), recv)
    else:
        run, start, args = lib.Allgatherv, lib.Iallgatherv, (h.send_buffer(x), [recv, vector])
    h.ready()
    return _call(runner, call, run, start, args, lambda: h.result(recv, call.out, call.shape, x.dtype))


def _allgather_displaced(runner, call, h, lib):
    """MPI_Allgatherv with the caller's displacements; for even blocks MPI_Allgather into packed rows, then placed:
    which MPI call runs follows the counts, the same on every rank, never one rank's own layout (a rank whose
    blocks lie packed calls MPI_Allgather; Allgatherv against it hangs)."""
    recv = _displaced_recv(call, h)
    even = _vector(call.counts) is None
    if even or _reaches_past_the_limit(call.counts, call.displs):   # received packed (this rank's own layout), placed
        packed = _new(h, (sum(call.counts),), call.x.dtype)
        h.ready()
        run, start, into = (lib.Allgather, lib.Iallgather, packed) if even else (
            lib.Allgatherv, lib.Iallgatherv, [packed, (list(call.counts), list(offsets(call.counts)[:-1]))])
        return _call(runner, call, run, start, (h.send_buffer(call.x), into),
                     _placed(h, call, packed, recv, call.counts, call.displs))
    h.ready()
    args = (h.send_buffer(call.x), [recv, (list(call.counts), list(call.displs))])
    return _call(runner, call, lib.Allgatherv, lib.Iallgatherv, args,
                 lambda: h.result(recv, call.out, call.shape, call.x.dtype))


def _reaches_past_the_limit(elems, displs) -> bool:
    """Whether blocks of ``elems`` at ``displs`` reach past what one MPI call takes (engine/counts.py): MPI-3's
    displacements are C ints. Such a rank's blocks go packed (displacements within the call's whole message, which
    resolving kept within the limit), placed or gathered by copies; the MPI call, and so its pairing, is the same."""
    return counts.too_many(extent(elems, displs))


def _new(h, shape, dtype):
    """A scratch buffer MPI writes: on the host when staging, else of the call's backend."""
    return np.empty(shape, dtype) if h.staging else h.xp.empty(shape, dtype)


def _placed(h, call, packed, recv, counts, displs):
    """The finish of a call received into ``packed`` (blocks one after another): each block copied to its
    displacement in ``recv`` (elements), then the result as the caller's."""
    def finish():
        flat_recv = recv.reshape(-1)
        for c, d, a in zip(counts, displs, offsets(counts)[:-1]):
            if c:
                flat_recv[d:d + c] = packed[a:a + c]
        return h.result(recv, call.out, call.shape, call.x.dtype)
    return finish


def _gathered_from(blocks_of, counts, displs, module):
    """Blocks of ``blocks_of`` (flat) at ``displs`` packed one after another (a send of even blocks)."""
    return module.concatenate([blocks_of[d:d + c] for c, d in zip(counts, displs)])


def _displaced_recv(call, h):
    """The receive buffer of a call with displacements: ``out`` itself where MPI may write it; else a buffer that
    starts as ``out`` (or zeros), so that the rows between the blocks stay as they were."""
    x, out, xp = call.x, call.out, call.xp
    if out is not None and out.flags.c_contiguous and not h.staging and not xp.may_share_memory(out, x):
        return out
    if out is None:
        return np.zeros(call.shape, x.dtype) if h.staging else xp.zeros(call.shape, x.dtype)
    return xp.asnumpy(out) if h.staging else out.copy()


def _alltoall_displaced(runner, call, h, lib):
    """MPI_Alltoallv with the caller's displacements (either side; the other side's blocks one after another); for
    an even matrix MPI_Alltoall from and into packed blocks, as every rank without displacements calls it."""
    if _alltoall_vectors(call.matrix, runner.rank) is None:
        return _alltoall_even_displaced(runner, call, h, lib)
    sends, received = list(call.matrix[runner.rank]), [r[runner.rank] for r in call.matrix]
    src = flat(h.arg(call.x))
    send_at = list(call.send_displs) if call.send_displs is not None else list(offsets(sends)[:-1])
    if call.send_displs is not None and _reaches_past_the_limit(sends, send_at):   # sent packed (a copy)
        src, send_at = _gathered_from(src, sends, send_at, np if h.staging else h.xp), list(offsets(sends)[:-1])
    placed = None   # where blocks received packed are placed (displacements past the limit)
    if call.displs is None:
        recv, recv_at = _empty(call.xp, call.shape, call.x.dtype, call.out, h.staging, call.x), list(offsets(received)[:-1])
    elif _reaches_past_the_limit(received, call.displs):
        placed = _displaced_recv(call, h)
        recv, recv_at = _new(h, (sum(received),), call.x.dtype), list(offsets(received)[:-1])
    else:
        recv, recv_at = _displaced_recv(call, h), list(call.displs)
    h.ready()
    args = ([src, (sends, send_at)], [recv, (received, recv_at)])
    finish = (lambda: h.result(recv, call.out, call.shape, call.x.dtype)) if placed is None else \
        _placed(h, call, recv, placed, received, call.displs)
    return _call(runner, call, lib.Alltoallv, lib.Ialltoallv, args, finish)


def _alltoall_even_displaced(runner, call, h, lib):
    """Blocks of ``c`` elements everywhere, at this rank's displacements: sent from packed copies of the blocks at
    ``send_displs``, received into packed rows then placed at ``recv_displs``; MPI_Alltoall in between."""
    n, x = runner.size, call.x
    c = call.matrix[0][0]
    src = flat(h.arg(x))
    if call.send_displs is not None:
        src = _gathered_from(src, [c] * n, call.send_displs, np if h.staging else h.xp)
    if call.displs is None:
        recv = _empty(call.xp, call.shape, x.dtype, call.out, h.staging, x)
        h.ready()
        return _call(runner, call, lib.Alltoall, lib.Ialltoall, (src, recv),
                     lambda: h.result(recv, call.out, call.shape, x.dtype))
    recv, packed = _displaced_recv(call, h), _new(h, (c * n,), x.dtype)
    h.ready()
    return _call(runner, call, lib.Alltoall, lib.Ialltoall, (src, packed),
                 _placed(h, call, packed, recv, [c] * n, call.displs))


def alltoall(runner, call):
    x, xp, lib = call.x, call.xp, _lib(runner, call)
    h = _Host(runner, xp)
    if call.displs is not None or call.send_displs is not None:
        return _alltoall_displaced(runner, call, h, lib)
    recv = _empty(xp, call.shape, x.dtype, call.out, h.staging, x)
    vectors = _alltoall_vectors(call.matrix, runner.rank)
    if vectors is None:  # every block of every rank the same size: MPI_Alltoall
        run, start, args = lib.Alltoall, lib.Ialltoall, (flat(h.arg(x)), recv)
    else:
        send, received = vectors
        run, start, args = lib.Alltoallv, lib.Ialltoallv, ([flat(h.arg(x)), send], [recv, received])
    h.ready()
    return _call(runner, call, run, start, args, lambda: h.result(recv, call.out, call.shape, x.dtype))


# -- which MPI call: the regular one for even blocks, computed once per shape ---------------------------------
_REGULAR = {"reduce_scatter": ("Reduce_scatter_block", "Reduce_scatter"), "allgather": ("Allgather", "Allgatherv"),
            "alltoall": ("Alltoall", "Alltoallv"), "allreduce": ("Allreduce",) * 2, "broadcast": ("Bcast",) * 2,
            "reduce": ("Reduce",) * 2, "gather": ("Gather", "Gatherv"), "scatter": ("Scatter", "Scatterv"),
            "scan": ("Scan",) * 2, "exscan": ("Exscan",) * 2}


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


# From this size a blocking broadcast posts MPI_Ibcast on every rank (the size is the same on all, so they all
# take the same form): the root then copies x into its out while MPI moves x, instead of first (2 ranks,
# out of place: 1.5-1.9x MPI_Bcast after the copy from 4 MiB, the same in place; bench/README.md).
BCAST_OVERLAP_BYTES = 1 << 20


def overlapped_bcast(lib, buf, root: int, source=None) -> None:
    """MPI_Ibcast of ``buf`` and wait; on the root, ``source`` (C-contiguous host memory apart from ``buf``) is
    what it sends, copied into ``buf`` meanwhile."""
    if source is None:
        lib.Ibcast(buf, root).Wait()
        return
    request = lib.Ibcast(source, root)
    buf[...] = source
    request.Wait()


def broadcast(runner, call):
    x, out, xp, root = call.x, call.out, call.xp, call.root
    h = _Host(runner, xp)
    in_place = out is x and x.flags.c_contiguous and not h.staging   # Bcast works in place anyway
    buf = x if in_place else _empty(xp, x.shape, x.dtype, out, h.staging, x)
    lib = _lib(runner, call)
    run, source = lib.Bcast, None
    if call.blocking and runner.watch is None and x.nbytes >= BCAST_OVERLAP_BYTES:   # decided alike everywhere
        if runner.rank == root and buf is not x and not h.staging and x.flags.c_contiguous and xp is np:
            source = x
        run = functools.partial(overlapped_bcast, lib, source=source)
    if runner.rank == root and buf is not x and source is None:
        buf[...] = h.arg(x)
    h.ready()
    return _call(runner, call, run, lib.Ibcast, (buf, root), lambda: h.result(buf, out, x.shape, x.dtype))


def reduce(runner, call):
    x, out, xp, root = call.x, call.out, call.xp, call.root
    h = _Host(runner, xp)
    at_root = call.shape is not None
    if at_root and out is x and x.flags.c_contiguous and not h.staging:
        send, recv = MPI.IN_PLACE, x
    else:
        send = flat(h.arg(x))
        recv = _empty(xp, x.shape, x.dtype, out, h.staging, x) if at_root else None
    h.ready()
    finish = _averaged(h, recv, call, runner.size) if at_root else _nothing
    lib = _lib(runner, call)
    return _call(runner, call, lib.Reduce, lib.Ireduce,
                 (_typed(send, call), _typed(recv, call), _mpi_op_of(call), root), finish)


def gather(runner, call):
    x, xp, root, lib = call.x, call.xp, call.root, _lib(runner, call)
    h = _Host(runner, xp)
    vector = _rooted_vector(call.counts, call.displs)
    send, recv, placed = h.send_buffer(x), None, None
    if call.shape is not None:   # the root
        if vector is None and not h.staging and is_block_of(x, call.out, root):
            send, recv = MPI.IN_PLACE, call.out   # x already lies in the root's slot of out, as MPI_IN_PLACE expects
        else:
            recv = _kept(h, call, x)
        if vector is not None and call.displs is not None and _reaches_past_the_limit(call.counts, call.displs):
            placed, recv = recv, _new(h, (sum(call.counts),), x.dtype)   # received packed, then placed
            vector = (list(call.counts), list(offsets(call.counts)[:-1]))
    h.ready()
    if vector is None:   # even blocks packed in rank order: MPI_Gather
        run, start, args = lib.Gather, lib.Igather, (send, None if recv is None else recv.reshape(-1), root)
    else:
        run, start, args = lib.Gatherv, lib.Igatherv, (send, None if recv is None else [recv.reshape(-1), vector], root)
    finish = _nothing if recv is None else (lambda: h.result(recv, call.out, call.shape, x.dtype)) if placed is None \
        else _placed(h, call, recv, placed, call.counts, call.displs)
    return _call(runner, call, run, start, args, finish)


def scatter(runner, call):
    x, xp, root, lib = call.x, call.xp, call.root, _lib(runner, call)
    h = _Host(runner, xp)
    vector = _rooted_vector(call.counts, call.displs)
    out = call.out
    if runner.rank == root and vector is None and not h.staging and out is not None and is_block_of(out, x, root):
        # in place: the root's out already is its block of x, which MPI_IN_PLACE leaves where it is
        h.ready()
        return _call(runner, call, lib.Scatter, lib.Iscatter, (h.send_buffer(x).reshape(-1), MPI.IN_PLACE, root),
                     lambda: out)
    recv = _empty(xp, call.shape, x.dtype, out, h.staging, x)
    send = h.send_buffer(x).reshape(-1) if runner.rank == root else None
    if send is not None and vector is not None and call.displs is not None \
            and _reaches_past_the_limit(call.counts, call.displs):   # the root's blocks sent packed (a copy)
        send = _gathered_from(send, call.counts, call.displs, np if h.staging else xp)
        vector = (list(call.counts), list(offsets(call.counts)[:-1]))
    h.ready()
    if vector is None:   # even blocks packed in rank order: MPI_Scatter
        run, start, args = lib.Scatter, lib.Iscatter, (send, recv, root)
    else:
        run, start, args = lib.Scatterv, lib.Iscatterv, (None if send is None else [send, vector], recv, root)
    return _call(runner, call, run, start, args, lambda: h.result(recv, call.out, call.shape, x.dtype))


@lru_cache(maxsize=256)
def _rooted_vector(elems: tuple, displs: tuple | None) -> tuple | None:
    """None for even blocks packed in rank order (MPI's regular call), else ``(counts, displacements)``."""
    if displs is None:
        return _vector(elems)
    return list(elems), list(displs)


def _kept(h: _Host, call, x):
    """The root's receive buffer of a gather: ``out`` where MPI may write it; else a copy of ``out`` (rows no block
    covers keep what they held, as they do when MPI writes ``out`` itself), or a new array, zero where no block
    lands."""
    out, xp = call.out, h.xp
    if out is None:
        made = np if h.staging else xp
        covered = sum(call.counts) == math.prod(call.shape)
        return (made.empty if covered else made.zeros)(call.shape, x.dtype)
    if out.flags.c_contiguous and not h.staging and not xp.may_share_memory(out, x):
        return out
    return xp.asnumpy(out) if h.staging else xp.array(out, order="C")
def scan(runner, call):
    return _prefix(runner, call, "Scan", "Iscan")


def exscan(runner, call):
    return _prefix(runner, call, "Exscan", "Iexscan")


def _prefix(runner, call, name: str, iname: str):
    """MPI_Scan or MPI_Exscan. Exscan's rank 0 (``call.shape`` None) gets nothing: MPI writes what it likes into a
    scratch buffer, and the caller's ``out`` stays as it was."""
    x, out, xp = call.x, call.out, call.xp
    h = _Host(runner, xp)
    mine = call.shape is not None
    if mine and out is x and x.flags.c_contiguous and not h.staging:   # MPI allows in place on any rank
        send, recv = MPI.IN_PLACE, x
    else:
        send = flat(h.arg(x))
        recv = _empty(xp, x.shape, x.dtype, out if mine else None, h.staging, x)
    h.ready()
    lib = _lib(runner, call)
    return _call(runner, call, getattr(lib, name), getattr(lib, iname),
                 (_typed(send, call), _typed(recv, call), _mpi_op_of(call)),
                 _averaged(h, recv, call, runner.size) if mine else _nothing)


def _lib(runner, call):
    """The communicator of the call: ``later`` for a call started late, from a Request's progress (runner.prepared):
    on it such calls start in call order whatever else ran meanwhile."""
    return runner.later if call.late else runner.lib


def _nothing():
    return None   # no result off the root


def _call(runner, call, run, start, args, finish):
    """``run(*args)`` then ``finish()``; non-blocking, a Request on ``start(*args)``; under the watchdog
    (``runner.watch``), started non-blocking and polled to the deadline.

    MPI raising inside its collective ends the job naming the call (engine/abort.py): the other
    ranks may be inside it too.
    """
    label = f"{call.collective} #{call.seq} (mpi)"
    if runner.watch is not None:
        watch = runner.watch.of(call)   # entered in the flight recorder as the call started (Runner.run)
        request = start(*args)
        if not call.blocking:
            return Request.of_mpi(request, finish, watch, label, runner.rank, runner.dropped, keep=args,
                                  track=runner.native)
        try:
            watch.finish([request])
        except BaseException:   # a timeout (abort off) or an interrupt: MPI still reads and writes the buffers
            runner.left_in_flight(args, label)   # the buffers (the watchdog keeps the request, which holds none)
            raise
        return finish()
    try:
        if call.blocking:
            run(*args)
            return finish()
        request = start(*args)
    except MPI.Exception as e:
        collective_failed(label, runner.rank, e)
    return Request.of_mpi(request, finish, None, label, runner.rank, runner.dropped, keep=args, track=runner.native)

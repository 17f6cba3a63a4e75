"""The mpi4py face in one process: its reading of mpi4py's buffer specifications and ops, and its requests.

The reference for what a spec names is mpi4py itself: the bytes mpi4py sends for a spec
(``Sendrecv`` to this very process on ``COMM_SELF``), and the bytes it writes when it receives into
one, are the bytes the face's view holds. The multi-rank comparison with mpi4py's collectives is
tests/mpi/test_api.py.
"""
import array

import numpy as np
import pytest
from mpi4py import MPI

import pycollect as pc
from pycollect.mpi4py_face import buffers
from pycollect.mpi4py_face.reductions import UserOps, reduction


def sent_by_mpi4py(spec) -> bytes:
    """The bytes mpi4py sends for ``spec``."""
    box, status = bytearray(4096), MPI.Status()
    MPI.COMM_SELF.Sendrecv(spec, 0, 7, [box, MPI.BYTE], 0, 7, status)
    return bytes(box[:status.Get_count(MPI.BYTE)])


def written_by_mpi4py(spec, buf: np.ndarray, nbytes: int) -> np.ndarray:
    """Which bytes of ``buf`` mpi4py writes when it receives ``nbytes`` into ``spec`` (True where written)."""
    before = buf.view(np.uint8).reshape(-1).copy()
    MPI.COMM_SELF.Sendrecv([np.full(nbytes, 0xA5, np.uint8), MPI.BYTE], 0, 8, spec, 0, 8)
    return buf.view(np.uint8).reshape(-1) != before


def specs(buf):
    """Every simple form mpi4py documents, over ``buf`` (12 float64 values)."""
    return [buf, [buf, MPI.DOUBLE], (buf, "d"), [buf, 5, MPI.DOUBLE], [buf, (4, 2), MPI.DOUBLE], [buf, 4, 3, MPI.DOUBLE],
            [buf, (3, 1)], [buf, [3, 1]], [buf, MPI.INT], [buf, 7, MPI.FLOAT], [buf, MPI.BYTE], [buf, (0, 12), MPI.DOUBLE],
            [buf, 2, MPI.DOUBLE.Create_contiguous(3).Commit()], [buf, 0, MPI.DOUBLE], [None, MPI.DOUBLE]]


def test_simple_specs_name_the_bytes_mpi4py_moves():
    buf = np.arange(12.0) + 0.25
    for spec in specs(buf):
        view = buffers.simple(spec, "Send", "sendbuf", False).data
        assert view.tobytes() == sent_by_mpi4py(spec), spec
        assert view.size == 0 or np.shares_memory(view, buf), spec
    for spec in specs(buf)[:-1]:
        buf[:] = 0.0   # a pattern the message's bytes differ from
        view = buffers.simple(spec, "Recv", "recvbuf", True).data
        written = written_by_mpi4py(spec, buf, view.nbytes)
        mask = np.zeros(buf.nbytes, bool)
        if view.size:
            start = view.ctypes.data - buf.ctypes.data
            mask[start:start + view.nbytes] = True
        assert (written == mask).all(), spec


def test_buffers_of_other_kinds_and_their_inferred_datatypes():
    """Types as mpi4py infers them from the buffer format: 'B' as the installed mpi4py types it (MPI.UNSIGNED_CHAR
    in 4.1: it refuses an Allreduce of a uint8 array into [buf, MPI.BYTE]), an int64 array MPI.LONG, ..."""
    byte = buffers.unsigned_bytes_type()
    other = MPI.BYTE if byte == MPI.UNSIGNED_CHAR else MPI.UNSIGNED_CHAR
    for buf in (np.zeros(2, np.uint8), bytearray(2), b"xy"):     # mpi4py takes the inferred type, not the other
        MPI.COMM_SELF.Allreduce(buf, [np.zeros(2, np.uint8), byte], op=MPI.BOR)
        with pytest.raises(ValueError, match="mismatch"):
            MPI.COMM_SELF.Allreduce(buf, [np.zeros(2, np.uint8), other], op=MPI.BOR)
    cases = [(bytearray(b"abcdef"), byte, 6), (array.array("i", [1, 2, 3]), MPI.INT, 3),
             (np.zeros(4, np.uint8), byte, 4), (np.zeros(3, np.int64), MPI.LONG, 3),
             (np.zeros(2, np.complex128), MPI.C_DOUBLE_COMPLEX, 2), (np.zeros(2, np.longdouble), MPI.LONG_DOUBLE, 2),
             (np.zeros(5, bool), MPI.C_BOOL, 5), (memoryview(np.zeros(3, np.float32)), MPI.FLOAT, 3),
             (b"xyz", byte, 3)]
    for buf, datatype, count in cases:
        block = buffers.simple(buf, "Send", "sendbuf", False)
        assert block.datatype == datatype and block.per_block == count, (buf, buffers.type_name(block.datatype))
        assert block.data.tobytes() == sent_by_mpi4py(buf)
    fortran = np.asfortranarray(np.arange(6.0).reshape(2, 3))   # memory order, as MPI reads it
    assert buffers.simple(fortran, "Send", "sendbuf", False).data.tobytes() == sent_by_mpi4py(fortran)
    pairs = np.zeros(3, buffers.numpy_dtype(MPI.DOUBLE_INT, "t", "b"))
    block = buffers.simple([pairs, MPI.DOUBLE_INT], "Send", "sendbuf", False)
    assert block.data.dtype.names == ("f0", "f1") and block.per_block == 3 and block.data.itemsize == 16


def test_blocks_and_vectors_split_as_mpi4py_documents():
    buf = np.arange(12.0)
    assert buffers.simple(buf, "Gather", "recvbuf", True, 3).per_block == 4
    assert buffers.simple([buf, 2, MPI.DOUBLE], "Gather", "recvbuf", True, 3).data.shape == (6,)
    assert buffers.simple([buf, (2, 3), MPI.DOUBLE], "Gather", "recvbuf", True, 4).data.tolist() == list(range(3, 11))
    forms = [  # spec, counts, displs
             ([buf[:10], MPI.DOUBLE], (3, 3, 2, 2), (0, 3, 6, 8)),          # counts None: the first ranks one more
             ([buf, 2, MPI.DOUBLE], (2, 2, 2, 2), (0, 2, 4, 6)),             # one count for each
             ([buf, [1, 0, 3, 2], MPI.DOUBLE], (1, 0, 3, 2), (0, 1, 1, 4)),  # a list is counts
             ([buf, ([1, 0, 3, 2], [9, 0, 5, 1]), MPI.DOUBLE], (1, 0, 3, 2), (9, 0, 5, 1)),
             ([buf, [1, 2, 1, 2], [0, 3, 6, 9], MPI.DOUBLE], (1, 2, 1, 2), (0, 3, 6, 9)),
             ([buf, ([2, 2, 2, 2], 3), MPI.DOUBLE], (2, 2, 2, 2), (0, 3, 6, 9)),  # an int displacement: a stride
             ([buf, ([2, 1, 2, 1], None)], (2, 1, 2, 1), (0, 2, 3, 5))]
    for spec, counts, displs in forms:
        v = buffers.vector(spec, "Gatherv", "recvbuf", True, 4)
        assert (v.counts, v.displs) == (counts, displs), spec
        assert v.packed() == (displs == tuple(np.cumsum((0,) + counts[:-1]).tolist()))
        assert v.block(2).tolist() == buf[displs[2]:displs[2] + counts[2]].tolist()


BAD = [  # (spec, writable, blocks, exception, words)
    ([np.zeros(3), 1, 0, MPI.DOUBLE, 5], True, 0, ValueError, ["recvbuf", "2 to 4 items"]),
    ([1.0, 2.0], True, 0, TypeError, ["recvbuf", "must be a buffer", "float"]),
    ("text", True, 0, TypeError, ["recvbuf", "str"]),
    (b"abc", True, 0, BufferError, ["recvbuf", "read-only"]),
    (np.zeros((4, 4))[:, ::2], True, 0, BufferError, ["recvbuf", "not contiguous"]),
    ([np.zeros(3), 4, MPI.DOUBLE], True, 0, ValueError, ["recvbuf", "holds 3 elements of MPI_DOUBLE", "asks for 4"]),
    ([np.zeros(3), -1, MPI.DOUBLE], True, 0, ValueError, ["recvbuf", "count must not be negative"]),
    ([np.zeros(3), 1.5, MPI.DOUBLE], True, 0, TypeError, ["recvbuf", "count must be an integer"]),
    ([np.zeros(3), (1, 4), MPI.DOUBLE], True, 0, ValueError, ["recvbuf", "displacement 4 is past its end"]),
    ([np.zeros(5, np.uint8), MPI.INT], True, 0, ValueError, ["recvbuf", "5 bytes", "MPI_INT"]),
    (np.zeros(5), True, 2, ValueError, ["recvbuf", "not a multiple of the 2 blocks"]),
    ([np.zeros(3), "?x"], True, 0, TypeError, ["recvbuf", "cannot map '?x'"]),
    ([np.zeros(4, np.uint8), MPI.WCHAR], True, 0, TypeError, ["recvbuf", "MPI_WCHAR", "no NumPy dtype of its 4 bytes"]),
    ([np.zeros(3), 3.5], True, 0, TypeError, ["recvbuf", "count must be an integer, got 3.5"]),
    ([np.zeros(3), MPI.DATATYPE_NULL], True, 0, ValueError, ["recvbuf", "DATATYPE_NULL"]),
    ([np.zeros(8), 1, MPI.DOUBLE.Create_vector(2, 1, 2).Commit()], True, 0, TypeError, ["recvbuf", "gaps"]),
]
BAD_VECTORS = [
    ([np.zeros(6), [1, 2], MPI.DOUBLE], ValueError, ["recvbuf", "2 counts", "one per rank (3)"]),
    ([np.zeros(6), ([1, 2, 3], [0, 1, 4]), MPI.DOUBLE], ValueError, ["recvbuf", "block 2", "displs[2]=4"]),
    ([np.zeros(6), [1, -2, 3], MPI.DOUBLE], ValueError, ["recvbuf", "counts[1] must not be negative"]),
    ([np.zeros(6), ([1, 2, 3], "abc"), MPI.DOUBLE], TypeError, ["recvbuf", "displacement must be an integer"]),
    ([np.zeros(6), ([1, 2, 3], [0, 1]), MPI.DOUBLE], ValueError, ["recvbuf", "2 displs", "one per rank (3)"]),
]


def test_bad_specs_raise_naming_the_argument():
    for spec, writable, blocks, exc, words in BAD:
        with pytest.raises(exc) as info:
            buffers.simple(spec, "Allreduce", "recvbuf", writable, blocks)
        assert all(w in str(info.value) for w in words), (spec, str(info.value))
        assert str(info.value).startswith("Allreduce: ")
    for spec, exc, words in BAD_VECTORS:
        with pytest.raises(exc) as info:
            buffers.vector(spec, "Gatherv", "recvbuf", True, 3)
        assert all(w in str(info.value) for w in words), (spec, str(info.value))


def test_ops_as_pycollect_takes_them():
    x = np.arange(4.0)
    assert reduction(MPI.SUM, x, x, MPI.DOUBLE, UserOps(), "Allreduce") == (x, MPI.SUM, x)
    pairs = np.zeros(3, buffers.numpy_dtype(MPI.DOUBLE_INT, "t", "b"))
    pairs["f0"], pairs["f1"] = [3.0, 1.0, 2.0], [7, 8, 9]
    (values, where), op, (out_values, out_where) = reduction(MPI.MAXLOC, pairs, pairs, MPI.DOUBLE_INT, UserOps(), "t")
    assert values.tolist() == [3.0, 1.0, 2.0] and where.tolist() == [7, 8, 9] and op == MPI.MAXLOC
    assert not np.shares_memory(values, pairs) and np.shares_memory(out_values, pairs)   # in place: read first
    for bad, words in [(lambda: reduction(MPI.MINLOC, x, x, MPI.DOUBLE, UserOps(), "Allreduce"), ["MINLOC", "pair"]),
                       (lambda: reduction("sum", x, x, MPI.DOUBLE, UserOps(), "Allreduce"), ["op must be an MPI.Op"]),
                       (lambda: reduction(MPI.OP_NULL, x, x, MPI.DOUBLE, UserOps(), "Allreduce"), ["MPI.Op"])]:
        with pytest.raises(TypeError) as info:
            bad()
        assert all(w in str(info.value) for w in words) and "Allreduce" in str(info.value)
    for op, name in ((MPI.REPLACE, "MPI.REPLACE"), (MPI.NO_OP, "MPI.NO_OP")):     # MPI_Accumulate's, not a reduction's
        with pytest.raises(ValueError, match=f"Allreduce: op {name} is for one-sided accumulates"):
            reduction(op, x, x, MPI.DOUBLE, UserOps(), "Allreduce")


def test_user_ops_compute_what_mpi_hands_their_function():
    """A non-commutative MPI.Op.Create op becomes a pycollect Op computing MPI's ``inout = in op inout`` (the lower
    ranks' ``in`` first), the same as MPI_Reduce_local; in place stays in place; one Op per (op, datatype)."""
    def first_plus_twice(a, b, datatype):
        a, b = np.frombuffer(a, "f8"), np.frombuffer(b, "f8")
        b[:] = a + 2 * b
    op = MPI.Op.Create(first_plus_twice, commute=False)
    try:
        ops = UserOps()
        x, y = np.array([1.0, 2.0, 3.0]), np.array([10.0, 20.0, 30.0])
        opaque, user, out = reduction(op, x, x, MPI.DOUBLE, ops, "Allreduce")
        assert isinstance(user, pc.Op) and not user.commute and out is opaque and opaque.dtype.itemsize == 8
        assert reduction(op, y, None, MPI.DOUBLE, ops, "Allreduce")[1] is user
        a, b = x.view("V8"), y.view("V8")
        got = np.empty(3).view("V8")
        user.combine(np)(a, b, out=got)
        expected = y.copy()
        op.Reduce_local(x, expected)
        assert got.view("f8").tolist() == expected.tolist() == [21.0, 42.0, 63.0]
        user.combine(np)(a, b, out=b)   # out is b
        assert y.tolist() == [21.0, 42.0, 63.0]
        triple = MPI.DOUBLE.Create_contiguous(3).Commit()
        block = np.arange(6.0).reshape(2, 3)
        opaque = reduction(op, block, None, triple, ops, "Allreduce")[0]
        assert opaque.shape == (2,) and opaque.dtype.itemsize == 24   # one element: three doubles, never split
        triple.Free()
    finally:
        op.Free()


def test_requests_wait_test_and_waitall_with_mpi4pys_own():
    done = pc.mpi4py.Request()
    assert done.Test() and done.Wait() is True
    box = np.zeros(2)
    theirs = [MPI.COMM_SELF.Irecv(box, 0, 5), MPI.COMM_SELF.Isend(np.ones(2), 0, 5)]
    assert pc.mpi4py.Request.Waitall([done] + theirs) is True and box.tolist() == [1.0, 1.0]
    assert pc.mpi4py.Request.Testall([done])


def test_the_face_in_one_process():
    """Routed calls at one rank, attributes falling through, and a method the Communicator lacks named."""
    face = pc.mpi4py(MPI.COMM_WORLD)
    try:
        assert face.Get_rank() == MPI.COMM_WORLD.Get_rank() and face.size == MPI.COMM_WORLD.size
        x, y = np.arange(3.0), np.zeros(3)
        with face.pycollect.record() as log:
            face.Allreduce([x, MPI.DOUBLE], [y, MPI.DOUBLE], op=MPI.MAX)
            face.Iallgather(x, y).Wait()
        assert [r.collective for r in log] == ["allreduce", "allgather"] and y.tolist() == [0.0, 1.0, 2.0]
        with pytest.raises(TypeError, match="MPI.Intracomm"):
            pc.mpi4py(42)
        for name in ("scan", "gather"):
            if not hasattr(face.pycollect, name):
                with pytest.raises(NotImplementedError, match=f"Communicator.{name}"):
                    getattr(face, name.capitalize())(x, y)
    finally:
        face.pycollect.free()


def _whole(view, a: np.ndarray) -> bool:
    """Whether ``view`` is the caller's array ``a`` itself, every element of it (no temporary, no part)."""
    return view.ctypes.data == a.ctypes.data and view.size == a.size and view.dtype == a.dtype


def test_displaced_blocks_go_to_the_displs_forms_without_a_temporary():
    """Allgatherv, Gatherv, Scatterv and Alltoallv with a gap before the block: each route hands the caller's
    whole buffer and the displacements to the Communicator (nothing to copy back), and the call writes the block
    where the displacement puts it, the gap left as it was (one rank; tests/mpi/test_api.py compares with mpi4py
    at every size)."""
    face = pc.mpi4py(MPI.COMM_WORLD)
    try:
        if face.size != 1:
            pytest.skip("one process: the routes of a world of one")
        x, spread = np.arange(1.0, 3.0), np.array([9.0, 1.0, 2.0])
        for name, sent, route in [("Allgatherv", x, face._allgather), ("Gatherv", x, lambda *a: face._gather(*a, 0)),
                                  ("Alltoallv", [spread, ([2], [1]), MPI.DOUBLE], face._alltoall)]:
            y = np.full(6, -1.0)
            spec = [y, ([2], [3]), MPI.DOUBLE]
            plan = route(name, sent, spec)
            displs = plan.kwargs.get("recv_displs" if name == "Alltoallv" else "displs")
            assert plan.after is None and _whole(plan.kwargs["out"], y) and displs == (3,), (name, plan)
            assert name != "Alltoallv" or (_whole(plan.x, spread) and plan.kwargs["send_displs"] == (1,)), plan
            getattr(face, name)(sent, spec)
            assert y.tolist() == [-1.0, -1.0, -1.0, 1.0, 2.0, -1.0], (name, y)
        y = np.full(2, -1.0)
        whole = np.array([7.0, 7.0, 7.0, 1.0, 2.0])
        plan = face._scatter("Scatterv", [whole, ([2], [3]), MPI.DOUBLE], y, 0)
        assert _whole(plan.x, whole) and plan.kwargs["displs"] == (3,) and _whole(plan.kwargs["out"], y)
        assert plan.after is None
        face.Scatterv([whole, ([2], [3]), MPI.DOUBLE], y, root=0)
        assert y.tolist() == [1.0, 2.0]
    finally:
        face.pycollect.free()

"""The bad inputs of docs/errors.md that no other test covers, one test per row.

Each test checks the exception type, that the message names the argument, that nothing was
written into the caller's arrays, and that the ranks are still in step afterwards (a barrier,
then a correct collective). Rows already covered elsewhere are named in docs/errors.md.

The ``test_validation_*`` tests need ``Communicator(validate=True)`` and
``pc.CollectiveMismatchError``: a mismatch across ranks raises on every rank, naming the field.
"""
import warnings

import numpy as np
import pytest
from mpi4py import MPI

import pycollect as pc
from helpers import agree, in_step, integer_valued, mpi_allgather, mpi_allreduce, mpi_alltoall, raises, same, verdicts
from pycollect.engine import backend
from pycollect.engine.layout import split_even

WORLD = MPI.COMM_WORLD.Get_size()


def x_of(shape, dtype="f8", seed=0):
    return integer_valued(shape, np.dtype(dtype), "sum", seed)


# -- counts that do not add up --------------------------------------------------------------------------
def test_alltoall_counts_not_summing_to_rows(comm):
    x = x_of((4, 2), seed=comm.rank)
    raises(comm, lambda: comm.alltoall(x, counts=[5] + [0] * (comm.size - 1)), ValueError,
           ["alltoall", "counts sum to 5", "4 rows"], [x])


def test_alltoall_count_matrix_checked(comm):
    x = x_of((4, 2), seed=comm.rank)
    p = comm.size
    raises(comm, lambda: comm.alltoall(x, counts=np.zeros((p, p + 1), int)), ValueError,
           ["alltoall", f"counts as a matrix must be ({p}, {p})", f"{p} rows of lengths [{p + 1}]"], [x])
    off = [[4] + [0] * (p - 1)] * p
    off[comm.rank] = [5] + [0] * (p - 1)
    raises(comm, lambda: comm.alltoall(x, counts=off), ValueError,
           ["alltoall", f"counts[{comm.rank}] (this rank's row) sums to 5", "4 rows"], [x])
    negative = [[4] + [0] * (p - 1)] * p
    negative[(comm.rank + 1) % p] = [5, -1] + [0] * (p - 2) if p > 1 else [4]
    if p > 1:
        raises(comm, lambda: comm.alltoall(x, counts=negative), ValueError, ["alltoall", "must not be negative"], [x])


def test_allgather_counts_disagree_with_own_rows(comm):
    x = x_of((4, 2), seed=comm.rank)
    out = np.zeros((3 * comm.size, 2))
    raises(comm, lambda: comm.allgather(x, counts=[3] * comm.size, out=out), ValueError,
           ["allgather", f"counts[{comm.rank}] is 3", "4 rows"], [x, out])


def test_counts_not_integers(comm):
    x = x_of((4,), seed=comm.rank)
    raises(comm, lambda: comm.reduce_scatter(x, counts="ab"), TypeError,
           ["reduce_scatter", "counts must be a sequence", f"{comm.size} integers"], [x])
    raises(comm, lambda: comm.alltoall(x, counts=[None] * comm.size), TypeError, ["alltoall", "counts"], [x])
    # a dict iterates its keys (before: read as the counts, {0: 99} taken as [0]), a set in no rank order
    for counts in ({r: 99 for r in range(comm.size)}, set(range(comm.size))):
        raises(comm, lambda: comm.reduce_scatter(x, counts=counts), TypeError,
               ["reduce_scatter: counts must be a sequence", f"got {type(counts).__name__}"], [x])


def test_nonblocking_counts_checked_at_start(comm):
    x = x_of((4,), seed=comm.rank)
    raises(comm, lambda: comm.ireduce_scatter(x, counts=[-1] + [5] + [0] * (comm.size - 2) if comm.size > 1 else [-1]),
           ValueError, ["reduce_scatter", "counts must not be negative"], [x])


# -- roots and peers --------------------------------------------------------------------------------------
@pytest.mark.parametrize("root", ["negative", "size", "float", "text"])
def test_root_out_of_range_or_not_an_int(comm, root):
    value = {"negative": -1, "size": comm.size, "float": 1.0, "text": "0"}[root]
    x = x_of((5,), seed=comm.rank)
    out = np.zeros(5)
    for name, call in (("broadcast", lambda: comm.broadcast(x, root=value, out=out)),
                       ("reduce", lambda: comm.reduce(x, root=value, out=out))):
        raises(comm, call, ValueError, [name, "root must be a rank in", f"[0, {comm.size})", repr(value)], [x, out])


def test_gather_scatter_arguments(comm):
    """Every rank passes the same bad root, counts or displs: every rank raises, naming it; nothing written."""
    size, rank = comm.size, comm.rank
    x, out = x_of((2, 2), seed=rank), np.full((2 * size, 2), 7.0)
    for name, call in (("gather", lambda: comm.gather(x, root=size, out=out)),
                       ("scatter", lambda: comm.scatter(out, root=-1, out=x))):
        raises(comm, call, ValueError, [name, "root must be a rank in", f"[0, {size})"], [x, out])
    for name, call in (("gather", lambda: comm.gather(x, counts=[2] * (size + 1), out=out)),
                       ("scatter", lambda: comm.iscatter(out, counts=[2] * (size + 1), out=x))):
        raises(comm, call, ValueError, [name, f"counts must have one entry per rank ({size}), got {size + 1}"], [x, out])
    negative = [-1, 2 * size + 1] + [0] * (size - 2) if size > 1 else [-1]
    raises(comm, lambda: comm.scatter(out, counts=negative, out=x), ValueError,
           ["scatter", "counts must not be negative"], [x, out])
    if size > 1:   # two blocks at row 0
        raises(comm, lambda: comm.igather(x, counts=[2] * size, displs=[0] * size, out=out), ValueError,
               ["gather", "displs overlap", "rank 0's rows [0, 2)", "rank 1's rows [0, 2)"], [x, out])
    raises(comm, lambda: comm.scatter(out, displs=[0] * size, out=x), ValueError,
           ["scatter", "displs needs counts"], [x, out])
    raises(comm, lambda: comm.gather(x, counts=[2] * size, displs=[-1] * size, out=out), ValueError,
           ["gather", "displs must not be negative"], [x, out])


def test_gather_scatter_errors_found_in_the_exchange(comm):
    """What only the exchange of rows can judge raises on every rank, in every mode: the root's ``out`` of the wrong
    rows (gather without counts, blocking or not), the root's rows not splitting evenly, another rank's ``out``."""
    size, rank = comm.size, comm.rank
    root = size - 1
    x, out = x_of((2, 2), seed=rank), np.full((2 * size + 1, 2), 7.0)
    words = [f"gather: out has shape ({2 * size + 1}, 2), expected ({2 * size}, 2)"]
    for call in (lambda: comm.gather(x, root=root, out=out), lambda: comm.igather(x, root=root, out=out).wait()):
        raises(comm, call, ValueError if rank == root else pc.CollectiveMismatchError,
               words if rank == root else [f"rank {root} failed"] + words, [x, out])
    block = np.full((2, 2), 7.0)
    if size > 1:   # every rank's count of rows divides 1 rank's
        raises(comm, lambda: comm.scatter(out if rank == root else None, root=root, out=block), ValueError,
               ["scatter", f"x has {2 * size + 1} rows on the root (rank {root})", "pass counts"], [out, block])
    wrong = np.full((3, 2), 7.0) if rank == 0 else block
    words = ["scatter: out has shape (3, 2), expected (2, 2)"]
    raises(comm, lambda: comm.iscatter(out[:2 * size] if rank == root else None, root=root, out=wrong).wait(),
           ValueError if rank == 0 else pc.CollectiveMismatchError, words if rank == 0 else ["rank 0 failed"] + words,
           [out, wrong])
    raises(comm, lambda: comm.scatter(None, root=root), TypeError if rank == root else ValueError,
           ["scatter: x must be a NumPy or CuPy array"] if rank == root else ["scatter: off the root pass out="], [])


@pytest.mark.parametrize("peer", [-1, "size"])
def test_peer_out_of_range(comm, peer):
    value = comm.size if peer == "size" else peer
    x, box = x_of((3,), seed=comm.rank), np.zeros(3)
    raises(comm, lambda: comm.isend(x, dest=value), ValueError, ["isend", "dest must be a rank", repr(value)], [x])
    raises(comm, lambda: comm.irecv(box, source=value), ValueError,
           ["irecv", "source must be a rank", repr(value)], [box])
    raises(comm, lambda: comm.recv(box, source=value, tag=3), ValueError, ["irecv", "source"], [box])


def test_a_refused_message_ends_its_peer_and_tags_messages_on_that_rank(comm):
    """Each rank refuses a receive (read-only out) and a send (x not an array) on tag 5 and catches both: every later
    message of that peer and tag raises there, naming the refused one, while tag 6 goes on. Before, the next receive
    on tag 5 took the refused one's message: it returned the first of the two the peer sent as the second (found by
    a helper's fuzzing)."""
    if comm.size == 1:
        pytest.skip("a message to itself: MPI completes a send to self only with its receive posted")
    c = pc.Communicator(comm.mpi)
    peer, source = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    first, second = np.full(3, 1.0 + comm.rank), np.full(3, 100.0 + comm.rank)
    for x in (first, second):
        c.send(x, peer, tag=5)   # small: MPI buffers them, the sends return
    box = np.zeros(3)
    box.flags.writeable = False
    raises(comm, lambda: c.recv(box, source, tag=5), ValueError, ["irecv: out is read-only"], [box])
    raises(comm, lambda: c.send([1.0], peer, tag=5), TypeError, ["isend: x must be a NumPy or CuPy array"])
    out = np.full(3, -7.0)
    raises(comm, lambda: c.recv(out, source, tag=5), RuntimeError,
           [f"receive from rank {source}, tag 5: refused, as every message of this peer and tag after one refused",
            "(ValueError: irecv: out is read-only"], [out])
    raises(comm, lambda: c.isend(first, peer, tag=5), RuntimeError,
           [f"send to rank {peer}, tag 5: refused", "(TypeError: isend: x must be a NumPy or CuPy array"], [first])
    request = c.irecv(out, source, tag=6)
    c.send(second, peer, tag=6)
    agree(comm, same(request.wait(), np.full(3, 100.0 + source)), f"tag 6: {out}")
    c.barrier()
    c._p2p.Probe(source, 5)   # both sent before the barrier: here once one is (the second follows it in order)
    c._p2p.Probe(source, 5)
    with pytest.warns(ResourceWarning) as warned:   # the two on tag 5: a freed communicator's unreceived messages
        c.free()                                    # reached the next one MPI made (another test's receive)
    words = f"messages of send/recv never received, dropped (2 from rank {source}, tag 5)"
    agree(comm, any(words in str(w.message) for w in warned), f"{[str(w.message) for w in warned]}")
    again = pc.Communicator(comm.mpi)   # the context reused: nothing of c's left to pair with its receive
    request = again.irecv(out, source, tag=5)
    again.send(np.full(3, 1000.0 + comm.rank), peer, tag=5)
    agree(comm, same(request.wait(), np.full(3, 1000.0 + source)), f"tag 5 on a new communicator: {out}")
    again.free()


def test_a_message_for_a_refused_receive_arriving_after_free_reaches_no_later_communicator(comm):
    """Ranks in pairs: the even one refuses a receive from the odd one (read-only out) and frees its Communicator
    before the odd one sends, so the message arrives after free() looked. Before, the next Communicator MPI made
    reused the freed one's context and its receive returned that message, exit status 0 (a helper's reproducer;
    also across two nodes after a barrier). The refusing rank keeps the context now; the new receive gets the new
    message."""
    r = comm.rank
    role = "alone" if r % 2 == 0 and r + 1 == comm.size else "receiver" if r % 2 == 0 else "sender"
    c = pc.Communicator(comm.mpi)
    if role == "receiver":
        box = np.zeros(3)
        box.flags.writeable = False
        with pytest.raises(ValueError, match="irecv: out is read-only"):
            c.recv(box, r + 1, tag=4)
        c.free()
        comm.mpi.Barrier()
    else:
        comm.mpi.Barrier()
        if role == "sender":
            c.send(np.full(3, 100.0 + r), r - 1, tag=4)   # small: MPI buffers it, the send returns
        c.free()
    again = pc.Communicator(comm.mpi)
    out = np.full(3, -7.0)
    if role == "receiver":
        again.recv(out, r + 1, tag=4)
    elif role == "sender":
        again.send(np.full(3, 7.0 + r), r - 1, tag=4)
    agree(comm, role != "receiver" or same(out, np.full(3, 8.0 + r)), f"the new Communicator received {out}")
    again.free()


def test_free_drops_what_a_refused_gathers_leaves_sent_and_says_so(comm):
    """The root refuses a linear gather (out of the wrong shape) that the others, leaves sending straight to it, end
    without it. Their messages, never received, are dropped by free() with a warning: a freed communicator's context
    is reused by MPI, and a later Communicator's call of the same number (its tag) could take them."""
    if comm.size == 1:
        pytest.skip("a gather with leaves")
    c = pc.Communicator(comm.mpi)
    x = np.full(2, 1.0 + comm.rank)
    if comm.rank == 0:
        with pytest.raises(ValueError, match="gather: out has shape"):
            c.igather(x, root=0, algorithm="linear", out=np.zeros(3), counts=[2] * comm.size)
        for peer in range(1, comm.size):
            c._runner.lib.Probe(peer, MPI.ANY_TAG)   # arrived: what free() can see
    else:
        assert c.igather(x, root=0, algorithm="linear", counts=[2] * comm.size).wait() is None
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        c.free()
    said = [str(w.message) for w in warned if issubclass(w.category, ResourceWarning)]
    words = ["messages of the library's calls never received, dropped (1 from rank 1, tag"] + \
        [f"1 from rank {r}, tag" for r in range(2, comm.size)]
    agree(comm, not said if comm.rank else any(all(w in m for w in words) for m in said), f"{said}")


# -- op against dtype, unknown names ------------------------------------------------------------------------
@pytest.mark.parametrize("op, dtype", [("max", "c8"), ("min", "c16"), ("bxor", "f4"), ("band", "bfloat16"),
                                       ("bor", "c8")])
def test_op_the_dtype_does_not_support(comm, op, dtype):
    """Every reducing collective, blocking and not, names the op and the dtype."""
    if dtype == "bfloat16":
        import ml_dtypes
        dtype = ml_dtypes.bfloat16
    x = x_of((2 * comm.size,), dtype, comm.rank)
    words = [op, str(np.dtype(dtype))]
    for name, call in (("allreduce", lambda: comm.allreduce(x, op=op)),
                       ("allreduce", lambda: comm.iallreduce(x, op=op, algorithm="ring")),
                       ("reduce_scatter", lambda: comm.reduce_scatter(x, op=op)),
                       ("reduce_scatter", lambda: comm.ireduce_scatter(x, op=op)),
                       ("reduce", lambda: comm.reduce(x, op=op, root=0))):
        raises(comm, call, ValueError, [name] + words, [x])


def test_dtype_no_op_supports(comm):
    x = np.zeros(3, "M8[s]")
    raises(comm, lambda: comm.reduce(x, op="max"), TypeError, ["reduce", "dtype datetime64[s] is not supported"], [x])


@pytest.mark.parametrize("op, dtype, words", [("land", "f8", "needs a bool or integer dtype, got float64"),
                                              ("sum", "?", "for bool use 'land', 'lor' or 'lxor'"),
                                              ("bor", "?", "needs an integer dtype, got bool"),
                                              ("minloc", "c16", "needs an integer or float dtype (not complex)")])
def test_new_ops_on_dtypes_they_do_not_take(comm, op, dtype, words):
    """Logical ops, minloc and maxloc against the dtypes MPI defines them on, on every reducing collective."""
    x = np.ones(2 * comm.size, dtype)
    for name, call in (("allreduce", lambda: comm.allreduce(x, op=op)),
                       ("reduce_scatter", lambda: comm.ireduce_scatter(x, op=op, algorithm="ring")),
                       ("reduce", lambda: comm.reduce(x, op=op.upper(), root=0))):
        raises(comm, call, ValueError, [name, repr(op), words], [x])


def test_non_commutative_op_on_a_schedule_that_reorders(comm):
    """A non-commutative op is refused, naming the op and the algorithm, by every schedule that combines the ranks
    out of order; the message names the ones that keep it (MPI's own always does)."""
    matmul = pc.Op(lambda a, b, out: np.matmul(a, b, out=out), commute=False, name="matmul")
    x = np.ones(2 * comm.size)
    for name, call, algorithm in (
            ("allreduce", lambda: comm.allreduce(x, op=matmul, algorithm="ring"), "ring"),
            ("allreduce", lambda: comm.iallreduce(x, op=matmul, algorithm="rabenseifner"), "rabenseifner"),
            ("reduce_scatter", lambda: comm.reduce_scatter(x, op=matmul, algorithm="pairwise"), "pairwise")):
        raises(comm, call, ValueError, [name, "op matmul is not commutative", repr(algorithm), "use algorithm 'mpi'"],
               [x])
    if comm.size > 1:   # the binomial tree keeps rank order from root 0 only
        raises(comm, lambda: comm.reduce(x, op=matmul, root=comm.size - 1, algorithm="binomial"), ValueError,
               ["reduce", "op matmul is not commutative", "'binomial'"], [x])


def test_user_op_that_cannot_take_the_dtype(comm):
    x = np.ones(3, np.int32)
    raises(comm, lambda: comm.allreduce(x, op=np.hypot), ValueError,
           ["allreduce", "op hypot cannot reduce dtype int32"], [x])
    raises(comm, lambda: comm.reduce(x, op=np.negative), ValueError, ["reduce", "op negative is a ufunc of 1 input"],
           [x])


def test_minloc_bad_index_and_out(comm):
    x = np.ones(4)
    index = np.arange(3)
    raises(comm, lambda: comm.allreduce((x, index), op="minloc"), ValueError,
           ["allreduce", "x[1] (the index) has shape (3,)"], [x, index])
    raises(comm, lambda: comm.allreduce((x, np.full(4, 2 ** 40)), op="maxloc"), ValueError,
           ["allreduce", "must fit in int32"], [x])
    raises(comm, lambda: comm.allreduce((x, x), op="maxloc"), TypeError, ["allreduce", "x[1] (the index) must be"], [x])
    out = np.zeros(4)
    raises(comm, lambda: comm.allreduce(x, op="minloc", out=out), TypeError,
           ["allreduce", "out must be None or a pair"], [x, out])
    where = np.zeros(5, np.int32)
    raises(comm, lambda: comm.allreduce(x, op="minloc", out=(out, where)), ValueError,
           ["allreduce", "out[1] has shape (5,)"], [x, out, where])


def test_unknown_algorithm_every_collective(comm):
    x = x_of((2 * comm.size, 2), seed=comm.rank)
    calls = {"reduce_scatter": lambda: comm.reduce_scatter(x, algorithm="bruck"),
             "allgather": lambda: comm.iallgather(x, algorithm="pairwise"),
             "alltoall": lambda: comm.alltoall(x, algorithm="ring"),
             "broadcast": lambda: comm.broadcast(x, algorithm="tree"),
             "reduce": lambda: comm.reduce(x, algorithm="fastest")}
    for name, call in calls.items():
        raises(comm, call, ValueError, [f"{name}: unknown algorithm", "expected one of",
                                        ", ".join(pc.algorithms(name))], [x])


def test_unknown_op_every_reducing_collective(comm):
    x = x_of((comm.size,), seed=comm.rank)
    for name, call in (("reduce_scatter", lambda: comm.reduce_scatter(x, op="mean")),
                       ("reduce", lambda: comm.reduce(x, op="argmax")),   # "MAX" is max (test_arguments)
                       ("allreduce", lambda: comm.iallreduce(x, op=None))):
        raises(comm, call, ValueError, [f"{name}: unknown op", "expected one of sum"], [x])


def test_mpi_algorithm_on_a_dtype_mpi_cannot_reduce(comm):
    import ml_dtypes
    x = x_of((comm.size,), ml_dtypes.bfloat16, comm.rank)
    raises(comm, lambda: comm.reduce_scatter(x, algorithm="mpi"), ValueError,
           ["reduce_scatter", "algorithm 'mpi' cannot", "bfloat16", "choose one of"], [x])
    y = np.ones(comm.size, np.int8)   # MPI has no (int8, int) pair type for MINLOC
    raises(comm, lambda: comm.allreduce(y, op="minloc", algorithm="mpi"), ValueError,
           ["allreduce", "algorithm 'mpi' cannot", "int8 with op 'minloc'"], [y])


# -- scan, exscan, reduce_scatter_block -----------------------------------------------------------------------
def test_scan_arguments_the_prefix_cannot_take(comm):
    """avg (no prefix form), an op the dtype does not take, MPI's own on a dtype MPI cannot reduce, a reduce_scatter
    algorithm, a wrong ``out``: raised on every rank, as the call starts, nothing written."""
    import ml_dtypes
    x, bf = x_of((3, 2), "f8", comm.rank), x_of((3,), ml_dtypes.bfloat16, comm.rank)
    out, bad = np.zeros_like(x), np.zeros((2, 2))
    for name in ("scan", "iexscan"):   # both collectives, blocking and not (the four share one path)
        call, where = getattr(comm, name), name.lstrip("i")
        raises(comm, lambda: call(x, op="avg", out=out), ValueError, [f"{where}: op 'avg' has no prefix form"], [x, out])
        raises(comm, lambda: call(x, op="bxor"), ValueError, [f"{where}: op 'bxor' needs an integer dtype", "float64"],
               [x])
        raises(comm, lambda: call(bf, algorithm="mpi"), ValueError, [where, "algorithm 'mpi' cannot", "bfloat16"], [bf])
        raises(comm, lambda: call(x, algorithm="ring"), ValueError,
               [f"{where}: unknown algorithm 'ring'", "recursive_doubling, linear"], [x])
        # exscan's rank 0 checks its out too (though it writes none): the error comes on every rank
        raises(comm, lambda: call(x, out=bad), ValueError, [where, "out has shape (2, 2)", "expected (3, 2)"], [x, bad])


def test_reduce_scatter_block_rows_not_a_multiple_of_the_size(comm):
    if comm.size == 1:
        pytest.skip("every number of rows is a multiple of one rank")
    x, out = x_of((comm.size + 1, 2), seed=comm.rank), np.zeros((1, 2))
    for call in (comm.reduce_scatter_block, comm.ireduce_scatter_block):
        raises(comm, lambda: call(x, out=out), ValueError,
               [f"reduce_scatter_block: x has {comm.size + 1} rows", f"not a multiple of the {comm.size} ranks"], [x, out])
    raises(comm, lambda: comm.reduce_scatter_block(x[:comm.size], algorithm="bruck"), ValueError,
           ["reduce_scatter_block: unknown algorithm 'bruck'", "ring"], [x])


def test_allgather_displacements_checked(comm):
    """Overlapping blocks, displs without counts, of the wrong length or negative, an out too short for them."""
    p = comm.size
    x = x_of((2, 2), seed=comm.rank)
    counts, out = [2] * p, np.zeros((2 * p, 2))
    cases = [([0] * p, ValueError, ["allgather: displs overlap: rank 0's rows [0, 2) and rank 1's rows [0, 2)"]),
             ([2 * i for i in range(p)] + [0], ValueError, [f"displs must have one entry per rank ({p}), got {p + 1}"]),
             ([-1] + [2 * i for i in range(1, p)], ValueError, ["allgather: displs must not be negative"]),
             ([2 * i + 1 for i in range(p)], ValueError, [f"out has shape ({2 * p}, 2), expected ({2 * p + 1}, 2)"])]
    for displs, exc, words in cases[1 if p == 1 else 0:]:   # one rank's block overlaps no other
        raises(comm, lambda: comm.allgather(x, counts=counts, displs=displs, out=out), exc, words, [x, out])
    raises(comm, lambda: comm.iallgather(x, displs=[2 * i for i in range(p)]), ValueError,
           ["allgather: displs needs counts"], [x])


def test_displacements_no_array_could_hold_without_out(comm):
    """Displacements past any array's size, no out: refused naming them, on every rank that passed them, before
    the call (before: NumPy's "array is too big" from inside the call, naming nothing the caller passed)."""
    p = comm.size
    x = x_of((2, 2), seed=comm.rank)
    far = [2**62 + 2 * i for i in range(p)]
    raises(comm, lambda: comm.allgather(x, counts=[2] * p, displs=far), ValueError,
           ["allgather: displs reach row", "more than an array can hold"], [x])
    raises(comm, lambda: comm.alltoall(np.concatenate([x] * p), [2] * p, recv_displs=far), ValueError,
           ["alltoall: recv_displs reach row", "more than an array can hold"], [x])


def test_validation_gather_displacements_no_array_could_hold_at_the_root(vcomm):
    root = vcomm.size - 1
    at_root = vcomm.rank == root
    x = x_of((2,), seed=vcomm.rank)
    words = ["gather: displs reach row", "more than an array can hold"]
    raises(vcomm, lambda: vcomm.gather(x, root=root, counts=[2] * vcomm.size,
                                       displs=[2**62 + 2 * i for i in range(vcomm.size)]),
           ValueError if at_root else pc.CollectiveMismatchError, words if at_root else [f"rank {root} failed"] + words,
           [x])


def test_alltoall_displacements_checked(comm):
    """Received blocks that overlap, a sent block past x's rows, displacements without counts: on every rank."""
    p = comm.size
    x, out = x_of((2 * p, 2), seed=comm.rank), np.zeros((2 * p, 2))
    counts = [2] * p
    if p > 1:
        raises(comm, lambda: comm.alltoall(x, counts, out=out, recv_displs=[0] * p), ValueError,
               ["alltoall: recv_displs overlap: rank 0's rows [0, 2) and rank 1's rows [0, 2)"], [x, out])
    raises(comm, lambda: comm.alltoall(x, counts, out=out, send_displs=[2 * p - 1] * p), ValueError,
           [f"alltoall: send_displs put the 2 rows for rank 0 at row {2 * p - 1}, past x's {2 * p} rows"], [x, out])
    raises(comm, lambda: comm.ialltoall(x, recv_displs=[2 * i for i in range(p)]), ValueError,
           ["alltoall: send_displs and recv_displs need counts"], [x])


# -- out of the wrong shape, dtype or kind ----------------------------------------------------------------------
def test_out_wrong_shape_every_collective(comm):
    """``reduce`` is left out: only the root checks ``out`` (see test_validation_bad_out_at_the_root_only)."""
    size, rank = comm.size, comm.rank
    x = x_of((2 * size, 3), "i4", rank)
    bad = np.zeros((7, 3), np.int32)
    calls = {"reduce_scatter": ((2, 3), lambda: comm.reduce_scatter(x, out=bad)),
             "allgather": ((2 * size * size, 3), lambda: comm.allgather(x, out=bad)),
             "alltoall": ((2 * size, 3), lambda: comm.ialltoall(x, out=bad)),
             "broadcast": ((2 * size, 3), lambda: comm.broadcast(x, out=bad))}
    for name, (want, call) in calls.items():
        raises(comm, call, ValueError, [name, "out has shape (7, 3)", f"expected {want}"], [x, bad])


def test_out_wrong_dtype_every_collective(comm):
    x = x_of((2 * comm.size,), "f4", comm.rank)
    for name, out, call in (
            ("reduce_scatter", np.zeros(2, np.float64), lambda o: comm.reduce_scatter(x, out=o)),
            ("allgather", np.zeros(2 * comm.size ** 2, np.int32), lambda o: comm.allgather(x, out=o)),
            ("alltoall", np.zeros(2 * comm.size, np.float16), lambda o: comm.alltoall(x, out=o)),
            ("broadcast", np.zeros(2 * comm.size, np.complex64), lambda o: comm.broadcast(x, out=o))):
        raises(comm, lambda: call(out), TypeError, [name, f"out has dtype {out.dtype}", "expected float32"], [x, out])


def test_out_not_an_array(comm):
    x = x_of((3,), seed=comm.rank)
    raises(comm, lambda: comm.allreduce(x, out=[0.0, 0.0, 0.0]), TypeError,
           ["allreduce", "out must be a NumPy or CuPy array", "list"], [x])
    raises(comm, lambda: comm.broadcast(x, out=memoryview(bytearray(24))), TypeError,
           ["broadcast", "out must be a NumPy or CuPy array", "memoryview"], [x])


def test_irecv_into_a_strided_out(comm):
    box = np.zeros((4, 6))
    view = box[:, ::2]
    raises(comm, lambda: comm.irecv(view, source=0), ValueError, ["irecv: out must be C-contiguous"], [box])
    raises(comm, lambda: comm.recv(box, source=MPI.ANY_SOURCE), ValueError,
           ["irecv: source must be a rank in", f"got {MPI.ANY_SOURCE} (MPI.ANY_SOURCE, which is not taken"], [box])
    raises(comm, lambda: comm.recv(box, source=0, tag=MPI.ANY_TAG), ValueError,
           ["irecv: tag must be in [0,", "MPI.ANY_TAG is not taken (name the tag)"], [box])


def test_a_message_shorter_than_out_raises_on_the_receiver(comm):
    """Each rank sends 3 float64 to the next; the next receives into 5 (recv, irecv's wait, and irecv's test
    polled): ValueError naming the bytes (MPI takes the shorter message without a word, and out looked whole:
    its last two elements were stale). Watched (PYCOLLECT_TIMEOUT) the same. Then a message that fits is taken."""
    size, rank = comm.size, comm.rank
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    words = ["recv: the message from rank", f"{prv}, tag 5 has 24 bytes, but out (float64(5,)) has 40"]
    with pc.Communicator(comm.mpi, timeout=60) as watched:
        for c, how in ((comm, "recv"), (comm, "wait"), (comm, "test"), (watched, "recv")):
            sent = c.isend(np.arange(3.0), nxt, tag=5)
            out = np.full(5, -1.0)

            def receive(c=c, how=how, out=out):
                if how == "recv":
                    return c.recv(out, prv, tag=5)
                req = c.irecv(out, prv, tag=5)
                if how == "wait":
                    return req.wait()
                while not req.test():
                    pass
                return req.wait()
            raises(comm, receive, ValueError, words)
            sent.wait()
        sent = comm.isend(np.arange(5.0), nxt, tag=6)
        out = np.zeros(5)
        agree(comm, comm.recv(out, prv, tag=6) is out and same(out, np.arange(5.0)), f"a message that fits: {out}")
        sent.wait()


# -- out overlapping the input ---------------------------------------------------------------------------------
# An ``out`` that partly overlaps ``x`` is filled from a temporary (comm._target); the MPI paths
# never receive into memory they send from.
SHIFTS = (1, 2, 3, -1, -2)  # elements between the start of x and the start of out


def _overlap_case(comm, collective, algorithm, shift, seed):
    """``("ran", result correct?)`` or ``("raised", message)`` for ``out`` = x's window moved by ``shift`` elements."""
    size, rank = comm.size, comm.rank
    rows = 2 * size
    n_out = {"reduce_scatter": 2, "allgather": rows * size}.get(collective, rows)
    buf = integer_valued((rows * size + 2 * rows + 8,), np.dtype("i8"), "sum", seed + rank)
    x = buf[4:4 + rows]
    out = buf[4 + shift:4 + shift + n_out]
    xc = x.copy()
    if collective == "allreduce":
        expected, run = mpi_allreduce(comm.mpi, xc, "sum"), lambda: comm.allreduce(x, algorithm=algorithm, out=out)
    elif collective == "reduce_scatter":
        expected = mpi_allreduce(comm.mpi, xc, "sum")[2 * rank:2 * rank + 2]
        run = lambda: comm.reduce_scatter(x, algorithm=algorithm, out=out)  # noqa: E731
    elif collective == "allgather":
        expected, run = mpi_allgather(comm.mpi, xc), lambda: comm.allgather(x, algorithm=algorithm, out=out)
    elif collective == "alltoall":
        expected = mpi_alltoall(comm.mpi, xc, split_even(rows, size))
        run = lambda: comm.alltoall(x, algorithm=algorithm, out=out)  # noqa: E731
    elif collective == "broadcast":
        expected = comm.mpi.bcast(xc, root=size - 1)
        run = lambda: comm.broadcast(x, root=size - 1, algorithm=algorithm, out=out)  # noqa: E731
    else:
        total = mpi_allreduce(comm.mpi, xc, "sum")
        expected = total if rank == size - 1 else None
        run = lambda: comm.reduce(x, root=size - 1, algorithm=algorithm, out=out)  # noqa: E731
    try:
        got = run()
    except ValueError as e:
        return "raised", str(e)
    return "ran", same(None if got is None else np.array(got), expected)


@pytest.mark.parametrize("collective", ["allreduce", "reduce_scatter", "allgather", "alltoall", "broadcast", "reduce"])
def test_out_partly_overlapping_input(comm, collective):
    """An ``out`` sharing part of ``x``'s memory: correct on every rank, or a ValueError naming out on every rank.

    ``out=x`` exactly (in place) is covered in test_collectives.py; the "mpi" paths receive into a
    temporary when ``out`` may share memory with ``x`` (mpi_native._empty). The small-allreduce
    fast path is ``test_out_partly_overlapping_input_fast_allreduce``.
    """
    wrong = []
    for a, algorithm in enumerate(pc.algorithms(collective)):
        if collective == "allreduce" and algorithm in ("auto", "mpi"):
            continue  # the small-message fast path: test_out_partly_overlapping_input_fast_allreduce
        for s, shift in enumerate(SHIFTS):
            outcome, detail = _overlap_case(comm, collective, algorithm, shift, 100 * a + s)
            verdicts = comm.mpi.allgather((outcome, detail))
            every_raised = all(v[0] == "raised" and "out" in v[1] for v in verdicts)
            every_right = all(v == ("ran", True) for v in verdicts)
            if not (every_raised or every_right):
                wrong.append((algorithm, shift, [r for r, v in enumerate(verdicts) if v != ("ran", True)]))
        in_step(comm)   # once per algorithm: the verdicts' allgather already met every rank after each case
    agree(comm, not wrong, f"{collective}: wrong result or not every rank raised, (algorithm, shift, ranks): {wrong}")


@pytest.mark.parametrize("algorithm", ["auto", "mpi"])
def test_out_partly_overlapping_input_fast_allreduce(comm, algorithm):
    for s, shift in enumerate(SHIFTS):
        outcome, detail = _overlap_case(comm, "allreduce", algorithm, shift, s)
        agree(comm, outcome == "ran" and detail is True or outcome == "raised" and "out" in detail,
              f"allreduce {algorithm} shift {shift}: {outcome} {detail}")
        in_step(comm)


# -- arguments that are not arrays ---------------------------------------------------------------------------
@pytest.mark.parametrize("value", [3.0, np.float64(3.0), (1, 2), None, b"abc"], ids=["float", "np-scalar", "tuple",
                                                                                      "none", "bytes"])
def test_not_an_array(comm, value):
    name = type(value).__name__
    for where, call in (("allreduce", lambda: comm.iallreduce(value)),
                        ("reduce_scatter", lambda: comm.reduce_scatter(value)),
                        ("allgather", lambda: comm.allgather(value)),
                        ("alltoall", lambda: comm.alltoall(value)),
                        ("broadcast", lambda: comm.broadcast(value)),
                        ("reduce", lambda: comm.reduce(value)),
                        ("isend", lambda: comm.isend(value, 0))):
        raises(comm, call, TypeError, [f"{where}: x must be a NumPy or CuPy array", name])
    raises(comm, lambda: comm.irecv(value, 0), TypeError, ["irecv: out must be a NumPy or CuPy array", name])


def test_zero_dimensional_where_blocks_are_rows(comm):
    x = np.array(5.0)
    for where, call in (("reduce_scatter", lambda: comm.reduce_scatter(x)),
                        ("allgather", lambda: comm.allgather(x)),
                        ("alltoall", lambda: comm.ialltoall(x))):
        raises(comm, call, ValueError, [where, "x must have at least one dimension"], [x])


# -- NumPy and CuPy mixed ----------------------------------------------------------------------------------------
def test_numpy_and_cupy_mixed(comm):
    try:
        import cupy
        usable = bool(cupy.cuda.is_available())
    except Exception:  # noqa: BLE001 (not installed, or no driver)
        usable = False
    if not all(comm.mpi.allgather(usable)):
        pytest.skip("needs CuPy with a usable CUDA device on every rank")
    xh = x_of((4,), seed=comm.rank)
    xd = cupy.asarray(xh)
    hout, dout = np.zeros(4), cupy.zeros(4)
    raises(comm, lambda: comm.allreduce(xh, out=dout), TypeError,
           ["allreduce", "out is a cupy array but x is a numpy array"], [xh, hout])
    raises(comm, lambda: comm.allreduce(xd, out=hout), TypeError,
           ["allreduce", "out is a numpy array but x is a cupy array"], [xh, hout])
    agree(comm, bool((dout == 0).all()) and bool((xd == cupy.asarray(xh)).all()), "device arrays written")


# -- the environment --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("var", ["PYCOLLECT_ALGO_ALLREDUCE", "PYCOLLECT_ALGO_ALLTOALL"])
def test_env_unknown_algorithm_at_construction(comm, monkeypatch, var):
    monkeypatch.setenv(var, "fastest")
    raises(comm, pc.Communicator, ValueError, [f"{var} must be one of", "got 'fastest'"])


@pytest.mark.parametrize("var", ["PYCOLLECT_SEGMENT_BYTES", "PYCOLLECT_TREE_SEGMENT_BYTES"])
@pytest.mark.parametrize("value, words", [("4M", "must be an integer number of bytes, got '4M'"),
                                          ("-1", "must not be negative, got -1"),
                                          ("", "must be an integer number of bytes, got ''")])
def test_env_bad_byte_count(comm, monkeypatch, var, value, words):
    monkeypatch.setenv(var, value)
    raises(comm, pc.Communicator, ValueError, [f"{var} {words}"])


@pytest.mark.parametrize("value", ["soon", "0", "-5", "nan"])
def test_env_bad_timeout(comm, monkeypatch, value):
    monkeypatch.setenv("PYCOLLECT_TIMEOUT", value)
    raises(comm, pc.Communicator, ValueError, ["PYCOLLECT_TIMEOUT", value])


def test_env_bad_debug(comm, monkeypatch):
    monkeypatch.setenv("PYCOLLECT_DEBUG", "maybe")
    raises(comm, pc.Communicator, ValueError, ["PYCOLLECT_DEBUG", "maybe"])


def test_env_bad_cuda_aware(comm, monkeypatch):
    """Read at the first collective on a device array (NumPy-only programs never read it)."""
    monkeypatch.setenv("PYCOLLECT_CUDA_AWARE", "yes")
    raises(comm, lambda: backend.cuda_aware(MPI), ValueError, ["PYCOLLECT_CUDA_AWARE must be 0 or 1, got 'yes'"])


def test_env_tuning_file_missing(comm, monkeypatch):
    monkeypatch.setenv("PYCOLLECT_TUNING", "/nonexistent/pycollect-tuning.json")
    raises(comm, pc.Communicator, ValueError, ["PYCOLLECT_TUNING", "/nonexistent/pycollect-tuning.json", "cannot be read"])


# -- the communicator ---------------------------------------------------------------------------------------------
def test_not_an_intracommunicator(comm):
    raises(comm, lambda: pc.Communicator(42), TypeError, ["Communicator: comm must be an MPI intracommunicator", "42"])
    raises(comm, lambda: pc.Communicator(MPI.COMM_NULL), TypeError, ["comm is MPI.COMM_NULL", "in no group"])
    raises(comm, lambda: pc.Communicator(comm), TypeError, ["must be an MPI intracommunicator", "Communicator("])
    if comm.size < 2:
        return  # an intercommunicator joins two groups
    colour = comm.rank % 2
    local = comm.mpi.Split(colour, comm.rank)
    inter = local.Create_intercomm(0, comm.mpi, 1 - colour, tag=77)
    try:
        raises(comm, lambda: pc.Communicator(inter), TypeError,
               ["Communicator: comm is an intercommunicator; pass an intracommunicator"])
    finally:
        inter.Free()
        local.Free()


# -- validation mode: the same collective with different arguments on different ranks ------------------------------
@pytest.fixture
def vcomm(comm):
    c = pc.Communicator(validate=True)
    yield c
    c.free()


def mismatch(vcomm, call, field, words, arrays=()):
    """Every rank raises CollectiveMismatchError naming ``field``, the odd rank out and ``words``."""
    if vcomm.size < 2:
        pytest.skip("a mismatch across ranks needs two ranks")
    odd = vcomm.size - 1
    return raises(vcomm, call, pc.CollectiveMismatchError, [field, f"rank {odd}", *words], arrays)


def test_validation_mismatched_shapes(vcomm):
    odd = vcomm.rank == vcomm.size - 1
    x = x_of((5, 3) if odd else (4, 3), seed=vcomm.rank)
    err = mismatch(vcomm, lambda: vcomm.allreduce(x, algorithm="ring"), "shape", ["5, 3", "4, 3", "allreduce"], [x])
    agree(vcomm, isinstance(err, ValueError), "CollectiveMismatchError is a ValueError")


def test_validation_mismatched_dtypes(vcomm):
    odd = vcomm.rank == vcomm.size - 1
    x = x_of((6,), "f4" if odd else "f8", vcomm.rank)
    mismatch(vcomm, lambda: vcomm.allreduce(x), "dtype", ["float32", "float64"], [x])


def test_validation_mismatched_ops(vcomm):
    odd = vcomm.rank == vcomm.size - 1
    x = x_of((6,), seed=vcomm.rank)
    mismatch(vcomm, lambda: vcomm.allreduce(x, op="max" if odd else "sum"), "op", ["max", "sum"], [x])


def test_validation_tells_user_ops_of_one_name_apart(vcomm):
    """Two lambdas (or two functions of one name) with other bodies: compared by their compiled code, not their
    name alone (before 2026-12-04 every rank returned, with results that differed between ranks); the same body
    passes, on every algorithm's path."""
    odd = vcomm.rank == vcomm.size - 1
    x = x_of((6,), seed=vcomm.rank)
    added = pc.Op(lambda a, b, out: np.add(a, b, out=out), commute=True)
    larger = pc.Op(lambda a, b, out: np.maximum(a, b, out=out), commute=True)
    for algorithm in ("mpi", "ring"):
        mismatch(vcomm, lambda: vcomm.allreduce(x, op=larger if odd else added, algorithm=algorithm), "op",
                 ["<lambda>", "code"], [x])
    with verdicts(vcomm) as check:
        same_body = pc.Op(lambda a, b, out: np.add(a, b, out=out), commute=True)
        got = vcomm.allreduce(x, op=same_body if odd else added, algorithm="ring")
        check(same(got, vcomm.allreduce(x)), "the same body on every rank")


def test_validation_mismatched_roots(vcomm):
    odd = vcomm.rank == vcomm.size - 1
    x = x_of((6,), seed=vcomm.rank)
    out = np.zeros(6)
    mismatch(vcomm, lambda: vcomm.broadcast(x, root=vcomm.size - 1 if odd else 0, out=out), "root", [], [x, out])


def test_validation_mismatched_counts(vcomm):
    odd = vcomm.rank == vcomm.size - 1
    n = 2 * vcomm.size
    counts = [2] * vcomm.size
    if odd:
        counts[0], counts[-1] = 3, 1
    x = x_of((n, 2), seed=vcomm.rank)
    mismatch(vcomm, lambda: vcomm.reduce_scatter(x, counts=counts), "counts", ["reduce_scatter"], [x])


def test_validation_mismatched_algorithms(vcomm):
    odd = vcomm.rank == vcomm.size - 1
    x = x_of((100,), seed=vcomm.rank)
    mismatch(vcomm, lambda: vcomm.allreduce(x, algorithm="tree" if odd else "recursive_doubling"), "algorithm",
             ["tree", "recursive_doubling"], [x])


def test_validation_reduce_scatter_block_rows_on_one_rank(vcomm):
    """One rank's rows not a multiple of the size: its own error there, the same error named on every other rank."""
    if vcomm.size == 1:
        pytest.skip("a mismatch across ranks needs two ranks")
    odd = vcomm.rank == vcomm.size - 1
    x = x_of((vcomm.size + 1 if odd else 2 * vcomm.size, 2), seed=vcomm.rank)
    raises(vcomm, lambda: vcomm.reduce_scatter_block(x, algorithm="ring"), ValueError,
           ["reduce_scatter_block", f"x has {vcomm.size + 1} rows", "not a multiple of the"], [x])


def test_validation_from_environment(comm, monkeypatch):
    """``PYCOLLECT_DEBUG=1`` turns validation on without the keyword."""
    monkeypatch.setenv("PYCOLLECT_DEBUG", "1")
    c = pc.Communicator()
    try:  # ops that differ: without validation MPI returns a silently wrong sum, it neither aborts nor hangs
        odd = c.rank == c.size - 1
        x = x_of((6,), "i8", c.rank)
        mismatch(c, lambda: c.allreduce(x, op="min" if odd else "sum"), "op", ["min", "sum"], [x])
    finally:
        c.free()


def test_validation_local_error_raises_on_every_rank(vcomm):
    """A bad root on rank 0 alone: without validation the others would wait in the broadcast.

    Rank 0 raises its own ValueError; the others a CollectiveMismatchError that quotes it.
    """
    first = vcomm.rank == 0
    x = x_of((6,), seed=vcomm.rank)
    words = ["broadcast: root must be a rank in", repr(vcomm.size)]
    raises(vcomm, lambda: vcomm.broadcast(x, root=vcomm.size if first else 0),
           ValueError if first else pc.CollectiveMismatchError, words if first else ["rank 0 failed"] + words, [x])


def test_validation_bad_out_at_the_root_only(vcomm):
    """``reduce`` checks ``out`` on the root alone; validation turns the root's error into every rank's."""
    root = vcomm.size - 1
    at_root = vcomm.rank == root
    x = x_of((6,), seed=vcomm.rank)
    out = np.zeros(7) if at_root else None
    words = ["reduce: out has shape (7,), expected (6,)"]
    raises(vcomm, lambda: vcomm.reduce(x, root=root, out=out),
           ValueError if at_root else pc.CollectiveMismatchError,
           words if at_root else [f"rank {root} failed"] + words, [x] + ([out] if at_root else []))


def test_validation_gather_bad_out_at_the_root_only(vcomm):
    """``gather`` with counts checks ``out`` on the root alone; validation makes the root's error every rank's."""
    root = vcomm.size - 1
    at_root = vcomm.rank == root
    x = x_of((2,), seed=vcomm.rank)
    out = np.zeros(2 * vcomm.size + 1) if at_root else None
    words = [f"gather: out has shape ({2 * vcomm.size + 1},), expected ({2 * vcomm.size},)"]
    raises(vcomm, lambda: vcomm.gather(x, root=root, out=out, counts=[2] * vcomm.size),
           ValueError if at_root else pc.CollectiveMismatchError,
           words if at_root else [f"rank {root} failed"] + words, [x] + ([out] if at_root else []))

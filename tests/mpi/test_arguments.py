"""The argument layer (engine/args.py) and the settings agreed at construction (settings.py).

Each test passes a bad argument on every rank (or a setting on some ranks only) and checks, on
every rank: the exception type, that the message names the argument, that nothing was written
into the caller's arrays, and that the ranks are still in step (helpers.raises).
"""
import os

import ml_dtypes
import numpy as np
import pytest
from mpi4py import MPI

import pycollect as pc
from helpers import agree, integer_valued, raises, same
from pycollect.engine.topology import Topology

WORLD = MPI.COMM_WORLD.Get_size()
TAG_UB = MPI.COMM_WORLD.Get_attr(MPI.TAG_UB)
ALGORITHMS = {c: [a for a in pc.algorithms(c) if a != "auto"]
              for c in ("allreduce", "reduce_scatter", "allgather", "alltoall", "broadcast", "reduce")}


def x_of(shape, dtype="f8", seed=0):
    return integer_valued(shape, np.dtype(dtype), "sum", seed)


def read_only(a):
    a.flags.writeable = False
    return a


# -- (3) a read-only out is refused before anything is sent ---------------------------------------------------
def calls_with_out(comm, x, algorithm):
    """Each collective with a read-only ``out`` of the right shape and dtype."""
    p, n = comm.size, x.shape[0]

    def out(rows):
        return read_only(np.zeros(rows, x.dtype))
    return {"allreduce": lambda: comm.allreduce(x, algorithm=algorithm, out=out(n)),
            "iallreduce": lambda: comm.iallreduce(x, algorithm=algorithm, out=out(n)).wait(),
            "reduce_scatter": lambda: comm.reduce_scatter(x, algorithm=algorithm, out=out(n // p)),
            "allgather": lambda: comm.allgather(x, algorithm=algorithm, out=out(p * n)),
            "alltoall": lambda: comm.alltoall(x, algorithm=algorithm, out=out(n)),
            "broadcast": lambda: comm.broadcast(x, algorithm=algorithm, out=out(n)),
            "reduce": lambda: comm.reduce(x, root=0, algorithm=algorithm, out=out(n) if comm.rank == 0 else None)}


@pytest.mark.parametrize("collective", ["allreduce", "iallreduce", "reduce_scatter", "allgather", "alltoall",
                                        "broadcast", "reduce"])
def test_read_only_out_is_refused_by_every_algorithm(comm, collective):
    base = collective[1:] if collective.startswith("i") else collective
    x = x_of((2 * comm.size,), seed=comm.rank)
    for algorithm in ALGORITHMS[base]:
        if base == "reduce":   # out is ignored off the root: only validation mode lets the others know
            checked = pc.Communicator(comm.mpi, validate=True)
            try:
                raises(comm, calls_with_out(checked, x, algorithm)[collective], ValueError,
                       ["reduce: out is read-only"], [x])
            finally:
                checked.free()
            continue
        raises(comm, calls_with_out(comm, x, algorithm)[collective], ValueError, [f"{base}: out is read-only"], [x])


def test_read_only_x_in_place_and_irecv(comm):
    x = read_only(x_of((5,), seed=comm.rank))
    for algorithm in ALGORITHMS["allreduce"]:
        raises(comm, lambda: comm.allreduce(x, algorithm=algorithm, out=x), ValueError, ["out is read-only"], [x])
    box = read_only(np.zeros(3))
    raises(comm, lambda: comm.irecv(box, source=0), ValueError, ["irecv: out is read-only"], [box])
    got = comm.allreduce(x)   # a read-only x with a new result is fine
    agree(comm, got.flags.writeable, "the result of a read-only x is writable")


def test_read_only_out_on_one_rank_with_validation_raises_everywhere(comm):
    if comm.size < 2:
        pytest.skip("needs two ranks")
    checked = pc.Communicator(comm.mpi, validate=True)
    try:
        x = x_of((4,), seed=comm.rank)
        out = np.zeros(4)
        if comm.rank == 1:
            read_only(out)
        err = raises(checked, lambda: checked.allreduce(x, algorithm="ring", out=out),
                     ValueError, ["out is read-only"], [x, out])
        agree(comm, isinstance(err, pc.CollectiveMismatchError) == (comm.rank != 1), "who raises what")
    finally:
        checked.free()


# -- (7) bad inputs that get a clear error naming the argument ----------------------------------------------------
def test_object_dtype_is_refused_by_every_collective(comm):
    x = np.array([1, "a", None] * comm.size, dtype=object)
    for name, call in {"allreduce": lambda: comm.allreduce(x), "allgather": lambda: comm.allgather(x),
                       "alltoall": lambda: comm.alltoall(x), "broadcast": lambda: comm.broadcast(x),
                       "reduce_scatter": lambda: comm.reduce_scatter(x), "reduce": lambda: comm.reduce(x),
                       "isend": lambda: comm.isend(x, dest=comm.rank)}.items():
        err = raises(comm, call, TypeError, [f"{name}: x has dtype object", "references to Python objects"], [x])
        agree(comm, "choose one of" not in str(err), "no algorithm is suggested for object arrays")


def test_mpi_algorithm_error_does_not_suggest_moving_what_cannot_move(comm):
    x = np.ones(3, ml_dtypes.bfloat16)
    err = raises(comm, lambda: comm.allgather(x, algorithm="mpi"), ValueError,
                 ["allgather: algorithm 'mpi' cannot move dtype bfloat16", "choose one of ring"], [x])
    agree(comm, "reduce" not in str(err), "allgather does not reduce")


@pytest.mark.parametrize("bad", [["sum"], ("sum",), {"op": "sum"}, np.sum, 3])   # np.sum: not a ufunc, nor an Op
def test_op_that_is_not_a_name(comm, bad):
    x = x_of((4,), seed=comm.rank)
    for name, call in {"allreduce": lambda: comm.allreduce(x, op=bad),
                       "iallreduce": lambda: comm.iallreduce(x, op=bad, algorithm="ring"),
                       "reduce_scatter": lambda: comm.reduce_scatter(x, op=bad),
                       "reduce": lambda: comm.reduce(x, op=bad)}.items():
        raises(comm, call, ValueError, [f"{name.lstrip('i') if name == 'iallreduce' else name}: unknown op",
                                        "expected one of sum"], [x])


@pytest.mark.parametrize("bad", [["ring"], ("mpi",), {"ring"}, None, 1])
def test_algorithm_that_is_not_a_name(comm, bad):
    x = x_of((2 * comm.size,), seed=comm.rank)
    for name in ALGORITHMS:
        call = {"allreduce": lambda: comm.allreduce(x, algorithm=bad),
                "reduce_scatter": lambda: comm.reduce_scatter(x, algorithm=bad),
                "allgather": lambda: comm.allgather(x, algorithm=bad),
                "alltoall": lambda: comm.alltoall(x, algorithm=bad),
                "broadcast": lambda: comm.broadcast(x, algorithm=bad),
                "reduce": lambda: comm.reduce(x, algorithm=bad)}[name]
        raises(comm, call, ValueError, [f"{name}: unknown algorithm", "expected one of auto"], [x])


@pytest.mark.parametrize("kind", ["string", "fractions", "integral floats", "bools"])
def test_counts_that_are_not_integers_are_never_rounded(comm, kind):
    p = comm.size
    x = x_of((2 * p,), seed=comm.rank)
    counts = {"string": "2" * p, "fractions": [2.7] + [2.0] * (p - 2) + [1.3] if p > 1 else [2.7],
              "integral floats": [2.0] * p, "bools": [True] * p}[kind]
    words = ["counts must", "integers"]
    raises(comm, lambda: comm.reduce_scatter(x, counts=counts), TypeError, ["reduce_scatter:"] + words, [x])
    raises(comm, lambda: comm.alltoall(x, counts=counts), TypeError, ["alltoall:"] + words, [x])
    raises(comm, lambda: comm.allgather(x, counts=counts), TypeError, ["allgather:"] + words, [x])
    matrix = [[2.5] * p] * p
    raises(comm, lambda: comm.alltoall(x, counts=matrix), TypeError, ["alltoall: counts must hold integers"], [x])


def test_numpy_integer_counts_are_integers(comm):
    p = comm.size
    x = x_of((2 * p,), seed=comm.rank)
    got = comm.reduce_scatter(x, counts=np.full(p, 2, np.int32))
    expected = comm.reduce_scatter(x, counts=[2] * p)
    agree(comm, same(got, expected), "NumPy integer counts")


@pytest.mark.parametrize("tag, exc", [(-1, ValueError), (TAG_UB + 1, ValueError), (2 ** 40, ValueError),
                                      (1.0, TypeError), ("3", TypeError), (True, TypeError)])
def test_tags_out_of_range_or_not_integers(comm, tag, exc):
    x = x_of((3,), seed=comm.rank)
    box = np.zeros(3)
    peer = (comm.rank + 1) % comm.size
    for name, call in {"isend": lambda: comm.isend(x, peer, tag=tag), "send": lambda: comm.send(x, peer, tag=tag),
                       "irecv": lambda: comm.irecv(box, peer, tag=tag), "recv": lambda: comm.recv(box, peer, tag=tag)
                       }.items():
        where = "isend" if name == "send" else "irecv" if name == "recv" else name
        raises(comm, call, exc, [f"{where}: tag must"] + ([f"[0, {TAG_UB}]"] if exc is ValueError else []), [x, box])


def test_roots_and_peers_that_are_bools(comm):
    x = x_of((3,), seed=comm.rank)
    raises(comm, lambda: comm.broadcast(x, root=False), ValueError, ["broadcast: root must be a rank"], [x])
    raises(comm, lambda: comm.isend(x, dest=True), ValueError, ["isend: dest must be a rank"], [x])


def test_byte_order_is_moved_and_named(comm):
    """Big-endian data moves and reduces right when every rank passes it; validation names a rank that differs."""
    x = x_of((6,), seed=comm.rank)
    swapped = x.astype(x.dtype.newbyteorder(">"))
    for algorithm in ALGORITHMS["allreduce"]:
        if algorithm == "mpi":
            raises(comm, lambda: comm.allreduce(swapped, algorithm="mpi"), ValueError,
                   ["algorithm 'mpi' cannot reduce dtype >f8"], [swapped])
            continue
        agree(comm, same(comm.allreduce(swapped, algorithm=algorithm).astype("f8"), comm.allreduce(x)), algorithm)
    if comm.size < 2:
        return
    checked = pc.Communicator(comm.mpi, validate=True)
    try:
        mine = swapped if comm.rank == 1 else x
        raises(checked, lambda: checked.allreduce(mine, algorithm="ring"), pc.CollectiveMismatchError,
               ["passed dtype", "rank 1 passed", "float64 (big-endian)"], [mine])
    finally:
        checked.free()


# -- (7) settings: checked as arguments and as variables, with the setting named ------------------------------------
@pytest.mark.parametrize("kw, exc, words", [
    ({"segment_bytes": -1}, ValueError, ["Communicator: segment_bytes", ">= 0", "-1"]),
    ({"segment_bytes": "4M"}, TypeError, ["Communicator: segment_bytes", "integer number of bytes", "'4M'"]),
    ({"tree_segment_bytes": 2.5}, TypeError, ["Communicator: tree_segment_bytes", "2.5"]),
    ({"validate": "0"}, TypeError, ["Communicator: validate must be True or False", "'0'"]),
    ({"abort_on_timeout": "yes"}, TypeError, ["Communicator: abort_on_timeout must be True or False"]),
    ({"timeout": True}, ValueError, ["Communicator: timeout must be a number of seconds"]),
    ({"tuning": 3}, TypeError, ["Communicator: tuning must be a path", "int 3"]),
    ({"topology": [0, 0]}, TypeError, ["Communicator: topology must be a pycollect Topology"]),
], ids=["segment-negative", "segment-text", "pipeline-float", "validate-text", "abort-text", "timeout-bool",
        "tuning-int", "topology-list"])
def test_bad_settings_as_arguments(comm, kw, exc, words):
    raises(comm, lambda: pc.Communicator(comm.mpi, **kw), exc, words)


def test_tuning_as_a_file_descriptor_is_not_closed(comm):
    r, w = os.pipe()
    try:
        raises(comm, lambda: pc.Communicator(comm.mpi, tuning=r), TypeError, ["tuning must be a path"])
        os.fstat(r)   # still open
    finally:
        os.close(r)
        os.close(w)


@pytest.mark.parametrize("content, words", [
    (b"", ["is empty"]),
    (b"   \n", ["is empty"]),
    (b'{"allreduce": [[1024, "ring"]', ["is not valid JSON", "line 1"]),
    (b"\xff\xfe{}", ["is not UTF-8 text"]),
    (b"[1, 2]", ["expected a JSON object"]),
], ids=["empty", "blank", "truncated", "not-utf8", "a-list"])
@pytest.mark.parametrize("source", ["argument", "environment"])
def test_malformed_tuning_files_name_the_file_and_the_setting(comm, tmp_path, monkeypatch, content, words, source):
    path = tmp_path / f"tuning-{comm.rank}.json"
    path.write_bytes(content)
    if source == "argument":
        raises(comm, lambda: pc.Communicator(comm.mpi, tuning=str(path)), ValueError,
               ["Communicator: tuning: tuning file", str(path)] + words)
    else:
        monkeypatch.setenv("PYCOLLECT_TUNING", str(path))
        raises(comm, lambda: pc.Communicator(comm.mpi), ValueError, ["PYCOLLECT_TUNING: tuning file", str(path)] + words)


# -- (2) settings that differ between ranks, or a bad one on some ranks -----------------------------------------
def _differing(comm, tmp_path):
    """(keyword arguments for this rank, the setting named, the words of the message) for each case."""
    odd = comm.rank == comm.size - 1
    table = tmp_path / f"tuning-{comm.rank}.json"
    table.write_text('{"allreduce": [[null, "ring"]]}' if odd else '{"allreduce": [[null, "mpi"]]}')
    two_nodes = Topology.uniform(comm.size, max(1, comm.size // 2))
    last = f"rank {comm.size - 1}"
    return {
        "validate": ({"validate": odd}, ["validate differs", f"{last} has on"]),
        "timeout": ({"timeout": 30.0 if odd else None}, ["timeout differs", f"{last} has 30 s", "none"]),
        "timeout value": ({"timeout": 30.0 if odd else 60.0}, ["timeout differs", "30 s", "60 s"]),
        "abort": ({"abort_on_timeout": not odd}, ["abort_on_timeout differs", f"{last} has off"]),
        "segment": ({"segment_bytes": 1024 if odd else None}, ["segment_bytes differs", f"{last} has 1024", "4194304"]),
        "tree_segment": ({"tree_segment_bytes": 0 if odd else 4096}, ["tree_segment_bytes differs", f"{last} has 0"]),
        "tuning": ({"tuning": str(table)}, ["tuning differs", f"{last} has tuning", "PYCOLLECT_TUNING"]),
        "topology": ({"topology": two_nodes if odd else Topology.single_node(comm.size)},
                     ["topology differs", f"{last} has topology"]),
    }


@pytest.mark.parametrize("case", ["validate", "timeout", "timeout value", "abort", "segment", "tree_segment", "tuning",
                                  "topology"])
def test_settings_that_differ_between_ranks_raise_on_every_rank(comm, tmp_path, case):
    if comm.size < 2:
        pytest.skip("needs two ranks")
    kw, words = _differing(comm, tmp_path)[case]
    raises(comm, lambda: pc.Communicator(comm.mpi, **kw), ValueError,
           ["Communicator: every rank must use the same settings"] + words)


@pytest.mark.parametrize("var, value, words", [
    ("PYCOLLECT_TIMEOUT", "soon", ["PYCOLLECT_TIMEOUT must be a number of seconds", "'soon'"]),
    ("PYCOLLECT_DEBUG", "0 ", ["PYCOLLECT_DEBUG must be 0"]),
    ("PYCOLLECT_SEGMENT_BYTES", "4M", ["PYCOLLECT_SEGMENT_BYTES must be an integer number of bytes"]),
])
def test_a_bad_setting_on_one_rank_raises_on_every_rank(comm, monkeypatch, var, value, words):
    if comm.size < 2:
        pytest.skip("needs two ranks")
    if comm.rank == 1:
        monkeypatch.setenv(var, value)
    err = raises(comm, lambda: pc.Communicator(comm.mpi), ValueError, words)
    agree(comm, ("rank 1 failed its settings checks" in str(err)) == (comm.rank != 1), f"who raises what: {err}")


def test_the_same_settings_build_and_agree(comm, tmp_path):
    path = tmp_path / f"tuning-{comm.rank}.json"   # each rank its own file, the same table
    path.write_text('{"allreduce": [[null, "ring"]]}')
    c = pc.Communicator(comm.mpi, tuning=str(path), segment_bytes=1 << 12, tree_segment_bytes=0, validate=True,
                        timeout=60, abort_on_timeout=False, topology=Topology.single_node(comm.size))
    try:
        agree(comm, c.auto_algorithm("allreduce", 8) == "ring" and c.segment_bytes == 4096, "settings kept")
        x = x_of((9,), seed=comm.rank)
        agree(comm, same(c.allreduce(x), comm.allreduce(x, algorithm="mpi")), "a call on the agreed settings")
    finally:
        c.free()


def test_out_rows_known_only_after_the_exchange_raise_on_every_rank(comm):
    """Without validation: a wrong out on one rank travels with the counts, so no rank moves on alone."""
    if comm.size < 2:
        pytest.skip("needs two ranks")
    p = comm.size
    x = x_of((2, 3), seed=comm.rank)
    rows = 2 * p + (1 if comm.rank == 1 else 0)
    out = np.zeros((rows, 3))
    err = raises(comm, lambda: comm.allgather(x, out=out), ValueError,
                 ["allgather", f"out has shape ({2 * p + 1}, 3), expected ({2 * p}, 3)"], [x, out])
    agree(comm, isinstance(err, pc.CollectiveMismatchError) == (comm.rank != 1), f"who raises what: {err!r}")
    counts = [2] + [0] * (p - 1)          # every rank sends its 2 rows to rank 0
    out = np.zeros((2 * p if comm.rank == 0 else 1, 3))
    err = raises(comm, lambda: comm.alltoall(x, counts=counts, out=out), ValueError,
                 ["alltoall", "out has shape (1, 3), expected (0, 3)"], [x, out])
    agree(comm, isinstance(err, pc.CollectiveMismatchError) == (comm.rank == 0), f"who raises what: {err!r}")


def test_ops_as_mpi4py_users_write_them(comm):
    """MPI.SUM and "SUM" reduce as "sum" does, in every reducing collective; MPI's ops pycollect lacks are refused."""
    x = np.arange(4.0 * comm.size) + comm.rank
    ok = True
    for op, name in ((MPI.SUM, "sum"), ("SUM", "sum"), (MPI.MAX, "max"), ("Max", "max"), (MPI.BXOR, "bxor")):
        y = x.astype(np.int64) if name == "bxor" else x
        for algorithm in ("mpi", "ring"):
            ok &= same(comm.allreduce(y, op=op, algorithm=algorithm), comm.allreduce(y, op=name))
            ok &= same(comm.reduce_scatter(y, op=op, algorithm=algorithm),
                       comm.reduce_scatter(y, op=name, algorithm=algorithm))
        got = comm.reduce(y, op=op, root=0)
        ok &= comm.rank != 0 or same(got, comm.reduce(y, op=name, root=0))
        if comm.rank != 0:
            comm.reduce(y, op=name, root=0)
    agree(comm, ok, "ops written as MPI.SUM and 'SUM'")
    raises(comm, lambda: comm.allreduce(x, op=MPI.REPLACE), ValueError, ["allreduce: unknown op", "MPI's SUM"], [x])

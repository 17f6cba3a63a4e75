"""The Communicator beyond the grid: non-blocking calls in flight together, point to point, topology,
selection overrides, and argument errors."""
import gc
import json
import os
import signal
import time
import warnings
import weakref

import numpy as np
import pytest
from mpi4py import MPI

import pycollect as pc
from helpers import (LATE_NOTICE, agree, drive_progress, integer_valued, mpi_allgather, mpi_allreduce, mpi_alltoall,
                     same, short_deadline, tell_the_late_rank, verdicts, wait_for_the_others)
from pycollect.engine.layout import split_even
from pycollect.select import Selector


def test_nonblocking_calls_in_flight_together(comm):
    """Several i* collectives started before any is waited on, tested round-robin, all correct."""
    xs = [integer_valued((50 + 7 * i,), np.dtype("i8"), "sum", 100 * i + comm.rank) for i in range(4)]
    expected = [mpi_allreduce(comm.mpi, x, "sum") for x in xs]
    rs_in = integer_valued((3 * comm.size + 1, 2), np.dtype("f8"), "sum", comm.rank)
    ag_in = integer_valued((comm.rank + 1, 2), np.dtype("i4"), "sum", comm.rank)
    a2a_in = integer_valued((2 * comm.size,), np.dtype("i2"), "sum", comm.rank)
    rs_expected = mpi_allreduce(comm.mpi, rs_in, "sum")
    start = sum(split_even(rs_in.shape[0], comm.size)[:comm.rank])
    rs_expected = rs_expected[start:start + split_even(rs_in.shape[0], comm.size)[comm.rank]]
    reqs = [comm.iallreduce(x, algorithm=a) for x, a in zip(xs, ["ring", "recursive_doubling", "tree", "mpi"])]
    reqs.append(comm.ireduce_scatter(rs_in, algorithm="pairwise"))
    reqs.append(comm.iallgather(ag_in, algorithm="bruck"))
    reqs.append(comm.ialltoall(a2a_in, algorithm="bruck"))
    while not all([r.test() for r in reqs]):
        pass
    results = pc.wait_all(reqs)
    ok = all(same(g, e) for g, e in zip(results[:4], expected))
    ok = ok and same(results[4], rs_expected) and same(results[5], mpi_allgather(comm.mpi, ag_in))
    ok = ok and same(results[6], mpi_alltoall(comm.mpi, a2a_in, split_even(a2a_in.size, comm.size)))
    agree(comm, ok, "non-blocking collectives in flight together")


@pytest.mark.parametrize("blocking_between", [False, True])
def test_requests_waited_in_other_orders_on_other_ranks(comm, blocking_between):
    """Schedule calls in flight on two Communicators, and calls whose rows are exchanged first (MPI's own and a
    schedule), each rank waiting for them in an order of its own (legal in MPI, which moves every call in flight in
    any of its waits), and with ``blocking_between`` the even ranks making a blocking schedule call before their waits
    while the odd ranks make it after theirs: right results, no hang. Each wait starts the process's deferred calls
    whose exchange ended and moves its other schedule calls on (executor.move_others); before 2026-12-05 a rank
    waiting on one call never posted the next round of another, nor started a deferred one, which its peer was
    waiting for, and the job hung."""
    c2 = pc.Communicator(comm.mpi)
    r, p = comm.rank, comm.size
    xs = [integer_valued((37 + 5 * i,), np.dtype("f8"), "sum", 10 * i + r) for i in range(3)]
    rs_in = integer_valued((2 * p + 1, 2), np.dtype("i8"), "sum", r)
    ag_in = integer_valued((2, 3), np.dtype("i4"), "sum", r)
    a2a_in = integer_valued((3 * p,), np.dtype("i2"), "sum", r)
    uneven = integer_valued((r + 1, 2), np.dtype("i4"), "sum", 5 + r)   # rows exchanged first: deferred calls
    rows = split_even(rs_in.shape[0], p)
    expected = [mpi_allreduce(comm.mpi, xs[0], "sum"), mpi_allreduce(comm.mpi, xs[1], "sum"),
                mpi_allgather(comm.mpi, ag_in), mpi_alltoall(comm.mpi, a2a_in, [3] * p),
                mpi_allreduce(comm.mpi, rs_in, "sum")[sum(rows[:r]):sum(rows[:r + 1])],
                mpi_allreduce(comm.mpi, xs[2], "sum"), mpi_allgather(comm.mpi, uneven), mpi_allgather(comm.mpi, uneven)]
    reqs = [comm.iallreduce(xs[0], algorithm="ring"), c2.iallreduce(xs[1], algorithm="tree"),
            comm.iallgather(ag_in, algorithm="ring", counts=[2] * p), comm.ialltoall(a2a_in, algorithm="bruck"),
            c2.ireduce_scatter(rs_in, algorithm="pairwise"), comm.iallreduce(xs[2], algorithm="recursive_doubling"),
            comm.iallgather(uneven, algorithm="mpi"), c2.iallgather(uneven, algorithm="ring")]
    between = None
    if blocking_between and r % 2 == 0:
        between = comm.allreduce(xs[1], algorithm="ring")
    order = list(range(len(reqs)))
    order = order[::-1] if r % 2 else order[r % len(order):] + order[:r % len(order)]
    got: list = [None] * len(reqs)
    for i in order:
        got[i] = reqs[i].wait()
    if blocking_between and r % 2:
        between = comm.allreduce(xs[1], algorithm="ring")
    with verdicts(comm) as check:
        for i, (g, e) in enumerate(zip(got, expected)):
            check(same(g, e), f"call {i} (waited {order.index(i) + 1}th)")
        check(not blocking_between or same(between, expected[1]), "the blocking call between")
        check(comm.in_flight() == 0 and c2.in_flight() == 0, f"in flight: {comm.in_flight()}, {c2.in_flight()}")
    c2.free()


def test_blocking_exchanges_beside_another_communicators_call_in_flight(comm):
    """A schedule call in flight on one Communicator while the even ranks make blocking calls on another first (the
    allreduce's recursive doubling, the ring reduce-scatter and allgather: at two ranks their one round is a blocking
    MPI_Sendrecv, engine/lean_exchange.py) and the odd ranks wait for the call first: right results, no hang. With a
    call in flight that other waits move on, the exchanges leave the round to the executor, whose wait moves it
    (Communicator._alone); before 2026-12-05 the Sendrecv sat in MPI and the peer waited for the ring's next round
    (found by a helper's fuzzing)."""
    c2 = pc.Communicator(comm.mpi)
    r, p = comm.rank, comm.size
    big = integer_valued((6000,), np.dtype("f8"), "sum", r)
    x = integer_valued((2 * p, 3), np.dtype("i8"), "sum", 7 + r)
    rows = split_even(2 * p, p)
    expected = [mpi_allreduce(comm.mpi, big, "sum"), mpi_allreduce(comm.mpi, x, "sum"),
                mpi_allreduce(comm.mpi, x, "sum")[sum(rows[:r]):sum(rows[:r + 1])], mpi_allgather(comm.mpi, x)]

    def blocking_calls():
        return [comm.allreduce(x, algorithm="recursive_doubling"), comm.reduce_scatter(x, algorithm="ring"),
                comm.allgather(x, algorithm="ring", counts=[2 * p] * p)]
    request = c2.iallreduce(big, algorithm="ring")
    if r % 2 == 0:
        got = blocking_calls()
        got.insert(0, request.wait())
    else:
        got = [request.wait()] + blocking_calls()
    with verdicts(comm) as check:
        for i, (g, e) in enumerate(zip(got, expected)):
            check(same(g, e), f"call {i}")
    c2.free()


def test_mpi_own_nonblocking_calls_keep_their_copies_of_a_strided_input(comm):
    """A strided input goes to MPI's non-blocking call as a contiguous copy, which MPI reads until the call completes:
    the Request holds it (mpi4py holds no buffer of a non-blocking collective). Freed as the call returned, its
    memory went to the next arrays, and ireduce_scatter gave every element wrong at 2 ranks, no error."""
    total = 1 << 19                      # 4 MiB of float64: a copy that size is its own mapping, reused once freed

    def strided(v):
        return np.repeat(v, 2)[::2]
    x = integer_valued((total,), np.dtype("f8"), "sum", comm.rank)
    counts = split_even(total, comm.size)
    start = sum(counts[:comm.rank])
    summed = mpi_allreduce(comm.mpi, x, "sum")
    calls = {"ireduce_scatter": (lambda: comm.ireduce_scatter(strided(x), algorithm="mpi"),
                                 summed[start:start + counts[comm.rank]]),
             "iallreduce": (lambda: comm.iallreduce(strided(x), algorithm="mpi"), summed),
             "ialltoall": (lambda: comm.ialltoall(strided(x), algorithm="mpi"), mpi_alltoall(comm.mpi, x, counts)),
             "iallgather": (lambda: comm.iallgather(strided(x[:total // comm.size]), algorithm="mpi"),
                            mpi_allgather(comm.mpi, x[:total // comm.size])),
             "iscan": (lambda: comm.iscan(strided(x), algorithm="mpi"), None)}
    with verdicts(comm) as check:
        for name, (start_call, expected) in calls.items():
            request = start_call()
            gc.collect()
            reuse = [np.full(total, -1.0) for _ in range(4)]   # takes the freed memory, if it was freed
            got = request.wait()
            del reuse
            check(expected is None or same(got, expected), f"{name}: the result read a freed copy")


def test_nonblocking_calls_return_before_the_other_ranks_start(comm):
    """iallreduce (accumulate too), ibroadcast and ireduce return at once: rank 0 starts them all, then tells
    the others to start theirs (a start that blocked would wait for ranks that wait for it), and every result
    is right."""
    p = comm.size
    half = np.full(5, 1 + comm.rank, np.float16)
    x = np.arange(6.0) + comm.rank

    def start():
        return [comm.iallreduce(half, accumulate="float32", algorithm="ring"),
                comm.iallreduce(half, accumulate="float32", algorithm="mpi", out=np.empty_like(half)),
                comm.ibroadcast(x, root=p - 1, algorithm="binomial"), comm.ibroadcast(x, root=0, algorithm="mpi"),
                comm.ireduce(x, root=0, algorithm="binomial"), comm.ireduce(x, root=p - 1, op="max", algorithm="mpi")]
    go = np.zeros(1, np.int64)
    if comm.rank == 0:
        reqs = start()
        for r in range(1, p):
            comm.mpi.Send(go, r, tag=3)
    else:
        comm.mpi.Recv(go, 0, tag=3)
        reqs = start()
    got = pc.wait_all(reqs)
    total = np.full(5, p * (p + 1) // 2, np.float16)
    ok = same(got[0], total) and same(got[1], total) and got[1].dtype == np.float16
    ok = ok and same(got[2], np.arange(6.0) + p - 1) and same(got[3], np.arange(6.0))
    ok = ok and (same(got[4], p * np.arange(6.0) + p * (p - 1) / 2) if comm.rank == 0 else got[4] is None)
    ok = ok and (same(got[5], np.arange(6.0) + p - 1) if comm.rank == p - 1 else got[5] is None)
    agree(comm, ok, f"non-blocking starts and results: {got}")


def _late_starts(c, part, y, rows):
    """Non-blocking calls whose rows are known only once the ranks exchange them: allgather without counts and
    alltoall with a row of counts, by MPI's own and by schedules (``shm`` too: started late it runs its messages)."""
    starts = [c.iallgather(part, algorithm=a) for a in ("mpi", "ring", "bruck", "shm")]
    starts += [c.ialltoall(y, counts=rows, algorithm=a) for a in ("mpi", "pairwise", "shm")]
    out = np.empty((c.size * (c.size + 1) // 2, 2), np.int64)
    starts.append(c.iallgather(part, out=out))
    return out, starts


@pytest.mark.parametrize("validate", [False, True])
def test_nonblocking_calls_that_exchange_counts_never_block(comm, validate):
    """Every i-call whose start needs an exchange (the rows; in validation mode the fingerprints too) returns at
    once: rank 0 starts them all, then tells the others to start theirs; a start that waited for its peers would
    wait for ranks that wait for it (the job then ends by the launcher's timeout, or the watchdog's). The ranks
    then wait last to first and every result equals MPI's own: the steps left to the Requests start in call order
    on every rank, whichever is waited first."""
    c = pc.Communicator(validate=True, timeout=120) if validate else comm
    p, r = c.size, c.rank
    part = integer_valued((r + 1, 2), np.dtype("i8"), "sum", 5 + r)   # uneven rows: a wrong exchange shows
    rows = [(r + j) % 3 for j in range(p)]
    y = integer_valued((sum(rows), 2), np.dtype("f8"), "sum", 9 + r)
    expected = [mpi_allgather(c.mpi, part)] * 4 + [mpi_alltoall(c.mpi, y, rows)] * 3 + [mpi_allgather(c.mpi, part)]
    go = np.zeros(1, np.int64)
    if r == 0:
        out, reqs = _late_starts(c, part, y, rows)
        for peer in range(1, p):
            c.mpi.Send(go, peer, tag=4)
    else:
        c.mpi.Recv(go, 0, tag=4)
        out, reqs = _late_starts(c, part, y, rows)
    got = {i: reqs[i].wait() for i in reversed(range(len(reqs)))}
    ok = all(same(got[i], e) for i, e in enumerate(expected))
    ok = ok and got[len(reqs) - 1] is out and same(c.allreduce(np.ones(2), algorithm="ring"), np.full(2, float(c.size)))
    if validate:
        c.free()
    agree(comm, ok, "non-blocking calls that exchange counts")


def test_late_starts_and_a_blocking_call_between(comm):
    """Two late starts in flight, a blocking collective between them and their waits, then waited in reverse
    order on rank 0 only, tested round-robin elsewhere; then a wrong ``out`` on one rank, found by the exchange,
    is raised by ``wait()`` on every rank (ValueError there, CollectiveMismatchError elsewhere) and the next
    call still pairs up."""
    p, r = comm.size, comm.rank
    a = integer_valued((r + 2,), np.dtype("i4"), "sum", r)
    b = integer_valued((2 * r + 1, 3), np.dtype("f4"), "sum", 3 + r)
    first, second = comm.iallgather(a, algorithm="mpi"), comm.iallgather(b, algorithm="mpi")
    total = comm.allreduce(np.full(3, r, np.int64))
    reqs = [first, second]
    if r == 0:
        got = [second.wait(), first.wait()][::-1]
    else:
        while not all([q.test() for q in reqs]):
            pass
        got = pc.wait_all(reqs)
    ok = same(got[0], mpi_allgather(comm.mpi, a)) and same(got[1], mpi_allgather(comm.mpi, b))
    ok = ok and same(total, np.full(3, p * (p - 1) // 2, np.int64))
    wrong = np.empty(p * (p + 3) // 2 + 1, np.int32) if r == p - 1 else None
    req = comm.iallgather(a, out=wrong)   # returns: the rows (and so out's) are known only after the exchange
    try:
        req.wait()
        err = None
    except (ValueError, pc.CollectiveMismatchError) as e:
        err = e
    want = ValueError if r == p - 1 else pc.CollectiveMismatchError
    ok = ok and type(err) is want and "allgather" in str(err) and "out has shape" in str(err)
    ok = ok and same(comm.allgather(a, algorithm="ring"), mpi_allgather(comm.mpi, a))
    agree(comm, ok, f"late starts: {got}, error {err!r}")


def test_every_broadcast_and_reduce_algorithm_in_flight_together(comm):
    """ibroadcast with each algorithm and ireduce with each, every root, started before any is waited on and tested
    round-robin: each equals MPI's own (uneven lengths, in place for one broadcast)."""
    from pycollect.algorithms import registry
    starts, expected = [], []
    for i, name in enumerate(registry.algorithms("broadcast")):
        root = i % comm.size
        x = integer_valued((3 * comm.size + i,), np.dtype("i8"), "sum", 10 * i + comm.rank)
        want = x.copy()
        comm.mpi.Bcast(want, root=root)
        starts.append(comm.ibroadcast(x, root=root, algorithm=name, out=x if i == 1 else None))
        expected.append(want)
    for i, name in enumerate(registry.algorithms("reduce")):
        root = (i + 1) % comm.size
        x = integer_valued((2 * comm.size + i, 2), np.dtype("f8"), "sum", 7 * i + comm.rank)
        total = mpi_allreduce(comm.mpi, x, "sum")   # every rank calls it; the root's is the answer
        want = total if comm.rank == root else None
        starts.append(comm.ireduce(x, root=root, algorithm=name))
        expected.append(want)
    while not all([r.test() for r in starts]):
        pass
    got = pc.wait_all(starts)
    ok = all(g is None if e is None else same(g, e) for g, e in zip(got, expected))
    agree(comm, ok, "ibroadcast and ireduce of every algorithm in flight together")


def test_pipeline_bytes_is_the_old_name_of_tree_segment_bytes(comm):
    with pytest.warns(DeprecationWarning, match="pipeline_bytes is now tree_segment_bytes"):
        c = pc.Communicator(comm.mpi, pipeline_bytes=4096)
    ok = c.tree_segment_bytes == 4096
    c.free()
    agree(comm, ok, "pipeline_bytes= sets tree_segment_bytes")


def test_library_traffic_does_not_match_user_messages(comm):
    """A user message with tag 1 pending on the same MPI communicator is not taken by a collective."""
    if comm.size < 2:
        pytest.skip("needs two ranks")
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    note = np.full(3, comm.rank, np.int64)
    send = comm.mpi.Isend(note, right, tag=1)
    got = comm.allreduce(np.ones(5, np.int64), algorithm="ring")
    box = np.empty(3, np.int64)
    comm.mpi.Recv(box, left, tag=1)
    send.Wait()
    agree(comm, same(got, np.full(5, comm.size, np.int64)) and (box == left).all(), "user message and collective")


def test_send_recv_round_trip(comm):
    if comm.size < 2:
        pytest.skip("needs two ranks")
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    x = np.arange(12, dtype=np.float32).reshape(3, 4) + comm.rank
    req = comm.isend(x, right, tag=7)
    box = comm.recv(np.empty((3, 4), np.float32), left, tag=7)
    req.wait()
    agree(comm, np.array_equal(box, np.arange(12, dtype=np.float32).reshape(3, 4) + left), "isend/recv")
    r = comm.irecv(np.empty(4, np.int8), left)
    comm.send(np.full(4, comm.rank, np.int8), right)
    agree(comm, (r.wait() == left).all(), "irecv/send")


def test_topology_matches_split_type(comm):
    """Nodes as MPI_Comm_split_type(SHARED) sees them; under simulated nodes, the expected cliques."""
    topo = comm.topology
    local = comm.mpi.Split_type(MPI.COMM_TYPE_SHARED)
    mates = sorted(local.allgather(comm.rank))
    local.Free()
    ok = list(topo.nodes[topo.node_of[comm.rank]]) == mates and topo.size == comm.size
    expect = os.environ.get("PYCOLLECT_EXPECT_NODES")
    if expect:
        ok = ok and topo.num_nodes == int(expect)
        by_block, k = os.environ.get("PYCOLLECT_EXPECT_BY_BLOCK") == "1", int(expect)
        cliques = [r * k // comm.size if by_block else r % k for r in range(comm.size)]   # MPICH's, even or not
        ok = ok and topo == pc.Topology.from_labels(cliques)
        ok = ok and topo.tier(0, 1) == ("intra-node" if by_block else "inter-node")
    agree(comm, ok, f"topology {topo} vs split_type {mates}")


def test_topology_ring_crosses_nodes_least(comm):
    order = comm.topology.ring_order
    crossings = sum(comm.topology.tier(order[i], order[(i + 1) % len(order)]) == "inter-node"
                    for i in range(len(order)))
    agree(comm, crossings == (comm.topology.num_nodes if comm.topology.num_nodes > 1 else 0), f"ring {order}")


def test_env_override_and_tuning_file(comm, tmp_path_factory, monkeypatch):
    monkeypatch.setenv("PYCOLLECT_ALGO_ALLREDUCE", "tree")
    agree(comm, Selector().choose("allreduce", 8) == "tree", "PYCOLLECT_ALGO_ALLREDUCE")
    monkeypatch.setenv("PYCOLLECT_ALGO_ALLREDUCE", "nonsense")
    with pytest.raises(ValueError, match="PYCOLLECT_ALGO_ALLREDUCE must be one of .*, got 'nonsense'"):
        Selector()
    monkeypatch.delenv("PYCOLLECT_ALGO_ALLREDUCE")
    path = tmp_path_factory.mktemp(f"tune{comm.rank}") / "tuning.json"
    path.write_text(json.dumps({"allreduce": [[1024, "recursive_doubling"], [None, "rabenseifner"]]}))
    sel = Selector(str(path))
    agree(comm, sel.choose("allreduce", 1024) == "recursive_doubling" and sel.choose("allreduce", 1025) == "rabenseifner",
          "tuning file")
    path.write_text(json.dumps({"allreduce": [[1024, "bogus"]]}))
    with pytest.raises(ValueError, match="bogus"):
        Selector(str(path))


def test_auto_falls_back_where_mpi_cannot_reduce(comm):
    import ml_dtypes
    x = np.ones(1000, ml_dtypes.bfloat16)   # MPI has no bfloat16 (float16 it has where MPIX_C_FLOAT16 exists)
    agree(comm, same(comm.allreduce(x), np.full(1000, comm.size, ml_dtypes.bfloat16)), "bfloat16 auto")
    with pytest.raises(ValueError, match="algorithm 'mpi' cannot"):
        comm.allreduce(x, algorithm="mpi")


def test_zero_size_and_world_shapes(comm):
    x = np.zeros((0, 3), np.float64)
    for algorithm in pc.algorithms("allreduce"):
        agree(comm, comm.allreduce(x, algorithm=algorithm).shape == (0, 3), f"zero-size {algorithm}")
    s = comm.reduce_scatter(np.ones((comm.size * 2, 2)))
    agree(comm, s.shape == (2, 2) and (s == comm.size).all(), "reduce_scatter shape")


@pytest.mark.parametrize("call", [
    lambda c: c.allreduce([1, 2, 3]),
    lambda c: c.allreduce(np.ones(3), op="mean"),
    lambda c: c.allreduce(np.ones(3), op="bxor"),
    lambda c: c.allreduce(np.ones(3, np.complex64), op="max"),
    lambda c: c.allreduce(np.ones(3), algorithm="fastest"),
    lambda c: c.allreduce(np.ones(3), out=np.ones(4)),
    lambda c: c.allreduce(np.ones(3), out=np.ones(3, np.float32)),
    lambda c: c.reduce_scatter(np.ones(4), counts=[1] * (c.size + 1)),
    lambda c: c.reduce_scatter(np.ones(4), counts=[5] + [0] * (c.size - 1)),
    lambda c: c.reduce_scatter(np.ones(4), counts=[-1] + [5 // max(c.size - 1, 1)] * (c.size - 1)),
    lambda c: c.broadcast(np.ones(3), root=c.size),
    lambda c: c.reduce(np.ones(3), root=-1),
    lambda c: c.send(np.ones(3), dest=c.size),
    lambda c: c.allreduce(np.ones(3), accumulate="float64"),
    lambda c: c.reduce_scatter(np.ones(c.size, np.float16), accumulate="float64"),
    lambda c: c.ireduce(np.ones(3, np.float16), accumulate=True),
    lambda c: c.allreduce(np.zeros(3, "M8[s]")),
], ids=["list", "op", "bxor-float", "max-complex", "algorithm", "out-shape", "out-dtype", "counts-len",
        "counts-sum", "counts-negative", "root-high", "root-negative", "dest", "accumulate", "accumulate-rs",
        "accumulate-ireduce", "datetime"])
def test_bad_arguments_raise_before_any_communication(comm, call):
    """Every rank passes the same bad argument, every rank raises, and nothing is left pending."""
    with pytest.raises((ValueError, TypeError)) as info:
        call(comm)
    agree(comm, len(str(info.value)) > 10, str(info.value))
    comm.barrier()  # all ranks are still in step


@pytest.mark.parametrize("algorithm", ["ring", "mpi"])
def test_a_communicator_collected_with_a_dropped_call_in_flight_keeps_its_buffers(comm, algorithm):
    """A Communicator left without free() (an error out of its with block) is collected while the Request of a call
    in flight was dropped: the call's buffers stay alive for MPI, which still writes into them. Before 2026-12-05 the
    runner's list of dropped calls went with it: MPI wrote the peers' data into arrays made afterwards (and the heap
    broke: SIGSEGV), found by a helper."""
    import gc
    n = 100_000
    overwritten = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        for _ in range(6):
            try:
                with pc.Communicator(comm.mpi) as c:
                    c.iallreduce(np.full(n, 7.0), algorithm=algorithm)   # its Request dropped at once
                    raise KeyError("the user's own error")
            except KeyError:
                pass
            del c
            gc.collect()
            hold = [np.full(n, -1.0) for _ in range(4)]   # would take the freed memory
            for _ in range(10):
                comm.mpi.Allreduce(np.ones(16), np.empty(16))   # MPI moves the orphaned call on
            overwritten += sum(not (h == -1.0).all() for h in hold)
    agree(comm, overwritten == 0, f"{overwritten} arrays made after the collection were written into")


def test_after_every_rank_refused_a_call_mpis_own_calls_go_on_right(comm):
    """Every rank refuses call k (a bad out), catches it and goes on: the next call that goes to MPI's own collective
    first meets every rank in the recheck (Runner.refused), which they all pass; results right, the lean paths back
    on after it. Through the mpi4py face too (its buffer checks take a number as a refused call)."""
    c = pc.Communicator(comm.mpi)
    face = pc.mpi4py(comm.mpi)
    r, p = comm.rank, comm.size
    leans = bool(c._lean)   # off throughout where calls are observed or validated (PYCOLLECT_TIMEOUT, _DEBUG)
    with verdicts(comm) as check:
        for algorithm in ("mpi", "auto", "ring"):
            with pytest.raises(ValueError, match="out has shape"):
                c.allreduce(np.ones(4), algorithm=algorithm, out=np.zeros(5))
            check(not c._lean, "lean paths on right after a refused call")
            got = c.allreduce(np.full(4, r + 1.0), algorithm=algorithm)
            check(same(got, np.full(4, p * (p + 1) / 2)), f"{algorithm}: {got}")
            got = c.allreduce(np.full(2, r + 2.0))   # small, auto: MPI's own
            check(same(got, np.full(2, p * (p + 3) / 2)) and bool(c._lean) == leans,
                  f"then {got}, lean {bool(c._lean)}")
        # non-blocking calls to MPI's own (auto, asked for, a non-commutative op's) go behind the recheck they start,
        # until a blocking call ends the refusal (the same call on every rank); MPI's own straight after it, while
        # those behind have not started yet; waited in another order than made
        with pytest.raises(ValueError, match="out has shape"):
            c.allreduce(np.ones(4), out=np.zeros(5))
        first = pc.Op(lambda a, b, out: np.copyto(out, a), commute=False, name="first")   # rank 0's
        behind = [c.iallreduce(np.full(3, r + 1.0)), c.iallgather(np.full(2, float(r)), algorithm="mpi"),
                  c.ireduce_scatter(np.full(p, 1.0 * r)), c.iallreduce(np.full(2, r + 3.0), op=first)]
        # (validation's agreement, PYCOLLECT_DEBUG, compares the call numbers instead: no recheck there)
        check(bool(c._runner.rechecks) == (c._check is None) and not c._lean, "a recheck in flight")
        behind[1].test()   # moves what it can, in call order (the recheck, the first call behind it)
        check(same(c.allreduce(np.full(2, 1.0)), np.full(2, float(p))) and bool(c._lean) == leans,
              "the recheck after them")
        straight = c.iallreduce(np.full(2, r + 1.0), algorithm="mpi")
        check(same(straight.wait(), np.full(2, p * (p + 1) / 2)), "MPI's own straight after the blocking call")
        firsts, block, rows, sums = (request.wait() for request in reversed(behind))
        check(same(sums, np.full(3, p * (p + 1) / 2)) and same(rows, np.repeat(np.arange(p, dtype=float), 2))
              and same(block, np.full(1, p * (p - 1) / 2)) and same(firsts, np.full(2, 3.0)),
              f"non-blocking after the refusal: {sums} {rows} {block} {firsts}")
        # MPI's own collectives of the library's making after a refusal meet too: a split, a grid, the windows
        for make in (lambda: c.split(r % 2), lambda: c.cartesian([p]), lambda: c.shared_empty(3)):
            with pytest.raises(ValueError, match="out has shape"):
                c.allreduce(np.ones(4), algorithm="ring", out=np.zeros(5))
            made = make()
            check(c._runner.refusal is None, "the refusal ended at the split, the grid or the windows' opening")
            if isinstance(made, pc.Communicator):
                got = made.allreduce(np.full(2, 1.0))
                check(same(got, np.full(2, float(made.size))), f"in the group made after the refusal: {got}")
                made.free()
        with pytest.raises(ValueError, match="recvbuf's count is 5"):
            face.Allreduce(np.ones(4), [np.zeros(5), 5, MPI.DOUBLE])
        y = np.zeros(4)
        face.Allreduce(np.full(4, 1.0 * r), y)
        check(same(y, np.full(4, p * (p - 1) / 2)), f"face: {y}")
    face.pycollect.free()
    c.free()


def test_a_scatterv_recvbuf_that_does_not_fit_raises_on_every_rank(comm):
    """The mpi4py face's Scatterv hands out the root's counts with every rank's own recvbuf count in one exchange
    (as Gatherv): a recvbuf of another count on the last rank alone raises on every rank. Before 2026-12-05 it raised
    there alone, after the root's counts had been broadcast: its next call, a call behind, was handed the block of
    the scatter the others had gone on to (a helper found it)."""
    face = pc.mpi4py(comm.mpi)
    r, p = comm.rank, comm.size
    last = r == p - 1
    send = [np.arange(4.0 * p), [4] * p, MPI.DOUBLE] if r == 0 else None
    with verdicts(comm) as check:
        with pytest.raises(ValueError) as info:
            face.Scatterv(send, np.zeros(5) if last else np.zeros(4))
        check(f"rank {p - 1} receives into recvbuf of 5 elements, but the root's sendbuf counts" in str(info.value),
              str(info.value))
        out = np.zeros(4)
        face.Scatterv([np.arange(4.0 * p) + 100, [4] * p, MPI.DOUBLE] if r == 0 else None, out)
        check(same(out, np.arange(4.0) + 100 + 4 * r), f"the next Scatterv: {out}")
    face.pycollect.free()


@pytest.mark.parametrize("validate", [False, True])
def test_a_gatherv_or_scatterv_root_out_of_range_on_one_rank_raises_on_every_rank(comm, validate):
    """The face's Gatherv and Scatterv read the root's layout from one exchange: a root out of range on the last rank
    raised IndexError there alone before it (the others waited in the exchange), -1 read the last rank's row, and
    roots that differed each read another's. Now the root is checked first and travels in the exchange."""
    face = pc.mpi4py(comm.mpi, validate=validate)
    r, p = comm.rank, comm.size
    last = r == p - 1
    with verdicts(comm) as check:
        for root, words in ((p, f"root must be a rank in [0, {p}), got {p}"), (-1, "got -1")):
            got = np.full(2 * p, -7)
            for call in (lambda: face.Gatherv(np.arange(2) + 10 * r, [got, [2] * p, MPI.INT64_T],
                                              root=root if last else 0),
                         lambda: face.Scatterv([np.arange(2 * p), [2] * p, MPI.INT64_T], got[:2],
                                               root=root if last else 0)):
                with pytest.raises(ValueError) as info:
                    call()
                said = str(info.value)
                check((words in said) if last or p == 1 else (f"rank(s) {p - 1} passed bad arguments" in said
                                                              or "failed its argument checks" in said), said)
                check(bool((got == -7).all()), f"written: {got}")
        if p > 1:   # each rank names another root: every rank raises
            with pytest.raises(ValueError) as info:
                face.Gatherv(np.arange(2), [np.zeros(2 * p, np.int64), [2] * p, MPI.INT64_T], root=r)
            check("the ranks passed other roots: rank 0 root 0, rank 1 root 1" in str(info.value), str(info.value))
        got = np.zeros(2 * p, np.int64)
        face.Gatherv(np.arange(2) + 10 * r, [got, [2] * p, MPI.INT64_T], root=0)
        want = np.concatenate([np.arange(2) + 10 * q for q in range(p)])
        check(r != 0 or same(got, want), f"the next Gatherv: {got}")
    face.pycollect.free()


def test_an_alltoallv_recvcount_that_differs_from_the_senders_raises_on_every_rank(comm):
    """The face's Alltoallv passed only the send counts: a rank whose recvbuf counted 1 element from rank 0 where
    rank 0 sent 2 returned with the block written past its count (or 3 counted: short of it), no error anywhere
    (a helper). Every rank's sendcounts and recvcounts now travel in one exchange and are compared."""
    if comm.size == 1:
        pytest.skip("a peer's count to differ from")
    face = pc.mpi4py(comm.mpi)
    r, p = comm.rank, comm.size
    x = np.arange(2 * p, dtype=np.int64) + 100 * r
    with verdicts(comm) as check:
        for asked in (1, 3):
            y = np.full(2 * p + 1, -7, np.int64)
            counts = [asked] + [2] * (p - 1) if r == 1 else [2] * p
            with pytest.raises(ValueError) as info:
                face.Alltoallv([x, ([2] * p, [2 * i for i in range(p)]), MPI.INT64_T],
                               [y, (counts, [2 * i + 1 for i in range(p)]), MPI.INT64_T])
            said = str(info.value)
            check(f"rank 0 sends rank 1 2 elements, rank 1's recvbuf counts {asked} from it" in said, said)
            check(bool((y == -7).all()), f"written: {y}")
        y = np.zeros(2 * p, np.int64)
        face.Alltoallv([x, ([2] * p, [2 * i for i in range(p)]), MPI.INT64_T], [y, ([2] * p, [2 * i for i in range(p)]), MPI.INT64_T])
        check(same(y, np.concatenate([np.arange(2 * r, 2 * r + 2) + 100 * q for q in range(p)])), f"the next: {y}")
    face.pycollect.free()


@pytest.mark.parametrize("algorithm", pc.algorithms("alltoall"))
def test_alltoall_in_place(comm, algorithm):
    """``out=x`` with even blocks and with uneven counts whose own block moves (MPI forbids aliasing:
    the MPI path must not hand it one buffer twice)."""
    size, rank = comm.size, comm.rank
    base = [(3 * k + 1) % 5 for k in range(size)]
    counts = [base[(j - rank) % size] for j in range(size)]   # every rank receives sum(base) rows
    for rows, given in ((2 * size, None), (sum(counts), counts)):
        x = integer_valued((rows, 2), np.dtype("f4"), "sum", 40 + rank)
        expected = mpi_alltoall(comm.mpi, x, split_even(rows, size) if given is None else given)
        back = comm.alltoall(x, counts=given, algorithm=algorithm, out=x)
        agree(comm, back is x and same(x, expected), f"alltoall in place {algorithm} counts={given}")


@pytest.mark.parametrize("collective", ["reduce_scatter", "allgather"])
def test_out_overlapping_input_on_mpi_path(comm, collective):
    """An ``out`` that is a view of ``x`` is never handed to MPI as both buffers."""
    x = integer_valued((2 * comm.size, 2), np.dtype("i8"), "sum", comm.rank)
    if collective == "reduce_scatter":
        expected = mpi_allreduce(comm.mpi, x, "sum")[2 * comm.rank:2 * comm.rank + 2]
        got = comm.reduce_scatter(x, algorithm="mpi", out=x[:2])
    else:
        part = x[:2].copy()
        expected = mpi_allgather(comm.mpi, part)
        got = comm.allgather(x[:2], algorithm="mpi", out=x)
    agree(comm, same(np.array(got), expected), f"{collective} out overlapping x")


@pytest.mark.parametrize("collective", ["reduce_scatter", "allgather", "reduce"])
def test_in_place_forms_equal_mpis_in_place_call(comm, collective):
    """The in-place forms ``pycollect bench`` times, for every algorithm, against MPI's own call with MPI_IN_PLACE:
    reduce_scatter with ``out`` x's block ``rank`` (MPI leaves its result at the start of x), allgather with ``x``
    out's block ``rank`` (with and without counts), reduce with ``out=x`` on the root. Only ``out`` is written."""
    size, rank, root = comm.size, comm.rank, comm.size - 1
    mine = slice(3 * rank, 3 * rank + 3)                  # this rank's block of rows
    data = integer_valued((3 * size, 2), np.dtype("f8"), "sum", 70 + rank)
    reference = data.copy()
    if collective == "reduce_scatter":
        comm.mpi.Reduce_scatter_block(MPI.IN_PLACE, reference, MPI.SUM)
        expected = reference[:3]
    elif collective == "allgather":
        comm.mpi.Allgather(MPI.IN_PLACE, reference)
        expected = reference
    else:
        comm.mpi.Reduce(MPI.IN_PLACE if rank == root else reference, reference if rank == root else None, MPI.SUM,
                        root=root)
        expected = reference if rank == root else data
    for algorithm in pc.algorithms(collective):
        for counts in ((None, [3] * size) if collective == "allgather" else (None,)):
            buf = data.copy()
            if collective == "reduce_scatter":
                out = buf[mine]
                got = comm.reduce_scatter(buf, algorithm=algorithm, out=out)
                ok = got is out and same(out, expected) and same(np.delete(buf, mine, axis=0),
                                                                np.delete(data, mine, axis=0))
            elif collective == "allgather":
                got = comm.allgather(buf[mine], algorithm=algorithm, out=buf, counts=counts)
                ok = got is buf and same(buf, expected)
            else:
                got = comm.reduce(buf, root=root, algorithm=algorithm, out=buf)
                ok = (got is buf) == (rank == root) and same(buf, expected)
            agree(comm, ok, f"{collective} in place {algorithm} counts={counts}")


def test_inputs_untouched_on_error(comm):
    x = np.arange(6.0)
    before = x.copy()
    with pytest.raises(ValueError):
        comm.allreduce(x, out=np.empty(5))
    agree(comm, np.array_equal(x, before), "input written on error")


def test_split_and_sub_make_groups_that_belong_to_their_parent(comm):
    """Groups inherit the parent's settings and its topology restricted to them, reduce over their own ranks,
    and are freed by the parent (or earlier by a with block)."""
    from helpers import raises
    p, r = comm.size, comm.rank
    parent = pc.Communicator(comm.mpi, timeout=120.0, segment_bytes=1 << 15, validate=True)
    try:
        half = parent.split(r % 2, key=-r)                     # ordered by key: the highest rank first
        mates = [q for q in range(p) if q % 2 == r % 2][::-1]
        ok = half.parent_ranks == mates and half.rank == mates.index(r)
        ok &= (half.timeout, half.segment_bytes, half.validate) == (120.0, 1 << 15, True)
        ok &= half.topology == pc.Topology.from_labels([parent.topology.node_of[q] for q in mates])
        ok &= half.allreduce(np.full(3, r + 1.0))[0] == sum(q + 1.0 for q in mates)
        order = [p - 1, 0] if p > 1 else [0]                     # the ranks in the order given
        first = parent.sub(order)
        ok &= (first is None) == (r not in order)
        ok &= first is None or (first.parent_ranks == order and first.rank == order.index(r))
        lone = parent.split(None if r == 0 else 7)
        ok &= (lone is None) == (r == 0)
        if lone is not None:
            with lone:
                pass
            ok &= lone._lib == MPI.COMM_NULL                     # freed at the end of the with block
        agree(comm, ok, "split/sub groups")
        bad = [p] if r == p - 1 else [0]                         # one rank's list is wrong: every rank raises
        raises(comm, lambda: parent.sub(bad), ValueError, ["sub"])
        raises(comm, lambda: parent.split(-2 if r == 0 else 1), ValueError, ["split"])
    finally:
        parent.free()
    agree(comm, half._lib == MPI.COMM_NULL and (first is None or first._lib == MPI.COMM_NULL),
          "groups left after their parent's free()")


# -- the mpi4py face: the same calls through pc.mpi4py and through mpi4py itself ----------------------------
FACE_TYPES = [("DOUBLE", MPI.DOUBLE), ("INT", MPI.INT), ("FLOAT", MPI.FLOAT), ("C_BOOL", MPI.C_BOOL),
              ("C_DOUBLE_COMPLEX", MPI.C_DOUBLE_COMPLEX), ("LONG_DOUBLE", MPI.LONG_DOUBLE)]
FACE_OPS = ["SUM", "PROD", "MAX", "MIN", "LAND", "LOR", "LXOR", "BAND", "BOR", "BXOR"]
PAIR_TYPES = [("DOUBLE_INT", MPI.DOUBLE_INT), ("FLOAT_INT", MPI.FLOAT_INT), ("LONG_INT", MPI.LONG_INT),
              ("TWOINT", MPI.TWOINT)]


@pytest.fixture(scope="module")
def face_and_mpi(comm):
    """The face over the world, and a duplicate of the world for mpi4py's own calls."""
    face, mine = pc.mpi4py(comm.mpi), comm.mpi.Dup()
    yield face, mine
    face.pycollect.free()
    mine.Free()


def _dtype(datatype):
    from mpi4py.util import dtlib
    return dtlib.to_numpy_dtype(datatype)


def _values(datatype, n: int, op: str, seed: int) -> np.ndarray:
    """``n`` integer-valued elements of ``datatype`` (pairs: small values, ties and indices; their padding bytes
    0x11, which MPI never moves): exact in any order."""
    dtype = _dtype(datatype)
    if dtype.names:
        pairs, rng = _padded(np.zeros(n, dtype), 0x11), np.random.default_rng(seed)
        pairs["f0"], pairs["f1"] = rng.integers(-2, 3, n), rng.integers(0, 5, n)
        return pairs
    return integer_valued((n,), dtype, "prod" if op == "PROD" else "band" if op[0] == "B" else "sum", seed)


def _recvbuf(n: int, datatype, value=0) -> np.ndarray:
    """A recvbuf of ``n`` elements of ``value``; a pair type's padding bytes 0xA5 (MPI never writes them)."""
    return _padded(np.full(n, value, _dtype(datatype)), 0xA5)


def _padded(a: np.ndarray, byte: int) -> np.ndarray:
    """``a`` with every byte that no field of its dtype covers set to ``byte`` (none for a dtype without fields)."""
    if a.dtype.names and a.size:
        raw = a.reshape(-1).view(np.uint8).reshape(a.size, a.dtype.itemsize)
        covered = np.zeros(a.dtype.itemsize, bool)
        for field, offset, *_ in a.dtype.fields.values():
            covered[offset:offset + field.itemsize] = True
        raw[:, ~covered] = byte
    return a


def _equal(a, b) -> bool:
    if a.dtype.names:   # byte for byte: a pair's padding stays as it was in the recvbuf (MPI never writes it)
        return a.shape == b.shape and a.tobytes() == b.tobytes()
    return a.shape == b.shape and np.array_equal(a, b)


def _fits_op(dtype, op: str) -> bool:
    kind = "b" if dtype == np.bool_ else dtype.kind
    return op in {"b": FACE_OPS[4:7], "i": FACE_OPS, "c": FACE_OPS[:2]}.get(kind, FACE_OPS[:4])


def _reduction_call(name, form, datatype, n, root, counts=None):
    """``call(comm, op, blocking, send, recv)``: ``name`` through ``comm`` with buffer form ``form``."""
    def call(c, op, blocking, s, r):
        if form == "in place" and (name != "Reduce" or c.rank == root):
            r[:len(s)] = s
            s = MPI.IN_PLACE
        specs = {"array": (s, r), "[buf, type]": ([s, datatype], [r, datatype]),
                 "[buf, count, type]": ([s, n - 1, datatype], [r, n - 1, datatype]),
                 "[buf, (count, displ), type]": ([s, (n - 2, 1), datatype], [r, (n - 2, 1), datatype]),
                 "[buf, count, displ, type]": ([s, n - 2, 2, datatype], [r, n - 2, 2, datatype]),
                 "in place": (s if s is MPI.IN_PLACE else [s, datatype], [r, datatype])}[form]
        extra = {"Reduce": dict(root=root), "Reduce_scatter": dict(recvcounts=counts)}.get(name, {})
        method = getattr(c, name if blocking else "I" + name.lower())
        request = method(*specs, op=op, **extra)
        if not blocking:
            request.Wait()
        return r
    return call


def _compare(check, face, mine, label, call, op, blocking, make):
    """``call`` through the face and through mpi4py on fresh, equal buffers from ``make()``; recvbufs equal."""
    got, want = call(face, op, blocking, *make()), call(mine, op, blocking, *make())
    check(_equal(got, want), f"{label}: face {got!r}, mpi4py {want!r}")


def test_mpi4py_face_reductions_equal_mpi4pys(comm, face_and_mpi):
    """Allreduce, Reduce, Reduce_scatter_block and Reduce_scatter (and I-forms, alternately) through the face and
    through mpi4py: every type and predefined op that fit, MINLOC/MAXLOC on the pair types, every buffer form,
    in place, roots across the world, uneven receive counts with zeros; recvbufs bit for bit equal."""
    face, mine = face_and_mpi
    p, r = comm.size, comm.rank
    forms = ["array", "[buf, type]", "[buf, count, type]", "[buf, (count, displ), type]", "[buf, count, displ, type]",
             "in place"]
    cases = [(t, d, op) for t, d in FACE_TYPES for op in FACE_OPS if _fits_op(_dtype(d), op)]
    cases += [(t, d, op) for t, d in PAIR_TYPES for op in ("MINLOC", "MAXLOC")]
    with verdicts(comm) as check:
        for i, (tname, datatype, op) in enumerate(cases):
            for j, name in enumerate(("Allreduce", "Reduce")):
                form = forms[(i + j) % len(forms)]
                if _dtype(datatype).names and form == "array":
                    form = "[buf, type]"   # a pair array has no format mpi4py can read its type from
                n, root, blocking = 5, (i + j) % p, (i + j) % 2 == 0
                make = lambda: (_values(datatype, n, op, 10 * i + r), _recvbuf(n, datatype))  # noqa: E731
                _compare(check, face, mine, f"{name} {tname} {op} {form} root {root} blocking {blocking}",
                         _reduction_call(name, form, datatype, n, root), getattr(MPI, op), blocking, make)
            counts = [(q + i) % 3 for q in range(p)]
            make_rs = lambda: (_values(datatype, sum(counts), op, 7 * i + r),  # noqa: E731
                               _recvbuf(max(counts[r], 1), datatype))
            call = _reduction_call("Reduce_scatter", "array", datatype, 0, 0, counts if i % 3 else None)
            _compare(check, face, mine, f"Reduce_scatter {tname} {op} counts {counts}", _sliced(call, counts[r], datatype),
                     getattr(MPI, op), i % 2 == 1, make_rs)
            _compare(check, face, mine, f"Reduce_scatter_block {tname} {op}", _block_call(datatype, i % 3, p),
                     getattr(MPI, op), i % 2 == 0, lambda: (_values(datatype, 2 * p, op, 3 * i + r),
                                                            _recvbuf(2 * p, datatype)))


def _sliced(call, count: int, datatype):
    """Reduce_scatter's ``call`` with its recvbuf cut to this rank's count (mpi4py gathers the counts from it)."""
    def sliced(c, op, blocking, s, r):
        call(c, op, blocking, [s, datatype], [r[:count], datatype])
        return r
    return sliced


def _block_call(datatype, form: int, p: int):
    """Reduce_scatter_block of 2 elements a rank: arrays, [buf, count, type] (1 a rank), or in place."""
    def call(c, op, blocking, s, r):
        if form == 0:
            specs = ([s, datatype], [r[:2], datatype])
        elif form == 1:
            specs = ([s[:p], 1, datatype], [r, 1, datatype])
        else:
            r[...] = s
            specs = (MPI.IN_PLACE, [r, datatype])
        request = getattr(c, "Reduce_scatter_block" if blocking else "Ireduce_scatter_block")(*specs, op=op)
        if not blocking:
            request.Wait()
        return r if form != 2 else r[:2]
    return call


def _user_ops():
    """A commutative op (elementwise sum of doubles) and a non-commutative one: the composition of affine maps
    ``x -> m x + c``, one element a contiguous type of two doubles (m, c), lower ranks' maps applied first."""
    def add(a, b, datatype):
        np.add(np.frombuffer(a, "f8"), np.frombuffer(b, "f8"), out=np.frombuffer(b, "f8"))

    def then(a, b, datatype):
        first, second = np.frombuffer(a, "f8").reshape(-1, 2), np.frombuffer(b, "f8").reshape(-1, 2)
        m, c = first[:, 0] * second[:, 0], first[:, 1] * second[:, 0] + second[:, 1]
        second[:, 0], second[:, 1] = m, c
    return MPI.Op.Create(add, commute=True), MPI.Op.Create(then, commute=False)


def test_mpi4py_face_user_ops_equal_mpi4pys(comm, face_and_mpi):
    """MPI.Op.Create ops, commutative and not, through Allreduce, Reduce (every root) and Reduce_scatter_block:
    the face's results equal mpi4py's; the non-commutative one shows any reordering of ranks."""
    face, mine = face_and_mpi
    p, r = comm.size, comm.rank
    add, then = _user_ops()
    affine = MPI.DOUBLE.Create_contiguous(2).Commit()
    rng = np.random.default_rng(40 + r)
    maps = np.stack([rng.choice([-1.0, 1.0, 2.0], 3 * p), rng.integers(-2, 3, 3 * p).astype(float)], axis=1)
    try:
        with verdicts(comm) as check:
            for k, (op, datatype, n) in enumerate([(add, MPI.DOUBLE, 6), (then, affine, 3)]):
                for i, name in enumerate(("Allreduce", "Reduce", "Reduce")):
                    form = ["[buf, type]", "in place", "[buf, count, type]"][i]
                    make = lambda: (maps.copy(), np.zeros_like(maps))   # noqa: E731
                    _compare(check, face, mine, f"{name} user op {k} {form}",
                             _reduction_call(name, form, datatype, n, (i + k) % p), op, i != 1, make)
                _compare(check, face, mine, f"Reduce_scatter_block user op {k}", _block_call(datatype, 1, p), op,
                         True, lambda: (maps[:p].copy(), np.zeros_like(maps[:p])))
    finally:
        add.Free()
        then.Free()
        affine.Free()


MOVED = [("DOUBLE", MPI.DOUBLE), ("INT", MPI.INT), ("C_BOOL", MPI.C_BOOL), ("C_DOUBLE_COMPLEX", MPI.C_DOUBLE_COMPLEX),
         ("LONG_DOUBLE", MPI.LONG_DOUBLE), ("FLOAT", MPI.FLOAT), ("DOUBLE_INT", MPI.DOUBLE_INT)]


def _layout(p: int, r: int, k: int):
    """Uneven counts (zeros among them) and displacements with gaps, the same on every rank for case ``k``:
    ``(counts, displs, length)``, plus this rank's own count."""
    counts = [(q + k) % 3 for q in range(p)]
    displs = [sum(counts[:q]) + 2 * q + 1 for q in range(p)] if k % 2 else None
    length = (displs[-1] + counts[-1] + 1) if displs else sum(counts)
    return counts, displs, max(length, 1), counts[r]


def _movement_calls(p: int, r: int, root: int, k: int, datatype):
    """``name -> (make, call)`` for the data-moving collectives of case ``k``: ``make()`` fresh buffers (equal on
    each call), ``call(comm, blocking, send, recv)`` the recvbuf to compare."""
    counts, displs, length, mine = _layout(p, r, k)
    vspec = (lambda b: [b, (counts, displs), datatype]) if k % 4 != 2 else (lambda b: [b, counts, datatype])
    fresh = lambda n: (_values(datatype, n, "SUM", 100 * k + r), _recvbuf(n, datatype))  # noqa: E731
    place = k % 3 == 2   # in place where MPI allows it

    def run(c, name, blocking, *specs, **kw):
        request = getattr(c, name if blocking else "I" + name.lower())(*specs, **kw)
        if not blocking:
            request.Wait()

    def gather(c, blocking, s, recv):
        at_root = c.rank == root
        if place and at_root:
            recv[root * 2:root * 2 + 2] = s[:2]
        run(c, "Gather", blocking, MPI.IN_PLACE if place and at_root else [s, 2, datatype], [recv, datatype],
            root=root)
        return recv

    def gatherv(c, blocking, s, recv):
        run(c, "Gatherv", blocking, [s, mine, datatype], vspec(recv), root=root)
        return recv

    def allgather(c, blocking, s, recv):
        if place:
            recv[r * 2:r * 2 + 2] = s[:2]
        run(c, "Allgather", blocking, MPI.IN_PLACE if place else [s, 2, datatype], [recv, datatype])
        return recv

    def allgatherv(c, blocking, s, recv):
        run(c, "Allgatherv", blocking, [s, mine, datatype], vspec(recv))
        return recv

    def alltoall(c, blocking, s, recv):
        if place:
            recv[...] = s
        run(c, "Alltoall", blocking, MPI.IN_PLACE if place else [s, datatype], [recv, datatype])
        return recv

    def alltoallv(c, blocking, s, recv):   # rank q sends (q + j + k) % 3 to rank j: symmetric, so in place fits
        rows = [(r + j + k) % 3 for j in range(p)]
        gaps = [sum(rows[:j]) + j for j in range(p)]
        if place:
            recv[...] = s
            run(c, "Alltoallv", blocking, MPI.IN_PLACE, [recv, (rows, gaps), datatype])
        else:
            recv_spec = [recv, (rows, gaps), datatype] if k % 2 else [recv, rows, datatype]   # gaps on both sides
            run(c, "Alltoallv", blocking, [s, (rows, gaps), datatype], recv_spec)
        return recv

    def bcast(c, blocking, s, recv):
        spec = [[s, datatype], [s, 3, datatype], [s, (2, 1), datatype], [s, 1, 2, datatype]][k % 4]
        run(c, "Bcast", blocking, spec, root=root)
        return s

    v = sum(counts) + 2 * p + 1
    return {"Gather": (lambda: fresh(2 * p), gather), "Gatherv": (lambda: fresh(max(length, v)), gatherv),
            "Allgather": (lambda: fresh(2 * p), allgather), "Allgatherv": (lambda: fresh(max(length, v)), allgatherv),
            "Alltoall": (lambda: fresh(2 * p), alltoall), "Alltoallv": (lambda: fresh(4 * p), alltoallv),
            "Bcast": (lambda: fresh(4), bcast)}


def test_mpi4py_face_data_movement_equals_mpi4pys(comm, face_and_mpi):
    """Bcast, Gather(v), Allgather(v), Alltoall(v) and their I-forms (alternately) through the face and through
    mpi4py: several types, roots across the world, uneven counts with zeros, displacements with gaps (the
    Communicator's displs= forms, no temporary), [buf, counts, type] and [buf, (counts, displs), type], in place
    where MPI allows it."""
    face, mine = face_and_mpi
    p, r = comm.size, comm.rank
    gathers = hasattr(face.pycollect, "gather")
    with verdicts(comm) as check:
        for k, (tname, datatype) in enumerate(MOVED * 2):
            root = (3 * k) % p
            for j, (name, (make, call)) in enumerate(_movement_calls(p, r, root, k, datatype).items()):
                if name.startswith("Gather") and not gathers:
                    continue
                blocking = (j + k) % 2 == 0
                got, want = call(face, blocking, *make()), call(mine, blocking, *make())
                if name.startswith("Gather") and r != root:
                    got = want   # recvbuf is not significant off the root
                check(_equal(got, want), f"{name} {tname} case {k} root {root} blocking {blocking}: face {got!r}, "
                                         f"mpi4py {want!r}")
    if not gathers:
        pytest.skip("Gather and Gatherv wait for Communicator.gather (issue 18 item 1); the rest passed")


def test_mpi4py_face_prefix_reductions_and_scatters_equal_mpi4pys(comm, face_and_mpi):
    """Scan and Exscan (every form, types and ops as the reductions, pairs, a non-commutative user op; rank 0's
    Exscan recvbuf untouched) and Scatter(v) (roots, uneven counts, gaps, in place) through the face and mpi4py."""
    face, mine = face_and_mpi
    p, r = comm.size, comm.rank
    scans, scatters = hasattr(face.pycollect, "scan"), hasattr(face.pycollect, "scatter")
    if not (scans or scatters):
        pytest.skip("Scan, Exscan and Scatter(v) wait for Communicator.scan, .exscan and .scatter (issue 18 item 1)")
    forms = ["array", "[buf, type]", "[buf, count, type]", "[buf, (count, displ), type]", "in place"]
    cases = [(t, d, op) for t, d in FACE_TYPES for op in FACE_OPS if _fits_op(_dtype(d), op)]
    cases += [(t, d, op) for t, d in PAIR_TYPES[:2] for op in ("MINLOC", "MAXLOC")]
    _, then = _user_ops()
    with verdicts(comm) as check:
        for i, (tname, datatype, op) in enumerate(cases if scans else []):
            for j, name in enumerate(("Scan", "Exscan")):
                form = forms[(i + j) % len(forms)]
                form = "[buf, type]" if _dtype(datatype).names and form == "array" else form
                make = lambda: (_values(datatype, 4, op, 10 * i + r), _recvbuf(4, datatype, 3))  # noqa: E731
                got, want = (_reduction_call(name, form, datatype, 4, 0)(c, getattr(MPI, op), (i + j) % 2 == 0,
                                                                           *make()) for c in (face, mine))
                sent, untouched = make()   # rank 0's Exscan: the recvbuf as handed in (in place: sendbuf copied there)
                if form == "in place":
                    untouched[:len(sent)] = sent
                check(_equal(got, want) if (name == "Scan" or r) else _equal(got, untouched),
                      f"{name} {tname} {op} {form}: face {got!r}, mpi4py {want!r}")
        for k, (tname, datatype) in enumerate(MOVED if scatters else []):
            root, (counts, displs, length, own) = (5 * k) % p, _layout(p, r, k)
            spec = (lambda b: [b, (counts, displs), datatype]) if k % 2 else (lambda b: [b, counts, datatype])

            def scatterv(c, blocking):
                s, recv = _values(datatype, length, "SUM", k), _recvbuf(2, datatype)
                request = getattr(c, "Scatterv" if blocking else "Iscatterv")(spec(s), [recv, own, datatype], root=root)
                _ = blocking or request.Wait()
                s2, recv2 = _values(datatype, 2 * p, "SUM", k), _recvbuf(2, datatype)
                in_place = k % 3 == 1 and c.rank == root
                c.Scatter([s2, datatype], MPI.IN_PLACE if in_place else [recv2, datatype], root=root)
                return recv, recv2   # apart: a concatenation of pairs leaves its own padding unset
            got, want = scatterv(face, k % 2 == 0), scatterv(mine, k % 2 == 0)
            check(all(map(_equal, got, want)),
                  f"Scatter(v) {tname} case {k} root {root}: face {got!r}, mpi4py {want!r}")
        if scans:
            maps = np.stack([np.arange(2.0 * p) % 3 - 1, np.arange(2.0 * p) + r], axis=1)   # (2p, 2): (m, c) pairs
            affine = MPI.DOUBLE.Create_contiguous(2).Commit()
            got, want = (_reduction_call("Scan", "[buf, type]", affine, 2 * p, 0)(c, then, True, maps.copy(),
                                                                                   np.zeros_like(maps))
                         for c in (face, mine))
            check(_equal(got, want), f"Scan with a non-commutative user op: face {got!r}, mpi4py {want!r}")
            affine.Free()
    then.Free()
    if not (scans and scatters):
        pytest.skip(f"{'Scatter(v)' if scans else 'Scan and Exscan'} wait for the Communicator's method (issue 18 item 1)")


def test_mpi4py_face_requests_routing_and_fall_through(comm, face_and_mpi):
    """Request.Waitall over the face's I-calls and mpi4py's own Isend/Irecv together, Testall until done (mpi4py's
    own MPI.Request.Waitall refuses a face request); every
    routed method runs as the Communicator's collective (its recording names each); everything else is the
    wrapped communicator's (Get_rank, rank, Split, lower-case pickling calls)."""
    face, mine = face_and_mpi
    p, r = comm.size, comm.rank
    x = np.arange(6.0) + r
    outs = [np.zeros(6), np.zeros(6 * p), np.arange(4) * (r == p - 1), np.zeros(6), np.zeros(1)]
    reqs = [face.Iallreduce(x, outs[0], op=MPI.MAX), face.Iallgather(x, outs[1]), face.Ibcast(outs[2], root=p - 1),
            face.Ibarrier(), mine.Isend(x[:1], (r + 1) % p, tag=11), mine.Irecv(outs[4], (r - 1) % p, tag=11),
            face.Ialltoall(np.repeat(np.arange(p, dtype=float) + 10 * r, 6 // p or 1)[:6 // p * p],
                           outs[3][:6 // p * p])]
    try:   # mpi4py's own Waitall refuses a face request, having waited for nothing (docs/errors.md)
        refused = not MPI.Request.Waitall(reqs[:1])
    except TypeError:
        refused = True
    half = reqs[:3]
    while not pc.mpi4py.Request.Testall(half):
        pass
    assert pc.mpi4py.Request.Waitall(reqs) is True
    ok = refused and _equal(outs[0], np.arange(6.0) + p - 1)
    ok = ok and _equal(outs[1], np.concatenate([np.arange(6.0) + q for q in range(p)]))
    ok = ok and _equal(outs[2], np.arange(4)) and outs[4][0] == (r - 1) % p
    per = 6 // p
    ok = ok and _equal(outs[3][:per * p], np.repeat(np.arange(p) * 10.0 + r, per) if per else outs[3][:0])
    with face.pycollect.record() as log:
        face.Allreduce(x, outs[0])
        face.Reduce(MPI.IN_PLACE if r == 0 else x, outs[0], root=0)
        face.Bcast(outs[0])
        face.Allgather(x, outs[1])
        face.Reduce_scatter_block(np.zeros(p), outs[4])
        face.Reduce_scatter(np.zeros(p), outs[4], [1] * p)
        face.Iallgather(x, outs[1]).Wait()
        face.Barrier()
    routed = [e.collective.removesuffix("_block") for e in log]   # the block form may record as reduce_scatter
    expected = ["allreduce", "reduce", "broadcast", "allgather", "reduce_scatter", "reduce_scatter", "allgather"]
    ok = ok and routed[:len(expected)] == expected
    split = face.Split(r % 2, r)
    ok = ok and face.Get_rank() == r and face.rank == r and face.size == p and split.size == (p + 1 - r % 2) // 2
    ok = ok and face.allreduce(r) == p * (p - 1) // 2   # mpi4py's own lower-case (pickling) call, fallen through
    split.Free()
    agree(comm, ok, f"requests, routing ({routed}) and fall-through")


def test_mpi4py_face_any_and_some_complete_each_request_once_as_mpi4pys(comm, face_and_mpi):
    """``Waitany``, ``Testany``, ``Waitsome``, ``Testsome`` over the face's I-calls and mpi4py's own Isend/Irecv
    together report each request complete once, then MPI.UNDEFINED (``Testany``: with flag True) or None, as
    mpi4py's own class methods do over mpi4py's requests (checked alike); every result right."""
    face, mine = face_and_mpi
    p, r = comm.size, comm.rank

    def start(c):
        x = np.arange(4.0) + r
        outs = [np.zeros(4), np.zeros(4 * p), np.full(1, -1.0)]
        reqs = [c.Iallreduce(x, outs[0]), mine.Isend(x[:1], (r + 1) % p, tag=12), c.Iallgather(x, outs[1]),
                mine.Irecv(outs[2], (r - 1) % p, tag=12)]
        return reqs, outs

    def any_order(wait_any):
        def drain(reqs):
            seen = []
            while (i := wait_any(reqs)) != MPI.UNDEFINED and len(seen) < 8:   # a request reported twice: no hang
                seen.append(i)
            return seen
        return drain

    def tested_any(test_any):
        def drain(reqs):
            seen = []
            while True:
                i, flag = test_any(reqs)
                if (flag and i == MPI.UNDEFINED) or len(seen) >= 8:
                    return seen
                seen += [i] if flag else []
        return drain

    def some_order(some):
        def drain(reqs):
            seen = []
            while (done := some(reqs)) is not None and len(seen) < 8:
                seen += done
            return seen
        return drain

    ok, failures = True, []
    for cls, c in ((pc.mpi4py.Request, face), (MPI.Request, mine)):
        for name, drain in (("Waitany", any_order(cls.Waitany)), ("Testany", tested_any(cls.Testany)),
                            ("Waitsome", some_order(cls.Waitsome)), ("Testsome", some_order(cls.Testsome))):
            reqs, outs = start(c)
            seen = drain(reqs)
            right = sorted(seen) == [0, 1, 2, 3] and _equal(outs[0], p * np.arange(4.0) + p * (p - 1) // 2)
            right = right and _equal(outs[1], np.concatenate([np.arange(4.0) + q for q in range(p)]))
            right = right and outs[2][0] == (r - 1) % p
            if not right:
                failures.append(f"{cls.__module__}.{name}: {seen} {outs}")
            ok &= right
    agree(comm, ok, f"any/some: {failures[:2]}")


def test_mpi4py_face_request_methods_as_mpi4pys(comm, face_and_mpi):
    """A face request and mpi4py's own on the same call: truthy while active, falsy once waited; ``Get_status``
    True once done and the request still active; lower-case ``wait()`` None and ``test()`` ``(True, None)``;
    ``Free`` refuses an inactive request with MPI.Exception; on an active face request it finishes the call."""
    face, mine = face_and_mpi
    x = np.arange(3.0) + comm.rank
    expected = comm.size * np.arange(3.0) + comm.size * (comm.size - 1) // 2
    seen = {}
    for name, c in (("face", face), ("mpi4py", mine)):
        outs = [np.zeros(3) for _ in range(4)]
        q = c.Iallreduce(x, outs[0])
        active = bool(q)
        while not q.Get_status():
            pass
        still = bool(q)
        q.Wait()
        waited = bool(q)
        q2 = c.Iallreduce(x, outs[1])
        waited_lower = q2.wait()
        q2 = c.Iallreduce(x, outs[2])
        while not (tested := q2.test())[0]:
            pass
        lower = (waited_lower, tested)
        q3 = c.Iallreduce(x, outs[3])
        if name == "face":
            q3.Free()   # finishes the call (mpi4py's would let it go on, writing outs[3] at some later time)
        else:
            q3.Wait()
        try:
            q3.Free()
            refused = None
        except MPI.Exception as e:
            refused = e.Get_error_class()
        right = all(_equal(o, expected) for o in outs)
        seen[name] = (active, still, waited, lower, refused, right)
    agree(comm, seen["face"] == seen["mpi4py"] and seen["face"][-1] and seen["face"][:3] == (True, True, False),
          f"face / mpi4py: {seen}")


def test_mpi4py_face_free_frees_both_communicators(comm):
    """A face's ``Free`` frees the wrapped communicator (mpi4py's handle turns null) and the face's pycollect
    Communicator; over COMM_WORLD it is refused with mpi4py's MPI.Exception and frees nothing; with a call in flight,
    pycollect's RuntimeError and nothing freed, then once the call is waited it frees both."""
    r = comm.rank
    sub = pc.mpi4py(comm.mpi.Split(r % 2, r))
    out = np.zeros(1)
    sub.Allreduce(np.ones(1), out)
    sub.Free()
    ok = out[0] == sub.pycollect.size and sub.mpi == MPI.COMM_NULL and sub.pycollect._freed
    world = pc.mpi4py(MPI.COMM_WORLD)
    try:
        world.Free()
        refused = False
    except MPI.Exception:
        refused = True
    ok = ok and refused and not world.pycollect._freed
    busy = pc.mpi4py(comm.mpi.Dup(), validate=True)   # a validated non-blocking call is deferred: in flight till waited
    request = busy.Iallreduce(np.ones(1), out)
    try:
        busy.Free()
        refused_busy = False
    except RuntimeError:
        refused_busy = busy.mpi != MPI.COMM_NULL and not busy.pycollect._freed   # nothing freed
    request.Wait()
    busy.Free()
    ok = ok and refused_busy and out[0] == comm.size and busy.mpi == MPI.COMM_NULL
    if not world.pycollect._freed:
        world.Allreduce(np.ones(1), out)   # still usable
        ok = ok and out[0] == comm.size
        world.pycollect.free()
    agree(comm, ok, f"Free: {out}, refused {refused}, in flight refused {refused_busy}")


def test_mpi4py_face_bad_buffers_raise_on_every_rank(comm):
    """A bad spec passed on every rank raises on every rank, nothing written; in validation mode a bad spec on one
    rank raises there (naming the argument) and on every other rank (naming the rank), and no rank waits."""
    from helpers import raises
    p, r = comm.size, comm.rank
    face = pc.mpi4py(comm.mpi)
    x, y = np.arange(4.0), np.zeros(4)
    for call, exc, words in [
            (lambda: face.Allreduce(x, [y, 5, MPI.DOUBLE]), ValueError, ["Allreduce", "recvbuf", "asks for 5"]),
            (lambda: face.Allreduce([x, MPI.FLOAT], y), ValueError, ["Allreduce", "mismatch", "MPI_FLOAT"]),
            (lambda: face.Allreduce(x, [y, 3, MPI.DOUBLE]), ValueError, ["Allreduce", "sendbuf has count 4"]),
            (lambda: face.Iallreduce(x, y, op="sum"), TypeError, ["Iallreduce", "op must be an MPI.Op"]),
            (lambda: face.Allreduce(x, y, op=MPI.MINLOC), TypeError, ["MINLOC", "pair datatype"]),
            (lambda: face.Allgather(x, np.zeros(4 * p + 1)), ValueError, ["Allgather", "recvbuf"]),
            (lambda: face.Allgather(x.astype(np.float32), np.zeros(4 * p)), TypeError, ["Allgather", "float32"]),
            (lambda: face.Ibcast([bytearray(3), 4, MPI.BYTE], root=p - 1), ValueError, ["Ibcast", "buf", "asks for 4"]),
            (lambda: face.Bcast(bytearray(3), root=p), ValueError, ["broadcast", "root"]),
            (lambda: face.Allreduce(x, np.zeros((4, 4))[:, ::2]), BufferError, ["recvbuf", "not contiguous"])]:
        raises(comm, call, exc, words, arrays=[x, y])
    if p > 1:   # Gatherv: the root's counts and every rank's own meet in one exchange, so every rank raises
        gathered = np.zeros(2 * p + 3)
        sent = x[:3] if r == p - 1 else x[:2]
        raises(comm, lambda: face.Gatherv(sent, [gathered, ([2] * p, [2 * q + 3 for q in range(p)]), MPI.DOUBLE]),
               ValueError, ["Gatherv", f"rank {p - 1} sends 3 elements", "root's recvbuf counts"], arrays=[x, gathered])
        bad = [gathered, ([2] * p, [0] * (p - 1) + [2 * p + 2]), MPI.DOUBLE] if r == 0 else None   # past its end
        words = ["Gatherv", "recvbuf"] if r == 0 else ["Gatherv", "rank(s) 0", "no rank went on"]
        raises(comm, lambda: face.Gatherv(x[:2], bad, root=0), ValueError, words, arrays=[x, gathered])
    face.pycollect.free()
    checked = pc.mpi4py(comm.mpi, validate=True)
    bad = [y, 9, MPI.DOUBLE] if r == p - 1 else y
    words = ["recvbuf", "asks for 9"] if r == p - 1 else [f"rank(s) {p - 1}", "no rank went on"]
    raises(comm, lambda: checked.Allreduce(x, bad), ValueError, words, arrays=[x, y])
    words = ["recvbuf", "holds"] if r == 0 else ["rank(s) 0", "no rank went on"]
    raises(comm, lambda: checked.Reduce_scatter(x, [y, 5 if r == 0 else 1, MPI.DOUBLE]), ValueError, words,
           arrays=[x, y])
    if p > 1:   # the root may broadcast from read-only memory, the others receive into theirs
        words = ["Bcast", "read-only"] if r else [f"rank(s) {', '.join(map(str, range(1, p)))}", "no rank went on"]
        raises(comm, lambda: checked.Bcast(b"abc" if r else bytearray(3), root=0), BufferError if r else ValueError,
               words)
    checked.pycollect.free()


def test_a_call_whose_tag_is_still_in_flight_is_refused(comm):
    """A schedule's messages carry the call's number modulo a power of two within MPI's TAG_UB. A call whose tag an
    earlier call in flight on this rank still holds (that many calls later) is refused before anything is sent,
    naming the earlier call: before, MPI paired the two calls' messages first come, first served, and an ibroadcast
    waited after a later one of the same tag returned the later one's data, without an error. Half the tag space in
    flight is refused alike (a later call's tag could not be told from a past one's). Then the calls in flight
    complete with their results and the Communicator works on."""
    c = pc.Communicator(comm.mpi)
    runner, p = c._runner, comm.size
    live, tag_ub = runner.live, comm.mpi.Get_attr(MPI.TAG_UB)
    every = [np.arange(4.0) + r for r in range(p)]
    x = np.arange(4.0) + comm.rank
    with verdicts(comm) as check:
        check(live.mask + 1 <= tag_ub + 1 < 2 * (live.mask + 1) and live.mask & (live.mask + 1) == 0,
              f"tag space {live.mask + 1} for TAG_UB {tag_ub}")
        first = c.ibroadcast(np.full(3, 111.0) if comm.rank == 0 else np.zeros(3), root=0, algorithm="binomial")
        held = c.in_flight() == 1   # a schedule's call holds its tag until waited (at one rank too)
        runner.seq += live.mask     # every rank skips as many numbers: the next call takes the first one's tag
        try:
            c.ibroadcast(np.full(3, 222.0) if comm.rank == 0 else np.zeros(3), root=0, algorithm="binomial")
            refused = ""
        except RuntimeError as e:
            refused = str(e)
        check(held and "still in flight" in refused and f"(#{runner.seq - live.mask - 1}," in refused,
              f"the call on the tag in flight: {refused!r}")
        check(same(first.wait(), np.full(3, 111.0)), "the call in flight after the refusal")
        check(same(c.allreduce(x, algorithm="ring"), sum(every)), "the Communicator after the refusal")
        mask, live.mask = live.mask, 15   # a tag space of 16, set alike on every rank with nothing in flight
        try:
            requests = [c.iallreduce(x + i, algorithm="ring") for i in range(8)]
            try:
                c.iallreduce(x, algorithm="ring")
                refused = ""
            except RuntimeError as e:
                refused = str(e)
            check("8 calls are in flight here, half the tag space" in refused, f"half: {refused!r}")
            check(all(same(r.wait(), sum(every) + p * i) for i, r in enumerate(requests)), "the calls in flight")
        finally:
            live.mask = mask
        check(same(c.allreduce(x, algorithm="ring"), sum(every)), "the Communicator after the second refusal")
    c.free()


def test_free_with_a_call_in_flight_refuses_and_frees_nothing(comm):
    """free() while a schedule's call, a group's or a deferred one (rows exchanged first) is in flight raises
    RuntimeError on every rank that has one and frees nothing: the call then completes with its result, the
    Communicator still works, and once waited it frees. MPI's own non-blocking call is not counted: MPI completes it
    after the free, as it does."""
    c = pc.Communicator(comm.mpi)
    half = c.split(comm.rank % 2)
    x = np.arange(6.0) + comm.rank
    every = [np.arange(6.0) + r for r in range(comm.size)]
    with verdicts(comm) as check:
        for name, start, expected in (
                ("ring allreduce", lambda: c.iallreduce(x, algorithm="ring"), sum(every)),
                ("a group's ring allreduce", lambda: half.iallreduce(x, algorithm="ring"), sum(every[comm.rank % 2::2])),
                ("allgather, rows exchanged first", lambda: c.iallgather(x, algorithm="ring"), np.concatenate(every))):
            request = start()
            try:
                c.free()
                refused = ""
            except RuntimeError as e:
                refused = str(e)
            check("still in flight" in refused and "nothing was freed" in refused, f"{name}: free() said {refused!r}")
            check(same(request.wait(), expected), f"{name}: the result after the refused free")
        check(same(c.allreduce(x, algorithm="ring"), sum(every)), "the Communicator after the refusals")
        try:   # a with block that raises with a call in flight: its own error comes out, nothing is freed
            with c:
                request = c.iallreduce(x, algorithm="ring")
                raise KeyError("the block's own error")
        except KeyError:
            check(c.in_flight() == 1 and not c._freed, "in flight after the with block's error")
        check(same(request.wait(), sum(every)) and c.in_flight() == 0, "the call after the with block's error")
        request = c.iallreduce(x, algorithm="mpi")
        check(c.in_flight() == 0, "MPI's own call counted as in flight")
        c.free()
        check(same(request.wait(), sum(every)), "MPI's own call in flight through free()")
        check(half._freed, "the group freed with its parent")
        watched = pc.Communicator(comm.mpi, timeout=120.0)   # its own calls polled to a deadline
        requests = [watched.iallreduce(x, algorithm="mpi"), watched.ibroadcast(x, root=0, algorithm="mpi")]
        watched.free()   # completes them first (Open MPI 5.0 crashed in a wait after MPI_Comm_free)
        check(same(requests[1].wait(), every[0]) and same(requests[0].wait(), sum(every)),
              "MPI's own calls under the watchdog through free()")


def test_requests_dropped_in_flight_complete_and_free(comm):
    """Requests dropped before they complete (no reference left, never waited): each call is kept by its
    Communicator, not freed with its buffers (MPI then wrote into freed memory: a segmentation fault for MPI's own
    call, a corrupt heap for a schedule's), moves on at the Communicator's later calls, and free() completes it, its
    result in its ``out``; a ResourceWarning names each. MPI's own call, schedules, a group's, a deferred one (rows
    exchanged first; validation's agreement) and point-to-point messages."""
    c, checked = pc.Communicator(comm.mpi), pc.Communicator(comm.mpi, validate=True)
    half = c.split(comm.rank % 2)
    r, p = comm.rank, comm.size
    x = np.arange(6.0) + r
    every = [np.arange(6.0) + q for q in range(p)]
    starts = (("MPI's allreduce", lambda o: c.iallreduce(x, algorithm="mpi", out=o), sum(every)),
              ("ring allreduce", lambda o: c.iallreduce(x, algorithm="ring", out=o), sum(every)),
              ("a group's ring allreduce", lambda o: half.iallreduce(x, algorithm="ring", out=o),
               sum(every[r % 2::2])),
              ("validated tree allreduce", lambda o: checked.iallreduce(x, algorithm="tree", out=o), sum(every)),
              ("ring allgather, rows exchanged first", lambda o: c.iallgather(x, algorithm="ring", out=o),
               np.concatenate(every)),
              ("a message from the left", lambda o: c.irecv(o, (r - 1) % p, tag=5), every[(r - 1) % p]))
    outs = []
    with verdicts(comm) as check:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ResourceWarning)
            for name, start, expected in starts:
                out = np.full(expected.shape, -7.0)
                start(out)   # the Request dropped at once
                outs.append((name, out, expected))
            c.isend(x, (r + 1) % p, tag=5)
            gc.collect()
            check(same(c.allreduce(x, algorithm="ring"), sum(every)), "a call after the dropped ones")
            c.free()
            checked.free()
        for name, out, expected in outs:
            check(same(out, expected), f"{name}: out after free() is {out}, expected {expected}")
        said = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
        check(len(said) == len(starts) + 1 and all("dropped before it completed" in s for s in said),
              f"ResourceWarnings: {said}")
        check(c.in_flight() == 0 and half._freed, "in flight after free()")


def test_a_dropped_call_that_fails_warns_and_raises_into_no_other_call(comm):
    """A validated call whose ranks disagree (dtypes), its Request dropped: its CollectiveMismatchError is told in a
    RuntimeWarning where the Communicator completes it (a later call or free()), never raised into those calls,
    which go on with their results."""
    c = pc.Communicator(comm.mpi, validate=True)
    x = np.ones(8, np.float32 if comm.rank == comm.size - 1 else np.float64)
    with verdicts(comm) as check:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            c.iallreduce(x, algorithm="ring")   # dropped at once
            gc.collect()
            check(same(c.allreduce(np.ones(3)), np.full(3, float(comm.size))), "the call after the dropped one")
            c.free()
        said = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
        check(comm.size == 1 or any("allreduce #1" in s and "CollectiveMismatchError" in s for s in said),
              f"RuntimeWarnings: {said}")


def test_requests_dropped_together_complete_in_call_order(comm):
    """Requests dropped at once (a list of them deleted: CPython frees its items last first) are completed in call
    order by free(), as the other ranks, which wait theirs in call order, move them: in drop order, rank 0 waited
    on its second call while the others moved their first, and the job hung."""
    c = pc.Communicator(comm.mpi)
    x = np.arange(1 << 12, dtype=np.float64) + comm.rank
    outs = [np.zeros_like(x) for _ in range(3)]
    requests = [c.iallreduce(x * (i + 1), algorithm="ring", out=o) for i, o in enumerate(outs)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        if comm.rank == 0:
            del requests
            gc.collect()
        else:
            for request in requests:
                request.wait()
        c.free()
    total = mpi_allreduce(comm.mpi, x, "sum")
    with verdicts(comm) as check:
        check(all(same(o, total * (i + 1)) for i, o in enumerate(outs)), "results of the dropped calls")


def test_a_request_dropped_after_earlier_ones_moved_on_is_completed(comm):
    """Each Request holds its Communicator's list of dropped Requests: a call moving the dropped ones on used to
    replace the list, so a Request made after that and dropped later landed on the old one, was never completed, and
    free() refused it (one call still in flight, its out unwritten; at 9 ranks the heap then broke)."""
    c = pc.Communicator(comm.mpi)
    x = np.arange(300, dtype=np.float64) + comm.rank
    out_gather, out_sum = np.full(100 * comm.size, -7.0), np.full(300, -7.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        c.iallreduce(x, algorithm="ring")                                    # dropped at once
        gathering = c.iallgather(x[:100], algorithm="bruck", out=out_gather)  # made after #1 moved on (rows first)
        summing = c.iallreduce(x, algorithm="recursive_doubling", out=out_sum)
        del gathering, summing
        gc.collect()
        with verdicts(comm) as check:
            try:
                c.free()
                refused = ""
            except RuntimeError as e:
                refused = str(e)
            check(refused == "", f"free() refused: {refused}")
            check(same(out_gather, mpi_allgather(comm.mpi, x[:100]).reshape(-1)), "the dropped allgather's out")
            check(same(out_sum, mpi_allreduce(comm.mpi, x, "sum")), "the dropped allreduce's out")


class _Interrupt(BaseException):
    """What a signal handler raises into a wait (as KeyboardInterrupt does), kept apart from pytest's own."""


@pytest.mark.parametrize("timeout, algorithm", [(None, "ring"), (30.0, "ring"), (30.0, "mpi")],
                         ids=["unwatched", "watched", "watched-mpi"])
def test_a_blocking_call_interrupted_keeps_its_buffers_and_frees(comm, timeout, algorithm, monkeypatch):
    """A blocking call interrupted in its wait (KeyboardInterrupt, here a signal's exception; rank 0 starts alone
    and each rank is interrupted 0.1 s into the call) raises it and is over for the Communicator: in_flight() 0,
    free() goes ahead. Its buffers are kept, never freed under MPI (before, the call's requests and its out went
    with the exception, and a late peer's message landed in freed memory; MPI's own call under the watchdog lost
    them until 2026-12-04, and its peers' results read freed memory). MPI's own blocking call is watched only
    under the watchdog (unwatched, MPI holds the interpreter until it returns)."""
    if comm.size == 1:
        pytest.skip("one rank's call waits for nobody")
    from pycollect.engine import executor, watchdog
    c = pc.Communicator(comm.mpi, timeout=timeout)
    armed: list = []

    def arming(poll):   # the interrupt comes 0.1 s into the call's wait, not while it is being set up
        def first_arms(*args, **kwargs):
            if not armed:
                armed.append(True)
                signal.setitimer(signal.ITIMER_REAL, 0.1)
            return poll(*args, **kwargs)
        return first_arms
    monkeypatch.setattr(executor, "poll", arming(executor.poll))
    monkeypatch.setattr(watchdog, "poll", arming(watchdog.poll))
    previous = signal.signal(signal.SIGALRM, _raise_interrupt)
    try:
        if comm.rank:   # rank 0 waits alone, and is interrupted first
            comm.mpi.Recv(np.empty(1), source=0, tag=LATE_NOTICE)
        out = np.zeros(1 << 14)
        kept = weakref.ref(out)
        try:
            c.allreduce(np.ones(1 << 14), algorithm=algorithm, out=out)
            interrupted = False
        except _Interrupt:
            interrupted = True
        signal.setitimer(signal.ITIMER_REAL, 0)
        if comm.rank == 0:
            for q in range(1, comm.size):
                comm.mpi.Send(np.zeros(1), dest=q, tag=LATE_NOTICE)
    finally:
        signal.signal(signal.SIGALRM, previous)
    monkeypatch.undo()
    del out
    gc.collect()
    with verdicts(comm) as check:
        # MPI's own call may complete on the later ranks: rank 0's request, posted before its interruption, moves
        check(interrupted or (algorithm == "mpi" and comm.rank > 0), "the call was not interrupted")
        check(not interrupted or kept() is not None, "the interrupted call's out was freed")
        check(c.in_flight() == 0, f"in flight after the interruption: {c.in_flight()}")
        c.free()


def test_a_call_interrupted_while_it_posts_its_first_round_keeps_what_it_posted(comm, monkeypatch):
    """An interrupt that lands while a call posts its first messages (here on every rank, after its receives and
    before its first send): raised, the call is over for the Communicator (in_flight() 0, free() goes ahead), and its
    receives' buffers are kept. Before 2026-12-05 the Execution was lost with its posted receives (MPI then wrote into
    freed memory), its tag stayed live, and free() refused (found by a helper)."""
    from pycollect.engine import executor
    if comm.size == 1:
        pytest.skip("one rank posts nothing")

    def interrupted(self, buf):
        raise _Interrupt()
    monkeypatch.setattr(executor.Execution, "_send_buf", interrupted)
    c = pc.Communicator(comm.mpi)
    out = np.zeros(1 << 12)
    kept = weakref.ref(out)
    try:
        c.allreduce(np.ones(1 << 12), algorithm="ring", out=out)
        raised = False
    except _Interrupt:
        raised = True
    monkeypatch.undo()
    del out
    gc.collect()
    with verdicts(comm) as check:
        check(raised, "the interrupt was not raised")
        check(kept() is not None, "the interrupted call's out was freed")
        check(c.in_flight() == 0, f"in flight after the interruption: {c.in_flight()}")
        try:
            c.allreduce(np.ones(3))
            refused = ""
        except RuntimeError as e:
            refused = str(e)
        check("interrupted in flight" in refused, f"a later call not refused: {refused!r}")
        c.free()


def _raise_interrupt(signum, frame):
    raise _Interrupt()


def _waited(plan, threaded: bool = True) -> dict:
    """name -> result of each ``(name, request, pause)`` of ``plan``: each Request waited after its pause, in a thread of
    its own (``threaded``), else in turn in this one."""
    import threading
    got: dict = {}

    def wait(name, request, pause):
        time.sleep(pause)
        got[name] = request.wait()
    if not threaded:
        for step in plan:
            wait(*step)
        return got
    threads = [threading.Thread(target=wait, args=step) for step in plan]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return got


def test_a_deferred_call_started_while_another_thread_waits_keeps_its_tag(comm, monkeypatch):
    """Call #n (an iallgather whose rows are exchanged first: deferred) is started by one thread's wait while another
    thread waits #n+1 (a ring iallreduce) and looks for stray messages meanwhile: #n's tag stays live until its
    Execution holds it, so its peers' early messages are never read as a past call's. Before 2026-12-05 the tag left
    first, and the waiting thread ended the job ("a message of call #n, which has ended on this rank"); the gap is
    widened here by a pause before a late call starts (found by a helper)."""
    from pycollect import runner
    started = runner.Runner._start

    def late_start(self, call):
        if call.late:
            time.sleep(0.03)   # the starting thread descheduled between the steps' end and the Execution
        return started(self, call)
    monkeypatch.setattr(runner.Runner, "_start", late_start)
    c = pc.Communicator(comm.mpi)
    r, p = comm.rank, comm.size
    with verdicts(comm) as check:
        for it in range(4):
            a = np.full((400 + r, 2), float(r + it))   # uneven rows, no counts: exchanged first
            b = np.full((400, 2), float(r * it))
            first, second = c.iallgather(a, algorithm="ring"), c.iallreduce(b, algorithm="ring")
            got = _waited([("second", second, 0.0), ("first", first, 0.02)] if r == 0 else
                          [("first", first, 0.0), ("second", second, 0.06)])
            check(same(got["first"], np.concatenate([np.full((400 + q, 2), float(q + it)) for q in range(p)])),
                  f"iallgather {it}")
            check(same(got["second"], np.full((400, 2), float(sum(q * it for q in range(p))))), f"iallreduce {it}")
        check(c.in_flight() == 0, f"in flight: {c.in_flight()}")
    c.free()


def test_a_message_received_by_another_thread_between_the_probe_and_the_look_is_not_stray(comm, monkeypatch):
    """While a thread waits a call, it probes its peers for messages of calls that ended here; another thread waiting
    an earlier call may receive the probed message and end that call between the probe and the look at the calls in
    flight. Forced here: the look waits until the probed message's call has ended. Before 2026-12-05 the message
    was then taken for a stray and the job ended ("a message of call #1, which has ended on this rank"; CI's 4-rank
    run once); only a message still there on a second look is one."""
    from pycollect.engine import pairing
    real = pairing.stray_call

    def once_its_call_ended(tag, seq, live):
        deadline = time.monotonic() + 0.2
        while tag != live.of(seq) and tag in live and time.monotonic() < deadline:
            time.sleep(0.001)
        return real(tag, seq, live)
    monkeypatch.setattr(pairing, "stray_call", once_its_call_ended)
    c = pc.Communicator(comm.mpi)
    r, p = comm.rank, comm.size
    with verdicts(comm) as check:
        for it in range(12):
            earlier, later = c.iallgather(np.full((300, 2), float(r + it)), algorithm="ring"), \
                c.iallreduce(np.full(600, float(r)), algorithm="ring")
            # rank 0 waits the later call first, so it looks while its peers send the earlier one's messages
            got = _waited([("later", later, 0.0), ("earlier", earlier, 0.02)] if r == 0 else
                          [("earlier", earlier, 0.0), ("later", later, 0.0)], threaded=r == 0)
            check(same(got["earlier"], np.concatenate([np.full((300, 2), float(q + it)) for q in range(p)])),
                  f"iallgather {it}")
            check(same(got["later"], np.full(600, p * (p - 1) / 2)), f"iallreduce {it}")
    c.free()


@pytest.mark.parametrize("others", ["on_time", "late"])
def test_a_started_call_is_waited_while_another_thread_blocks_in_a_later_calls_step(comm, others):
    """Under validation an alltoall with a row of counts is deferred behind its agreement, then its exchange of
    counts. Rank 0 waits it in one thread, which starts the ring iallgather before it and blocks in the exchange;
    rank 0's other thread waits that iallgather, whose rounds the others need before they reach the exchange. Before
    2026-12-05 that thread waited for the first one's lock although its call had started, or (the others late: it
    came while the first thread was still in the iallgather's agreement) until the first thread was done: a hang
    either way (found by a helper's fuzzing)."""
    if comm.size == 1:
        pytest.skip("one rank waits for nobody")
    c = pc.Communicator(comm.mpi, validate=True)
    r, p = comm.rank, comm.size
    with verdicts(comm) as check:
        for it in range(3):
            if r and others == "late":
                time.sleep(0.2)
            a = c.iallgather(np.full((1500, 2), float(r + it)), algorithm="ring", counts=[1500] * p)
            b = c.ialltoall(np.full((2 * p, 2), float(r)), counts=[2] * p, algorithm="pairwise")
            got = _waited([("b", b, 0.0), ("a", a, 0.05)] if r == 0 else [("a", a, 0.02), ("b", b, 0.0)],
                          threaded=r == 0)
            check(same(got["a"], np.repeat(np.arange(p, dtype=float) + it, 1500)[:, None] * np.ones(2)), f"a {it}")
            check(same(got["b"], np.repeat(np.arange(p, dtype=float), 2)[:, None] * np.ones(2)), f"b {it}")
    c.free()


@pytest.mark.parametrize("validate", [False, True])
def test_two_requests_waited_in_two_threads_at_once(comm, validate):
    """Calls started in order on one thread, each Request waited in a thread of its own at once (legal in MPI, whose
    library runs with MPI_THREAD_MULTIPLE): right results. The calls that start after an exchange of counts (allgather
    without counts, every call under validation) wait on the runner's queue of deferred steps, which two threads
    took at once before 2026-12-05 (MPI's internal error, then a hang; found by a helper)."""
    import threading
    c = pc.Communicator(comm.mpi, validate=validate)
    r, p = comm.rank, comm.size
    with verdicts(comm) as check:
        for it in range(6):
            xs = [np.full((2, 3), 10.0 * r + it), np.full((1, 3), 100.0 * r + it), np.full(4, r + it / 8)]
            requests = [c.iallgather(xs[0], algorithm="ring"), c.iallgather(xs[1], algorithm="mpi"),
                        c.iallreduce(xs[2], algorithm="recursive_doubling")]
            got: list = [None] * len(requests)

            def wait(i):
                try:
                    got[i] = requests[i].wait()
                except Exception as e:  # noqa: BLE001 (reported below)
                    got[i] = e
            threads = [threading.Thread(target=wait, args=(i,)) for i in range(len(requests))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            want = [np.repeat(10.0 * np.arange(p) + it, 2)[:, None] * np.ones(3),
                    (100.0 * np.arange(p) + it)[:, None] * np.ones(3), np.full(4, sum(q + it / 8 for q in range(p)))]
            for g, w in zip(got, want):
                check(isinstance(g, np.ndarray) and same(g, w), f"iteration {it}: {g!r}")
        check(c.in_flight() == 0, f"in flight: {c.in_flight()}")
    c.free()


def test_an_shm_request_tested_in_a_thread_while_another_makes_calls(comm):
    """A window call's Request tested (or waited) in a thread of its own while the main thread makes more window
    calls, some growing their slot: right results. The main thread's calls settle the window queue and seat their
    slot, finishing its last holder, which is that Request; before 2026-12-05 the two threads completed one MPI
    request at once (MPICH's internal error, the job ended in 2 of 2 runs at 2 ranks): the queue is settled under
    the windows' lock, and a windowed run is moved on by one thread at a time."""
    import threading
    c = pc.Communicator(comm.mpi)
    r, p = comm.rank, comm.size
    with verdicts(comm) as check:
        for it in range(16):
            n = 1000 + 37 * it
            request = c.iallreduce(np.full(n, r + 1.0), algorithm="shm")
            got: list = [None]

            def test_then_wait():
                try:
                    while not request.test() and it % 2:
                        pass
                    got[0] = request.wait()
                except Exception as e:  # noqa: BLE001 (reported below)
                    got[0] = e
            t = threading.Thread(target=test_then_wait)
            t.start()
            big = c.allreduce(np.full(n * (1 + it % 4) * 8, 2.0 * r), algorithm="shm")   # growing its slot
            t.join()
            check(same(big, np.full(big.size, p * (p - 1.0))), f"iteration {it}: the main thread's call {big[:3]}")
            check(isinstance(got[0], np.ndarray) and same(got[0], np.full(n, p * (p + 1) / 2)),
                  f"iteration {it}: the Request's {got[0]!r}")
    c.free()


@pytest.mark.parametrize("gap", ["settle", "first_round"])
def test_shm_requests_waited_in_threads_while_the_main_thread_seats_their_slots(comm, monkeypatch, gap):
    """Four "shm" Requests take the four window slots, each waited in a thread of its own, while the main thread's
    blocking "shm" call seats its slot, finishing the first Request (its holder). Two gaps, widened here in the
    workers: between a wait's start and the windows' lock ("settle"): the worker held its run's lock and waited for
    the windows' one, which the main thread held while it waited for the run's: a hang; and inside the Execution's
    first round ("first_round"): the Execution had made itself the slot's holder, and the main thread waited the
    half-built Execution past the run's lock: AttributeError, the job ended. Before 2026-12-05 both (found by a
    helper's fuzzing, 2 of 8 seeds at 2 ranks)."""
    import threading
    from pycollect.engine import executor
    worker = lambda: threading.current_thread() is not threading.main_thread()   # noqa: E731
    class LateLock:   # the windows' lock, taken late by the workers
        def __init__(self, lock):
            self.lock = lock

        def acquire(self, blocking=True):
            if blocking and worker():
                time.sleep(0.05)
            return self.lock.acquire(blocking)

        def release(self):
            self.lock.release()

        def __enter__(self):
            return self.acquire()

        def __exit__(self, *exc):
            self.release()
    if gap == "first_round":
        first_round = executor.Execution._next_round

        def late_first_round(self):
            if self.index == -1 and self.slot is not None and worker():
                time.sleep(0.05)
            return first_round(self)
        monkeypatch.setattr(executor.Execution, "_next_round", late_first_round)
    c = pc.Communicator(comm.mpi)
    r, p = comm.rank, comm.size
    c.allreduce(np.ones(8), algorithm="shm")   # the windows open
    if gap == "settle" and c._runner.windows is not None:
        c._runner.windows.lock = LateLock(c._runner.windows.lock)
    with verdicts(comm) as check:
        for it in range(3):
            requests = [c.iallreduce(np.full(16, float(r + k + it)), algorithm="shm") for k in range(4)]
            got: list = [None] * 4

            def wait(k):
                got[k] = requests[k].wait()
            threads = [threading.Thread(target=wait, args=(k,)) for k in range(4 if gap == "settle" else 1)]
            for t in threads:
                t.start()
            time.sleep(0.01)   # the workers go first
            big = c.allreduce(np.full(64, 1.0), algorithm="shm")   # its slot is the first Request's
            for t in threads:
                t.join()
            for k in range(len(threads), 4):
                wait(k)
            check(same(big, np.full(64, float(p))), f"iteration {it}: the main thread's {big[:3]}")
            for k in range(4):
                check(same(got[k], np.full(16, sum(q + k + it for q in range(p)) * 1.0)), f"iteration {it}: {k}")
    c.free()


def test_a_late_rank_times_out_where_the_windows_open(comm):
    """Abort off, the last rank comes late to the first "shm" call (which opens the shared-memory windows): the others
    time out in it, and so does the late rank, whose exchange pairs with the one they left to MPI (before 2026-12-05 it
    then waited in MPI_Comm_split_type for ever, unwatched; found by a helper)."""
    if comm.size not in (2, 3, 4):   # each case waits out a deadline: shown at 2-4 ranks
        pytest.skip("a timeout's case: shown at 2, 3 and 4 ranks")
    c = pc.Communicator(comm.mpi, timeout=60, abort_on_timeout=False)
    late = comm.size - 1
    c.allreduce(np.ones(3), algorithm="ring")
    short_deadline(c)
    if comm.rank == late:
        wait_for_the_others(comm)
    try:
        c.allreduce(np.ones(6), algorithm="shm")
        timed_out = ""
    except pc.CollectiveTimeout as e:
        timed_out = str(e)
    if comm.rank != late:
        tell_the_late_rank(comm, late)
    comm.mpi.Barrier()
    with verdicts(comm) as check:
        check("allreduce #2" in timed_out, f"no timeout: {timed_out!r}")
        c.free()


def test_a_late_rank_times_out_where_its_slot_grows_and_every_rank_frees(comm):
    """Abort off, the last rank late to an "shm" call that grows its slot: the others time out in its agreement and
    free(); the late rank's agreement pairs with theirs, and it grew its slot (MPI's window call, collective and
    unwatched) while they freed theirs: both waited for ever (found by a helper). Every rank meets first now,
    watched: the late rank times out there too, and free() goes ahead on every rank."""
    if comm.size not in (2, 3, 4):   # each case waits out a deadline: shown at 2-4 ranks
        pytest.skip("a timeout's case: shown at 2, 3 and 4 ranks")
    c = pc.Communicator(comm.mpi, timeout=60, abort_on_timeout=False)
    c.allreduce(np.ones(8), algorithm="shm")   # the windows open, slots of a page
    short_deadline(c)
    late = comm.size - 1
    if comm.rank == late:
        wait_for_the_others(comm)
    try:
        c.allreduce(np.ones(100_000), algorithm="shm")   # its slot must grow
        timed_out = ""
    except pc.CollectiveTimeout as e:
        timed_out = str(e)
    if comm.rank != late:
        tell_the_late_rank(comm, late)
    c.free()
    comm.mpi.Barrier()
    agree(comm, "allreduce #2" in timed_out, f"no timeout: {timed_out!r}")


@pytest.mark.parametrize("algorithm", ["ring", "pairwise", "recursive_halving"])
def test_abort_off_copies_keep_a_reduce_scatter_in_place(comm, algorithm):
    """With abort off every call runs on copies; an out that is x's own block stays x's copy's block, so the call runs
    in place as it does on the caller's arrays, to the bit (a copy apart ran out of place: complex products, whose
    operand order shows in the last bit, differed; found by a helper)."""
    r, p = comm.rank, comm.size
    private = pc.Communicator(comm.mpi, timeout=60, abort_on_timeout=False)
    with verdicts(comm) as check:
        for seed in range(40):
            rng = np.random.default_rng([seed, r])
            x = (rng.standard_normal(p) + 1j * rng.standard_normal(p)).astype(np.complex64)
            y = x.copy()
            plain = comm.reduce_scatter(x, op="prod", algorithm=algorithm, out=x[r:r + 1])
            copied = private.reduce_scatter(y, op="prod", algorithm=algorithm, out=y[r:r + 1])
            check(plain.tobytes() == copied.tobytes() and x.tobytes() == y.tobytes(), f"seed {seed}: {plain} {copied}")
    private.free()


@pytest.mark.parametrize("algorithm, blocking", [("mpi", True), ("mpi", False), ("ring", True), ("auto", False)])
def test_a_call_that_timed_out_breaks_the_communicator_off(comm, algorithm, blocking):
    """Abort off, the last rank skips a call and the others time out in it: each of them then refuses every later call
    on that Communicator, collective or message, naming the call; MPI was handed copies, so nothing is written into
    the caller's out, at the raise or after, when the late rank's next call pairs with the one left to MPI; free()
    goes ahead. Before 2026-12-05 the ranks that caught the timeout ran on: MPI's own allreduce paired with the
    late rank's next call and all returned wrong sums, and the exchange of counts of an iallgather paired and handed
    back the other call's data; MPI wrote the late peers' result into out after the exception."""
    if comm.size not in (2, 3, 4):   # each case waits out a deadline: shown at 2-4 ranks
        pytest.skip("a timeout's case: shown at 2, 3 and 4 ranks")
    c = pc.Communicator(comm.mpi, timeout=60, abort_on_timeout=False)
    late = comm.size - 1
    x = np.full(5, comm.rank + 1.0)
    collective = "allgather" if algorithm == "auto" else "allreduce"   # auto without counts: the exchange first
    shape = (5 * comm.size,) if collective == "allgather" else (5,)
    out = np.full(shape, -7.0)
    with verdicts(comm) as check:
        check(same(c.allreduce(x, algorithm=algorithm), np.full(5, comm.size * (comm.size + 1) / 2)), "call #1")
        short_deadline(c)
        if comm.rank != late:
            call = getattr(c, collective if blocking else "i" + collective)
            try:
                request = call(x, algorithm=algorithm, out=out)
                if not blocking:
                    request.wait()
                timed_out = ""
            except pc.CollectiveTimeout as e:
                timed_out = str(e)
            tell_the_late_rank(comm, late)
            check(f"{collective} #2 (" in timed_out, f"no timeout: {timed_out!r}")
            check(bool((out == -7.0).all()), "out written at the timeout")
            for later in (lambda: c.allreduce(x, algorithm=algorithm), lambda: c.iallgather(x),
                          lambda: c.send(x, late), lambda: c.irecv(out, late), lambda: c.barrier()):
                try:
                    later()
                    refused = ""
                except RuntimeError as e:
                    refused = str(e)
                check(f"takes no more calls on this rank: {collective} #2 (" in refused, f"not refused: {refused!r}")
        else:   # once the others timed out, the late rank's next call pairs with the one they left to MPI
            wait_for_the_others(comm)
            try:   # non-blocking: a wait that timed out is not waited again by free() (it raised the timeout again)
                if blocking:
                    getattr(c, collective)(x, algorithm=algorithm)
                else:
                    getattr(c, "i" + collective)(x, algorithm=algorithm).wait()
            except pc.CollectiveTimeout:
                pass
        comm.mpi.Barrier()
        drive_progress(comm)
        check(comm.rank == late or bool((out == -7.0).all()), "out written after the timeout")
        check(c.in_flight() == 0, f"in flight: {c.in_flight()}")
        c.free()


@pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning")
def test_array_subclasses_memmap_passes_matrix_and_masked_refused(comm, tmp_path_factory):
    """np.memmap (and np.recarray) move as the arrays they are, through every algorithm; np.matrix (its views stay
    two-dimensional: the schedules' flat views of it were not flat, and the job ended in a pairing error that
    blamed the ranks' shapes) and masked arrays (whose mask would be left behind) are refused naming the argument,
    x or out, on every rank, nothing written. The mpi4py face reads a subclass's memory, as mpi4py does."""
    r, p = comm.rank, comm.size
    base = np.arange(6.0 * p).reshape(2 * p, 3) + r                                 # (2p, 3)
    path = tmp_path_factory.mktemp(f"memmap{r}")
    with verdicts(comm) as check:
        for collective in ("allreduce", "allgather", "alltoall", "broadcast"):
            want = getattr(comm, collective)(base, algorithm="mpi")
            for algorithm in pc.algorithms(collective):
                x = np.memmap(path / f"{collective}-{algorithm}-x", np.float64, "w+", shape=base.shape)
                x[...] = base
                out = np.memmap(path / f"{collective}-{algorithm}-out", np.float64, "w+", shape=want.shape)
                got = getattr(comm, collective)(x.view(np.recarray) if algorithm == "auto" else x, algorithm=algorithm,
                                                out=out)
                check(got is out and same(out, want), f"{collective} {algorithm}: a memmap's result differs")
        plain = np.zeros((p, 3))
        for name, call in (("x", lambda: comm.allreduce(np.matrix(base), algorithm="ring")),
                           ("out", lambda: comm.allgather(base[:1], out=np.matrix(plain))),
                           ("x", lambda: comm.allreduce(np.ma.masked_array(base, mask=base > 3))),
                           ("out", lambda: comm.allreduce(base, out=np.ma.masked_array(np.zeros_like(base))))):
            try:
                call()
                said = ""
            except TypeError as e:
                said = str(e)
            check(f": {name} is a " in said and ("numpy.matrix" in said or "masked array" in said),
                  f"{name}: raised {said!r}")
        check(not plain.any(), "a refused call wrote into the caller's array")
        face = pc.mpi4py(comm.mpi)   # mpi4py reads a subclass's memory as it lies: so does the face
        for x in (np.matrix(base), np.ma.masked_array(base, mask=base > 3)):
            got, want = np.matrix(np.zeros_like(base)), np.zeros_like(base)
            face.Allreduce(x, got, op=MPI.SUM)
            comm.mpi.Allreduce(x, want, op=MPI.SUM)
            check(same(np.asarray(got), want), f"the face's Allreduce of a {type(x).__name__}")
        face.pycollect.free()



def test_groups_freed_on_their_own_leave_their_makers_list(comm):
    """A group freed on its own (free(), a with block) leaves its maker's list of groups, which free() walks: it kept
    every one (15 KB each, and in_flight() walked them all: 2 ms after 2000 splits; found by a helper). A group kept
    is still freed with its maker."""
    c = pc.Communicator(comm.mpi)
    for _ in range(20):
        c.split(0).free()
        with c.split(comm.rank % 2) as h:
            h.allreduce(np.ones(2))
        outer = c.split(0)
        outer.split(0).free()
        outer.free()
    kept = c.split(0)
    agree(comm, c._groups == [kept], f"{len(c._groups)} groups kept")
    c.free()
    agree(comm, kept._freed, "the group kept was not freed with its maker")


def test_free_of_a_face_over_the_world_is_refused_before_anything_is_freed(comm):
    """mpi4py refuses to free a predefined communicator, and the face's Free says nothing is freed then; with a
    dropped call in flight it freed its pycollect Communicator first, and every later call was refused (found by a
    helper)."""
    import gc
    face = pc.mpi4py(comm.mpi)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        face.Iallreduce(np.ones(4), np.zeros(4))   # its Request dropped
        gc.collect()
    with pytest.raises(MPI.Exception):
        face.Free()
    y = np.zeros(4)
    face.Allreduce(np.ones(4), y)
    agree(comm, same(y, np.full(4, float(comm.size))), f"after the refused Free: {y}")
    face.pycollect.free()


@pytest.mark.parametrize("validate", [False, True])
def test_recv_displs_refused_on_one_rank_after_the_exchange_leave_no_rank_waiting(comm, validate):
    """alltoall with a row of counts: recv_displs (and out with them) are judged once the exchange told every rank's
    rows to this one, by this rank alone (they are its own, as MPI's are). The last rank's overlapping ones raised
    there and the others waited in the call for ever, validation mode too (found by a helper). That rank now takes
    part with its result into scratch and raises after: the others get their right rows, its out is untouched, and
    every rank goes on in step."""
    c = pc.Communicator(comm.mpi, validate=validate)
    r, p = comm.rank, comm.size
    last = r == p - 1
    x = np.arange(2.0 * p) + 100 * r
    want = mpi_alltoall(comm.mpi, x, [2] * p)
    with verdicts(comm) as check:
        for blocking in (True, False):
            out = np.full(2 * p, -1.0)
            displs = [0] * p if last and p > 1 else [2 * q for q in range(p)]
            try:
                call = c.alltoall if blocking else c.ialltoall
                got = call(x, counts=[2] * p, recv_displs=displs, out=out)
                got = got if blocking else got.wait()
                check(not (last and p > 1) and got is out and same(out, want), f"blocking {blocking}: {out}")
            except ValueError as e:
                check(last and "recv_displs overlap" in str(e) and (out == -1.0).all(), f"{e}; out {out}")
        after = c.allreduce(np.full(3, r + 1.0), algorithm="ring")
        check(same(after, np.full(3, p * (p + 1) / 2)), f"the next call: {after}")
    c.free()

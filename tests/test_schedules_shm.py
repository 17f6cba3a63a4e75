"""The shared-memory window schedules ("shm"), simulated for every rank, and the simulator's window checks."""
import numpy as np
import pytest

import pycollect as pc
from pycollect.algorithms.registry import all_schedules
from pycollect.engine.schedule import Copy, Recv, Round, Schedule, Send, Slice
from pycollect.engine.simulate import ScheduleError, simulate
from pycollect.engine.topology import Topology
from simharness import check, make_problem

FALLBACK = {"allreduce": "ring", "reduce_scatter": "ring", "allgather": "ring", "alltoall": "pairwise",
            "broadcast": "binomial"}
SIZES = range(1, 10)


def lengths(size):
    return sorted({0, 1, max(size - 1, 0), size, size + 1, 13, 100})


@pytest.mark.parametrize("collective", ["allreduce", "reduce_scatter", "allgather", "broadcast"])
def test_even_and_short_vectors(collective):
    for size in SIZES:
        for n in lengths(size):
            for inplace in (False, True):
                ops = ("sum", "max", "bxor") if collective in ("allreduce", "reduce_scatter") else ("sum",)
                for op in ops:
                    for root in ({0, size - 1} if collective == "broadcast" else {0}):
                        prob = make_problem(collective, size, n=n, root=root, windows=True)
                        check(collective, "shm", prob, op=op, inplace=inplace)


@pytest.mark.parametrize("collective", ["reduce_scatter", "allgather"])
def test_uneven_blocks(collective):
    rng = np.random.default_rng(3)
    for size in SIZES:
        for _ in range(4):
            counts = rng.integers(0, 4, size).tolist()   # zeros and blocks shorter than the world
            check(collective, "shm", make_problem(collective, size, counts=counts, windows=True), inplace=False)
            check(collective, "shm", make_problem(collective, size, counts=counts, windows=True), inplace=True)


def test_alltoall_matrices_in_and_out_of_place():
    rng = np.random.default_rng(5)
    for size in SIZES:
        for n in lengths(size):
            for inplace in (False, True):
                check("alltoall", "shm", make_problem("alltoall", size, n=n * size, windows=True), inplace=inplace)
        m = rng.integers(0, 4, (size, size))
        check("alltoall", "shm", make_problem("alltoall", size, matrix=m.tolist(), windows=True))
        sym = (m + m.T).tolist()   # in place needs every rank's in and out of one length
        check("alltoall", "shm", make_problem("alltoall", size, matrix=sym, windows=True), inplace=True)


@pytest.mark.parametrize("collective", sorted(FALLBACK))
def test_without_windows_it_is_the_message_schedule(collective):
    """Ranks on several nodes, or device buffers: the schedule of the named message algorithm, exactly."""
    for topo in (Topology.uniform(4, 2), Topology.single_node(4)):
        prob = make_problem(collective, 4, n=40, topology=topo, windows=False)
        assert all_schedules(collective, "shm", prob) == all_schedules(collective, FALLBACK[collective], prob)
    windowed = all_schedules(collective, "shm", make_problem(collective, 4, n=40, windows=True))
    assert any(rnd.window for s in windowed for rnd in s.rounds)


def test_traffic_counts_each_read_once_on_the_intra_node_tier():
    """A read from a peer's window is that peer's intra-node traffic; publishing is a copy."""
    size, nbytes = 4, 4 * 4000
    t = pc.traffic("allgather", "shm", size=size, nbytes=nbytes)
    block = nbytes // size
    assert all(r.bytes_sent == (size - 1) * block for r in t.per_rank)
    assert t.bytes_by_tier()["intra-node"] == size * (size - 1) * block and t.rounds == 1
    a = pc.traffic("allreduce", "shm", size=size, nbytes=nbytes)
    assert a.max_bytes_sent == 2 * (size - 1) * block and a.rounds == 2   # as much as the ring, in 2 rounds
    ring = pc.traffic("allreduce", "ring", size=size, nbytes=nbytes)
    assert a.max_bytes_sent == ring.max_bytes_sent and ring.rounds == 2 * (size - 1)
    two_nodes = pc.traffic("allgather", "shm", size=size, nbytes=nbytes, topology=Topology.uniform(size, 2))
    assert two_nodes.rounds == size - 1   # no shared window across nodes: the ring


def test_allreduce_on_several_nodes_reduces_in_windows_and_rings_across():
    """On uniform nodes the shm allreduce is the hierarchical one with its two intra-node phases as window rounds:
    its result on every kind of topology, and its inter-node traffic exactly the hierarchical allreduce's."""
    tops = [Topology.uniform(4, 2), Topology.uniform(4, 2, by_block=False), Topology.uniform(6, 3),
            Topology.uniform(8, 4), Topology.uniform(6, 2), Topology.uniform(9, 3, by_block=False),
            Topology.uniform(3, 1), Topology.from_labels([0, 0, 1, 1, 1])]
    for top in tops:
        for n in (0, 1, 2, top.size - 1, 13, 100):
            for inplace in (False, True):
                for op in ("sum", "max"):
                    check("allreduce", "shm", make_problem("allreduce", top.size, n=n, topology=top, windows=True),
                          op=op, inplace=inplace)
    nbytes, top = 4 * 6000, Topology.uniform(12, 4)
    shm = pc.traffic("allreduce", "shm", size=12, nbytes=nbytes, topology=top)
    hier = pc.traffic("allreduce", "hierarchical", size=12, nbytes=nbytes, topology=top)
    assert shm.bytes_by_tier()["inter-node"] == hier.bytes_by_tier()["inter-node"] > 0
    assert shm.rounds == 2 + 2 * (3 - 1)           # two window rounds around the ring of 3 nodes
    for uneven in (Topology.from_labels([0, 0, 1, 1, 1]), Topology.uniform(3, 1)):   # the ring instead
        p = make_problem("allreduce", uneven.size, n=30, topology=uneven, windows=True)
        assert all_schedules("allreduce", "shm", p) == all_schedules("allreduce", "ring", p)


def _pair(rounds0, rounds1, win=4):
    return [Schedule(tuple(rounds0), win=win), Schedule(tuple(rounds1), win=win)]


def _run(scheds):
    x = [np.arange(4.0), np.arange(4.0) + 10]
    simulate(scheds, x, [np.zeros(4), np.zeros(4)], np.add)


def test_simulator_checks_windows():
    s0, r1 = Slice("in", 0, 2), Slice("out", 0, 2)
    publish = Round(sends=(Send(1, s0, at=0),), window=True)
    read = Round(recvs=(Recv(0, r1, at=0),), window=True)
    _run(_pair([publish], [read]))
    with pytest.raises(ScheduleError, match="did not publish"):
        _run(_pair([publish], [Round(recvs=(Recv(0, r1, at=1),), window=True)]))
    with pytest.raises(ScheduleError, match="may still read"):
        _run(_pair([publish, publish], [read, read]))
    with pytest.raises(ScheduleError, match="outside its window"):
        _run(_pair([Round(sends=(Send(1, Slice("in", 0, 4), at=2),), window=True)], [read]))
    with pytest.raises(ScheduleError, match="deadlock"):
        _run(_pair([publish], [read, Round(window=True)]))   # rank 0 never reaches the second fence
    with pytest.raises(ScheduleError, match="mixes"):
        _run(_pair([Round(sends=(Send(1, s0, at=0), Send(1, s0)), window=True)], [read]))
    with pytest.raises(ScheduleError, match="not a window round"):
        _run(_pair([Round(sends=(Send(1, s0, at=0),))], [read]))
    with pytest.raises(ScheduleError, match="differently"):
        _run([Schedule((publish,), win=4), Schedule((read,), win=8)])


def test_simulator_checks_lent_inputs():
    """A rank that lends its input (read where it lies) must not write over it before the next fence, and a
    from_input round must be one on every rank."""
    s0, r1 = Slice("in", 0, 2), Slice("out", 0, 2)
    publish = Round(sends=(Send(1, s0, at=0),), window=True, from_input=True)
    read = Round(recvs=(Recv(0, r1, at=0),), window=True, from_input=True)
    lent = [Schedule((publish,), win=4, lends=True), Schedule((read,), win=4, lends=True)]
    _run(lent)
    clobber = Round(pre=(Copy(Slice("in", 2, 4), Slice("in", 0, 2)),))   # writes the lent range, no fence between
    with pytest.raises(ScheduleError, match="writes over its input"):
        _run([Schedule((publish, clobber), win=4, lends=True), lent[1]])
    _run([Schedule((publish, clobber), win=4, lends=False), lent[1]])    # published, not lent: allowed
    with pytest.raises(ScheduleError, match="is not from_input"):
        _run([lent[0], Schedule((Round(recvs=read.recvs, window=True),), win=4)])
    with pytest.raises(ScheduleError, match="not its input at its own offset"):
        _run([Schedule((Round(sends=(Send(1, s0, at=1),), window=True, from_input=True),), win=4), lent[1]])


def test_alltoall_in_place_does_not_lend_its_input():
    """In place, the all-to-all's reads write over its input: lending it would let peers read overwritten data,
    which the simulator finds when the schedule is made to lend it."""
    import dataclasses

    from pycollect.algorithms import alltoall_shm
    prob = make_problem("alltoall", 3, n=6, windows=True)
    scheds = [alltoall_shm.schedule(dataclasses.replace(prob, rank=r)) for r in range(3)]
    assert not any(s.lends for s in scheds)
    x = [np.arange(6.0) + 10 * r for r in range(3)]
    with pytest.raises(ScheduleError, match="writes over its input"):
        simulate([dataclasses.replace(s, lends=True) for s in scheds], x, x, np.add)
    assert all(s.lends for s in (alltoall_shm.schedule(dataclasses.replace(prob, rank=r, aliased=False))
                                 for r in range(3)))

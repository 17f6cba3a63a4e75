"""The engine without MPI: layouts, topology, the ring schedules, pc.traffic and the selector."""
import os
import json

import ml_dtypes
import numpy as np
import pytest

import pycollect as pc
import simharness as h
from pycollect.engine.pairing import LiveTags, stray_call
from pycollect.engine.layout import MAX_PIECES, block_ranges, ceil_log2, even_ranges, offsets, pieces, split_even
from pycollect.engine.schedule import Recv, Round, Schedule, Send, Slice
from pycollect.select import Selector, load_tuning
from pycollect.engine.simulate import ScheduleError, simulate
from pycollect.engine.topology import Topology

SIZES = list(range(1, 13)) + [16]


@pytest.mark.parametrize("n", [0, 1, 5, 8, 13])
@pytest.mark.parametrize("parts", [1, 2, 3, 8])
def test_split_even_first_blocks_longer(n, parts):
    counts = split_even(n, parts)
    assert sum(counts) == n and len(counts) == parts
    assert all(c == n // parts + (i < n % parts) for i, c in enumerate(counts))
    starts = [sum(counts[:i]) for i in range(parts + 1)]                # by hand, not with the library's helpers
    assert list(offsets(counts)) == starts
    by_hand = [(3 + a, 3 + b) for a, b in zip(starts, starts[1:])]
    assert even_ranges(3, 3 + n, parts) == block_ranges(counts, 3) == by_hand


@pytest.mark.parametrize("n", [0, 1, 5, MAX_PIECES, MAX_PIECES + 1, 3 * MAX_PIECES * 7 + 5, 10 ** 7 + 3])
def test_pieces_cover_the_message_in_at_most_max_pieces(n):
    """Consecutive pieces from 0 to n of ``seg`` elements each (the last shorter) while that makes at most MAX_PIECES;
    finer settings are raised to n / MAX_PIECES (one byte cut 64 MiB into 16 million pieces)."""
    for seg in (0, 1, 2, 7, 1000, n, n + 1):
        p = pieces(n, seg)
        assert p[0][0] == 0 and p[-1][1] == n and all(a[1] == b[0] for a, b in zip(p, p[1:])), (n, seg)
        assert 1 <= len(p) <= MAX_PIECES and all(b > a for a, b in p[:-1]), (n, seg)
        if 0 < seg < n and n <= seg * MAX_PIECES:
            assert {b - a for a, b in p[:-1]} <= {seg} and len(p) == -(-n // seg), (n, seg)
        elif 0 < seg < n:
            assert len(p) == MAX_PIECES or len(p) == -(-n // -(-n // MAX_PIECES)), (n, seg)


def test_trees_of_one_element_segments_cut_at_most_max_pieces_and_reduce_right():
    rounds = pc.traffic("allreduce", "tree", size=8, nbytes=64 << 20, tree_segment_bytes=1).rounds
    assert MAX_PIECES <= rounds <= MAX_PIECES + 2 * 3, rounds   # S + 2 ceil(log2 N) - 1 rounds
    for collective, algorithm in (("allreduce", "tree"), ("reduce", "binomial"), ("broadcast", "binomial")):
        h.check(collective, algorithm, h.make_problem(collective, 3, n=MAX_PIECES * 2 + 1, tree_segment=1))


def test_offsets_and_block_ranges_by_hand():
    assert tuple(offsets((2, 0, 3))) == (0, 2, 2, 5) and tuple(offsets(())) == (0,)
    assert block_ranges((2, 0, 3), 5) == [(5, 7), (7, 7), (7, 10)]


def test_topology_tiers_and_ring_order():
    t = Topology.uniform(6, 3, by_block=False)          # nodes (0,2,4), (1,3,5)
    assert t.nodes == ((0, 2, 4), (1, 3, 5)) and t.num_nodes == 2 and t.ranks_per_node == 3
    assert t.tier(0, 0) == "self" and t.tier(0, 2) == "intra-node" and t.tier(0, 1) == "inter-node"
    assert t.ring_order == (0, 2, 4, 1, 3, 5)
    crossings = sum(t.tier(t.ring_order[i], t.ring_order[(i + 1) % 6]) == "inter-node" for i in range(6))
    assert crossings == 2
    assert Topology.from_labels([7, 7, 3, 3]) == Topology((0, 0, 1, 1))
    with pytest.raises(ValueError, match="numbered"):
        Topology((1, 0))


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("n", [0, 1, 2, 7, 13, 100])
def test_ring_schedules_match_reference(size, n):
    for topo in (None, Topology.uniform(size, 2, by_block=False)):
        for inplace in (False, True):
            h.check("allreduce", "ring", h.make_problem("allreduce", size, n=n, topology=topo), inplace=inplace)
        for op in ("sum", "max", "bxor"):
            h.check("reduce_scatter", "ring", h.make_problem("reduce_scatter", size, n=n, topology=topo), op=op)
        h.check("allgather", "ring", h.make_problem("allgather", size, n=n, topology=topo))
    counts = [(7 * i + n) % 4 for i in range(size)]
    h.check("reduce_scatter", "ring", h.make_problem("reduce_scatter", size, counts=counts))
    h.check("allgather", "ring", h.make_problem("allgather", size, counts=counts))


@pytest.mark.parametrize("size", [2, 3, 4, 5, 8, 16])
def test_ring_allreduce_traffic_is_textbook(size):
    """Each rank sends 2(N-1)/N of the data in 2(N-1) rounds (Patarasuk and Yuan)."""
    nbytes = size * 4 * 1000
    t = pc.traffic("allreduce", "ring", size=size, nbytes=nbytes)
    for r in t.per_rank:
        assert r.bytes_sent == r.bytes_recv == 2 * (size - 1) * nbytes // size
        assert r.rounds == 2 * (size - 1) and r.messages_sent == 2 * (size - 1)
    assert t.total_bytes == 2 * (size - 1) * nbytes


@pytest.mark.parametrize("size", [2, 3, 5, 8])
def test_ring_reduce_scatter_and_allgather_traffic(size):
    nbytes = size * 8 * 10
    for coll in ("reduce_scatter", "allgather"):
        t = pc.traffic(coll, "ring", size=size, nbytes=nbytes, dtype="float64")
        assert t.rounds == size - 1
        assert all(r.bytes_sent == (size - 1) * nbytes // size for r in t.per_rank)


def test_ring_traffic_by_tier_crosses_each_node_once():
    topo = Topology.uniform(8, 4, by_block=False)        # ring order groups each node's ranks
    t = pc.traffic("allreduce", "ring", size=8, nbytes=8 * 4 * 100, topology=topo)
    per_message = 4 * 100
    # 2 links of the ring cross nodes; each carries 2(N-1) messages of n/N elements
    assert t.bytes_by_tier()["inter-node"] == 2 * 2 * (8 - 1) * per_message
    assert t.bytes_by_tier()["intra-node"] == (8 - 2) * 2 * (8 - 1) * per_message


def test_traffic_rejects_what_it_cannot_walk():
    with pytest.raises(ValueError, match="algorithm must be one of"):
        pc.traffic("allreduce", "mpi", size=4, nbytes=64)
    with pytest.raises(ValueError, match="topology has 2 ranks"):
        pc.traffic("allreduce", "ring", size=4, nbytes=64, topology=Topology.single_node(2))
    with pytest.raises(ValueError, match=r"nbytes must be below 2\*\*62"):   # int64 block tables: wrong from 2**63
        pc.traffic("reduce_scatter", "pairwise", size=5, nbytes=2**62)
    big = pc.traffic("reduce_scatter", "pairwise", size=5, nbytes=5 * 2**59)   # exact below the bound
    assert (big.max_bytes_sent, big.total_bytes) == (4 * 2**59, 5 * 4 * 2**59)


@pytest.mark.parametrize("collective", ["allreduce", "reduce_scatter", "allgather", "alltoall", "broadcast", "reduce"])
def test_every_algorithm_registered_and_round_counts_positive(collective):
    names = pc.algorithms(collective)
    assert names[:2] == ("auto", "mpi") and len(names) >= 3
    for name in names[2:]:
        t = pc.traffic(collective, name, size=5, nbytes=4 * 1000)
        assert t.rounds >= 1 and t.total_bytes > 0


def test_simulator_reports_deadlock_and_mismatch():
    topo = Topology.single_node(2)
    both_recv = [Schedule((Round(recvs=(Recv(1 - r, Slice("out", 0, 1)),)),)) for r in range(2)]
    x = [np.zeros(1), np.zeros(1)]
    with pytest.raises(ScheduleError, match="deadlock"):
        simulate(both_recv, x, [np.zeros(1), np.zeros(1)], np.add)
    sizes = [Schedule((Round(sends=(Send(1, Slice("in", 0, 1)),)),)),
             Schedule((Round(recvs=(Recv(0, Slice("out", 0, 0)),)),))]
    with pytest.raises(ScheduleError, match="matched a send of 1"):
        simulate(sizes, x, [np.zeros(1), np.zeros(1)], np.add)
    assert topo.size == 2


def test_selector_table_env_and_file(tmp_path, monkeypatch):
    monkeypatch.delenv("PYCOLLECT_ALGO_ALLREDUCE", raising=False)
    monkeypatch.delenv("PYCOLLECT_TUNING", raising=False)
    s = Selector(size=2)
    assert s.choose("allreduce", 8) == "mpi" and s.choose("allreduce", 1 << 30) == "ring"
    assert Selector(size=4).choose("allreduce", 1 << 30) == "shm"
    assert Selector(size=4).choose("allreduce", 12 << 20) == "rabenseifner"
    assert Selector(size=4, multi_node=True).choose("reduce_scatter", 1 << 30) == "recursive_halving"
    assert Selector(size=4, multi_node=True).choose("broadcast", 1 << 30) == "mpi"
    assert Selector(multi_node=True).choose("allreduce", 1 << 30) == "hierarchical"
    f = tmp_path / "t.json"
    f.write_text(json.dumps({"table": {"alltoall": [[100, "bruck"], [None, "pairwise"]]}}))
    assert load_tuning(str(f))["alltoall"][0] == [100, "bruck"]
    assert Selector(str(f)).choose("alltoall", 101) == "pairwise"
    for bad, msg in ([{"alltoall": [[100, "bruck"]]}, "end with a row"], [{"gossip": [[None, "x"]]}, "unknown collective"],
                     [{"alltoall": [["x", "bruck"]]}, "is not"]):
        f.write_text(json.dumps(bad))
        with pytest.raises(ValueError, match=msg):
            load_tuning(str(f))
    monkeypatch.setenv("PYCOLLECT_ALGO_ALLGATHER", "bruck")
    assert Selector().choose("allgather", 1 << 30) == "bruck"


def test_ceil_log2():
    assert [ceil_log2(n) for n in (1, 2, 3, 4, 5, 8, 9)] == [0, 1, 2, 2, 3, 3, 4]


def test_cuda_aware_detection(monkeypatch):
    from mpi4py import MPI

    from pycollect.engine import backend
    monkeypatch.setenv("PYCOLLECT_CUDA_AWARE", "1")
    assert backend.cuda_aware(MPI) is True
    monkeypatch.setenv("PYCOLLECT_CUDA_AWARE", "yes")
    with pytest.raises(ValueError, match="PYCOLLECT_CUDA_AWARE must be 0 or 1"):
        backend.cuda_aware(MPI)
    monkeypatch.delenv("PYCOLLECT_CUDA_AWARE")
    assert backend.cuda_aware(MPI) is False   # the MPICH wheel is built without CUDA


def test_mpi_algorithm_calls_the_regular_collective_for_even_blocks():
    """MPICH's v-forms run slower algorithms: even blocks must go to MPI_Allgather and its kin."""
    from pycollect.engine import mpi_native
    assert mpi_native._vector((4, 4, 4)) is None and mpi_native._vector((0, 0)) is None
    assert mpi_native._vector((3, 2, 2)) == ([3, 2, 2], [0, 3, 5])
    assert mpi_native._alltoall_vectors(((2, 2), (2, 2)), 1) is None
    send, received = mpi_native._alltoall_vectors(((1, 2), (3, 4)), 1)
    assert send == ([3, 4], [0, 3]) and received == ([2, 4], [0, 2])
    assert [mpi_native.mpi_call(c, e) for c, e in [("allgather", True), ("allgather", False),
                                                   ("reduce_scatter", True), ("alltoall", True)]] == [
        "Allgather", "Allgatherv", "Reduce_scatter_block", "Alltoall"]


def test_overlap_is_decided_by_the_node_s_cores_not_the_binding():
    """Two ranks, each bound to one core by its launcher, still have a core each: segments overlap."""
    import os
    import shutil
    import subprocess
    import sys
    if shutil.which("taskset") is None or (os.cpu_count() or 1) < 2:
        pytest.skip("needs taskset and two cores")
    code = "import pycollect as pc; c = pc.Communicator(); print(c._runner.overlap); c.free()"
    proc = subprocess.run(["mpiexec", "-n", "2", "taskset", "-c", "0", sys.executable, "-c", code],
                          capture_output=True, text=True, timeout=120, env=dict(os.environ, OMP_NUM_THREADS="1"))
    # the two ranks' lines may interleave: count the verdicts
    assert proc.returncode == 0 and proc.stdout.count("True") == 2 and "False" not in proc.stdout, proc.stdout + proc.stderr


def test_environment_parsers_say_name_what_and_got():
    """engine/environment.py: every parser's error reads ``NAME must be ..., got 'text'``; unset gives the default."""
    from pycollect.engine import environment as env
    bad = [(lambda e: env.switch("PYCOLLECT_X", False, "0 or 1", e), "yes"),
           (lambda e: env.nbytes("PYCOLLECT_X", 7, e), "4M"),
           (lambda e: env.seconds("PYCOLLECT_X", e), "-1"),
           (lambda e: env.algorithm("PYCOLLECT_X", ("ring", "tree"), e), "fast")]
    for parse, text in bad:
        with pytest.raises(ValueError, match=rf"^PYCOLLECT_X must .*, got '{text}'$"):
            parse({"PYCOLLECT_X": text})
    assert [parse({}) for parse, _ in bad] == [False, 7, None, None]
    assert env.switch("PYCOLLECT_X", None, "0 or 1", {"PYCOLLECT_X": "1"}) is True
    assert env.nbytes("PYCOLLECT_X", 7, {"PYCOLLECT_X": "0"}) == 0
    assert env.directory("PYCOLLECT_X", {"PYCOLLECT_X": "rel"}) == os.path.abspath("rel")


def test_the_trees_segments_keep_their_old_names_with_a_warning():
    """PYCOLLECT_PIPELINE_BYTES and pipeline_bytes= still work (now PYCOLLECT_TREE_SEGMENT_BYTES and
    tree_segment_bytes=: "pipeline" names pipeline parallelism alone), each with a DeprecationWarning."""
    import pycollect as pc
    from pycollect.engine import environment as env
    with pytest.warns(DeprecationWarning, match="PYCOLLECT_PIPELINE_BYTES is now PYCOLLECT_TREE_SEGMENT_BYTES"):
        assert env.tree_segment_bytes(7, {"PYCOLLECT_PIPELINE_BYTES": "4096"}) == 4096
    assert env.tree_segment_bytes(7, {"PYCOLLECT_TREE_SEGMENT_BYTES": "64", "PYCOLLECT_PIPELINE_BYTES": "4096"}) == 64
    assert env.tree_segment_bytes(7, {}) == 7
    new = pc.traffic("allreduce", "tree", size=5, nbytes=1 << 16, tree_segment_bytes=4096)
    with pytest.warns(DeprecationWarning, match="pipeline_bytes is now tree_segment_bytes"):
        old = pc.traffic("allreduce", "tree", size=5, nbytes=1 << 16, pipeline_bytes=4096)
    assert old.summary() == new.summary() != pc.traffic("allreduce", "tree", size=5, nbytes=1 << 16).summary()


def test_traffic_cuts_the_trees_as_a_call_does(monkeypatch):
    """pc.traffic's segmented trees by default as a Communicator's call runs them (1 MiB, or
    PYCOLLECT_TREE_SEGMENT_BYTES): a binomial broadcast of 3 MiB + 20 B on 4 ranks sends 4 segments to each of
    rank 0's two children; it counted them whole (2 messages) before 2026-12-04, where the run sends 8."""
    import pycollect as pc
    from pycollect.settings import read
    nbytes = 3 * (1 << 20) + 20
    call = read().tree_segment_bytes
    assert call == 1 << 20
    assert pc.traffic("broadcast", "binomial", 4, nbytes).per_rank[0].messages_sent == 8
    assert pc.traffic("broadcast", "binomial", 4, nbytes, tree_segment_bytes=0).per_rank[0].messages_sent == 2
    monkeypatch.setenv("PYCOLLECT_TREE_SEGMENT_BYTES", str(1 << 21))
    assert read().tree_segment_bytes == 1 << 21
    assert pc.traffic("broadcast", "binomial", 4, nbytes).per_rank[0].messages_sent == 4


def test_every_nonblocking_call_takes_its_blocking_twins_arguments():
    """Issue 16: an i-call accepts exactly the blocking call's parameters (names, order, defaults); only the return
    annotation differs (a Request)."""
    import inspect
    from pycollect.comm import Communicator
    twins = [name for name in dir(Communicator) if name.startswith("i") and hasattr(Communicator, name[1:])
             and callable(getattr(Communicator, name))]
    assert {"iallreduce", "ireduce_scatter", "iallgather", "ialltoall", "ibroadcast", "ireduce", "isend"} <= set(twins)
    for name in twins:
        blocking = inspect.signature(getattr(Communicator, name[1:]))
        started = inspect.signature(getattr(Communicator, name))
        assert list(started.parameters.values()) == list(blocking.parameters.values()), name


@pytest.mark.parametrize("nap", [0.0, 0.001])
def test_poll_naps_only_when_asked(monkeypatch, nap):
    """A wait past SPIN_S pauses ``nap`` between tests; ``nap`` 0 (across nodes: TCP moves bytes only while MPI is
    called) never sleeps, only yields."""
    from types import SimpleNamespace
    from pycollect.engine import progress
    tests = iter([False] * 6 + [True])
    slept, yielded = [], []
    monkeypatch.setattr(progress, "MPI", SimpleNamespace(Request=SimpleNamespace(Testall=lambda r, s: next(tests))))
    monkeypatch.setattr(progress, "SPIN_S", -1.0)   # every test after the first is past the spin
    monkeypatch.setattr(progress.time, "sleep", slept.append)
    monkeypatch.setattr(progress.os, "sched_yield", lambda: yielded.append(1))
    assert progress.poll([], None, None, None, nap) is None
    assert (slept, bool(yielded)) == (([nap] * 5, False) if nap else ([], True))


def test_avg_truncates_toward_zero_and_divides_exactly():
    """op="avg" finishes a sum: integers toward zero (as C), the dtype's minimum included (abs() wraps there: an
    int8 sum of -128 over 2 ranks gave +64); floats divided, not times a rounded 1/size (seven 3.0 gave
    3.0000002 in float32), complex part by part."""
    from pycollect.engine.ops import finish_avg
    for dtype in (np.int8, np.int16, np.int64, np.uint8, np.uint64):
        info = np.iinfo(dtype)
        sums = [v for v in (info.min, info.min + 1, -7, -6, -1, 0, 1, 6, 7, info.max) if info.min <= v]
        for size in range(1, 9):
            got = np.array(sums, dtype)
            finish_avg(got, size)
            want = [-(-int(v) // size) if int(v) < 0 else int(v) // size for v in np.array(sums, dtype)]
            assert got.tolist() == want, (dtype, size)
    for dtype in (np.float16, np.float32, np.float64, np.complex64, np.complex128):
        for size in range(1, 9):
            got = np.full(5, 3 * size * (1 + 1j) if np.dtype(dtype).kind == "c" else 3 * size, dtype)
            finish_avg(got, size)
            assert (got == (3 + 3j if np.dtype(dtype).kind == "c" else 3)).all(), (dtype, size, got)
    for dtype in (np.float16, ml_dtypes.bfloat16):          # a size these cannot hold (257 is 256 in bfloat16)
        got = np.full(3, 1000, dtype)
        finish_avg(got, 257 if dtype is ml_dtypes.bfloat16 else 2049)
        want = 1000 / (257 if dtype is ml_dtypes.bfloat16 else 2049)
        assert (got == np.asarray(want, dtype)).all(), (dtype, got, want)


@pytest.mark.parametrize("tag_ub, space", [(32767, 2**15), (40000, 2**15), (2**20 - 1, 2**20), (2**21, 2**21),
                                           (2**29 - 1, 2**29), (2**31 - 1, 2**31)])
def test_the_tag_space_is_the_largest_power_of_two_within_tag_ub(tag_ub, space):
    live = LiveTags(tag_ub)
    assert (live.mask, live.half, live.of(space + 5), live.of(space - 1)) == (space - 1, space // 2, 5, space - 1)


def test_a_stray_tag_is_a_past_calls_within_half_the_space_else_a_later_ones():
    live = LiveTags(2**20 - 1)             # a space of 2**20 tags, half 2**19
    seq = 3 * 2**20 + 10                   # the waiting call's number; its tag is 10
    assert stray_call(9, seq, live) == seq - 1                         # the call before
    assert stray_call(10 - 2**19 + 1 + 2**20, seq, live) == seq - 2**19 + 1   # the oldest a tag can name
    assert stray_call(10 + 2**19, seq, live) is None                   # half the space ahead: a later call's
    assert stray_call(11, seq, live) is None                           # the next call's
    live.add(9)
    assert stray_call(9, seq, live) is None                            # in flight here: not ended
    live.admit(seq)                                                    # its own tag is free
    with pytest.raises(RuntimeError, match=r"call #4194313 cannot start .* \(#3145737, or one a multiple of 1048576"):
        live.admit(seq - 1 + 2**20)


def test_a_topology_takes_any_sequence_of_integers_and_names_anything_else():
    """A list or an array of node numbers is kept as a tuple (before, a list was taken and the first schedule call
    failed: unhashable type); a float or a string is refused naming node_of."""
    assert Topology([0, 0, 1, 1]) == Topology(np.array([0, 0, 1, 1])) == Topology.uniform(4, 2)
    assert hash(Topology([0, 1])) == hash(Topology((0, 1)))
    for bad in ((0, 1.0), "01", 3):
        with pytest.raises(TypeError, match="node_of must be a sequence of integers"):
            Topology(bad)
    assert pc.traffic("allreduce", "ring", size=4, nbytes=64, topology=Topology([0, 0, 1, 1])).max_bytes_sent == 96

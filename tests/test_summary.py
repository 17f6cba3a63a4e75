"""The counted forms of the schedules (``summaries`` in an algorithm's module) against the walk of the schedules."""
import random
import time

import pytest

import pycollect as pc
from pycollect.algorithms import registry
from pycollect.engine.layout import ceil_log2, split_even
from pycollect.algorithms.registry import all_schedules, counted_summaries
from pycollect.engine.schedule import Problem
from pycollect.engine.summary import RankClasses, finish, of_schedule
from pycollect.engine.topology import Topology
from pycollect.engine.traffic import count, count_summaries
from pycollect.costmodel import Link, Model, summary_times

FORMS = [(c, a) for c in registry.COLLECTIVES for a in registry.schedule_algorithms(c)
         if hasattr(registry.get_module(c, a), "summaries")]
LOGARITHMIC = {"recursive_doubling", "rabenseifner", "recursive_halving", "tree", "binomial"}
MODEL = Model({"intra-node": Link(2e-6, 1e-10), "inter-node": Link(9e-6, 8e-10)}, gamma=3e-11, overhead=1e-6,
              dirty=5e-11)   # dirty: what a rank sends that the call wrote enters the times compared


def written(summaries) -> list[int]:
    """Each rank's elements sent from what the call wrote (``Shape.written``): a form's once a class."""
    if isinstance(summaries, RankClasses):
        per_class = [sum(k * s.written for k, s in summaries.whole(c)) for c in range(len(summaries.templates))]
        return [per_class[c] for c in summaries.class_of]
    return [sum(k * s.written for k, s in summary) for summary in summaries]


def topologies(size, rng):
    yield Topology.single_node(size)
    yield Topology.uniform(size, 2, by_block=True)
    yield Topology.uniform(size, 3, by_block=False)
    labels = [rng.randrange(max(1, size // 3)) for _ in range(size)]   # uneven nodes, ranks scattered
    yield Topology.from_labels(labels)


def problems(collective, size, topo, rng, windows=(False,)):
    for w in windows:
        for n in {0, 1, size - 1, size + 1, 4 * size, 5 * size + 3}:
            counts = split_even(n, size)
            yield Problem(0, size, topo, n=n, counts=counts, matrix=(counts,) * size, windows=w)
        # uneven blocks, zeros among them, of up to 4N sizes (a ring's rounds all of other sizes: its phase less one)
        counts = tuple(rng.randrange(4) if rng.random() < 0.5 else rng.randrange(4 * size) for _ in range(size))
        yield Problem(0, size, topo, n=sum(counts), counts=counts, matrix=(counts,) * size, windows=w)
        # the trees' pipeline from a root that is not 0, the last segment shorter: three segments, or on odd sizes
        # 2L+1 (enough for the tree allreduce's form off powers of two)
        n, segments = 5 * size + 3, 3 if size % 2 == 0 else 2 * ceil_log2(size) + 1
        counts = split_even(n, size)
        yield Problem(0, size, topo, n=n, counts=counts, matrix=(counts,) * size, root=rng.randrange(size),
                      tree_segment=-(-n // segments), windows=w)
        counts = (3,) * size   # the all-to-alls' even blocks, out of place
        yield Problem(0, size, topo, n=3 * size, counts=counts, matrix=(counts,) * size, aliased=False, windows=w)


def test_some_algorithms_have_forms():
    assert {("allreduce", "ring"), ("reduce_scatter", "ring"), ("allgather", "ring")} <= set(FORMS)


@pytest.mark.parametrize("collective, algorithm", FORMS)
def test_forms_count_what_the_schedules_walk(collective, algorithm):
    """Every rank's traffic and predicted time wherever the form answers, else the module's ``counts`` form where it
    has one (elsewhere the schedules are walked: nothing to compare): on every kind of topology and every problem at
    N <= 16, 24 and 31; at 48 and 64 on every kind of topology, one of the last three problems on each (even blocks
    out of place, a pipeline from another root, uneven blocks) by turns; and at every other N <= 64 and at 97 and 128
    (and 102 and 1003 for the algorithms of logarithmically many rounds) on one topology and one of those problems,
    each by turns. The all-to-alls and the pairwise reduce-scatter, whose forms answer every problem and whose walks
    send N^2 messages: every problem to 24, every topology at 31, the sample above."""
    rng = random.Random(7)
    counts_form = hasattr(registry.get_module(collective, algorithm), "counts")
    delegates = algorithm == "shm"   # without a window: its message twin's form, checked there at every size
    quadratic = algorithm == "pairwise" or (collective, algorithm) == ("alltoall", "bruck")   # a walk of N^2 messages
    full = [*range(1, 9), 13] if delegates else [*range(1, 17), 24] + ([] if quadratic else [31])
    wide = [] if delegates else [31] if quadratic else [48, 64]   # every topology, one problem each: the largest
    # walks cost most (O(N^2) objects a ring, O(N^2) messages an all-to-all)
    light = [] if delegates else [n for n in [*range(17, 65), 97, 128] if n not in full + wide]
    light += [102, 1003] if algorithm in LOGARITHMIC else []   # few rounds a rank: the walk is cheap
    answered = 0
    for size in full + wide + light:
        kinds = list(topologies(size, rng))
        for k, topo in enumerate(kinds if size in full + wide else [kinds[size % len(kinds)]]):
            cases = list(problems(collective, size, topo, rng, (False, True) if delegates else (False,)))
            for p in cases if size in full else [cases[-1 - (size + k) % 3]]:   # even, out of place; pipeline; uneven
                formed = counted_summaries(collective, algorithm, p, in_step=False)
                if formed is None and counts_form:   # where the full form declines, the module's counts form
                    formed = counted_summaries(collective, algorithm, p, in_step=False, counts_only=True)
                if formed is None:
                    continue
                answered += 1
                walked = [of_schedule(s) for s in all_schedules(collective, algorithm, p)]
                where = f"{collective}/{algorithm} N={size} n={p.n} counts={p.counts[:8]} {topo.describe()}"
                assert count_summaries(formed, topo, 4) == count_summaries(walked, topo, 4), where
                assert written(formed) == written(walked), where
                assert summary_times(MODEL, formed, topo, 4) == pytest.approx(summary_times(MODEL, walked, topo, 4),
                                                                              rel=1e-12), where
    assert answered, f"{collective}/{algorithm}: the form answered no problem"


@pytest.mark.parametrize("collective, algorithm", [(c, a) for c, a in FORMS if a in LOGARITHMIC
                                                  and c not in ("scan", "exscan")])
def test_forms_off_powers_of_two_are_not_offered_to_the_lockstep(collective, algorithm):
    """A butterfly's fold and a tree's missing children put ranks out of step: the cluster simulator's lockstep
    (counted_summaries' default) gets no form there, the counts do. (The scans' doubling has no fold: a rank that
    drops a round drops every later one, and their forms are offered at every size.)"""
    p = Problem(0, 6, Topology.uniform(6, 2), n=60, counts=split_even(60, 6), tree_segment=2)
    assert counted_summaries(collective, algorithm, p) is None
    assert counted_summaries(collective, algorithm, p, in_step=False) is not None
    p = Problem(0, 8, Topology.uniform(8, 2), n=80, counts=split_even(80, 8))
    assert counted_summaries(collective, algorithm, p) is not None


def test_walked_summaries_count_as_the_schedules():
    p = Problem(0, 6, Topology.uniform(6, 2), n=50, counts=split_even(50, 6))
    scheds = all_schedules("allreduce", "tree", p)
    assert count_summaries([of_schedule(s) for s in scheds], p.topology, 8) == count(scheds, p.topology, 8)


def test_a_ring_of_16384_ranks_on_2048_nodes_is_counted_at_once():
    """Not a timing test of speed but of order: O(N^2) would take minutes here, O(N) about a second."""
    topo = Topology.uniform(16384, 8)
    start = time.perf_counter()
    t = pc.traffic("allreduce", "ring", size=16384, nbytes=1 << 30, topology=topo)
    assert time.perf_counter() - start < 30
    per_block = (1 << 30) // 16384
    # every rank sends 2(N-1) blocks; one rank in 8 sends to the next node
    assert t.max_bytes_sent == 2 * 16383 * per_block and t.rounds == 2 * 16383
    assert t.bytes_by_tier()["inter-node"] == 2048 * 2 * 16383 * per_block


def test_shared_memory_windows_on_one_node_of_4096_ranks_are_counted_at_once():
    """pc.traffic's default topology is one node: its "shm" calls walked every rank's window rounds, each reading
    every peer (O(N^2): minutes at 4096 ranks); now by class (a rank's own block), against closed forms. Not a timing
    test of speed but of order: a generous bound."""
    size, block = 4096, 16                         # elements of each rank's block
    nbytes = size * block * 4
    start = time.perf_counter()
    reads = (size - 1) * block * 4                # a rank reads one block from every peer's window
    for collective, read in (("allreduce", 2 * reads), ("reduce_scatter", reads), ("allgather", reads),
                             ("alltoall", reads), ("broadcast", nbytes)):
        t = pc.traffic(collective, "shm", size, nbytes)   # alltoall: each rank's send buffer
        received = [r.bytes_recv for r in t.per_rank]
        if collective == "broadcast":              # every rank but the root copies the vector out of its window
            assert received == [0] + [nbytes] * (size - 1)
        else:
            assert received == [read] * size, collective
        tiers = t.bytes_by_tier()
        assert tiers["intra-node"] == sum(r.bytes_sent for r in t.per_rank) and not tiers["inter-node"], collective
    assert time.perf_counter() - start < 60


def test_rooted_and_scan_forms_count_16384_ranks_at_once():
    """The gathers, scatters and scans at 16384 ranks on 2048 nodes from their counted forms (the binomial gather's
    walk was quadratic: about 1 s at 4096 ranks), against closed forms; a generous bound on the time (bench/scale.py
    measures it)."""
    size, block = 16384, 64                        # elements of each rank's block (of the vector for the scans)
    topo = Topology.uniform(size, 8)
    start = time.perf_counter()
    for collective, algorithm in (("gather", "binomial"), ("gather", "linear"), ("scatter", "binomial"),
                                  ("scatter", "linear")):
        t = pc.traffic(collective, algorithm, size, size * block * 4, topology=topo)
        sent = [r.bytes_sent for r in t.per_rank]
        received = [r.bytes_recv for r in t.per_rank]
        root, others = (received, sent) if collective == "gather" else (sent, received)
        assert root[0] == (size - 1) * block * 4, (collective, algorithm)   # the root moves every block but its own
        if algorithm == "linear":
            assert others[1:] == [block * 4] * (size - 1) and t.rounds == 1
        else:                                      # relative rank v moves its subtree: 2^(lowest set bit of v) blocks
            assert others[1:] == [(v & -v) * block * 4 for v in range(1, size)] and t.rounds == 14
    for collective in ("scan", "exscan"):
        t = pc.traffic(collective, "recursive_doubling", size, block * 4, topology=topo)
        assert t.rounds == 14 + (collective == "exscan")
        assert t.per_rank[-1].bytes_recv == (14 + (collective == "exscan")) * block * 4
        t = pc.traffic(collective, "linear", size, block * 4, topology=topo)
        assert [r.bytes_sent for r in t.per_rank] == [block * 4] * (size - 1) + [0]
        assert t.bytes_by_tier()["inter-node"] == 2047 * block * 4     # one hop across each node boundary
    assert time.perf_counter() - start < 30


def test_the_scale_benchmark_writes_every_algorithm(tmp_path):
    """bench/scale.py at small sizes: a record (timed) for every schedule of every collective."""
    import json
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = tmp_path / "scale.json"
    proc = subprocess.run([sys.executable, os.path.join(root, "bench", "scale.py"), "--sizes", "8,16", "--no-plan", "--no-simulate",
                           "--no-explain", "--json", str(out)], cwd=root, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=root))
    assert proc.returncode == 0, proc.stderr
    records = json.loads(out.read_text())["records"]
    expected = {(c, a) for c in registry.COLLECTIVES for a in registry.schedule_algorithms(c)}
    assert {(r["collective"], r["algorithm"]) for r in records} == expected
    assert all(r["seconds"] is not None and r["seconds"] >= 0 for r in records) and len(records) == 2 * len(expected)


@pytest.mark.parametrize("collective, algorithm", FORMS)
def test_formed_schedules_run_in_lockstep(collective, algorithm):
    """What ``explain`` assumes above its walk limit: each rank finishes at its form's ``finish``, its own count of
    rounds and those it idles through."""
    from pycollect.tools.explain import critical_path
    rng = random.Random(3)
    sizes = [*range(1, 9)] if algorithm == "shm" else [*range(1, 13), 24]   # shm: its message twin's, checked there
    for size in sizes + ([37, 100] if algorithm in LOGARITHMIC else []):
        for topo in topologies(size, rng):
            for p in problems(collective, size, topo, rng, (False, True) if algorithm == "shm" else (False,)):
                formed = counted_summaries(collective, algorithm, p, in_step=False)
                if formed is None:   # walked there, not assumed
                    continue
                scheds = all_schedules(collective, algorithm, p)
                where = f"{collective}/{algorithm} N={size} n={p.n} counts={p.counts[:8]} {topo.describe()}"
                assert critical_path(scheds) == [finish(s) for s in formed], where
                if isinstance(formed, RankClasses):   # once a class, as explain reads them (a closed form's own)
                    ends = formed.finishes()
                    assert critical_path(scheds) == [ends[c] for c in formed.class_of], where


def test_explain_answers_at_scale(tmp_path):
    import json
    import os
    import subprocess
    import sys
    out = tmp_path / "e.json"
    proc = subprocess.run([sys.executable, "-m", "pycollect", "explain", "allreduce", "--algorithm", "hierarchical",
                           "--size", "4096", "--bytes", "1G", "--nodes", "512", "--rank", "9", "--json", str(out)],
                          capture_output=True, text=True, timeout=300, env=dict(os.environ, PYTHONPATH=os.getcwd()))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    s = data["summary"]
    # M = 512 nodes of L = 8: 2(L-1) rounds in the node, 2(M-1) across
    assert s["rounds"] == s["critical_path_rounds"] == 2 * 7 + 2 * 511 and len(data["records"]) == 4096
    assert data["rounds"]["rank"] == 9 and len({r["round"] for r in data["rounds"]["rows"]}) == 2 * 7 + 2 * 511


@pytest.mark.parametrize("collective, algorithm", FORMS)
def test_explain_sums_a_forms_classes_as_the_walk_does(collective, algorithm, monkeypatch):
    """``explain --algorithm all`` above its walk limit counts each class of a form once and weighs it by its ranks;
    its figures equal those of every rank's schedule walked. The named summaries count as the classes do."""
    import numpy as np
    from pycollect.tools import explain
    for size, per_node, by_block, nbytes, root in ((12, 4, True, 4 * (5 * 12 + 3), 5), (16, 2, False, 4 * 16 * 7, 0),
                                                   (9, 3, True, 4 * 9, 2)):
        topo = Topology.uniform(size, per_node, by_block=by_block)
        call = explain.Call(collective, topo, nbytes, np.dtype("float32"), root, 7)
        monkeypatch.setattr(explain, "WALK_LIMIT", 1 << 30)
        walked = explain.explain(call, algorithm, records=False)[2]
        monkeypatch.setattr(explain, "WALK_LIMIT", 0)
        formed = counted_summaries(collective, algorithm, call.problem(), in_step=False)
        if formed is None:
            continue
        assert explain.explain(call, algorithm, records=False)[2] == walked, f"{collective}/{algorithm} N={size}"
        assert count_summaries(list(formed), topo, 4) == count_summaries(formed, topo, 4)


def test_the_tree_allreduce_counts_off_powers_of_two_with_few_segments():
    """There (1 to 2L-2 segments) the tree's form compacts each rank's rounds after the idle rounds that make it
    finish on the critical path (``pipeline_starts``): its counts, times and finishing rounds equal the walk's."""
    from pycollect.tools.explain import critical_path
    rng = random.Random(5)
    answered = 0
    for size in (3, 5, 6, 7, 11, 12, 24, 37):
        for topo in topologies(size, rng):
            for segments in sorted({1, 2, 3, 2 * ceil_log2(size) - 2}):
                n = 5 * size + 3
                counts = split_even(n, size)
                p = Problem(0, size, topo, n=n, counts=counts, tree_segment=-(-n // segments))
                formed = counted_summaries("allreduce", "tree", p, in_step=False)
                scheds = all_schedules("allreduce", "tree", p)
                walked = [of_schedule(s) for s in scheds]
                where = f"N={size} segments={segments} {topo.describe()}"
                assert count_summaries(formed, topo, 4) == count_summaries(walked, topo, 4), where
                assert written(formed) == written(walked), where
                assert summary_times(MODEL, formed, topo, 4) == pytest.approx(summary_times(MODEL, walked, topo, 4),
                                                                              rel=1e-12), where
                assert critical_path(scheds) == [finish(s) for s in formed], where
                answered += 1
    assert answered >= 8 * 4 * 3


def test_pipeline_starts_equal_the_critical_path_of_every_segment_count():
    """``allreduce_tree.pipeline_starts`` (NumPy, every rank at once) against the walk of the compacted rounds on
    one node, every segment count from 1 to 2L+1 at N off powers of two to 40 and at 100."""
    from pycollect.algorithms.allreduce_tree import pipeline_starts
    from pycollect.tools.explain import critical_path
    for size in [*range(3, 41), 100]:
        if size & (size - 1) == 0:
            continue
        for segments in range(1, 2 * ceil_log2(size) + 2):
            n = 2 * size + 1
            p = Problem(0, size, Topology.single_node(size), n=n, counts=split_even(n, size),
                        tree_segment=-(-n // segments))
            scheds = all_schedules("allreduce", "tree", p)
            busy = [sum(r.communicates for r in s.rounds) for s in scheds]
            starts = pipeline_starts(size, len(range(0, n, -(-n // segments))))
            assert [a + b for a, b in zip(starts, busy)] == critical_path(scheds), (size, segments)


def test_forms_that_run_ahead_finish_where_the_walk_does_at_larger_sizes():
    """The forms whose ranks drop rounds and run ahead (empty blocks in Bruck and scatter_allgather, the tree's few
    segments off powers of two), off powers of two on nodes of 8 (the last one short): every rank's finishing round,
    counts and time equal the walk's, with N/2 and N-1 elements (the all-to-all's a rank: blocks of 0 and 1) and with
    4 segments of the tree."""
    from pycollect.engine.shapes import even_problem
    from pycollect.tools.explain import critical_path
    cases = [("alltoall", "bruck", 0), ("allgather", "bruck", 0), ("broadcast", "scatter_allgather", 0),
             ("allreduce", "tree", 4)]
    for size in (100, 257):
        topo = Topology.uniform(size, 8) if size % 8 == 0 else Topology.from_labels([r // 8 for r in range(size)])
        for collective, algorithm, segments in cases[1:] if size > 100 else cases:   # Bruck's all-to-all: N^2 copies
            for n in (size // 2, size - 1) if not segments else (5 * size + 3,):
                p = even_problem(collective, 0, size, topo, n, root=size // 3,
                                 tree_segment=-(-n // segments) if segments else 0)
                formed = counted_summaries(collective, algorithm, p, in_step=False)
                scheds = all_schedules(collective, algorithm, p)
                where = f"{collective}/{algorithm} N={size} n={n}"
                assert critical_path(scheds) == [finish(s) for s in formed], where
                walked = [of_schedule(s) for s in scheds]
                assert count_summaries(formed, topo, 4) == count_summaries(walked, topo, 4), where
                assert written(formed) == written(walked), where
                assert summary_times(MODEL, formed, topo, 4) == pytest.approx(summary_times(MODEL, walked, topo, 4),
                                                                              rel=1e-12), where


def test_forms_of_every_block_its_own_size_count_as_the_walk_at_larger_sizes():
    """The forms that count their traffic in closed form and build their rounds only where they are read
    (``summary.Deferred``: the pairwise reduce-scatter and all-to-all, Bruck's allgather), every block its own size
    with a tenth of them empty, on uneven nodes of 4 to 12: every rank's counts and time equal the walk's (the
    pairwise walks send N^2 messages: 257 ranks; Bruck's also at 1000), and so do the rounds each rank finishes in."""
    from pycollect.tools.explain import critical_path
    rng = random.Random(11)
    for size, cases in ((257, (("reduce_scatter", "pairwise"), ("alltoall", "pairwise"), ("allgather", "bruck"))),
                        (1000, (("allgather", "bruck"),))):
        labels: list[int] = []
        while len(labels) < size:
            labels += [len(set(labels))] * rng.randrange(4, 13)
        topo = Topology.from_labels(labels[:size])
        counts = tuple(rng.randrange(4 * size) if rng.random() < 0.9 else 0 for _ in range(size))
        p = Problem(0, size, topo, n=sum(counts), counts=counts, matrix=(counts,) * size)
        for collective, algorithm in cases:
            formed = counted_summaries(collective, algorithm, p, in_step=False)
            scheds = all_schedules(collective, algorithm, p)
            walked = [of_schedule(s) for s in scheds]
            where = f"{collective}/{algorithm} N={size}"
            ends = formed.finishes()
            assert [ends[c] for c in formed.class_of] == critical_path(scheds), where
            assert count_summaries(formed, topo, 4) == count_summaries(walked, topo, 4), where
            assert summary_times(MODEL, formed, topo, 4) == pytest.approx(summary_times(MODEL, walked, topo, 4),
                                                                          rel=1e-12), where


@pytest.mark.parametrize("kwargs, words", [
    ({"nbytes": -4}, "nbytes must be an integer of at least 0, got -4"),      # gave negative traffic
    ({"nbytes": 4.0}, "nbytes must be an integer of at least 0, got 4.0"),     # gave float totals
    ({"nbytes": True}, "nbytes must be an integer of at least 0, got True"),
    ({"nbytes": 1023}, r"nbytes = 1023 is not a whole number of float32 elements \(4 bytes each\)"),   # was cut
    ({"nbytes": 64, "root": -1}, r"root must be a rank in \[0, 8\), got -1"),  # tuple.index's error
    ({"nbytes": 64, "root": 8}, r"root must be a rank in \[0, 8\), got 8"),    # IndexError
    ({"nbytes": 64, "tree_segment_bytes": -5}, "tree_segment_bytes must be an integer of at least 0, got -5"),
    ({"nbytes": 64, "size": 0}, "size must be an integer of at least 1, got 0"),
])
def test_traffic_refuses_bad_arguments_naming_them(kwargs, words):
    import pycollect as pc
    call = {"size": 8, **kwargs}
    with pytest.raises(ValueError, match=words):
        pc.traffic("broadcast", "binomial", **call)

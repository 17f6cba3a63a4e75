"""The cluster simulator (clustersim.py) on cases checked by hand, and its two ways against each other."""
import dataclasses
import json
import time

import pytest

from pycollect.algorithms import registry
from pycollect.engine.layout import split_even
from pycollect.algorithms.registry import all_schedules, all_summaries, counted_summaries
from pycollect.engine.schedule import Problem, Recv, Round, Schedule, Send, Slice
from pycollect.engine.summary import of_schedule
from pycollect.engine.topology import INTER, INTRA, Topology
from pycollect.plan.config import links_from_presets
from pycollect.clustersim import Cluster, lockstep, predict, predict_all, walk
from pycollect.costmodel import Link, Model

AI, BI = 2e-6, 1e-10          # intra-node latency (s), seconds per byte
AE, BE = 9e-6, 8e-10          # inter-node
GAMMA, OVERHEAD = 3e-11, 1e-6
MODEL = Model({INTRA: Link(AI, BI), INTER: Link(AE, BE)}, gamma=GAMMA, overhead=OVERHEAD)
PORTED = Model({INTRA: Link(AI, BI, port=True), INTER: Link(AE, BE, port=True)}, gamma=GAMMA, overhead=OVERHEAD)
FORMS = [(c, a) for c in registry.COLLECTIVES for a in registry.schedule_algorithms(c)
         if hasattr(registry.get_module(c, a), "summaries")]


def exchange(pairs, nbytes_elems):
    """One round in which each (a, b) of ``pairs`` sends ``nbytes_elems`` elements both ways."""
    size = 1 + max(max(p) for p in pairs)
    rounds = [[] for _ in range(size)]
    for a, b in pairs:
        for me, peer in ((a, b), (b, a)):
            rounds[me].append((Send(peer, Slice("in", 0, nbytes_elems)), Recv(peer, Slice("out", 0, nbytes_elems))))
    return [Schedule((Round(tuple(s for s, _ in msgs), tuple(r for _, r in msgs)),)) for msgs in rounds]


# -- closed forms ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("size", [2, 3, 5, 8])
def test_ring_allreduce_on_one_tier_is_the_textbook_sum(size):
    """2(N-1) rounds of alpha + (n/N) beta + overhead, the first N-1 also reducing n/N."""
    n = 64 * size                                         # elements, even blocks
    block = n // size * 4
    expected = (size - 1) * (AI + block * BI + GAMMA * block + OVERHEAD) + (size - 1) * (AI + block * BI + OVERHEAD)
    topo = Topology.single_node(size)
    for method in ("walk", "lockstep"):
        got = predict(Cluster(MODEL), "allreduce", "ring", topo, n * 4, method=method)
        assert got.seconds == pytest.approx(expected, rel=1e-12), method


@pytest.mark.parametrize("nics", [None, 1, 4])
def test_ring_across_two_nodes_is_paced_by_its_crossings(nics):
    """Nodes of 4: the ring leaves each node once a round, so every round waits for one inter-node hop,
    whatever the NICs (one message a round per node: nothing to share)."""
    size, n = 8, 8 * 1024
    block = n // size * 4
    expected = (size - 1) * (AE + block * BE + GAMMA * block + OVERHEAD) + (size - 1) * (AE + block * BE + OVERHEAD)
    got = predict(Cluster(MODEL, nics), "allreduce", "ring", Topology.uniform(size, 4), n * 4, method="walk")
    assert got.seconds == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("nics", [None, 1, 2, 4])
def test_hierarchical_rings_share_the_nics_of_their_node(nics):
    """M nodes of L ranks: L rings across the nodes run at once, so the L messages leaving a node each round
    share its NICs: each gets min(1, nics / L) of a port. Closed form of the four ring phases."""
    nodes, width = 3, 4
    size, n = nodes * width, 24 * 1024
    share = 1.0 if nics is None else min(1.0, nics / width)
    local, across = n // width * 4, n // width // nodes * 4      # bytes of a block in and across nodes
    intra = (width - 1) * (AI + local * BI + OVERHEAD)
    inter = (nodes - 1) * (AE + across * BE / share + OVERHEAD)
    expected = 2 * intra + (width - 1) * GAMMA * local + 2 * inter + (nodes - 1) * GAMMA * across
    topo = Topology.uniform(size, width)
    for method in ("walk", "lockstep"):
        got = predict(Cluster(MODEL, nics), "allreduce", "hierarchical", topo, n * 4, method=method)
        assert got.seconds == pytest.approx(expected, rel=1e-12), (method, nics)


def test_exchange_across_nodes_shares_one_nic():
    """Two nodes of three; each rank swaps with its counterpart: three messages leave and enter each node."""
    elems = 1000
    scheds = exchange([(0, 3), (1, 4), (2, 5)], elems)
    topo = Topology.uniform(6, 3)
    alone = AE + elems * 4 * BE
    assert walk(scheds, topo, Cluster(MODEL), 4) == pytest.approx([alone + OVERHEAD] * 6)
    shared = AE + elems * 4 * BE * 3 / 2                   # 2 ports for 3 messages
    assert walk(scheds, topo, Cluster(MODEL, 2), 4) == pytest.approx([shared + OVERHEAD] * 6)
    assert walk(scheds, topo, Cluster(MODEL, 3), 4) == pytest.approx([alone + OVERHEAD] * 6)


def test_a_late_peer_delays_its_partner_and_those_waiting_on_it():
    """0 <-> 1 swap, then 1 <-> 2 swap; rank 0 enters 5 ms late: 1 waits for it, and 2 waits for 1."""
    elems, late = 500, 5e-3
    hop = AI + elems * 4 * BI + OVERHEAD
    one = Slice("in", 0, elems), Slice("out", 0, elems)
    scheds = [Schedule((Round((Send(1, one[0]),), (Recv(1, one[1]),)),)),
              Schedule((Round((Send(0, one[0]),), (Recv(0, one[1]),)), Round((Send(2, one[0]),), (Recv(2, one[1]),)))),
              Schedule((Round((Send(1, one[0]),), (Recv(1, one[1]),)),))]
    topo = Topology.single_node(3)
    assert walk(scheds, topo, Cluster(MODEL), 4) == pytest.approx([hop, 2 * hop, 2 * hop])
    assert walk(scheds, topo, Cluster(MODEL), 4, start=[late, 0, 0]) == pytest.approx([late + hop, late + 2 * hop,
                                                                                     late + 2 * hop])


def test_messages_share_a_port_only_while_they_overlap():
    """Two nodes of two, one NIC each; 0 <-> 2 and 1 <-> 3 swap W seconds of a port's bytes. Ranks 1 and 3 enter
    ``late``: alone on the port until then, the first pair's messages drain at half speed while both pairs'
    do, and the second pair's finish alone. Entering after the first pair's bytes are out, they never share."""
    elems = 1000
    work = elems * 4 * BE
    scheds = exchange([(0, 2), (1, 3)], elems)
    topo = Topology.uniform(4, 2)
    cluster = Cluster(MODEL, 1)
    both = AE + 2 * work + OVERHEAD
    assert walk(scheds, topo, cluster, 4) == pytest.approx([both] * 4, rel=1e-12)
    late = work / 4
    first, second = AE + 2 * work - late + OVERHEAD, AE + 2 * work + OVERHEAD
    assert walk(scheds, topo, cluster, 4, start=[0, late, 0, late]) == pytest.approx([first, second] * 2, rel=1e-12)
    late = work
    alone = AE + work + OVERHEAD
    assert walk(scheds, topo, cluster, 4, start=[0, late, 0, late]) == pytest.approx([alone, late + alone] * 2,
                                                                                     rel=1e-12)


def test_broadcast_scatter_allgather_shares_no_port_it_does_not_use_at_once():
    """The root's scatter sends and the later ring sends of one round index never overlap: the walk charges no
    sharing between them, and equals the lockstep on one NIC a node (once 1.37-1.50x above it)."""
    cluster = Cluster(MODEL, 1)
    for size in (8, 16):
        topo = Topology.uniform(size, size // 2)
        walked = predict(cluster, "broadcast", "scatter_allgather", topo, 64 << 20, method="walk").seconds
        stepped = predict(cluster, "broadcast", "scatter_allgather", topo, 64 << 20, method="lockstep").seconds
        assert walked == pytest.approx(stepped, rel=1e-9), size


def test_pairwise_across_nodes_keeps_the_port_busy():
    """All-to-all pairwise on two nodes of L under one NIC: L^2 blocks leave each node, and the walk's ranks,
    running apart, keep the port busy: within 2% above its bound (the bytes over the port's bandwidth). The
    lockstep charges idle port time that the walk does not (its forms count rounds by kind): above the walk."""
    for size in (8, 16):
        width = size // 2
        topo, nbytes = Topology.uniform(size, width), 16 << 20
        cluster = Cluster(MODEL, 1)
        walked = predict(cluster, "alltoall", "pairwise", topo, nbytes, method="walk").seconds
        stepped = predict(cluster, "alltoall", "pairwise", topo, nbytes, method="lockstep").seconds
        bound = width * width * (nbytes // size) * BE
        assert bound <= walked <= 1.02 * bound, (size, walked / bound)
        assert stepped > walked, size


@pytest.mark.parametrize("size", [2, 3, 8])
def test_a_linear_gather_drains_through_the_roots_port(size):
    """One node, links with ports: the N-1 blocks entering the root share its port, so its round lasts all of
    them, in the walk, in lockstep and in the cost model; without ports one block's time."""
    from pycollect.costmodel import predict as alpha_beta
    elems = 1000
    topo = Topology.single_node(size)
    expected = AI + (size - 1) * elems * 4 * BI + OVERHEAD
    for method in ("walk", "lockstep"):
        got = predict(Cluster(PORTED), "gather", "linear", topo, elems * 4 * size, method=method)
        assert got.seconds == pytest.approx(expected, rel=1e-12), method
    assert alpha_beta(PORTED, "gather", "linear", topo, elems * 4 * size) == pytest.approx(expected, rel=1e-12)
    alone = predict(Cluster(MODEL), "gather", "linear", topo, elems * 4 * size, method="walk")
    assert alone.seconds == pytest.approx(AI + elems * 4 * BI + OVERHEAD, rel=1e-12)


def test_a_message_takes_the_smallest_share_of_its_ports_and_nics():
    """Two nodes of two; rank 0 takes a block from 2 and one from 3, rank 1 one from 3. Each rank's port of the
    inter-node tier gives its two messages half of it (rank 3's out, rank 0's in); the three crossing node 1's NICs
    get 2/3 of a port each from two NICs, 1/3 from one: the smallest share paces each message."""
    elems = 1000
    block = Slice("in", 0, elems)
    scheds = [Schedule((Round((), (Recv(2, Slice("out", 0, elems)), Recv(3, Slice("out", elems, elems)))),)),
              Schedule((Round((), (Recv(3, Slice("out", 0, elems)),)),)),
              Schedule((Round((Send(0, block),), ()),)),
              Schedule((Round((Send(0, block), Send(1, block)), ()),))]
    topo, work = Topology.uniform(4, 2), elems * 4 * BE
    for model, nics, share in ((PORTED, None, 1 / 2), (PORTED, 2, 1 / 2), (PORTED, 1, 1 / 3), (MODEL, 2, 2 / 3)):
        assert max(walk(scheds, topo, Cluster(model, nics), 4)) == pytest.approx(AE + work / share + OVERHEAD,
                                                                                rel=1e-12), (model.ports, nics)


@pytest.mark.parametrize("nodes", [False, True])
def test_through_ports_no_schedule_beats_the_bandwidth_of_a_port(nodes):
    """On one tier (one node, or a node a rank) with a port per rank a direction, every collective's bus bandwidth
    (nccl-tests' factor) is bounded by the port's: each rank must move its share of the bytes through it. Without
    ports the linear gather and scatter and the window schedules (read from N-1 peers at once) came out above it,
    up to N-1 times."""
    model = Model({INTRA: Link(0.0, BI, port=True), INTER: Link(0.0, BE, port=True)})
    for size in range(2, 9):
        topo = Topology.uniform(size, 1) if nodes else Topology.single_node(size)
        bandwidth = 1 / (BE if nodes else BI)
        nbytes = 4 * 64 * size ** 2
        for collective in registry.COLLECTIVES:
            for algorithm in registry.schedule_algorithms(collective):
                got = predict(Cluster(model), collective, algorithm, topo, nbytes)
                if got.seconds is None:
                    continue
                assert got.busbw <= bandwidth * (1 + 1e-9), (collective, algorithm, topo.describe())


def test_a_message_never_received_is_named():
    scheds = [Schedule((Round(recvs=(Recv(1, Slice("out", 0, 4)),)),)), Schedule(())]
    with pytest.raises(RuntimeError, match="rank 0 waits in its round 0"):
        walk(scheds, Topology.single_node(2), Cluster(MODEL), 4)


# -- the counted forms in lockstep against the walk ------------------------------------------------------
def _layouts(size):
    yield Topology.single_node(size)
    for width in (2, 3, 4):
        if size % width == 0 and size > width:
            yield Topology.uniform(size, width)


@pytest.mark.parametrize("collective, algorithm", FORMS)
def test_lockstep_equals_the_walk_where_ranks_keep_in_step(collective, algorithm):
    """Even blocks, nodes of equal size: the walk's finish equals the forms run in lockstep for the rings, the
    hierarchical, the butterflies, the trees and scatter_allgather (every rank waits on its neighbours, partner or
    parent each round); off powers of two the butterflies' fold and the trees' missing children where every rank is
    on one node. The pairwise forms (and the shm all-to-all, pairwise off one node) count their rounds by kind, not
    in order, so the NIC sharing of their rounds lands on other round indices: within 2.5% of the walk here (nodes
    of 2 to 4, N <= 12), held to 5%; more on wider nodes (test_pairwise_across_nodes_keeps_the_port_busy). Alike
    with a port per rank and tier (``Link.port``)."""
    windows = (False, True) if algorithm == "shm" else (False,)   # one node's windows by class (since 2026-12-05)
    for size, w in [(size, w) for size in range(2, 13) for w in windows]:
        for topo in _layouts(size):
            for model, nics in [(m, nics) for m in (MODEL, PORTED) for nics in (None, 1, 2)]:
                cluster = Cluster(model, nics)
                n = 96 * size
                counts = split_even(n, size)
                p = Problem(0, size, topo, n=n, counts=counts, matrix=(counts,) * size, windows=w)
                formed = counted_summaries(collective, algorithm, p)
                if formed is None:      # walked there (a butterfly's fold), never run in lockstep
                    continue
                walked = max(walk(all_schedules(collective, algorithm, p), topo, cluster, 4))
                stepped, _ = lockstep(formed, topo, cluster, 4)
                where = f"{collective}/{algorithm} {topo.describe()} nics={nics} ports={sorted(model.ports)}"
                if (algorithm == "pairwise" or (collective, algorithm) == ("alltoall", "shm")) and topo.num_nodes > 1:
                    assert stepped == pytest.approx(walked, rel=0.05), where
                else:
                    assert stepped == pytest.approx(walked, rel=1e-9), where


def test_lockstep_bounds_the_walk_from_above_on_uneven_blocks():
    """The slowest rank of each round paces everyone in lockstep: for the rings never faster than the walk of the
    same rounds (schedules whose ranks drift apart under a NIC limit can be: clustersim's docstring). The counted
    forms list a phase's rounds by size (blocks differ by one element), so theirs is close to it."""
    for size in (5, 6, 9):
        for topo in _layouts(size):
            p = Problem(0, size, topo, n=7 * size + 3, counts=split_even(7 * size + 3, size))
            for collective, algorithm in (("allreduce", "ring"), ("allgather", "ring"), ("reduce_scatter", "ring")):
                scheds = all_schedules(collective, algorithm, p)
                walked = max(walk(scheds, topo, Cluster(MODEL, 1), 4))
                in_order, _ = lockstep([of_schedule(s) for s in scheds], topo, Cluster(MODEL, 1), 4)
                formed, _ = lockstep(all_summaries(collective, algorithm, p), topo, Cluster(MODEL, 1), 4)
                where = (collective, topo.describe())
                assert in_order >= walked * (1 - 1e-12), where
                assert formed == pytest.approx(in_order, rel=1e-3), where


# -- at scale --------------------------------------------------------------------------------------------
def test_sixteen_thousand_ranks_in_lockstep():
    """16384 ranks on 2048 nodes: the ring's closed form, from its counted form; a generous bound on the time
    (bench/scale.py measures it)."""
    size, n = 16384, 16384 * 64
    block = n // size * 4
    expected = (size - 1) * (AE + block * BE + GAMMA * block + OVERHEAD) + (size - 1) * (AE + block * BE + OVERHEAD)
    start = time.perf_counter()
    got = predict(Cluster(MODEL, 8), "allreduce", "ring", Topology.uniform(size, 8), n * 4)
    assert time.perf_counter() - start < 60
    assert got.method == "lockstep" and got.seconds == pytest.approx(expected, rel=1e-9)
    assert got.busbw == pytest.approx(n * 4 / got.seconds * 2 * (size - 1) / size)


def test_a_chain_at_sixteen_thousand_ranks_in_lockstep():
    """The linear scan and exscan: every rank its own class, each waiting one round more than the last. Each node of
    8 adds 7 hops inside it and 1 across, so the time grows by the same step per node: walked at 64 and 128 ranks,
    extrapolated to 16384, it must equal the form run in lockstep there (which steps only the classes whose round
    changes: the whole chain, where every class was once priced at every round, took minutes)."""
    cluster = Cluster(MODEL, 2)
    for collective in ("scan", "exscan"):
        walked = []
        for size in (64, 128):
            topo = Topology.uniform(size, 8)
            p = Problem(0, size, topo, n=96)
            walked.append(max(walk(all_schedules(collective, "linear", p), topo, cluster, 4)))
        start = time.perf_counter()
        topo = Topology.uniform(16384, 8)
        stepped, classes = lockstep(counted_summaries(collective, "linear", Problem(0, 16384, topo, n=96)), topo,
                                    cluster, 4)
        assert time.perf_counter() - start < 60
        per_node = (walked[1] - walked[0]) / 8
        assert classes == 16384 and stepped == pytest.approx(walked[0] + per_node * (2048 - 8), rel=1e-9), collective


def test_no_form_over_the_step_limit_says_so_without_walking():
    topo = Topology.uniform(4000, 8)   # not a power of two: the tree has no counted form there
    got = predict(Cluster(MODEL), "allreduce", "tree", topo, 1 << 20, step_limit=10_000)
    assert got.seconds is None and got.method == "none" and "over the limit of 10000" in got.note
    walked = predict(Cluster(MODEL), "allreduce", "tree", Topology.uniform(64, 8), 1 << 20, step_limit=10_000)
    assert walked.method == "walk" and walked.seconds > 0
    assert got.to_dict()["busbw_GBps"] is None


def test_predict_all_lists_every_schedule():
    got = predict_all(Cluster(MODEL, 1), "allreduce", Topology.uniform(8, 4), 1 << 20)
    assert [p.algorithm for p in got] == list(registry.schedule_algorithms("allreduce"))
    assert all(p.seconds and p.seconds > 0 for p in got)


def test_arguments_are_checked():
    with pytest.raises(ValueError, match="nics_per_node must be a positive integer"):
        Cluster(MODEL, 0)
    with pytest.raises(ValueError, match="no schedule 'nope'"):
        predict(Cluster(MODEL), "allreduce", "nope", Topology.single_node(2), 64)
    with pytest.raises(ValueError, match="method must be one of"):
        predict(Cluster(MODEL), "allreduce", "ring", Topology.single_node(2), 64, method="exact")
    with pytest.raises(ValueError, match="start has 1 times for 2 ranks"):
        walk(exchange([(0, 1)], 4), Topology.single_node(2), Cluster(MODEL), 4, start=[0.0])


# -- pycollect explain --predict ---------------------------------------------------------------------------
def test_explain_predict_prints_every_algorithm(capsys, tmp_path):
    from pycollect import cli
    path = tmp_path / "predict.json"
    assert cli.main(["explain", "allreduce", "--algorithm", "all", "--size", "8", "--bytes", "64M", "--nodes", "2",
                     "--predict", "--links", "nvlink4,ib-ndr", "--nics-per-node", "1", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    assert "8 ranks on 2 node(s) of 4" in out and "1 NIC(s) a node" in out
    records = json.loads(path.read_text())["records"]
    assert [r["algorithm"] for r in records] == list(registry.schedule_algorithms("allreduce"))
    cluster = Cluster(links_from_presets("nvlink4", "ib-ndr"), 1)
    ring = predict(cluster, "allreduce", "ring", Topology.uniform(8, 4), 64 << 20, tree_segment_bytes=1 << 20)
    assert records[0]["seconds"] == pytest.approx(ring.seconds) and records[0]["method"] == "walk"


def test_explain_predict_reads_a_fitted_model(capsys, tmp_path):
    from pycollect import cli
    path = tmp_path / "fit.json"
    path.write_text(json.dumps({"model": MODEL.to_dict()}))
    assert cli.main(["explain", "reduce_scatter", "--algorithm", "ring", "--size", "4", "--bytes", "4M",
                     "--predict", "--model", str(path)]) == 0
    row = capsys.readouterr().out.splitlines()[-1].split()
    expected = predict(Cluster(MODEL), "reduce_scatter", "ring", Topology.single_node(4), 4 << 20).seconds
    assert row[0] == "ring" and float(row[1]) == pytest.approx(expected * 1e6, abs=0.1)


@pytest.mark.parametrize("argv, message", [
    (["--nics-per-node", "2"], "--nics-per-node: the simulator's flags need --predict"),
    (["--predict", "--links", "nvlink4"], "expected two presets INTRA,INTER"),
    (["--predict", "--links", "nvlink4,carrier-pigeon"], "--links: unknown link preset 'carrier-pigeon'"),
    (["--predict", "--links", "nvlink4,ib", "--model", "f.json"], "--model and --links both give the links"),
    (["--predict", "--rank", "3"], "--rank 3 picks whose rounds to print; --predict prints none"),
    (["--algorithm", "all", "--rank", "0"], "--rank 0 picks whose rounds to print; --algorithm all prints none"),
])
def test_explain_predict_argument_errors(argv, message, capsys):
    from pycollect import cli
    status = cli.main(["explain", "allreduce", "--algorithm", "ring", "--size", "8", "--bytes", "8M", *argv])
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1 and message in err, err


# -- the planner's price ---------------------------------------------------------------------------------
def test_the_planner_prices_with_the_simulator_when_asked():
    from pycollect.plan.comm import price
    topo = Topology.uniform(16, 4)
    plain = price("allreduce", "auto", topo, 64 << 20, "float32", MODEL)
    sim = price("allreduce", "auto", topo, 64 << 20, "float32", MODEL, simulate=True)
    gpu = [a for a in registry.schedule_algorithms("allreduce") if a != "shm"]   # host windows: no GPU takes them
    expected = {a: predict(Cluster(MODEL), "allreduce", a, topo, 64 << 20).seconds for a in gpu}
    best = min(expected, key=expected.__getitem__)
    assert sim[0] == best and sim[2] == pytest.approx(expected[best], rel=1e-12)
    from pycollect.costmodel import predict_all as alpha_beta
    by_model = alpha_beta(MODEL, "allreduce", topo, 64 << 20)
    assert plain[2] == pytest.approx(min(by_model[a] for a in gpu), rel=1e-12)   # the default: the alpha-beta price


def test_predict_takes_the_root(capsys, tmp_path):
    """On nodes of 5, 2 and 1 ranks a broadcast from the lone node's rank crosses more (longer) than from the
    large node's; on uniform nodes the trees cross between nodes alike from any root. explain passes --root on."""
    from pycollect import cli
    cluster = Cluster(links_from_presets("nvlink4", "ib-ndr"), 1)
    uneven = Topology.from_labels([0, 0, 0, 0, 0, 1, 1, 2])
    for algorithm in ("binomial", "scatter_allgather"):
        times = [predict(cluster, "broadcast", algorithm, uneven, 64 << 20, root=r).seconds for r in (0, 4, 7)]
        assert times[0] == times[1] and times[2] > times[0] * 1.2, (algorithm, times)
    with pytest.raises(ValueError, match=r"simulate: root must be a rank in \[0, 8\), got 8"):
        predict(cluster, "broadcast", "binomial", uneven, 64, root=8)
    path = tmp_path / "root.json"
    assert cli.main(["explain", "reduce", "--algorithm", "binomial", "--size", "8", "--bytes", "64M", "--nodes", "2",
                     "--predict", "--root", "5", "--links", "nvlink4,ib-ndr", "--json", str(path)]) == 0
    data = json.loads(path.read_text())
    assert data["header"]["explain"]["root"] == 5
    expected = predict(Cluster(cluster.model), "reduce", "binomial", Topology.uniform(8, 4), 64 << 20, root=5,
                       tree_segment_bytes=1 << 20)
    assert data["records"][0]["seconds"] == pytest.approx(expected.seconds, rel=1e-12)


def test_explain_predict_says_why_a_row_is_not_simulated(capsys):
    """12288 ranks: not a power of two, so scatter_allgather has no counted form, and its ring is too long to walk."""
    from pycollect import cli
    assert cli.main(["explain", "broadcast", "--algorithm", "scatter_allgather", "--size", "12288", "--bytes", "1G",
                     "--nodes", "1536", "--predict"]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[2:]}
    assert set(rows) == {"scatter_allgather"}
    assert all("no counted form; walking about" in line and "over the limit" in line for line in rows.values())


def test_explain_predict_simulates_every_broadcast_at_scale(capsys):
    """16384 ranks on 2048 nodes: every broadcast schedule has a counted form there, run in lockstep."""
    from pycollect import cli
    assert cli.main(["explain", "broadcast", "--algorithm", "all", "--size", "16384", "--bytes", "1G", "--nodes",
                     "2048", "--predict"]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[2:]}
    assert set(rows) == set(registry.schedule_algorithms("broadcast"))
    assert all("lockstep" in line and "counted form" in line for line in rows.values())


@pytest.mark.parametrize("collective", registry.COLLECTIVES)
def test_every_schedule_walks_to_its_end(collective):
    """Window rounds, trees, all-to-alls and uneven nodes match every message they post."""
    cluster = Cluster(MODEL, 1)
    for topo in (Topology.single_node(5), Topology.uniform(6, 3), Topology.uniform(8, 2, by_block=False),
                 Topology.from_labels([0, 1, 0, 2, 1, 0, 2])):
        for got in predict_all(cluster, collective, topo, 1 << 16):
            assert got.method == "walk" and got.seconds > 0, (got, topo.describe())


def test_the_planner_simulates_its_collectives_when_the_cluster_says_so():
    from pycollect import plan as P
    from pycollect.plan.comm import dp_topology, group_links
    spec = P.ModelSpec.from_name("gpt3-1.3b", batch=64)
    config = P.ParallelConfig(dp=16, tp=4, algorithm="auto")
    plain = P.ClusterSpec.from_presets(64, 8, 80e9, 989e12, nics_per_node=2)
    simulated = dataclasses.replace(plain, simulate=True)
    (grad,) = [op for op in P.comm_ops(spec, simulated, config) if op.where == "dp"]
    topo = dp_topology(config, simulated)
    expected = predict(Cluster(group_links(simulated, topo)), "allreduce", grad.algorithm, topo, grad.nbytes, 2)
    assert grad.seconds == pytest.approx(expected.seconds, rel=1e-12)
    (before,) = [op for op in P.comm_ops(spec, plain, config) if op.where == "dp"]
    assert before.seconds == pytest.approx(P.comm.price("allreduce", "auto", topo, grad.nbytes, "float16",
                                                        group_links(plain, topo))[2], rel=1e-12)
    with pytest.raises(ValueError, match="simulate must be True or False"):
        dataclasses.replace(plain, simulate="yes")


FITTED = Model({INTRA: Link(3e-6, 1e-10, beta_far=3e-10, far_bytes=1 << 16, beta_shared=2e-11),
                INTER: Link(2e-5, 1e-9, beta_far=2e-9, far_bytes=1 << 18, beta_shared=1e-10)},
               gamma=3e-11, overhead=2e-6, gamma_far=9e-11, copy=2e-11, copy_far=7e-11, cache_bytes=1 << 17,
               fence=4e-6, call_overhead=1e-5)


@pytest.mark.parametrize("window_as_messages", [True, False])
@pytest.mark.parametrize("collective, algorithm", [("allreduce", "ring"), ("allreduce", "hierarchical"),
                                                   ("reduce_scatter", "ring"), ("allgather", "ring"),
                                                   ("allreduce", "shm"), ("allgather", "shm")])
def test_where_no_rank_waits_it_prices_every_term_as_the_cost_model(collective, algorithm, window_as_messages):
    """A fitted model's every term (out-of-cache rates, copies, shared bytes, fences, per call) priced alike: with
    ranks in step and a port a message, the simulator's time is the cost model's."""
    from pycollect.costmodel import predict as alpha_beta
    model = dataclasses.replace(FITTED, window_as_messages=window_as_messages)
    for topo in (Topology.single_node(4), Topology.uniform(6, 3)):
        for nbytes in (4 * 6 * 10, 4 * 6 * 5000, 4 * 6 * 200000):
            got = predict(Cluster(model), collective, algorithm, topo, nbytes, 4, method="walk")
            assert got.seconds == pytest.approx(alpha_beta(model, collective, algorithm, topo, nbytes), rel=1e-9), \
                (topo.describe(), nbytes)


def test_with_a_fitted_model_the_simulator_prices_each_measured_call_as_the_cost_model(tmp_path):
    """bench/cluster_sim_fitted.py on a committed `bench fit` file: every row simulated, equal to the cost model."""
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = tmp_path / "fitted.json"
    proc = subprocess.run([sys.executable, os.path.join(root, "bench", "cluster_sim_fitted.py"),
                           os.path.join(root, "bench", "results", "2026-12-01-fit-4ranks-2nodes.json"),
                           "--json", str(out)], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=root))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert data["summary"]["rows"] == len(data["records"]) > 50
    assert data["summary"]["simulator_equals_cost_model"] == len(data["records"])

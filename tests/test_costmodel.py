"""The alpha-beta-gamma cost model: fitting from samples, and pricing schedules by hand formulas (no MPI)."""
import dataclasses

import numpy as np
import pytest

from pycollect import Topology
from pycollect.engine.schedule import Recv, Round, Schedule, Send, Slice
from pycollect import costmodel as cm

INTRA, INTER = "intra-node", "inter-node"
SIZES = [8, 64, 512, 4096, 32768, 1 << 18, 1 << 20, 1 << 23]


def _round_trips(alpha, beta, sizes=SIZES, noise=0.0, seed=0):
    rng = np.random.default_rng(seed)
    return [(b, 2 * (alpha + b * beta) * (1 + noise * rng.standard_normal())) for b in sizes for _ in range(3)]


@pytest.mark.parametrize("alpha,beta", [(3e-6, 1 / 4e9), (25e-6, 1 / 0.5e9), (1e-6, 1 / 100e9), (0.0, 1e-9)])
def test_fit_recovers_alpha_beta_exactly(alpha, beta):
    link = cm.fit_link(_round_trips(alpha, beta))
    assert link.alpha == pytest.approx(alpha, rel=1e-9, abs=1e-15)
    assert link.beta == pytest.approx(beta, rel=1e-9)


def test_fit_recovers_alpha_beta_from_noisy_samples():
    link = cm.fit_link(_round_trips(14e-6, 1 / 4e9, noise=0.05, seed=3))
    assert link.alpha == pytest.approx(14e-6, rel=0.1)
    assert link.beta == pytest.approx(1 / 4e9, rel=0.1)


def test_one_way_is_half_the_round_trip():
    rtt = cm.fit_link(_round_trips(5e-6, 1e-9))
    one_way = cm.fit_link([(b, t / 2) for b, t in _round_trips(5e-6, 1e-9)], round_trip=False)
    assert rtt.alpha == pytest.approx(one_way.alpha) and rtt.beta == pytest.approx(one_way.beta)


def test_coefficients_are_never_negative():
    # time falling with size pulls beta below 0: pinned to 0, alpha the mean
    link = cm.fit_link([(8, 2e-5), (1 << 20, 1.8e-5)], round_trip=False)
    assert link.beta == 0 and link.alpha > 0
    # pure bandwidth with a smaller-than-linear small size pulls alpha below 0
    link = cm.fit_link([(1000, 0.5e-6), (1 << 20, 1e-3)], round_trip=False)
    assert link.alpha == 0 and link.beta > 0


@pytest.mark.parametrize("samples", [[], [(64, 1e-5), (64, 2e-5)], [(64, 0.0), (128, 1e-5)]])
def test_fit_rejects_what_cannot_be_fitted(samples):
    with pytest.raises(ValueError, match="fit_link"):
        cm.fit_link(samples)


def test_fit_model_per_tier():
    model = cm.fit_model({INTRA: _round_trips(14e-6, 1 / 4e9), INTER: _round_trips(25e-6, 1 / 0.5e9)}, gamma=1e-10)
    assert model.link(INTRA).alpha == pytest.approx(14e-6) and model.link(INTER).beta == pytest.approx(2e-9)
    assert model.gamma == 1e-10 and model.samples == {INTRA: len(SIZES) * 3, INTER: len(SIZES) * 3}
    assert cm.Model.from_dict(model.to_dict()) == model


def test_measure_gamma_is_a_plausible_cost():
    gamma = cm.measure_gamma(1 << 20, repeats=3)
    assert 1e-13 < gamma < 1e-8     # between 100 GB/s... and 0.1 GB/s of float32 adds


def _model(gamma=0.0):
    return cm.Model({INTRA: cm.Link(10e-6, 1 / 4e9), INTER: cm.Link(25e-6, 1 / 0.5e9)}, gamma)


@pytest.mark.parametrize("size", [2, 3, 4, 8])
@pytest.mark.parametrize("gamma", [0.0, 1 / 10e9])
def test_ring_allreduce_on_one_tier_is_the_hand_formula(size, gamma):
    nbytes = 4 * size * 1000                                   # n/N whole float32 elements
    model = _model(gamma)
    a, b = model.link(INTRA).alpha, model.link(INTRA).beta
    # 2(N-1) rounds each alpha + n/N beta; N-1 of them reduce n/N bytes
    hand = 2 * (size - 1) * (a + nbytes / size * b) + (size - 1) * nbytes / size * gamma
    got = cm.predict(model, "allreduce", "ring", Topology.single_node(size), nbytes)
    assert got == pytest.approx(hand, rel=1e-12)


@pytest.mark.parametrize("by_block", [True, False])
@pytest.mark.parametrize("nbytes", [1 << 20, 64 << 20])
def test_hierarchical_beats_ring_across_a_slow_tier(by_block, nbytes):
    topo = Topology.uniform(8, 4, by_block=by_block)
    predicted = cm.predict_all(_model(1 / 10e9), "allreduce", topo, nbytes)
    assert predicted["hierarchical"] < predicted["ring"]
    # the ring's boundary ranks cross the slow tier in each of its 2(N-1) rounds
    assert predicted["ring"] >= 14 * (25e-6 + nbytes / 8 / 0.5e9)


def test_hierarchical_equals_ring_on_one_node():
    topo = Topology.single_node(4)
    predicted = cm.predict_all(_model(), "allreduce", topo, 1 << 20, algorithms=["ring", "hierarchical"])
    assert predicted["hierarchical"] == pytest.approx(predicted["ring"])


def test_a_round_costs_its_slowest_message_plus_reductions():
    topo = Topology.uniform(4, 2)                                        # nodes (0,1), (2,3)
    model = _model(gamma=1e-9)
    rnd = Round(sends=(Send(1, Slice("in", 0, 100)), Send(2, Slice("in", 0, 10))),
                recvs=(Recv(1, Slice("out", 0, 50), acc=Slice("in", 0, 50)),))
    slowest = max(10e-6 + 400 / 4e9, 25e-6 + 40 / 0.5e9, 10e-6 + 200 / 4e9)
    assert cm.round_time(model, rnd, 0, topo, 4) == pytest.approx(slowest + 200 * 1e-9)
    scheds = [Schedule((rnd, rnd)), Schedule(()), Schedule(()), Schedule(())]
    assert cm.rank_times(model, scheds, topo, 4) == pytest.approx([2 * (slowest + 200e-9), 0, 0, 0])


def test_a_port_takes_a_rounds_messages_of_one_direction_one_after_another():
    """Over a tier with a port (the presets' GPU links) what a rank sends over it in a round drains as one message,
    and what it receives as another, both directions at once: the two sends to rank 1 cost 160 elements on the
    intra tier, beside the inter send and the intra receive; without a port the larger send alone."""
    topo = Topology.uniform(4, 2)
    ported = cm.Model({t: dataclasses.replace(k, port=True) for t, k in _model(1e-9).links.items()}, 1e-9)
    rnd = Round(sends=(Send(1, Slice("in", 0, 100)), Send(1, Slice("in", 100, 60)), Send(2, Slice("in", 0, 10))),
                recvs=(Recv(1, Slice("out", 0, 50), acc=Slice("in", 0, 50)),))
    slowest = max(10e-6 + 640 / 4e9, 25e-6 + 40 / 0.5e9, 10e-6 + 200 / 4e9)    # the two intra sends as one
    assert cm.round_time(ported, rnd, 0, topo, 4) == pytest.approx(slowest + 200 * 1e-9)
    assert cm.round_time(_model(1e-9), rnd, 0, topo, 4) == pytest.approx(max(10e-6 + 400 / 4e9, 25e-6 + 40 / 0.5e9)
                                                                         + 200 * 1e-9)
    assert cm.Model.from_dict(ported.to_dict()) == ported


@pytest.mark.parametrize("size", [2, 3, 8])
def test_through_a_port_a_linear_gather_is_paced_by_the_roots_bandwidth(size):
    """The root receives N-1 blocks in its one round: without a port the round costs one block (N-1 links' worth
    of bandwidth at once), through one it costs all of them; a ring, one send and one receive a round, the same
    either way."""
    block = 4 * 1000
    topo = Topology.single_node(size)
    link = cm.Link(10e-6, 1 / 4e9)
    plain, ported = cm.Model({INTRA: link}), cm.Model({INTRA: dataclasses.replace(link, port=True)})
    assert cm.predict(plain, "gather", "linear", topo, block * size) == pytest.approx(10e-6 + block / 4e9)
    assert cm.predict(ported, "gather", "linear", topo, block * size) == \
        pytest.approx(10e-6 + (size - 1) * block / 4e9, rel=1e-12)
    for collective in ("allreduce", "allgather", "reduce_scatter"):
        assert cm.predict(ported, collective, "ring", topo, block * size) == \
            cm.predict(plain, collective, "ring", topo, block * size)


def test_the_presets_link_ports():
    from pycollect.plan.config import links_from_presets
    assert links_from_presets().ports == {INTRA, INTER}


def test_a_window_round_with_far_rates_fence_and_dirty_bytes_by_hand():
    """A window round priced as the copies it is (window_as_messages=False), each term written out: reductions
    and copies near up to cache_bytes and far past it, what the peers fetch that the call wrote (dirty, up to
    cache_bytes), the local copy, what it publishes, the round's overhead and its fence."""
    from pycollect.engine.summary import Shape
    model = cm.Model({INTRA: cm.Link(1e-6, 1e-10)}, gamma=1e-10, gamma_far=3e-10, copy=2e-10, copy_far=5e-10,
                     cache_bytes=1000, fence=7e-6, overhead=2e-6, dirty=1e-11, window_as_messages=False)
    shape = Shape(recvs=((1, 500, True), (2, 300, False)), copied=100, window=True, published=200)
    reduced = 1000 * 1e-10 + 1000 * 3e-10            # 2000 bytes: 1000 near, 1000 far
    copied_in = 1000 * 2e-10 + 200 * 5e-10            # 1200 bytes
    dirty = 1000 * 1e-11                              # 3200 bytes read, up to cache_bytes of them
    hand = reduced + copied_in + dirty + 400 * 2e-10 + 800 * 2e-10 + 2e-6 + 7e-6
    assert cm.round_time(model, shape, 0, Topology.single_node(3), 4) == pytest.approx(hand, rel=1e-12)


def test_the_call_overhead_once_a_call_and_memory_rates_past_the_shared_cache():
    """call_overhead is paid once per call; past memory_bytes of a node's working set (an allreduce: 2 x bytes x
    ranks on the node), x = 1 - memory_bytes / working set of every byte costs the memory rate: a 2-rank ring of
    4000 bytes (working set 16000, memory_bytes 4000: x = 0.75) by hand."""
    link = cm.Link(1e-6, 1e-10, beta_memory=5e-10)
    model = cm.Model({INTRA: link}, gamma=1e-11, gamma_memory=4e-11, memory_bytes=4000)
    topo = Topology.single_node(2)
    beta, gamma = 0.25 * 1e-10 + 0.75 * 5e-10, 0.25 * 1e-11 + 0.75 * 4e-11
    hand = 2 * (1e-6 + 2000 * beta) + 2000 * gamma
    assert cm.predict(model, "allreduce", "ring", topo, 4000) == pytest.approx(hand, rel=1e-12)
    small = 2 * (1e-6 + 500 * 1e-10) + 500 * 1e-11   # 1000 bytes: working set 4000, in cache
    assert cm.predict(model, "allreduce", "ring", topo, 1000) == pytest.approx(small, rel=1e-12)
    called = dataclasses.replace(model, call_overhead=5e-6)
    assert cm.predict(called, "allreduce", "ring", topo, 4000) == pytest.approx(hand + 5e-6, rel=1e-12)


def test_errors_name_the_problem():
    with pytest.raises(ValueError, match="no measurement for tier 'inter-node'"):
        cm.predict(cm.Model({INTRA: cm.Link(1e-6, 1e-9)}), "allreduce", "ring", Topology.uniform(4, 2), 1024)
    with pytest.raises(ValueError, match="no schedule 'mpi'"):
        cm.predict(_model(), "allreduce", "mpi", Topology.single_node(2), 1024)


def test_pick_is_the_least_predicted():
    assert cm.pick({"ring": 3.0, "tree": 1.0, "rabenseifner": 1.0}) == "tree"
    with pytest.raises(ValueError):
        cm.pick({})


@pytest.mark.parametrize("collective", ["allreduce", "reduce_scatter", "allgather", "alltoall", "broadcast", "reduce"])
def test_every_schedule_can_be_priced(collective):
    topo = Topology.uniform(6, 3, by_block=False)
    for algorithm, seconds in cm.predict_all(_model(1e-10), collective, topo, 6 * 4 * 1000, tree_segment_bytes=1024).items():
        assert seconds > 0, algorithm


def test_overhead_is_paid_per_communicating_round_and_fitted_from_residues():
    from pycollect.costmodel import Link, Model, critical_rounds, fit_overhead, predict
    topo = Topology.single_node(4)
    base = Model({"intra-node": Link(1e-6, 1e-9)})
    rounds = critical_rounds("allreduce", "ring", topo, 4096)
    assert rounds == 2 * (4 - 1)
    with_overhead = Model(base.links, overhead=5e-6)
    extra = predict(with_overhead, "allreduce", "ring", topo, 4096) - predict(base, "allreduce", "ring", topo, 4096)
    assert abs(extra - rounds * 5e-6) < 1e-12
    assert fit_overhead([(10e-6, 4e-6, 3), (20e-6, 2e-6, 6), (1e-6, 5e-6, 2)]) == pytest.approx(2e-6)
    with pytest.raises(ValueError, match="no measured call"):
        fit_overhead([(1e-6, 0.0, 0)])
    assert Model.from_dict(with_overhead.to_dict()).overhead == 5e-6

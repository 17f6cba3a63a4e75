"""The cost model's fitted terms and its held-out error, on calls timed by a known model (no MPI)."""
import dataclasses
from dataclasses import replace
import json
from types import SimpleNamespace

import numpy as np
import pytest

from pycollect import Topology
from pycollect.algorithms import registry
from pycollect.algorithms.registry import all_summaries
from pycollect.engine.shapes import even_problem
from pycollect.engine.summary import all_written, shape_of, written_after_first
from pycollect.tools import costfit as cf
from pycollect import costmodel as cm
from pycollect.tools import fit

INTRA, INTER = "intra-node", "inter-node"
KiB, MiB = 1 << 10, 1 << 20
SIZES = [4 * KiB << i for i in range(13)]            # 4 KiB .. 16 MiB by 2, as a `bench fit` sweep
COLLECTIVES = ("allreduce", "allgather", "reduce_scatter")

TRUE_ONE_NODE = cm.Model({INTRA: cm.Link(4e-6, 1e-10, 2e-10, 256 * KiB, 3e-11)}, 7e-11, overhead=3e-6, gamma_far=1.5e-10,
                         copy=5e-11, copy_far=1e-10, cache_bytes=256 * KiB, fence=12e-6, call_overhead=20e-6,
                         window_as_messages=False)
TRUE_TWO_NODES = cm.Model({INTRA: cm.Link(14e-6, 2e-10, 6e-10, 1 * MiB, 1e-10),
                           INTER: cm.Link(25e-6, 8e-10, 1.6e-9, 4 * MiB, 4e-10)},
                          5e-10, overhead=9e-6, gamma_far=8e-10, copy=4e-10, copy_far=9e-10, cache_bytes=1 * MiB,
                          call_overhead=120e-6, window_as_messages=False)


def _pingpong(true):
    """What a ping-pong would give: the right alpha, a beta off by 2x, no far regime, gamma off too."""
    return cm.Model({t: cm.Link(k.alpha, k.beta / 2) for t, k in true.links.items()}, true.gamma / 3)


def _calls(true, topology, sizes=SIZES, scale=lambda p: 1.0):
    """Every schedule of every collective at every size, timed by ``true`` (times ``scale(point)``)."""
    pts = [cf.Point(c, a, s, 1.0)                       # powers of two: whole elements per rank where split
           for c in COLLECTIVES for a in registry.schedule_algorithms(c) for s in sizes]
    probe = cf.Calls(pts, topology)
    timed = [dataclasses.replace(p, seconds=probe.predict(true, p) * scale(p)) for p in pts]
    return cf.Calls(timed, topology)


ONE_NODE = Topology.single_node(2)
TWO_NODES = Topology.uniform(4, 2)


@pytest.fixture(scope="module")
def one_node():
    return _calls(TRUE_ONE_NODE, ONE_NODE)


@pytest.fixture(scope="module")
def two_nodes():
    return _calls(TRUE_TWO_NODES, TWO_NODES)


# -- the model's new terms ------------------------------------------------------------------------------
def _old_round_time(model, shape, rank, topology, itemsize):
    """The round price before the far, copy, fence and call terms existed: the reference for the defaults."""
    slowest = 0.0
    for peer, n in [(peer, n) for peer, n in shape.sends] + [(peer, n) for peer, n, _ in shape.recvs]:
        link = model.link(topology.tier(rank, peer))
        slowest = max(slowest, link.alpha + n * itemsize * link.beta)
    reduced = sum(n for _, n, reduces in shape.recvs if reduces) * itemsize
    return slowest + model.gamma * reduced + (model.overhead if shape.communicates else 0.0)


@pytest.mark.parametrize("topology", [Topology.single_node(2), Topology.single_node(4), Topology.uniform(4, 2),
                                      Topology.uniform(8, 4, by_block=False)])
def test_defaults_price_exactly_as_before(topology):
    model = cm.Model({INTRA: cm.Link(3e-6, 1e-10), INTER: cm.Link(2e-5, 1e-9)}, 3e-11, overhead=2e-6)
    for collective in registry.COLLECTIVES:
        for algorithm in registry.schedule_algorithms(collective):
            problem = even_problem(collective, 0, topology.size, topology, 3000 * topology.size, tree_segment=4096)
            summaries = all_summaries(collective, algorithm, problem)
            old = max(sum(k * _old_round_time(model, s, r, topology, 4) for k, s in summ)
                      for r, summ in enumerate(summaries))
            # a form's base is priced once before its classes' rounds (RankClasses.fold): the same sum, in
            # another order
            assert cm.predict(model, collective, algorithm, topology, 4 * 3000 * topology.size,
                              tree_segment_bytes=4 * 4096) == pytest.approx(old, rel=1e-12), (collective, algorithm)


def test_an_old_model_file_loads_with_the_new_terms_off():
    old = {"gamma_s_per_byte": 2.5e-11, "overhead_s_per_round": 2.8e-05,
           "tiers": {INTRA: {"alpha_s": 3.9e-06, "beta_s_per_byte": 6.2e-11, "samples": 10}}}
    model = cm.Model.from_dict(old)
    assert model == cm.Model({INTRA: cm.Link(3.9e-6, 6.2e-11)}, 2.5e-11, overhead=2.8e-5)
    assert model.call_overhead == 0 and model.copy == 0 and model.cache_bytes is None and model.window_as_messages


@pytest.mark.parametrize("model", [TRUE_ONE_NODE, TRUE_TWO_NODES])
def test_to_dict_round_trips_through_json(model):
    again = cm.Model.from_dict(json.loads(json.dumps(model.to_dict())))
    assert again == model and again.links == model.links


def test_far_bytes_cost_the_far_rate_past_the_crossover():
    link = cm.Link(1e-6, 1e-10, 5e-10, 1000)
    assert link.time(1000) == pytest.approx(1e-6 + 1000 * 1e-10)
    assert link.time(3000) == pytest.approx(1e-6 + 1000 * 1e-10 + 2000 * 5e-10)
    assert cm.Link(1e-6, 1e-10).time(3000) == pytest.approx(1e-6 + 3000 * 1e-10)


def test_the_other_messages_of_a_round_pay_their_tiers_shared_rate():
    topo = Topology.uniform(4, 2)                                        # nodes (0,1), (2,3)
    model = cm.Model({INTRA: cm.Link(1e-6, 1e-10, beta_shared=1e-11), INTER: cm.Link(2e-6, 1e-9, beta_shared=1e-10)})
    shape = cm.Shape(sends=((2, 100),), recvs=((1, 100, False), (3, 50, False)))   # inter 400 B slowest
    slowest = 2e-6 + 400 * 1e-9
    assert cm.round_time(model, shape, 0, topo, 4) == pytest.approx(slowest + 400 * 1e-11 + 200 * 1e-10)


def test_a_window_round_publishes_each_range_once():
    topo = Topology.single_node(4)
    problem = even_problem("allgather", 1, 4, topo, 4 * 100)
    schedule = registry.get_schedule("allgather", "shm")(problem)
    (rnd,) = schedule.rounds
    shape = shape_of(rnd)
    assert shape.window and len(shape.sends) == 3 and shape.published == 100


@pytest.mark.parametrize("true,calls", [(TRUE_ONE_NODE, "one_node"), (TRUE_TWO_NODES, "two_nodes")])
def test_terms_dot_params_is_the_prediction(true, calls, request):
    calls = request.getfixturevalue(calls)
    values = cf.params_of(true)
    for p in calls.points[::7]:
        terms = cf.call_terms(true, calls, p)
        assert sum(c * values[n] for n, c in terms.items()) == pytest.approx(calls.predict(true, p), rel=1e-9), p


# -- fitting --------------------------------------------------------------------------------------------
def test_nonnegative_lstsq():
    a = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    assert cf.nonnegative_lstsq(a, a @ np.array([2.0, 3.0])) == pytest.approx([2.0, 3.0])
    x = cf.nonnegative_lstsq(a, np.array([1.0, -2.0, -1.0]))
    assert x.min() >= 0 and x[1] == 0


@pytest.mark.parametrize("true,calls", [(TRUE_ONE_NODE, "one_node"), (TRUE_TWO_NODES, "two_nodes")])
def test_the_fit_recovers_the_model_that_timed_the_calls(true, calls, request):
    calls = request.getfixturevalue(calls)
    got = cf.fit(calls, _pingpong(true), [None, 256 * KiB, 1 * MiB, 4 * MiB])
    assert got.cache_bytes == true.cache_bytes
    assert {t: k.far_bytes for t, k in got.links.items()} == {t: k.far_bytes for t, k in true.links.items()}
    want, have = cf.params_of(true), cf.params_of(got)
    for name in want:
        if name == "fence" and true.fence == 0:
            continue
        assert have[name] == pytest.approx(want[name], rel=1e-6, abs=1e-15), name
    assert cf.loss(got, calls) < 1e-20


def test_halves_alternate_sizes_per_collective():
    pts = [cf.Point("allreduce", "ring", s, 1.0) for s in (64, 8, 32, 16)] + \
        [cf.Point("allgather", "ring", s, 1.0) for s in (100, 300)] + [cf.Point("allreduce", "tree", 8, 1.0)]
    assert cf.halves(pts) == [1, 0, 0, 1, 0, 1, 0]


def test_error_stats():
    st = cf.error_stats([0.1, -0.3, 0.2, 0.0])
    assert st["count"] == 4 and st["median"] == pytest.approx(0.15) and st["max"] == pytest.approx(0.3)
    assert st["p90"] == pytest.approx(0.27) and st["within"] == 0.75
    assert cf.error_stats([])["count"] == 0


@pytest.fixture(scope="module")
def held_two_nodes(two_nodes):
    return cf.heldout(two_nodes, _pingpong(TRUE_TWO_NODES), [None, 1 * MiB, 4 * MiB])


def test_the_held_out_error_of_the_right_model_is_zero(held_two_nodes, two_nodes):
    records, models = held_two_nodes
    assert len(records) == len(two_nodes.points)
    assert {r["fitted_on"] for r in records} == {0, 1}
    stats = cf.summarize(records)
    assert stats["from"]["max"] < 1e-6 and stats["from"]["within"] == 1.0
    assert stats["from"]["count"] == sum(p.nbytes >= 32 * KiB for p in two_nodes.points)
    assert set(stats["by_size"]) == {str(p.nbytes) for p in two_nodes.points}


def test_the_held_out_error_of_a_wrong_model_is_large(one_node):
    # the right terms but no far regime to choose: past 256 KiB the calls cost twice what the near rates say
    wrong = cf.heldout(one_node, _pingpong(TRUE_ONE_NODE), [None])[0]
    assert cf.summarize(wrong)["from"]["max"] > 0.25
    # the ping-pong model alone, without fitting, is far off too
    pingpong = [one_node.predict(_pingpong(TRUE_ONE_NODE), p) / p.seconds - 1 for p in one_node.points]
    assert cf.error_stats(pingpong)["median"] > 0.25


def test_each_half_is_predicted_by_the_fit_on_the_other():
    # the odd-placed sizes timed twice as slow: a fit on the even ones predicts them at half (-50%), and
    # the fit on the odd ones predicts the even ones at double (+100%); no point sees its own fit
    halves = {}
    calls = _calls(TRUE_ONE_NODE, ONE_NODE, SIZES[:9])
    half = dict(zip([(p.collective, p.algorithm, p.nbytes) for p in calls.points], cf.halves(calls.points)))
    slow = cf.Calls([dataclasses.replace(p, seconds=p.seconds * (2 if half[(p.collective, p.algorithm, p.nbytes)] else 1))
                     for p in calls.points], ONE_NODE)
    records, _ = cf.heldout(slow, _pingpong(TRUE_ONE_NODE), [None, 256 * KiB])
    for r in records:
        halves.setdefault(r["fitted_on"], []).append(r["error"])
    assert np.allclose(halves[0], -0.5, atol=1e-6)
    assert np.allclose(halves[1], 1.0, atol=0.03)   # within 2%: alpha stays the ping-pong's, not doubled


def test_between_tells_interpolated_sizes_from_extrapolated_ones():
    # sizes alternate: half 0 holds 8 and 32 (and 128 for allreduce), half 1 16 and 64; a record was predicted
    # by the fit on the other half (fitted_on): allreduce 64 by half 0's (8..128, between), allgather 64 by
    # half 0's (8..32, beyond), the smallest sizes by half 1's (beyond)
    sizes = {"allreduce": (8, 16, 32, 64, 128), "allgather": (8, 16, 32, 64)}
    records = [{"collective": c, "size_bytes": s, "fitted_on": 1 - i % 2, "error": 0.1 * (i + 1)}
               for c, v in sizes.items() for i, s in enumerate(v)]
    inside = {(r["collective"], r["size_bytes"]): i for r, i in zip(records, cf.between(records))}
    assert inside == {("allreduce", 8): False, ("allreduce", 16): True, ("allreduce", 32): True,
                      ("allreduce", 64): True, ("allreduce", 128): False,
                      ("allgather", 8): False, ("allgather", 16): True, ("allgather", 32): True,
                      ("allgather", 64): False}
    stats = cf.summarize(records, from_bytes=16)
    assert stats["between"]["count"] == 5 and stats["beyond"]["count"] == 2
    assert stats["beyond"]["max"] == pytest.approx(0.5)   # allreduce 128, the fifth size


def test_heldout_needs_two_sizes():
    calls = cf.Calls([cf.Point("allreduce", "ring", 4096, 1e-4)], ONE_NODE)
    with pytest.raises(ValueError, match="heldout"):
        cf.heldout(calls, _pingpong(TRUE_ONE_NODE))
    with pytest.raises(ValueError, match="seconds must be > 0"):
        cf.Calls([cf.Point("allreduce", "ring", 4096, 0.0)], ONE_NODE)


# -- the tuning file: measured where measured, predicted between ----------------------------------------
def test_tuning_takes_the_models_pick_between_measured_sizes():
    world = SimpleNamespace(topology=ONE_NODE, size=2, tree_segment_bytes=0, auto_algorithm=lambda c, n: "mpi")
    rows = []
    for size, mpi_us in ((64 * KiB, 10.0), (256 * KiB, 40.0), (1 * MiB, 10_000.0)):
        rows.append({"collective": "allreduce", "size_bytes": size, "algorithm": "mpi", "measured_us": mpi_us})
        for a in registry.schedule_algorithms("allreduce"):
            rows.append({"collective": "allreduce", "size_bytes": size, "algorithm": a,
                         "measured_us": cm.predict(TRUE_ONE_NODE, "allreduce", a, ONE_NODE, size) * 1e6})
    fit.add_predictions(rows, TRUE_ONE_NODE, world)
    picks = fit.choices(rows, world)
    assert [p["measured_best"] for p in picks][:2] == ["mpi", "mpi"] and picks[2]["measured_best"] != "mpi"
    between = fit.between(rows, TRUE_ONE_NODE, world)
    assert [b["size_bytes"] for b in between] == [128 * KiB, 512 * KiB]
    assert between[0]["predicted_us"]["mpi"] == pytest.approx(20.0)    # log-log halfway between 10 and 40
    assert between[0]["algorithm"] == "mpi" and between[1]["algorithm"] != "mpi"
    entries = fit.tuning_entries(picks, between)
    assert [(e["size_bytes"], e["source"]) for e in entries] == [
        (64 * KiB, "measured"), (128 * KiB, "predicted"), (256 * KiB, "measured"), (512 * KiB, "predicted"),
        (1 * MiB, "measured")]
    table = fit.tuning_table(entries)["allreduce"]
    look = {n: next(a for lim, a in table if lim is None or n <= lim) for n in (64 * KiB, 200 * KiB, 300 * KiB)}
    assert look[64 * KiB] == "mpi" and look[200 * KiB] == "mpi" and look[300 * KiB] == between[1]["algorithm"]


# -- the planner prices with every term of a fitted model ----------------------------------------------
@pytest.mark.parametrize("model", [TRUE_TWO_NODES, cm.Model({INTRA: cm.Link(3e-6, 1e-10), INTER: cm.Link(2e-5, 1e-9)},
                                                            3e-11, overhead=2e-6)])
def test_the_planner_prices_a_call_as_predict_does(model):
    from pycollect.plan.comm import price
    for algorithm in registry.schedule_algorithms("allreduce"):
        _, _, seconds = price("allreduce", algorithm, TWO_NODES, 8 * MiB, "float32", model)
        assert seconds == cm.predict(model, "allreduce", algorithm, TWO_NODES, 8 * MiB), algorithm


def test_pycollect_plan_takes_every_fitted_term_from_the_file(tmp_path):
    import argparse

    from pycollect.tools.plan import add_arguments, build_cluster
    path = tmp_path / "fit.json"
    path.write_text(json.dumps({"model": TRUE_TWO_NODES.to_dict()}))
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--model", "gpt2", "--gpus", "8", "--batch", "8", "--tuning", str(path)])
    assert build_cluster(args).links == TRUE_TWO_NODES
    # a bandwidth given on the command line holds at every size
    args = parser.parse_args(["--model", "gpt2", "--gpus", "8", "--batch", "8", "--tuning", str(path), "--inter-bw", "1e9"])
    inter = build_cluster(args).links.link(INTER)
    assert (inter.beta, inter.beta_far, inter.far_bytes) == (1e-9, None, None)


def test_a_degenerate_ping_pong_fit_is_refused():
    """1/beta infinite on a tier (a sweep too small to show the bandwidth) is named, not handed on."""
    from pycollect.tools.fit import degenerate
    good = cm.Model({INTRA: cm.Link(3e-6, 1e-10), INTER: cm.Link(2e-5, 1e-9)})
    assert degenerate(good) == []
    flat = cm.Model({INTRA: cm.Link(3e-6, 1e-10), INTER: cm.Link(2e-5, 0.0)})
    lines = degenerate(flat)
    assert len(lines) == 1 and "tier inter-node is degenerate" in lines[0] and "--max-bytes" in lines[0]
    assert degenerate(cm.Model({INTRA: cm.Link(3e-6, 0.0, beta_far=2e-10, far_bytes=1 << 20)})) == []


# -- the memory regime: a node's working set past the shared cache ---------------------------------------
TRUE_MEMORY = dataclasses.replace(
    TRUE_ONE_NODE, links={INTRA: dataclasses.replace(TRUE_ONE_NODE.links[INTRA], beta_memory=5e-10)},
    memory_bytes=16 * MiB, gamma_memory=6e-10, copy_memory=4e-10, dirty=3e-11)


def test_at_call_mixes_every_rate_with_its_memory_rate_past_memory_bytes():
    assert TRUE_MEMORY.at_call(16 * MiB) is TRUE_MEMORY and TRUE_ONE_NODE.at_call(1 << 40) is TRUE_ONE_NODE
    m = TRUE_MEMORY.at_call(64 * MiB)                  # 3/4 of every byte from memory
    assert m.memory_bytes is None and m.gamma_memory is None and m.links[INTRA].beta_memory is None
    assert m.gamma == pytest.approx(0.25 * 7e-11 + 0.75 * 6e-10)
    assert m.gamma_far == pytest.approx(0.25 * 1.5e-10 + 0.75 * 6e-10)
    assert m.copy_far == pytest.approx(0.25 * 1e-10 + 0.75 * 4e-10)
    assert m.links[INTRA].beta == pytest.approx(0.25 * 1e-10 + 0.75 * 5e-10)
    assert m.links[INTRA].beta_far == pytest.approx(0.25 * 2e-10 + 0.75 * 5e-10)
    assert m.cache_bytes == TRUE_MEMORY.cache_bytes and m.links[INTRA].far_bytes == 256 * KiB
    assert m.links[INTRA].alpha == TRUE_MEMORY.links[INTRA].alpha and m.call_overhead == TRUE_MEMORY.call_overhead


def test_the_working_set_is_inputs_and_outputs_of_the_fullest_node():
    assert cm.working_set("allreduce", 8 * MiB, ONE_NODE) == 2 * 2 * 8 * MiB
    assert cm.working_set("allgather", 8 * MiB, TWO_NODES) == 2 * (8 * MiB + 2 * MiB)
    assert cm.working_set("reduce_scatter", 8 * MiB, Topology.single_node(4)) == 4 * (8 * MiB + 2 * MiB)
    assert cm.working_set("alltoall", 1 * MiB, Topology((0, 0, 0, 1))) == 3 * 2 * MiB


def test_a_round_counts_as_written_what_it_sends_from_any_buffer_but_the_input():
    from pycollect.engine.schedule import Recv, Round, Send, Slice
    rnd = Round(sends=(Send(1, Slice("in", 0, 5)), Send(2, Slice("out", 0, 7)), Send(3, Slice("tmp", 2, 5))),
                recvs=(Recv(1, Slice("out", 0, 5)),))
    assert shape_of(rnd).written == 7 + 3
    window = Round(sends=(Send(1, Slice("in", 0, 5), at=0),), recvs=(Recv(1, Slice("out", 0, 5), at=0),), window=True)
    assert shape_of(window).written == 5                                       # published: the call's copy
    quiet, a, b = (cm.Shape(copied=5), cm.Shape(sends=((1, 4),), recvs=((1, 4, True),)),
                   cm.Shape(sends=((1, 2),), recvs=((1, 2, False),)))
    assert written_after_first([quiet, a, b, b]) == [quiet, a, replace(b, written=2), replace(b, written=2)]
    assert all_written([quiet, ((), ((1, 3, False),), 0), (((1, 6),), (), 0)]) == \
        [quiet, cm.Shape(recvs=((1, 3, False),)), cm.Shape(sends=((1, 6),), written=6)]


def test_data_the_call_wrote_costs_dirty_when_a_peer_fetches_it():
    # 2 ranks: the ring allreduce's second round sends the block its first reduced; the allgather's one
    # message round sends the caller's input; a window round's reads are what the peer just published
    plain = dataclasses.replace(TRUE_ONE_NODE, dirty=0.0)
    dirty = dataclasses.replace(TRUE_ONE_NODE, dirty=1e-10)
    # below cache_bytes (256 KiB) a block's every byte, past it cache_bytes of them (the rest was written back)
    n = 256 * KiB
    extra = {(c, a): cm.predict(dirty, c, a, ONE_NODE, n) - cm.predict(plain, c, a, ONE_NODE, n)
             for c, a in (("allreduce", "ring"), ("allgather", "ring"), ("allreduce", "recursive_doubling"),
                          ("allreduce", "shm"), ("allgather", "recursive_doubling"), ("allgather", "bruck"),
                          ("reduce_scatter", "pairwise"))}
    assert extra["allreduce", "ring"] == pytest.approx(1e-10 * n / 2)
    assert extra["allgather", "ring"] == 0 and extra["allreduce", "recursive_doubling"] == 0
    assert extra["reduce_scatter", "pairwise"] == 0                       # every round sends a block of the input
    assert extra["allreduce", "shm"] == pytest.approx(1e-10 * n)       # two window rounds, half the vector each
    # the same one exchange as the ring allgather, but the block is sent from out (recursive doubling copies it
    # there first) or from tmp (Bruck rotates the blocks into it)
    assert extra["allgather", "recursive_doubling"] == pytest.approx(1e-10 * n / 2)
    assert extra["allgather", "bruck"] == pytest.approx(1e-10 * n / 2)
    for c, a in (("allreduce", "ring"), ("allgather", "recursive_doubling"), ("allreduce", "shm")):
        assert cm.predict(dirty, c, a, ONE_NODE, 4 * MiB) - cm.predict(plain, c, a, ONE_NODE, 4 * MiB) == \
            pytest.approx(1e-10 * 256 * KiB * (2 if a == "shm" else 1)), (c, a)


def test_a_round_that_only_sends_pays_no_latency_with_eager_sends():
    # the tree allreduce at 4 ranks on one node: relative rank 0 receives from 1 and 2, then sends to 2 and 1;
    # its two send-only rounds lose the link's alpha, its receive rounds and every rank of the ring keep it
    topo = Topology.single_node(4)
    waiting = cm.Model({INTRA: cm.Link(5e-6, 1e-10)}, overhead=1e-6)
    eager = dataclasses.replace(waiting, eager_sends=True)
    for nbytes in (4 * KiB, 1 * MiB):
        assert cm.predict(waiting, "allreduce", "tree", topo, nbytes) - cm.predict(eager, "allreduce", "tree", topo,
                                                                                  nbytes) == pytest.approx(2 * 5e-6)
        assert cm.predict(eager, "allreduce", "ring", topo, nbytes) == cm.predict(waiting, "allreduce", "ring", topo,
                                                                                  nbytes)
    assert cm.Model.from_dict(json.loads(json.dumps(eager.to_dict()))).eager_sends
    # the fit tries both and keeps the one its calls support: calls timed with eager sends are fitted with them
    true = dataclasses.replace(TRUE_ONE_NODE, eager_sends=True)
    calls = _calls(true, ONE_NODE, SIZES[:9])
    fitted = cf.fit(calls, _pingpong(true), [256 * KiB])
    assert fitted.eager_sends and max(abs(calls.predict(fitted, p) / p.seconds - 1) for p in calls.points) < 1e-6
    assert not cm.Model.from_dict({"tiers": {INTRA: {"alpha_s": 1e-6, "beta_s_per_byte": 1e-10}}}).eager_sends


def test_predict_prices_a_call_with_its_memory_share():
    for nbytes in (1 * MiB, 16 * MiB):
        ws = cm.working_set("allreduce", nbytes, ONE_NODE)
        assert cm.predict(TRUE_MEMORY, "allreduce", "ring", ONE_NODE, nbytes) == \
            cm.predict(TRUE_MEMORY.at_call(ws), "allreduce", "ring", ONE_NODE, nbytes)
    in_cache = dataclasses.replace(TRUE_ONE_NODE, dirty=TRUE_MEMORY.dirty)       # the same but no memory regime
    assert cm.predict(TRUE_MEMORY, "allreduce", "ring", ONE_NODE, 1 * MiB) == \
        cm.predict(in_cache, "allreduce", "ring", ONE_NODE, 1 * MiB)            # 4 MiB: in cache
    assert cm.predict(TRUE_MEMORY, "allreduce", "ring", ONE_NODE, 16 * MiB) > \
        1.5 * cm.predict(in_cache, "allreduce", "ring", ONE_NODE, 16 * MiB)


@pytest.fixture(scope="module")
def memory_calls():
    return _calls(TRUE_MEMORY, ONE_NODE)


def test_terms_dot_params_is_the_prediction_with_a_memory_regime(memory_calls):
    values = cf.params_of(TRUE_MEMORY)
    for p in memory_calls.points[::5]:
        terms = cf.call_terms(TRUE_MEMORY, memory_calls, p)
        assert sum(c * values[n] for n, c in terms.items()) == pytest.approx(memory_calls.predict(TRUE_MEMORY, p),
                                                                             rel=1e-9), p


def test_the_fit_recovers_a_memory_regime(memory_calls):
    got = cf.fit(memory_calls, _pingpong(TRUE_MEMORY), [None, 256 * KiB], memory=None)
    assert got.memory_bytes == 16 * MiB and got.cache_bytes == 256 * KiB
    want, have = cf.params_of(TRUE_MEMORY), cf.params_of(got)
    for name in ("gamma_memory", "copy_memory", f"beta_memory:{INTRA}", "gamma", "gamma_far", f"beta_far:{INTRA}",
                 "dirty"):
        assert have[name] == pytest.approx(want[name], rel=1e-6), name
    assert cf.loss(got, memory_calls) < 1e-20
    # without the regime the held-out error past the cache is large; with it, none
    without = cf.summarize(cf.heldout(memory_calls, _pingpong(TRUE_MEMORY), [None, 256 * KiB])[0])
    assert without["from"]["max"] > 0.25
    assert cf.memory_candidates(memory_calls) == [None, 8 * MiB, 16 * MiB, 32 * MiB]   # largest: 16 MiB x 2 x 2


def test_a_memory_model_round_trips_through_json_and_old_files_load_without_it():
    again = cm.Model.from_dict(json.loads(json.dumps(TRUE_MEMORY.to_dict())))
    assert again == TRUE_MEMORY and again.links == TRUE_MEMORY.links
    assert cm.Model.from_dict(TRUE_ONE_NODE.to_dict()).memory_bytes is None


# -- noise beside error, and fitting again from a saved run ----------------------------------------------
def test_the_summary_sets_each_miss_beside_its_spread():
    records = [{"collective": "allreduce", "algorithm": "ring", "size_bytes": s, "error": e, "fitted_on": 0, "spread": sp}
               for s, e, sp in ((16 * KiB, 0.9, 0.0), (64 * KiB, 0.1, 0.02), (1 * MiB, -0.4, 0.3), (4 * MiB, 0.3, 0.05))]
    st = cf.summarize(records)
    assert st["from"]["count"] == 3 and st["quiet"]["count"] == 2 and st["quiet"]["max"] == pytest.approx(0.3)
    assert [(m["size_bytes"], m["spread"]) for m in st["misses"]] == [(1 * MiB, 0.3), (4 * MiB, 0.05)]
    assert fit.spread({"passes_us": [10.0, 30.0, 12.0]}) == pytest.approx(0.2)
    assert fit.spread({"passes_us": [10.0]}) is None and fit.spread({}) is None


def _saved_run(path, true=TRUE_ONE_NODE, topology=ONE_NODE):
    """A `bench fit --json` file as a run writes it, its calls timed by ``true`` (the median pass 20% slower)."""
    calls = _calls(true, topology, SIZES[:10])
    records = []
    for p in calls.points:
        us = p.seconds * 1e6
        records.append({"collective": p.collective, "size_bytes": p.nbytes, "algorithm": p.algorithm, "iters": 5,
                        "measured_us": us, "passes_us": [us * 1.2, us, us * 1.3], "predicted_us": 1.0})
    doc = {"schema": "pycollect.bench/1", "kind": "fit", "records": records, "pairs": [],
           "header": {"node_of": list(topology.node_of), "pipeline_bytes": 0, "date": "then"},
           "pingpong_model": _pingpong(true).to_dict(), "choices": []}
    path.write_text(json.dumps(doc))
    return path


def test_fit_from_a_saved_run_needs_no_mpi_and_predicts_the_held_out_sizes(tmp_path, capsys):
    from pycollect.cli import main
    saved = _saved_run(tmp_path / "run.json")
    out, tuning = tmp_path / "again.json", tmp_path / "tuning.json"
    assert main(["bench", "fit", "--from", str(saved), "--json", str(out), "--tuning-out", str(tuning)]) == 0
    text = capsys.readouterr().out
    assert "held-out error" in text and "quiet" in text
    doc = json.loads(out.read_text())
    assert doc["kind"] == "fit" and doc["header"]["refit_from"] == str(saved) and doc["header"]["date"] == "then"
    stats = doc["heldout"]["stats"]
    assert stats["from"]["max"] < 0.02 and stats["quiet"]["count"] == 0 and stats["misses"] == []
    assert all(p["spread"] == pytest.approx(0.2) for p in doc["heldout"]["points"])
    assert all(r["predicted_us"] != 1.0 for r in doc["records"])           # priced again, not copied
    assert json.loads(tuning.read_text())["table"]["allreduce"]


def test_fit_from_a_file_that_is_not_a_fit_says_so(tmp_path, capsys):
    from pycollect.cli import main
    old = json.loads(_saved_run(tmp_path / "old.json").read_text())        # before pingpong_model was kept apart
    old["model"] = old.pop("pingpong_model")
    (tmp_path / "old.json").write_text(json.dumps(old))
    assert main(["bench", "fit", "--from", str(tmp_path / "old.json")]) == 0
    capsys.readouterr()
    other = tmp_path / "sweep.json"
    other.write_text(json.dumps({"kind": "sweep", "header": {}, "records": []}))
    assert main(["bench", "fit", "--from", str(other)]) == 2
    err = capsys.readouterr().err
    assert "--from" in err and "not a `bench fit --json` file" in err and "pingpong_model" in err
    assert main(["bench", "fit", "--from", str(tmp_path / "missing.json")]) == 2
    assert "cannot read it" in capsys.readouterr().err


@pytest.mark.parametrize("damage, message", [
    (lambda d: d["records"][2].update(size_bytes=-8), "records[2] has size_bytes -8; expected a positive integer"),
    (lambda d: [r.update(size_bytes=-r["size_bytes"]) for r in d["records"]], "records[0] has size_bytes -"),
    (lambda d: d["records"][1].update(measured_us=float("nan")), "records[1] has measured_us nan"),
    (lambda d: d["records"][1].update(passes_us=[1.0, "2"]), "and passes_us [1.0, '2']; expected positive times"),
    (lambda d: d["records"][0].update(iters=True), "records[0] has iters True"),
    (lambda d: d["records"][0].update(algorithm="fastest"), "algorithm 'fastest', which allreduce does not have"),
    (lambda d: d["records"][0].pop("collective"), "records[0] lacks collective"),
    (lambda d: d.update(records={"a": 1}), "records is not a list of records"),
    (lambda d: d["header"].update(node_of=[0, "a"]), "header.node_of: Topology: node_of must be"),
    # found by an audit (2026-12-05): tracebacks, a fit that ran on for minutes, a model of negative times fitted
    (lambda d: d.update(choices=[{"foo": 1}]), "choices must be a list of objects with collective, size_bytes"),
    (lambda d: d["header"].update(pipeline_bytes="x"), "header.tree_segment_bytes must be an integer >= 0, got 'x'"),
    (lambda d: d["pingpong_model"].pop("tiers"), "the file's pingpong_model: fitted model: tiers must be an object"),
    (lambda d: d["pingpong_model"]["tiers"]["intra-node"].update(alpha_s=-1.0),
     "pingpong_model: fitted model: tiers.intra-node.alpha_s must be a finite number >= 0, got -1.0"),
    (lambda d: d["records"][0].update(size_bytes=2**70), "above the largest buffer a fit measures, 1024G"),
])
def test_fit_from_a_damaged_file_names_the_record(tmp_path, capsys, damage, message):
    """A hand-edited or damaged record is refused, one line naming it (a negative size ended in "min() arg is an
    empty sequence"; all sizes negative fitted a model)."""
    from pycollect.cli import main
    doc = json.loads(_saved_run(tmp_path / "run.json").read_text())
    damage(doc)
    (tmp_path / "run.json").write_text(json.dumps(doc))
    assert main(["bench", "fit", "--from", str(tmp_path / "run.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pycollect bench fit: error: ") and message in err and err.count("\n") == 1, err


def test_fit_from_a_file_with_mpis_own_alone_at_a_size_fits_the_rest(tmp_path, capsys):
    """A size where only MPI's own call was kept (a trimmed file) has no schedule for the model to pick: passed
    over, not "min() arg is an empty sequence"."""
    from pycollect.cli import main
    doc = json.loads(_saved_run(tmp_path / "run.json").read_text())
    alone = doc["records"][0]["size_bytes"]
    doc["records"] = [r for r in doc["records"] if r["size_bytes"] != alone] + \
        [dict(doc["records"][0], collective="allreduce", algorithm="mpi")]
    (tmp_path / "run.json").write_text(json.dumps(doc))
    assert main(["bench", "fit", "--from", str(tmp_path / "run.json")]) == 0, capsys.readouterr().err


def test_fit_from_refuses_the_flags_only_measuring_reads(tmp_path, capsys):
    from pycollect.cli import main
    saved = str(_saved_run(tmp_path / "run.json"))
    assert main(["bench", "fit", "--from", saved, "-n", "5", "--collectives", "alltoall"]) == 2
    assert "--from measures nothing, so -n/--iters, --collectives would have no effect" in capsys.readouterr().err
    assert main(["bench", "fit", "--from", saved, "-n", "10"]) == 0   # the default given again changes nothing


def test_the_cluster_simulator_prices_the_memory_share_and_dirty_data_as_the_cost_model():
    from pycollect.clustersim import Cluster, predict as simulate
    for nbytes in (1 * MiB, 16 * MiB):     # rings of equal ranks: no rank waits, so the two agree
        for topology, method in ((ONE_NODE, "walk"), (ONE_NODE, "lockstep"), (Topology.single_node(4), "walk"),
                                 (Topology.single_node(4), "lockstep")):
            assert simulate(Cluster(TRUE_MEMORY), "allreduce", "ring", topology, nbytes, method=method).seconds == \
                pytest.approx(cm.predict(TRUE_MEMORY, "allreduce", "ring", topology, nbytes), rel=1e-12), (topology, method)


def test_a_few_stalled_calls_are_set_aside_not_fitted():
    # three calls that waited out a timer (x6): named as outliers, and the fit without them is the true model's
    stalled = {("allreduce", "recursive_doubling", 2 * MiB), ("allgather", "ring", 1 * MiB),
               ("reduce_scatter", "pairwise", 2 * MiB)}
    calls = _calls(TRUE_ONE_NODE, ONE_NODE, SIZES[:11],
                   scale=lambda p: 6.0 if (p.collective, p.algorithm, p.nbytes) in stalled else 1.0)
    start, crossovers = _pingpong(TRUE_ONE_NODE), [None, 256 * KiB]
    trimmed = cf.fit(calls, start, crossovers, trim=0.5)
    out = cf.outliers(trimmed, calls, 0.5)
    assert {(p.collective, p.algorithm, p.nbytes) for p, o in zip(calls.points, out) if o} == stalled
    want, have = cf.params_of(TRUE_ONE_NODE), cf.params_of(trimmed)
    for name in ("gamma", "gamma_far", f"beta_far:{INTRA}", "copy_far", "call_overhead"):
        assert have[name] == pytest.approx(want[name], rel=1e-6), name
    kept = [p for p, o in zip(calls.points, out) if not o]
    assert max(abs(calls.predict(trimmed, p) / p.seconds - 1) for p in kept) < 1e-6

"""Pipeline schedules and their simulator against the literature, without MPI.

Grids: p = 1..8 stages x m = 1..16 micro-batches for gpipe and 1f1b; v = 2..4 chunks and m a
multiple of p up to 16 for the interleaved schedule, and every m from p to 3p with v = 2, 3 for it
and for interleaved-mcore; and every (schedule, p <= 8, m <= 3p, v <= 3) the schedules accept walked
to its end without deadlock. The interleaved orders are compared with line-by-line transcriptions of
Megatron-LM's forward_backward_pipelining_with_interleaving (m a multiple of p) and of Megatron-Core's
get_schedule_table and get_pp_rank_microbatches (any m).
"""
import os
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pycollect.pipeline import (B, COMM, F, RECV_ACT, RECV_GRAD, SEND_ACT, SEND_GRAD, Action, all_actions,
                                bubble_formula, check_schedule_args, model_chunk, simulate, stage_actions,
                                warmup_count)
from pycollect.pipeline.schedules import ALL_SCHEDULES, ZERO_BUBBLE, group_size, interleaved, vshaped
from pycollect.pipeline.simulate import peak_memory

GRID = ([("gpipe", p, m, 1) for p in range(1, 9) for m in range(1, 17)]
        + [("1f1b", p, m, 1) for p in range(1, 9) for m in range(1, 17)]
        + [("interleaved", p, m, v) for p in range(1, 9) for v in range(2, 5) for m in range(p, 17, p)]
        + [(schedule, p, m, v) for schedule in ("interleaved", "interleaved-mcore") for p in range(1, 9)
           for v in (2, 3) for m in range(p, 3 * p + 1) if schedule == "interleaved-mcore" or m % p])
INTERLEAVED = [c for c in GRID if c[0].startswith("interleaved")]


def _ids(case):
    return "%s-p%d-m%d-v%d" % case


# -- structure ------------------------------------------------------------------------------------
def _check_structure(schedule, p, m, v, lists):
    every = {(i, c) for i in range(m) for c in range(v)}
    sends, recvs = Counter(), Counter()
    for s, actions in enumerate(lists):
        fwd = [(a.micro, a.chunk) for a in actions if a.op == F]
        bwd = [(a.micro, a.chunk) for a in actions if a.op == B]
        assert sorted(fwd) == sorted(every) and sorted(bwd) == sorted(every), (s, fwd, bwd)
        pos = {(a.op, a.micro, a.chunk): i for i, a in enumerate(actions) if a.op in (F, B)}
        assert all(pos[(F, *x)] < pos[(B, *x)] for x in every), s
        for i, a in enumerate(actions):
            k = model_chunk(s, a.chunk, p)
            if a.op in (F, B):
                # the receive right before, the send right after, exactly where the contract says
                recv, send = (RECV_ACT, SEND_ACT) if a.op == F else (RECV_GRAD, SEND_GRAD)
                first, final = (k == 0, k == p * v - 1) if a.op == F else (k == p * v - 1, k == 0)
                has_recv = p > 1 and not first
                has_send = p > 1 and not final
                assert (i > 0 and actions[i - 1][:3] == (recv, a.micro, a.chunk)) == has_recv, (s, i, a)
                assert (i + 1 < len(actions) and actions[i + 1][:3] == (send, a.micro, a.chunk)) == has_send, (s, i, a)
            elif a.op in (SEND_ACT, SEND_GRAD):
                to = k + 1 if a.op == SEND_ACT else k - 1          # the model chunk the message is for
                assert a.peer == to % p != s or p == 1, (s, a)
                sends[(a.op[5:], s, a.peer, a.micro, to)] += 1
            else:
                came = k - 1 if a.op == RECV_ACT else k + 1
                assert a.peer == came % p, (s, a)
                recvs[(a.op[5:], a.peer, s, a.micro, k)] += 1
    assert sends == recvs
    assert all(n == 1 for n in sends.values())
    if p == 1:
        assert not any(a.op in COMM for a in lists[0])


@pytest.mark.parametrize("case", GRID, ids=_ids)
def test_lists_are_complete_and_messages_pair_up(case):
    schedule, p, m, v = case
    lists = all_actions(schedule, p, m, v)
    assert lists == [stage_actions(schedule, p, m, v, s) for s in range(p)]
    _check_structure(schedule, p, m, v, lists)


@pytest.mark.parametrize("case", GRID, ids=_ids)
def test_no_deadlock_and_bubble_is_the_formula(case):
    schedule, p, m, v = case
    r = simulate(schedule, p, m, v)
    assert r.deadlock is None and r.unreceived == [], r.describe_deadlock()
    assert abs(r.bubble - bubble_formula(schedule, p, m, v)) < 1e-12
    assert abs(r.makespan - 3 * (m * v + p - 1)) < 1e-9        # F = 1, B = 2 per chunk
    assert sum(r.busy) == pytest.approx(3 * m * v * p)
    assert all(len(t) == 2 * m * v for t in r.timeline)
    assert r.per_stage_bubble[0] == pytest.approx(r.per_stage_bubble[-1])


def test_every_accepted_case_up_to_p8_m3p_v3_runs_without_deadlock():
    """The issue's grid whole, every schedule: each (p <= 8, m <= 3p, v <= 3) that ``check_schedule_args``
    accepts is walked to its end (no stage stuck, no message left unreceived, every computation run), and
    it accepts exactly what its docstring says: v = 1 but for the interleaved ones (any v) and zbv (v = 2),
    m >= p for the zero-bubble ones and for interleaving with v >= 2."""
    counts = Counter()
    for schedule in ALL_SCHEDULES:
        for p in range(1, 9):
            for m, v in ((m, v) for m in range(1, 3 * p + 1) for v in (1, 2, 3)):
                if vshaped(schedule):
                    expected = v == 2 and m >= p
                elif interleaved(schedule):
                    expected = v == 1 or m >= p
                else:
                    expected = v == 1 and (m >= p or schedule not in ZERO_BUBBLE)
                try:
                    check_schedule_args(schedule, p, m, v)
                except ValueError:
                    assert not expected, (schedule, p, m, v)
                    continue
                assert expected, (schedule, p, m, v)
                r = simulate(schedule, p, m, v)
                assert r.deadlock is None and r.unreceived == [], (schedule, p, m, v, r.describe_deadlock())
                per_pair = 3 if schedule in ZERO_BUBBLE else 2        # F, B and, split off the B, W
                assert [len(row) for row in r.timeline] == [per_pair * m * v] * p, (schedule, p, m, v)
                counts[schedule] += 1
    # all m <= 3p (108 pairs (p, m)); m >= p leaves 80 (2p + 1 for each p); the interleaved ones add v = 2, 3
    assert counts == {"gpipe": 108, "1f1b": 108, "interleaved": 108 + 2 * 80, "interleaved-mcore": 108 + 2 * 80,
                      "zb-h1": 80, "zb-h2": 80, "zbv": 80}


def test_gpipe_order():
    assert [str(a) for a in stage_actions("gpipe", 3, 3, 1, 1)] == [
        "RECV_ACT0<-0", "F0", "SEND_ACT0->2", "RECV_ACT1<-0", "F1", "SEND_ACT1->2", "RECV_ACT2<-0", "F2",
        "SEND_ACT2->2", "RECV_GRAD0<-2", "B0", "SEND_GRAD0->0", "RECV_GRAD1<-2", "B1", "SEND_GRAD1->0",
        "RECV_GRAD2<-2", "B2", "SEND_GRAD2->0"]


def _compute(schedule, p, m, v, s):
    return [(a.op, a.micro, a.chunk) for a in stage_actions(schedule, p, m, v, s) if a.op in (F, B)]


@pytest.mark.parametrize("p", range(1, 9))
@pytest.mark.parametrize("m", range(1, 17))
def test_1f1b_warmup_steady_cooldown(p, m):
    for s in range(p):
        w = min(p - s - 1, m)
        assert warmup_count("1f1b", p, m, 1, s) == w
        order = _compute("1f1b", p, m, 1, s)
        steady = [x for i in range(m - w) for x in ((F, w + i, 0), (B, i, 0))]
        assert order == [(F, i, 0) for i in range(w)] + steady + [(B, i, 0) for i in range(m - w, m)]


def _megatron_interleaved(p, m, v, rank):
    """Megatron-LM's forward_backward_pipelining_with_interleaving, its order of (op, micro, chunk) only."""
    total = m * v
    if m == p:
        warmup = total
    else:
        warmup = min((p - rank - 1) * 2 + (v - 1) * p, total)

    def get_model_chunk_id(microbatch_id, forward):
        microbatch_id_in_group = microbatch_id % (p * v)
        model_chunk_id = microbatch_id_in_group // p
        return model_chunk_id if forward else v - model_chunk_id - 1

    def get_microbatch_id_in_model_chunk(iteration_id):
        iteration_group_id = iteration_id // (p * v)
        return iteration_group_id * p + iteration_id % p

    out = []
    for k in range(warmup):
        out.append((F, get_microbatch_id_in_model_chunk(k), get_model_chunk_id(k, True)))
    for k in range(total - warmup):
        fk = k + warmup
        out.append((F, get_microbatch_id_in_model_chunk(fk), get_model_chunk_id(fk, True)))
        out.append((B, get_microbatch_id_in_model_chunk(k), get_model_chunk_id(k, False)))
    for k in range(total - warmup, total):
        out.append((B, get_microbatch_id_in_model_chunk(k), get_model_chunk_id(k, False)))
    return out


def _megatron_core_interleaved(p, m, v, rank, group):
    """Megatron-Core's get_schedule_table and get_pp_rank_microbatches with microbatch_group_size_per_vp_stage
    = ``group``, and the loop of its forward_backward_pipelining_with_interleaving: (op, micro, chunk) only."""
    table = []
    for lo in range(0, m, group):
        if lo + group >= m:
            table.extend([(i, c) for c in range(v) for i in range(lo, m)])
        else:
            table.extend([(i, c) for c in range(v) for i in range(lo, lo + group)])
    total = m * v
    warmup = min((p - rank - 1) * 2 + (v - 1) * group, total)
    fwd = [(F, i, c) for i, c in table]
    bwd = [(B, i, v - c - 1) for i, c in table]
    out = fwd[:warmup]
    for k in range(total - warmup):
        out += [fwd[k + warmup], bwd[k]]
    return out + bwd[total - warmup:]


@pytest.mark.parametrize("case", [c for c in GRID if c[0] == "interleaved" and c[2] % c[1] == 0], ids=_ids)
def test_interleaved_is_megatrons_order(case):
    _, p, m, v = case
    for s in range(p):
        assert _compute("interleaved", p, m, v, s) == _megatron_interleaved(p, m, v, s)


@pytest.mark.parametrize("case", [c for c in INTERLEAVED if c[3] > 1 and (c[0] == "interleaved-mcore" or c[2] != c[1])],
                         ids=_ids)
def test_interleaved_is_megatron_cores_order(case):
    """interleaved-mcore always, interleaved whenever m != p: Megatron-Core's order with the group size chosen,
    which is the smallest Megatron-Core accepts (p <= g <= m; the last group whole or at least p long)."""
    schedule, p, m, v = case
    g = group_size(p, m)
    accepted = [k for k in range(p, m + 1) if m % k == 0 or m % k >= p]
    assert g == min(accepted) and (g == p) == (m % p == 0)
    for s in range(p):
        assert _compute(schedule, p, m, v, s) == _megatron_core_interleaved(p, m, v, s, g)


def test_megatron_cores_order_holds_fewer_activations_at_m_equal_p_but_is_never_faster():
    """The issue's example, and the reason interleaved keeps all forwards first at m == p: the same bubble with
    free messages, slower when a message outlasts a computation, never faster (p = 2..6, v = 2, 3)."""
    assert simulate("interleaved-mcore", 4, 4, 2).peak_chunk_activations == [8, 8, 7, 5]
    assert simulate("interleaved", 4, 4, 2).peak_chunk_activations == [8, 8, 8, 8]
    slower = 0
    for p in range(2, 7):
        for v in (2, 3):
            for f, b, c in ((1, 2, 0), (1, 2, 1.5), (1, 1, 3), (2, 1, 2)):
                costs = {"F": f, "B": b, "comm": c}
                core = simulate("interleaved-mcore", p, p, v, costs=costs)
                legacy = simulate("interleaved", p, p, v, costs=costs)
                assert core.makespan >= legacy.makespan - 1e-9, (p, v, costs)
                assert sum(core.peak_chunk_activations) < sum(legacy.peak_chunk_activations)
                slower += core.makespan > legacy.makespan + 1e-9
                if c == 0:
                    assert core.makespan == pytest.approx(legacy.makespan)
    assert slower > 0


def test_interleaved_with_one_chunk_is_1f1b():
    for p, m in ((1, 1), (3, 5), (4, 8), (8, 3)):
        assert all_actions("interleaved", p, m, 1) == all_actions("1f1b", p, m, 1)


def test_one_stage_with_chunks_hands_over_locally():
    r = simulate("interleaved", 1, 3, 3)
    assert r.deadlock is None and r.bubble == 0 and r.makespan == 3 * 3 * 3
    assert not any(a.op in COMM for a in all_actions("interleaved", 1, 3, 3)[0])


# -- the literature -------------------------------------------------------------------------------
@pytest.mark.parametrize("schedule, m, v, percent", [("gpipe", 32, 1, 17.9), ("1f1b", 32, 1, 17.9),
                                                     ("gpipe", 128, 1, 5.2), ("1f1b", 128, 1, 5.2),
                                                     ("interleaved", 32, 2, 9.9)])
def test_literature_numbers(schedule, m, v, percent):
    r = simulate(schedule, 8, m, v)
    assert round(100 * r.bubble, 1) == percent == round(100 * bubble_formula(schedule, 8, m, v), 1)


@pytest.mark.parametrize("p", range(1, 9))
@pytest.mark.parametrize("m", range(1, 17))
def test_peak_in_flight(p, m):
    assert simulate("gpipe", p, m).peak_in_flight == [m] * p
    r = simulate("1f1b", p, m)
    assert r.peak_in_flight == r.peak_chunk_activations == [min(p - s, m) for s in range(p)]


@pytest.mark.parametrize("case", INTERLEAVED, ids=_ids)
def test_interleaved_peak_is_warmup_plus_one(case):
    schedule, p, m, v = case
    r = simulate(schedule, p, m, v)
    assert r.peak_chunk_activations == [min(warmup_count(schedule, p, m, v, s) + 1, m * v) for s in range(p)]
    assert all(1 <= a <= min(b, m) for a, b in zip(r.peak_in_flight, r.peak_chunk_activations))


def test_peak_counts_micro_batches_once_over_chunks():
    acts = [Action(F, 0, 0), Action(F, 0, 1), Action(F, 1, 0), Action(B, 0, 1), Action(B, 0, 0), Action(B, 1, 0)]
    assert peak_memory(acts) == (2, 3)


# -- costs ---------------------------------------------------------------------------------------
schedules_st = st.one_of(
    st.tuples(st.sampled_from(["gpipe", "1f1b"]), st.integers(1, 8), st.integers(1, 24), st.just(1)),
    st.integers(1, 8).flatmap(lambda p: st.tuples(st.sampled_from(["interleaved", "interleaved-mcore"]), st.just(p),
                                                  st.integers(p, 4 * p), st.integers(1, 4))))
cost_st = st.integers(1, 8).map(lambda x: x / 4)        # exact binary fractions: sums are exact


@settings(max_examples=60, deadline=None)
@given(schedules_st, cost_st, cost_st)
def test_bubble_is_the_formula_for_any_compute_costs(case, f, b):
    """With free communication the bubble is (p-1)/(m*v+p-1) whatever F and B cost."""
    schedule, p, m, v = case
    r = simulate(schedule, p, m, v, costs={"F": f, "B": b})
    assert r.deadlock is None
    assert r.makespan == pytest.approx((m * v + p - 1) * (f + b), abs=1e-9)
    assert abs(r.bubble - bubble_formula(schedule, p, m, v)) < 1e-12


@settings(max_examples=80, deadline=None)
@given(schedules_st, cost_st, cost_st, cost_st)
def test_communication_latency_lengthens_the_critical_path(case, f, b, c):
    """Latency c adds one micro-batch's 2(pv-1) hops to the critical path, or more.

    gpipe: exactly that, for any c. interleaved (v >= 2, m a multiple of p): exactly that when m == p
    (all warm-up; interleaved-mcore: that or more) or c <= min(F, B), more otherwise; off multiples of p the longer
    last group hides part of it (only the free-message makespan bounds it). 1f1b (and interleaved with
    v = 1): exactly that for m <= 2,
    more from m = 3 on (its steady state waits a round trip for each gradient). With p = 1 nothing
    is sent (the chunks hand over locally): no latency at all.
    """
    schedule, p, m, v = case
    r = simulate(schedule, p, m, v, costs={"F": f, "B": b, "comm": c})
    assert r.deadlock is None
    bound = (m * v + p - 1) * (f + b) + (2 * (p * v - 1) * c if p > 1 else 0)
    exact = (p == 1 or schedule == "gpipe" or (v > 1 and ((m == p and schedule == "interleaved") or c <= min(f, b)))
             or (v == 1 and m <= 2))
    if v > 1 and m % p and p > 1:
        assert r.makespan >= (m * v + p - 1) * (f + b) - 1e-9
    elif exact:
        assert r.makespan == pytest.approx(bound, abs=1e-9)
    elif schedule == "interleaved-mcore" and m == p:   # exact where every stage warms up fully, more elsewhere
        assert r.makespan >= bound - 1e-9
    else:
        assert r.makespan > bound + 1e-9
    assert r.bubble >= bubble_formula(schedule, p, m, v) - 1e-12


# -- broken lists ---------------------------------------------------------------------------------
def test_swapped_receives_deadlock_and_name_the_stuck_actions():
    lists = all_actions("1f1b", 3, 4, 1)
    mid = lists[1]
    i = mid.index(Action(RECV_GRAD, 0, 0, 2))
    j = mid.index(Action(RECV_ACT, 3, 0, 0))
    mid[i], mid[j] = mid[j], mid[i]      # stage 1 waits for micro 3 before it sends stage 0 the gradient of 0
    r = simulate(lists)
    assert r.deadlock == {0: Action(RECV_GRAD, 0, 0, 1), 1: Action(RECV_ACT, 3, 0, 0), 2: Action(RECV_ACT, 2, 0, 1)}
    assert "stage 1 waits on RECV_ACT3<-0" in r.describe_deadlock()


def test_a_missing_send_leaves_its_receiver_waiting():
    lists = all_actions("gpipe", 2, 2, 1)
    lists[0].remove(Action(SEND_ACT, 1, 0, 1))
    r = simulate(lists)
    assert r.deadlock == {1: Action(RECV_ACT, 1, 0, 0), 0: Action(RECV_GRAD, 0, 0, 1)}


def test_a_forward_without_its_receive_is_stuck():
    lists = all_actions("1f1b", 2, 2, 1)
    lists[1].remove(Action(RECV_ACT, 0, 0, 0))
    r = simulate(lists)
    assert r.deadlock[1] == Action(F, 0) and r.unreceived == [(0, Action(SEND_ACT, 0, 0, 1)),
                                                               (0, Action(SEND_ACT, 1, 0, 1))]


def test_a_wrong_peer_is_a_value_error():
    lists = all_actions("1f1b", 3, 2, 1)
    lists[1][0] = Action(RECV_ACT, 0, 0, 2)
    with pytest.raises(ValueError, match=r"stage 1 action 0 \(RECV_ACT0<-2\): peer 2, expected stage 0"):
        simulate(lists)


# -- pictures ------------------------------------------------------------------------------------
def test_plot_takes_a_simulated_or_a_measured_timeline(tmp_path):
    from pycollect.pipeline import plot_timeline
    from pycollect.plotting import pyplot
    r = simulate("interleaved", 2, 4, 2)
    path = plot_timeline(r.timeline, 2, title="sim", caption=f"bubble {r.bubble:.1%}", path=str(tmp_path / "a.png"))
    assert path == str(tmp_path / "a.png") and os.path.getsize(path) > 1000
    # measured: absolute clock, actions as JSON gives them back, a receive's wait among them
    t0 = 1.7e9
    measured = [[[t0 + s0, t0 + s1, list(a)] for s0, s1, a in row] for row in r.timeline]
    measured[1].insert(0, [t0, t0 + 0.5, [RECV_ACT, 0, 0, 0]])
    assert os.path.exists(plot_timeline(measured, path=str(tmp_path / "b.png")))
    fig = plot_timeline(measured, 2)
    assert fig.axes[0].get_xlim()[0] == 0
    pyplot().close(fig)
    with pytest.raises(ValueError, match="p=3 but the timeline has 2 stages"):
        plot_timeline(measured, 3)


# -- bad arguments --------------------------------------------------------------------------------
@pytest.mark.parametrize("args, message", [
    (("pipedream", 4, 8, 1), "schedule 'pipedream' is unknown"),
    (("1f1b", 0, 8, 1), "p must be a positive int, got 0"),
    (("1f1b", 4, -1, 1), "m must be a positive int, got -1"),
    (("interleaved", 4, 8, 0), "v must be a positive int, got 0"),
    (("gpipe", 4.0, 8, 1), "p must be a positive int, got 4.0"),
    (("gpipe", 4, 8, 2), "gpipe: v must be 1"),
    (("1f1b", 4, 8, 3), "1f1b: v must be 1"),
    (("interleaved", 4, 3, 2), "interleaved: m=3 micro-batches must be at least p=4"),
    (("interleaved-mcore", 4, 2, 3), "interleaved-mcore: m=2 micro-batches must be at least p=4"),
])
def test_bad_arguments_name_the_argument(args, message):
    for call in (check_schedule_args, all_actions, lambda *a: simulate(*a), bubble_formula):
        with pytest.raises(ValueError, match=message):
            call(*args)


def test_bad_stage_and_costs():
    with pytest.raises(ValueError, match=r"stage must be an int in 0..3 for p=4, got 4"):
        stage_actions("1f1b", 4, 8, 1, 4)
    with pytest.raises(ValueError, match="costs: B must be a finite non-negative number, got -1"):
        simulate("1f1b", 2, 2, costs={"B": -1})
    for bad in (float("nan"), float("inf")):   # NaN passed `value < 0` and gave a bubble of 0.0
        with pytest.raises(ValueError, match=f"costs: F must be a finite non-negative number, got {bad}"):
            simulate("1f1b", 2, 4, costs={"F": bad})
    with pytest.raises(ValueError, match="costs: unknown key 'X'"):
        simulate("1f1b", 2, 2, costs={"X": 1})
    with pytest.raises(ValueError, match="8 computations at up to 1e.308 and 8 transfers at 0 could take longer"):
        simulate("1f1b", 2, 2, costs={"F": 1e308, "B": 1e308})   # the walk answered a makespan of inf
    assert simulate("1f1b", 2, 2, costs={"F": 1e300, "B": 1e300}).makespan == pytest.approx(6e300)
    with pytest.raises(ValueError, match="p and m are needed"):
        simulate("1f1b")

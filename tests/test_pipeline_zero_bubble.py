"""Zero-bubble schedules (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024) as data, without MPI.

The backward split in B (input gradient) and W (weight gradient); ZB-H1 and ZB-H2 walked by the
simulator for every p <= 8 and m from p to 3p, against the paper's figures: at T_F = T_B = T_W
with free messages ZB-H1 idles (p-1)(T_F + T_B - T_W) per stage against 1F1B's
(p-1)(T_F + T_B + T_W), ZB-H2 runs each stage without a gap (for unequal costs: idles the paper's
(p-1)(T_F + T_B - 2T_W) on its first stage, none once T_W >= (T_F + T_B)/2), ZB-H1 holds 1F1B's
peak activations and ZB-H2 2p - 1 micro-batches; ZB-V takes v = 2 only; the plot draws F, B and W.
"""
from collections import Counter
from types import SimpleNamespace

import pytest

from pycollect.pipeline import (B, COMM, F, RECV_ACT, RECV_GRAD, SEND_ACT, SEND_GRAD, W, Action, all_actions,
                                bubble_formula, check_schedule_args, model_chunk, simulate, stage_of)
from pycollect.pipeline.simulate import peak_memory

GRID = [(schedule, p, m) for schedule in ("zb-h1", "zb-h2", "zbv") for p in range(1, 9) for m in range(p, 3 * p + 1)]
EQUAL = {"F": 1, "B": 2, "W": 1}          # T_F = T_B = T_W = 1: B is the whole backward, W half of it


def _ids(case):
    return "%s-p%d-m%d" % case


def _check_structure(p, m, v, lists, vshape):
    """One F, B and W of each (micro, chunk), F before B before W; receives and sends where the contract says."""
    sends, recvs = Counter(), Counter()
    last = p * v - 1
    for s, actions in enumerate(lists):
        pos = {a[:3]: i for i, a in enumerate(actions) if a.op in (F, B, W)}
        every = [(i, c) for i in range(m) for c in range(v)]
        assert len(pos) == 3 * m * v == sum(a.op in (F, B, W) for a in actions), s
        assert all(pos[(F, *x)] < pos[(B, *x)] < pos[(W, *x)] for x in every), s
        for i, a in enumerate(actions):
            k = model_chunk(s, a.chunk, p, vshape)
            if a.op in (F, B, W):
                recv = {F: RECV_ACT, B: RECV_GRAD}.get(a.op)
                send = {F: SEND_ACT, B: SEND_GRAD}.get(a.op)
                # a message unless the neighbouring model chunk is on this stage (p = 1, the bottom of a V)
                up, down = (k - 1, k + 1) if a.op == F else (k + 1, k - 1)
                has_recv = recv is not None and 0 <= up <= last and stage_of(up, p, vshape)[0] != s
                has_send = send is not None and 0 <= down <= last and stage_of(down, p, vshape)[0] != s
                assert (i > 0 and actions[i - 1][:3] == (recv, a.micro, a.chunk)) == has_recv, (s, i, a)
                assert (i + 1 < len(actions) and actions[i + 1][:3] == (send, a.micro, a.chunk)) == has_send, (s, i, a)
            elif a.op in (SEND_ACT, SEND_GRAD):
                to = k + 1 if a.op == SEND_ACT else k - 1          # the model chunk the message is for
                assert a.peer == stage_of(to, p, vshape)[0] != s, (s, a)
                sends[(a.op[5:], s, a.peer, a.micro, to)] += 1
            else:
                came = k - 1 if a.op == RECV_ACT else k + 1
                assert a.peer == stage_of(came, p, vshape)[0] != s, (s, a)
                recvs[(a.op[5:], a.peer, s, a.micro, k)] += 1
    assert sends == recvs and all(n == 1 for n in sends.values())
    assert p > 1 or not any(a.op in COMM for a in lists[0])


@pytest.mark.parametrize("case", GRID, ids=_ids)
def test_lists_are_complete_pair_up_and_never_deadlock(case):
    schedule, p, m = case
    v = 2 if schedule == "zbv" else 1
    lists = all_actions(schedule, p, m, v)
    _check_structure(p, m, v, lists, schedule == "zbv")
    r = simulate(schedule, p, m, v)
    assert r.deadlock is None and r.unreceived == [], r.describe_deadlock()
    assert all(len(row) == 3 * m * v for row in r.timeline)
    if schedule == "zbv" and m < 2 * p - 2:
        return                                # its warm-up cut short: longer than the formula
    # no schedule of one chunk per stage beats 3m + p - 1: the last stage starts after p - 1
    # forwards and has 3m to do; both reach it, for every m >= p (zbv: 6m + p - 1, p - 1 chunk hops)
    assert r.makespan == 3 * m * v + p - 1
    assert r.bubble == pytest.approx(bubble_formula(schedule, p, m, v), abs=1e-12)


def test_zb_h1_idles_a_third_of_1f1b():
    # the paper's figure: (p-1)(T_F + T_B - T_W) per stage against (p-1)(T_F + T_B + T_W)
    for p in range(2, 9):
        for m in (p, 2 * p, 3 * p):
            zb, base = simulate("zb-h1", p, m, costs=EQUAL), simulate("1f1b", p, m, costs=EQUAL)
            zb_idle = [zb.makespan - b for b in zb.busy]
            base_idle = [base.makespan - b for b in base.busy]
            assert zb_idle == [p - 1] * p and base_idle == [3 * (p - 1)] * p, (p, m)


@pytest.mark.parametrize("f, b_in, w", [(1, 1, 1), (1, 1.5, 0.5), (2, 1, 1), (1, 2, 1), (3, 2, 0.25), (1, 1, 0)])
def test_zb_h1_idle_formula_for_unequal_costs(f, b_in, w):
    # exact whenever T_W <= min(T_F, T_B): a W then always fits the gap before the next gradient
    for p in (2, 3, 5, 8):
        for m in (p, 2 * p + 1):
            r = simulate("zb-h1", p, m, costs={"F": f, "B": b_in + w, "W": w})
            assert r.makespan - m * (f + b_in + w) == pytest.approx((p - 1) * (f + b_in - w)), (p, m)


def test_zb_h2_each_stage_busy_without_a_gap():
    # the parallelogram: stage s works from s to 3m + s without idling once m >= 2p - 1 (its warm-up
    # of 2p - 1 forwards on stage 0); the bubble over the whole step stays ZB-H1's, since the stages
    # start p - 1 apart: the span bubble, idle inside each stage's span, is what goes to zero
    for p in range(1, 9):
        for m in range(max(p, 2 * p - 1), 3 * p + 1):
            r = simulate("zb-h2", p, m, costs=EQUAL)
            assert [(row[0][0], row[-1][1]) for row in r.timeline] == [(s, 3 * m + s) for s in range(p)], (p, m)
            assert r.span_bubble == 0.0
            assert r.bubble == pytest.approx((p - 1) / (3 * m + p - 1))
    # with fewer micro-batches the warm-up is cut short and a little idle remains, less than ZB-H1's
    # (at m = p the same: stage 0 has all forwards to run first in both)
    for p in range(3, 9):
        for m in range(p, 2 * p - 1):
            h1, h2 = simulate("zb-h1", p, m), simulate("zb-h2", p, m)
            if m == p:
                assert h2.span_bubble == pytest.approx(h1.span_bubble) and h2.makespan == h1.makespan
            else:
                assert 0 < h2.span_bubble < h1.span_bubble, (p, m)


@pytest.mark.parametrize("f, b_in, w", [(1, 1, 1), (1, 1.5, 0.5), (2, 1, 1), (1, 2, 1), (3, 2, 0.25), (1, 1, 0),
                                        (1, 1, 0.5), (2, 2, 1), (1, 1, 1.5)])
def test_zb_h2_idle_formula_for_unequal_costs(f, b_in, w):
    # the paper's ZB-H2 bubble (p-1)(T_F + T_B - 2T_W), none once T_W >= (T_F + T_B) / 2: the idle inside
    # stage 0's span (the stage that waits longest for its first gradient); stage s waits (p-1-s)(...)
    for p in (2, 3, 5, 8):
        for m in (2 * p - 1, 3 * p):
            r = simulate("zb-h2", p, m, costs={"F": f, "B": b_in + w, "W": w})
            idle = [row[-1][1] - row[0][0] - busy for row, busy in zip(r.timeline, r.busy)]
            assert idle == pytest.approx([max(0, (p - 1 - s) * (f + b_in - 2 * w)) for s in range(p)]), (p, m)


def test_peak_activations_against_1f1b():
    for p in range(1, 9):
        for m in range(p, 3 * p + 1):
            base = simulate("1f1b", p, m).peak_in_flight
            h1, h2 = simulate("zb-h1", p, m).peak_in_flight, simulate("zb-h2", p, m).peak_in_flight
            # held from F to W: p on every stage, 1F1B's peak (its first stage's)
            assert h1 == [p] * p and max(h1) == max(base), (p, m)
            # held from F to B (what a B needs): 1F1B's, stage by stage
            for s, actions in enumerate(all_actions("zb-h1", p, m)):
                assert peak_memory([a for a in actions if a.op != W])[0] == base[s], (p, m, s)
            # ZB-H2: 2p - 1 on every stage once its warm-up is whole, about twice 1F1B's
            assert h2 == [min(m, 2 * p - 1)] * p, (p, m)


def test_schedules_without_w_keep_b_whole():
    # B is the whole backward wherever a list holds no W of the pair: W's cost changes nothing
    for schedule, v in (("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("interleaved-mcore", 2)):
        a, b = simulate(schedule, 4, 8, v), simulate(schedule, 4, 8, v, costs={"W": 0.5})
        assert (a.makespan, a.busy, a.peak_in_flight) == (b.makespan, b.busy, b.peak_in_flight) == (
            3 * (8 * v + 3), [24.0 * v] * 4, a.peak_in_flight)


def test_split_rule_is_per_pair():
    # micro-batch 0 split (its B is the input gradient, B - W), micro-batch 1 whole
    r = simulate([[Action(F, 0), Action(B, 0), Action(W, 0), Action(F, 1), Action(B, 1)]],
                 costs={"F": 1, "B": 2, "W": 0.5})
    assert [(s, e, a.op) for s, e, a in r.timeline[0]] == [
        (0, 1, F), (1, 2.5, B), (2.5, 3, W), (3, 4, F), (4, 6, B)]
    assert simulate([[Action(F, 0), Action(B, 0), Action(W, 0)]]).makespan == 3   # W defaults to B / 2
    assert peak_memory([Action(F, 0), Action(B, 0), Action(F, 1), Action(W, 0), Action(B, 1)]) == (2, 2)


def test_a_w_before_its_b_is_stuck():
    r = simulate([[Action(F, 0), Action(W, 0), Action(B, 0)]])
    assert r.deadlock == {0: Action(W, 0)}


def test_bad_arguments_name_the_argument():
    with pytest.raises(ValueError, match="zb-h1: m=3 micro-batches must be at least p=4"):
        check_schedule_args("zb-h1", 4, 3)
    with pytest.raises(ValueError, match="zb-h2: v must be 1"):
        check_schedule_args("zb-h2", 4, 8, 2)
    with pytest.raises(ValueError, match=r"costs: W=3 must be at most B=2"):
        simulate("zb-h1", 2, 2, costs={"W": 3})


def test_the_executor_runs_them_with_chunks_that_split_their_backward():
    from pycollect.parallel.pipeline import RUNNABLE, Pipeline
    from pycollect.pipeline import ZERO_BUBBLE
    assert set(ZERO_BUBBLE) <= set(RUNNABLE)
    group = SimpleNamespace(size=2, rank=0)
    for schedule, v in (("zb-h1", 1), ("zb-h2", 1), ("zbv", 2)):  # refused before any message
        with pytest.raises(TypeError, match=rf"schedule '{schedule}' splits each backward in B and W, but "
                                            r"chunks\[0\] \(object\) has no backward_input and no backward_weight"):
            Pipeline([object()] * v, group, schedule=schedule, microbatches=2, virtual_stages=v)


def test_plot_draws_w_in_a_third_colour():
    # every F, B and W of each schedule one bar (what `pycollect explain pipeline --plot` draws); zbv's second
    # chunk a lighter shade of each colour, and named in the legend
    from pycollect.pipeline import plot_timeline
    from pycollect.plotting import pyplot
    blue, orange, green = (0.16, 0.38, 0.72), (0.9, 0.45, 0.1), (0.2, 0.58, 0.3)
    for schedule, p, m, v in (("zb-h1", 2, 2, 1), ("zb-h2", 3, 5, 1), ("zbv", 3, 5, 2)):
        fig = plot_timeline(simulate(schedule, p, m, v).timeline)
        ax = fig.axes[0]
        bars = Counter(tuple(round(c, 2) for c in bar.get_facecolor()[:3]) for bar in ax.patches
                       if abs(bar.get_height() - 0.8) < 1e-9 and bar.get_facecolor()[:3] != (0.96, 0.96, 0.96))
        names = [t.get_text() for t in ax.get_legend().get_texts()]
        pyplot().close(fig)
        assert {blue, orange, green} <= set(bars) and len(bars) == 3 * v, (schedule, bars)
        assert all(n == m * p for n in bars.values()), (schedule, bars)     # each (micro, chunk) once a stage
        assert names == (["forward", "input gradient", "weight gradient"] if v == 1 else
                         [f"{op} chunk {c}" for op in "FBW" for c in range(v)]), schedule


def test_zbv_is_bubble_free_at_1f1b_memory():
    # V-wise: stage s holds model chunks s and 2p - 1 - s; the forward runs down the stages and back up
    assert [model_chunk(s, c, 4, vshape=True) for s in range(4) for c in (0, 1)] == [0, 7, 1, 6, 2, 5, 3, 4]
    assert [stage_of(k, 4, vshape=True) for k in (0, 3, 4, 7)] == [(0, 0), (3, 0), (3, 1), (0, 1)]
    for p in range(2, 9):
        for m in range(2 * p - 1, 3 * p + 1):
            r = simulate("zbv", p, m, costs=EQUAL)
            # every stage busy from its first F to its last W; the stages start one chunk's F apart
            assert r.span_bubble == 0.0 and r.makespan == 6 * m + p - 1, (p, m)
            # 2p chunks' activations, a chunk half a stage's: 1F1B's p micro-batches of a whole stage
            assert r.peak_chunk_activations == [2 * p] * p
            assert max(r.peak_chunk_activations) == 2 * max(simulate("1f1b", p, m).peak_in_flight)
    # with fewer micro-batches the warm-up is cut short: longer, never deadlocked (the grid above)
    assert simulate("zbv", 4, 5, costs=EQUAL).makespan == 34 > 6 * 5 + 3


def test_zbv_arguments():
    # V-wise placement is defined for two chunks per stage (the paper's ZB-V); v = 3 is no V
    for v in (1, 3, 4):
        with pytest.raises(ValueError, match=rf"zbv: v must be 2 \(two chunks per stage placed V-wise\), got v={v}"):
            check_schedule_args("zbv", 4, 8, v)
    from pycollect.parallel import Pipeline
    with pytest.raises(ValueError, match=r"zbv: virtual_stages must be 2 \(two chunks per stage placed V-wise\), "
                                         r"got virtual_stages=3"):   # the executor's name for v
        Pipeline([object()] * 3, SimpleNamespace(size=2, rank=0), schedule="zbv", microbatches=2, virtual_stages=3)
    with pytest.raises(ValueError, match="zbv: m=2 micro-batches must be at least p=4"):
        check_schedule_args("zbv", 4, 2, 2)
    with pytest.raises(ValueError, match="simulate: vshape places two chunks per stage, got v=1"):
        simulate([[Action(F, 0), Action(B, 0)]], vshape=True)


def test_zbv_takes_its_two_chunks_when_none_is_given():
    """bubble_formula and all_actions, like simulate, take zbv's two chunks per stage when v is not given
    (before: v = 1 and 'zbv: v must be 2'); the other schedules one."""
    for p, m in ((2, 4), (4, 8)):
        assert bubble_formula("zbv", p, m) == bubble_formula("zbv", p, m, 2) == (p - 1) / (6 * m + p - 1)
        assert all_actions("zbv", p, m) == all_actions("zbv", p, m, 2)
        assert simulate("zbv", p, m).makespan == simulate("zbv", p, m, 2).makespan
        assert bubble_formula("1f1b", p, m) == (p - 1) / (m + p - 1)

"""pycollect.moe in one process: router rules, the dispatch layout, the reference against finite
differences, MoELayer (no group) against the reference, and bad input. No MPI communication."""
import math
import re

import functools

import numpy as np
import pytest

from gradcheck import numgrad as central_differences
from pycollect.moe import MoELayer, init_full, reference_moe
from pycollect.moe import dispatch, router

C, F, E, T = 6, 10, 4, 9
COEF = 1e-2


numgrad = functools.partial(central_differences, eps=1e-6)  # the step these routing tests use


def rel_err(got, want) -> float:
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-300))


def full_params(seed=1, c=C, f=F, e=E):
    """Full float64 weights with nonzero biases, large enough that routing is far from ties."""
    full = init_full(c, f, e, std=0.5, rng=seed, dtype=np.float64)
    r = np.random.default_rng(seed + 100)
    full["b1"], full["b2"] = r.standard_normal((e, f)), r.standard_normal((e, c))
    return full


def tokens(seed=2, t=T, c=C):
    r = np.random.default_rng(seed)
    return r.standard_normal((t, c)), r.standard_normal((t, c))


# ---- capacity, top-k, dropping, balancing loss ------------------------------------------------

@pytest.mark.parametrize("t, e, k, factor, want", [
    (1024, 8, 1, 1.25, 160), (1024, 8, 2, 1.25, 320), (10, 1, 1, 1.1, 11), (9, 4, 1, 1.0, 3),
    (9, 4, 2, 0.5, 3), (0, 4, 1, 1.0, 0), (3, 8, 1, 1.0, 1), (1024, 8, 1, 0.01, 2)])
def test_capacity_is_the_ceiling_of_k_t_over_e_times_factor(t, e, k, factor, want):
    assert router.capacity(t, e, k, factor) == want


def test_top_k_orders_by_probability_ties_to_the_lower_expert():
    probs = np.array([[0.1, 0.4, 0.1, 0.4], [0.25, 0.25, 0.25, 0.25], [0.7, 0.1, 0.15, 0.05]])
    expert, gate = router.top_k(probs, 2)
    assert expert.tolist() == [[1, 3], [0, 1], [0, 2]]
    np.testing.assert_allclose(gate, [[0.5, 0.5], [0.5, 0.5], [0.7 / 0.85, 0.15 / 0.85]], rtol=1e-15)
    expert1, gate1 = router.top_k(probs, 1)
    assert expert1.tolist() == [[1], [0], [0]] and gate1.ravel().tolist() == [0.4, 0.25, 0.7]


@pytest.mark.parametrize("k", [1, 2, 3])
def test_top_k_backward_matches_finite_differences(k):
    r = np.random.default_rng(k)
    probs = r.dirichlet(np.ones(5), size=4)  # (4, 5), distinct values
    dgate = r.standard_normal((4, k))
    expert, gate = router.top_k(probs, k)
    got = router.top_k_backward(dgate, probs, expert, gate)

    def loss():
        # the same choices, gates recomputed from the perturbed probabilities
        chosen = np.take_along_axis(probs, expert, axis=1)
        g = chosen if k == 1 else chosen / chosen.sum(axis=1, keepdims=True)
        return float((g * dgate).sum())
    assert rel_err(got, numgrad(loss, probs)) < 1e-8


def test_keep_mask_by_position_and_by_probability():
    # six tokens, top-1; expert 0 chosen by tokens 0, 2, 3, 5 with probabilities 0.5, 0.9, 0.6, 0.95
    expert = np.array([[0], [1], [0], [0], [1], [0]])
    probs = np.full((6, 2), 0.0)
    probs[np.arange(6), expert[:, 0]] = [0.5, 0.7, 0.9, 0.6, 0.8, 0.95]
    by_pos = router.keep_mask(expert, probs, 2, 2, "position")
    by_prob = router.keep_mask(expert, probs, 2, 2, "probability")
    assert by_pos[:, 0].tolist() == [True, True, True, False, True, False]
    assert by_prob[:, 0].tolist() == [False, True, True, False, True, True]
    assert router.dropped_per_expert(expert, by_pos, 2).tolist() == [2, 0]
    assert router.keep_mask(expert, probs, 2, None).all()


def test_keep_mask_probability_ties_go_to_the_earlier_token():
    expert = np.zeros((4, 1), np.int64)
    probs = np.tile([[0.6, 0.4]], (4, 1))
    assert router.keep_mask(expert, probs, 2, 3, "probability")[:, 0].tolist() == [True, True, True, False]


def test_aux_loss_is_coef_when_probabilities_are_uniform_and_coef_e_when_one_hot():
    t, e = 64, 8
    uniform = np.full((t, e), 1.0 / e)
    for k in (1, 2, 4):
        expert, _ = router.top_k(uniform, k)  # all ties: every token to experts 0..k-1
        assert router.aux_loss(uniform, expert, COEF) == COEF
        balanced = (np.arange(t)[:, None] + np.arange(k)[None, :]) % e  # every expert chosen alike
        assert router.aux_loss(uniform, balanced, COEF) == COEF
    one_hot = np.zeros((t, e))
    one_hot[:, 3] = 1.0
    expert, _ = router.top_k(one_hot, 1)
    assert router.aux_loss(one_hot, expert, COEF) == COEF * e


def test_aux_loss_backward_matches_finite_differences():
    r = np.random.default_rng(3)
    probs = r.dirichlet(np.ones(E), size=T)
    expert, _ = router.top_k(probs, 2)
    got = router.aux_loss_backward(0.7, probs, expert, COEF)
    assert rel_err(got, numgrad(lambda: 0.7 * router.aux_loss(probs, expert, COEF), probs)) < 1e-8


# ---- the dispatch layout (no communication) --------------------------------------------------

def test_local_layout_lists_each_expert_s_blocks_where_they_land():
    # p = 3 sources, E_l = 2 local experts: rows from source s for expert l
    counts = np.array([[1, 2], [0, 3], [2, 0]])
    per_source, runs, rows = dispatch.local_layout(counts)
    assert per_source == (3, 3, 2) and rows == (3, 5)
    # received: s0 [l0, l1, l1], s1 [l1, l1, l1], s2 [l0, l0]; s0's and s1's blocks of l1 are adjacent
    assert runs == ((0, 0, 1), (1, 1, 6), (0, 6, 8))
    assert dispatch.local_layout(np.array([[4], [0], [3]]))[1] == ((0, 0, 7),)  # one expert: one block
    assert dispatch.local_layout(np.zeros((2, 3), np.int64))[1:] == ((), (0, 0, 0))


def test_sort_by_expert_keeps_position_order_within_an_expert():
    expert = np.array([[2, 0], [0, 1], [2, 1], [0, 2]])
    keep = np.array([[True, True], [False, True], [True, True], [True, False]])
    order, counts = dispatch.sort_by_expert(expert, keep, 3)
    assert order.tolist() == [1, 6, 3, 5, 0, 4] and counts.tolist() == [2, 2, 2]


# ---- the reference against finite differences, MoELayer against the reference ----------------

@pytest.mark.parametrize("k, drop", [(1, False), (2, False), (2, True), (3, True)])
def test_reference_gradients_match_finite_differences(k, drop):
    full = full_params()
    x, dy = tokens()
    kw = dict(top_k=k, capacity_factor=0.6, drop_tokens=drop, aux_loss_coef=0.3, aux_grad=0.7)
    got = reference_moe(full, x, dy, **kw)
    if drop:
        assert got["dropped"].sum() > 0

    def loss():
        out = reference_moe(full, x, **kw)
        return float((out["y"] * dy).sum()) + 0.7 * out["aux_loss"]
    assert rel_err(got["dx"], numgrad(loss, x)) < 1e-7
    for name in full:
        assert rel_err(got["grads"][name], numgrad(loss, full[name])) < 1e-7, name


@pytest.mark.parametrize("order", ["position", "probability"])
@pytest.mark.parametrize("k, drop", [(1, False), (1, True), (2, False), (2, True), (4, True)])
def test_layer_without_group_equals_the_reference(k, drop, order):
    full = full_params()
    x, dy = tokens()
    layer = MoELayer.from_full(full, top_k=k, capacity_factor=0.6, drop_tokens=drop, drop_order=order,
                               aux_loss_coef=0.3)
    y = layer.forward(x)
    dx = layer.backward(dy, aux_grad=0.7)
    ref = reference_moe(full, x, dy, top_k=k, capacity_factor=0.6, drop_tokens=drop, drop_order=order,
                        aux_loss_coef=0.3, aux_grad=0.7)
    assert rel_err(y, ref["y"]) < 1e-12 and rel_err(dx, ref["dx"]) < 1e-12
    grads = layer.full_grads()
    assert sorted(grads) == sorted(full)
    for name in full:
        assert grads[name].shape == full[name].shape and rel_err(grads[name], ref["grads"][name]) < 1e-12, name
    assert layer.routing.keep.tolist() == ref["keep"] and layer.dropped.tolist() == ref["dropped"].tolist()
    assert math.isclose(layer.aux_loss, ref["aux_loss"], rel_tol=1e-12)
    assert layer.routing.capacity == ref["capacity"]


def test_layer_takes_b_t_c_as_b_times_t_tokens_and_accumulates_gradients():
    full = full_params()
    x, dy = tokens(t=12)
    flat = MoELayer.from_full(full, top_k=2, capacity_factor=0.8)
    y2 = flat.forward(x)
    dx2 = flat.backward(dy)
    shaped = MoELayer.from_full(full, top_k=2, capacity_factor=0.8)
    y3 = shaped.forward(x.reshape(3, 4, C))
    dx3 = shaped.backward(dy.reshape(3, 4, C))
    assert y3.shape == (3, 4, C) and np.array_equal(y3.reshape(12, C), y2) and np.array_equal(dx3.reshape(12, C), dx2)
    once = {n: g.copy() for n, g in shaped.grads.items()}
    shaped.forward(x.reshape(3, 4, C))
    shaped.backward(dy.reshape(3, 4, C))
    assert all(np.allclose(shaped.grads[n], 2 * once[n], rtol=1e-14, atol=0) for n in once)
    np.testing.assert_array_equal(shaped.full_params()["w1"], full["w1"])


def test_dropped_tokens_leave_the_layer_as_zero():
    full = full_params()
    x, _ = tokens(t=16)
    layer = MoELayer.from_full(full, top_k=1, capacity_factor=0.25)  # capacity 1 per expert
    y = layer.forward(x)
    gone = layer.routing.dropped_tokens
    assert gone.sum() == 16 - 4 and layer.dropped.sum() == 12
    assert not y[gone].any() and y[~gone].any()


def test_no_tokens_and_float32():
    full = {k: v.astype(np.float32) for k, v in full_params().items()}
    layer = MoELayer.from_full(full, top_k=2)
    y = layer.forward(np.zeros((0, C), np.float32))
    assert y.shape == (0, C) and layer.aux_loss == 0.0 and layer.dropped.tolist() == [0] * E
    assert layer.backward(np.zeros((0, C), np.float32), aux_grad=1.0).shape == (0, C)
    x, dy = (a.astype(np.float32) for a in tokens())
    y = layer.forward(x)
    assert y.dtype == np.float32 and layer.backward(dy).dtype == np.float32


def test_random_construction_is_the_same_for_one_rng():
    a = MoELayer(8, 16, 4, 2, 1.0, rng=5, dtype=np.float64)
    b = MoELayer(8, 16, 4, 2, 1.0, rng=5, dtype=np.float64)
    assert all(np.array_equal(a.params[n], b.params[n]) for n in a.params)
    assert a.params["w1"].shape == (4, 8, 16) and a.params["router"].shape == (8, 4)


# ---- bad input ---------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, message", [
    ({"top_k": 5}, "top_k = 5 is larger than num_experts = 4"),
    ({"top_k": 0}, "top_k must be a positive integer, got 0"),
    ({"capacity_factor": 0.0}, "capacity_factor must be a positive finite number, got 0.0"),
    ({"capacity_factor": -1.25}, "capacity_factor must be a positive finite number, got -1.25"),
    ({"capacity_factor": float("nan")}, "capacity_factor must be a positive finite number, got nan"),
    ({"drop_order": "random"}, "drop_order must be one of position, probability, got 'random'"),
    ({"aux_loss_coef": -0.1}, "aux_loss_coef must be a finite number >= 0, got -0.1"),
    ({"approximate": "erf"}, "approximate must be 'tanh' or 'none', got 'erf'"),
])
def test_bad_settings_are_refused(kwargs, message):
    with pytest.raises(ValueError, match="MoELayer.from_full: " + re.escape(message)):
        MoELayer.from_full(full_params(), **kwargs)
    args = {"top_k": 1, "capacity_factor": 1.0, **kwargs}
    with pytest.raises(ValueError, match="MoELayer: " + re.escape(message)):
        MoELayer(C, F, E, args.pop("top_k"), args.pop("capacity_factor"), **args)


def test_bad_tensors_are_refused():
    full = full_params()
    layer = MoELayer.from_full(full, top_k=2)
    with pytest.raises(RuntimeError, match="backward called before forward"):
        layer.backward(np.zeros((T, C)))
    with pytest.raises(ValueError, match=r"MoELayer.forward: x has shape \(9, 7\), expected \(\.\.\., 6\)"):
        layer.forward(np.zeros((T, C + 1)))
    with pytest.raises(TypeError, match="x has dtype float32, expected float64"):
        layer.forward(np.zeros((T, C), np.float32))
    with pytest.raises(TypeError, match="x has dtype int64, expected a floating dtype"):
        layer.forward(np.zeros((T, C), np.int64))
    layer.forward(np.zeros((T, C)))
    with pytest.raises(ValueError, match=r"MoELayer.backward: dy has shape \(8, 6\), expected \(9, 6\)"):
        layer.backward(np.zeros((T - 1, C)))
    bad = dict(full, w2=full["w2"][:, :, :-1])
    with pytest.raises(ValueError, match=r"w2 has shape \(4, 10, 5\), expected \(4, 10, 6\)"):
        MoELayer.from_full(bad)
    with pytest.raises(ValueError, match="params has names"):
        MoELayer.from_full({k: v for k, v in full.items() if k != "b1"})
    with pytest.raises(ValueError, match="d_model must be a positive integer, got 0"):
        MoELayer(0, F, E)

"""pycollect.nn: every gradient against central finite differences in float64, forwards against references."""
import math

import numpy as np
import pytest

import pycollect.nn as nn
from gradcheck import numgrad

RTOL = 1e-7


def rng(seed=0):
    return np.random.default_rng(seed)


def assert_close(got, want, rtol=RTOL):
    scale = max(np.abs(want).max(), 1e-12)
    err = np.abs(got - want).max() / scale
    assert err < rtol, f"relative error {err:.3g}"


def check_layer(layer, x, *, seed=1, eps=1e-5):
    """Input gradient and every parameter gradient of ``layer`` on loss = sum(forward(x) * R)."""
    y = layer.forward(x)
    r = rng(seed).standard_normal(y.shape)
    loss = lambda: float((layer.forward(x) * r).sum())  # noqa: E731
    layer.zero_grad()
    layer.forward(x)
    dx = layer.backward(r)
    if x.dtype.kind == "f":
        assert_close(dx, numgrad(loss, x, eps))
    for name, p in layer.params.items():
        assert layer.grads[name].shape == p.shape
        assert_close(layer.grads[name], numgrad(loss, p, eps))


def make_linear(bias=True, cin=5, cout=4):
    r = rng(2)
    return nn.Linear(r.standard_normal((cin, cout)), r.standard_normal(cout) if bias else None)


# ---- gradients ------------------------------------------------------------------------------

@pytest.mark.parametrize("bias", [True, False])
def test_linear_grads(bias):
    layer = make_linear(bias)
    check_layer(layer, rng().standard_normal((2, 3, 5)))
    assert ("b" in layer.params) == bias


@pytest.mark.parametrize("approximate", ["tanh", "none"])
def test_gelu_grads(approximate):
    check_layer(nn.GeLU(approximate), rng().standard_normal((3, 7)) * 2)


def test_layernorm_grads():
    r = rng(3)
    layer = nn.LayerNorm(1 + 0.3 * r.standard_normal(6), r.standard_normal(6), eps=1e-5)
    check_layer(layer, r.standard_normal((2, 3, 6)))


def test_softmax_grads():
    check_layer(nn.Softmax(), rng().standard_normal((2, 3, 5)) * 3)


def test_attention_core_grads():
    r = rng(4)
    B, NH, T, HS = 2, 2, 4, 3
    q, k, v = (r.standard_normal((B, NH, T, HS)) for _ in range(3))
    dout = r.standard_normal((B, NH, T, HS))
    out, att = nn.attention_forward(q, k, v)
    dq, dk, dv = nn.attention_backward(dout, q, k, v, att)
    loss = lambda: float((nn.attention_forward(q, k, v)[0] * dout).sum())  # noqa: E731
    for got, a in ((dq, q), (dk, k), (dv, v)):
        assert_close(got, numgrad(loss, a))


def make_attention(C=8, NH=2, seed=5):
    r = rng(seed)
    s = 0.5
    return nn.CausalSelfAttention(s * r.standard_normal((C, 3 * C)), s * r.standard_normal(3 * C),
                                  s * r.standard_normal((C, C)), s * r.standard_normal(C), NH)


def test_self_attention_grads():
    check_layer(make_attention(), rng(6).standard_normal((2, 4, 8)))


def test_embedding_grads():
    r = rng(7)
    V, T_max, C = 6, 5, 3
    layer = nn.Embedding(r.standard_normal((V, C)), r.standard_normal((T_max, C)))
    idx = np.array([[1, 2, 1, 0], [5, 1, 1, 3]])  # repeated tokens must add up
    assert layer.backward.__self__ is layer
    check_layer(layer, idx)
    assert np.all(layer.grads["wpe"][4:] == 0)
    assert np.all(layer.grads["wte"][4] == 0)


@pytest.mark.parametrize("ignore_index", [None, -100])
def test_cross_entropy_grads(ignore_index):
    r = rng(8)
    logits = r.standard_normal((2, 3, 5)) * 2
    targets = np.array([[0, 4, 2], [1, 1, 3]])
    if ignore_index is not None:
        targets[0, 1] = targets[1, 2] = ignore_index
    layer = nn.CrossEntropy(ignore_index=ignore_index)
    layer.forward(logits, targets)
    dlogits = layer.backward()
    loss = lambda: float(layer.forward(logits, targets))  # noqa: E731
    assert_close(dlogits, numgrad(loss, logits))
    if ignore_index is not None:
        assert np.all(dlogits[0, 1] == 0) and np.all(dlogits[1, 2] == 0)


# ---- forwards against references ------------------------------------------------------------

def test_softmax_rows_sum_to_one_and_stable():
    x = rng().standard_normal((3, 4, 9)) * 50 + 1000  # exp would overflow without the max shift
    y = nn.softmax_forward(x)
    assert np.all(np.isfinite(y))
    np.testing.assert_allclose(y.sum(-1), 1.0, rtol=0, atol=1e-12)


def test_attention_is_causal():
    layer = make_attention()
    x = rng(9).standard_normal((2, 5, 8))
    y = layer.forward(x)
    for t in range(5):
        x2 = x.copy()
        x2[:, t + 1:] = rng(10 + t).standard_normal(x2[:, t + 1:].shape)
        np.testing.assert_allclose(layer.forward(x2)[:, :t + 1], y[:, :t + 1], rtol=0, atol=1e-12)


def test_attention_core_matches_loop_reference():
    r = rng(11)
    B, NH, T, HS = 1, 2, 4, 3
    q, k, v = (r.standard_normal((B, NH, T, HS)) for _ in range(3))
    out, att = nn.attention_forward(q, k, v)
    for b in range(B):
        for h in range(NH):
            for t in range(T):
                s = np.array([q[b, h, t] @ k[b, h, u] / math.sqrt(HS) for u in range(t + 1)])
                p = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
                np.testing.assert_allclose(out[b, h, t], p @ v[b, h, :t + 1], rtol=1e-12, atol=1e-12)
                np.testing.assert_allclose(att[b, h, t, t + 1:], 0.0)


def test_self_attention_heads_are_independent_slices():
    """Each head sees only its HS columns of q, k, v (what a head-parallel split relies on)."""
    layer = make_attention(C=8, NH=2)
    x = rng(12).standard_normal((2, 3, 8))
    y = layer.forward(x)
    p, C, HS = layer.params, 8, 4
    qkv = x @ p["w_qkv"] + p["b_qkv"]
    heads = []
    for h in range(2):
        cols = [slice(i * C + h * HS, i * C + (h + 1) * HS) for i in range(3)]
        q, k, v = (qkv[:, None, :, c] for c in cols)  # (B, 1, T, HS)
        heads.append(nn.attention_forward(q, k, v)[0][:, 0])  # (B, T, HS)
    ref = np.concatenate(heads, axis=-1) @ p["w_proj"] + p["b_proj"]
    np.testing.assert_allclose(y, ref, rtol=1e-12, atol=1e-12)


def test_cross_entropy_is_minus_log_softmax():
    r = rng(13)
    logits = r.standard_normal((4, 6)) * 30
    targets = np.array([0, 5, 2, 2])
    loss, _ = nn.cross_entropy(logits, targets)
    def minus_log_softmax(row, t):     # by hand: -(row[t] - logsumexp(row)), not the library's softmax
        top = max(row)
        return -(row[t] - top - math.log(sum(math.exp(v - top) for v in row)))
    ref = np.mean([minus_log_softmax(logits[i], targets[i]) for i in range(4)])
    assert abs(float(loss) - ref) < 1e-12 * max(1.0, abs(ref))
    ignored = np.array([0, -1, 2, -1])  # the mean runs over the two kept tokens only
    loss, _ = nn.cross_entropy(logits, ignored, ignore_index=-1)
    ref = np.mean([minus_log_softmax(logits[i], ignored[i]) for i in (0, 2)])
    assert abs(float(loss) - ref) < 1e-12 * max(1.0, abs(ref))
    loss, d = nn.cross_entropy(logits, np.full(4, -1), ignore_index=-1)
    assert float(loss) == 0.0 and np.all(d == 0)


def test_gelu_forward_formulas():
    x = np.linspace(-6, 6, 101)
    exact = np.array([0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x])
    np.testing.assert_allclose(nn.gelu_forward(x, "none"), exact, rtol=1e-15, atol=1e-15)
    tanh = np.array([0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3))) for v in x])
    np.testing.assert_allclose(nn.gelu_forward(x, "tanh"), tanh, rtol=1e-14, atol=1e-15)
    assert nn.gelu_forward(x.astype(np.float32), "none").dtype == np.float32


def test_layernorm_forward_reference():
    x = rng(14).standard_normal((3, 5))
    w, b = np.arange(1.0, 6.0), np.full(5, 0.5)
    y, _, _ = nn.layernorm_forward(x, w, b, eps=1e-5)
    ref = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5) * w + b
    np.testing.assert_allclose(y, ref, rtol=1e-12, atol=1e-12)


def test_embedding_forward_reference():
    r = rng(15)
    wte, wpe = r.standard_normal((7, 3)), r.standard_normal((4, 3))
    idx = np.array([[6, 0, 6]])
    y = nn.Embedding(wte, wpe).forward(idx)
    np.testing.assert_array_equal(y[0, 2], wte[6] + wpe[2])


# ---- accumulation, zero_grad --------------------------------------------------------------

def test_grads_accumulate_and_zero_grad():
    layer = make_linear()
    x1, x2 = rng(16).standard_normal((3, 5)), rng(17).standard_normal((3, 5))
    d1, d2 = rng(18).standard_normal((3, 4)), rng(19).standard_normal((3, 4))
    layer.forward(x1); layer.backward(d1)  # noqa: E702
    g1 = {k: v.copy() for k, v in layer.grads.items()}
    layer.forward(x2); layer.backward(d2)  # noqa: E702
    np.testing.assert_allclose(layer.grads["w"], x1.T @ d1 + x2.T @ d2, rtol=1e-12)
    np.testing.assert_allclose(layer.grads["b"], g1["b"] + d2.sum(0), rtol=1e-12)
    grads_obj = layer.grads["w"]
    layer.zero_grad()
    assert layer.grads["w"] is grads_obj and np.all(grads_obj == 0) and np.all(layer.grads["b"] == 0)


def test_attention_grads_accumulate():
    layer = make_attention()
    x = rng(20).standard_normal((1, 3, 8))
    dy = rng(21).standard_normal((1, 3, 8))
    layer.forward(x); layer.backward(dy)  # noqa: E702
    once = {k: v.copy() for k, v in layer.grads.items()}
    layer.forward(x); layer.backward(dy)  # noqa: E702
    for k in once:
        np.testing.assert_allclose(layer.grads[k], 2 * once[k], rtol=1e-12)


def test_create_constructors():
    assert nn.Linear.create(4, 6, rng=0).params["w"].shape == (4, 6)
    a = nn.CausalSelfAttention.create(8, 2, rng=0, dtype=np.float64)
    assert a.params["w_qkv"].shape == (8, 24) and a.params["w_qkv"].dtype == np.float64
    assert nn.Embedding.create(10, 4, 3, rng=0).params["wpe"].shape == (4, 3)
    assert nn.LayerNorm.create(5).params["w"].sum() == 5


# ---- errors ---------------------------------------------------------------------------------

def test_errors_name_the_argument():
    lin = make_linear()
    with pytest.raises(ValueError, match=r"Linear.forward: x has shape \(2, 3\), expected \(\.\.\., 5\)"):
        lin.forward(np.zeros((2, 3)))
    with pytest.raises(TypeError, match="Linear.forward: x has dtype int64"):
        lin.forward(np.zeros((2, 5), np.int64))
    with pytest.raises(TypeError, match="Linear.forward: x has dtype float32, expected float64"):
        lin.forward(np.zeros((2, 5), np.float32))
    with pytest.raises(TypeError, match="Linear.forward: x must be a NumPy or CuPy array, got list"):
        lin.forward([[0.0] * 5])
    with pytest.raises(RuntimeError, match="backward called before forward"):
        make_linear().backward(np.zeros((1, 4)))
    lin.forward(np.zeros((2, 5)))
    with pytest.raises(ValueError, match=r"Linear.backward: dy has shape \(2, 3\), expected \(2, 4\)"):
        lin.backward(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="w_qkv has shape"):
        nn.CausalSelfAttention(np.zeros((8, 8)), np.zeros(24), np.zeros((8, 8)), np.zeros(8), 2)
    with pytest.raises(ValueError, match="nh=3 must be positive and divide C=8"):
        nn.CausalSelfAttention(np.zeros((8, 24)), np.zeros(24), np.zeros((8, 8)), np.zeros(8), 3)
    with pytest.raises(ValueError, match=r"CausalSelfAttention.forward: x has shape \(2, 8\)"):
        make_attention().forward(np.zeros((2, 8)))
    with pytest.raises(ValueError, match="approximate must be 'tanh' or 'none'"):
        nn.GeLU("erf")
    with pytest.raises(ValueError, match=r"LayerNorm.forward: x has shape \(2, 4\), expected \(\.\.\., 6\)"):
        nn.LayerNorm(np.ones(6), np.zeros(6)).forward(np.zeros((2, 4)))
    emb = nn.Embedding(np.zeros((5, 3)), np.zeros((4, 3)))
    with pytest.raises(TypeError, match="Embedding.forward: idx has dtype float64"):
        emb.forward(np.zeros((1, 2)))
    with pytest.raises(ValueError, match=r"idx holds values in \[0, 5\], expected \[0, 5\)"):
        emb.forward(np.array([[0, 5]]))
    with pytest.raises(ValueError, match="longer than T_max=4"):
        emb.forward(np.zeros((1, 5), np.int64))
    ce = nn.CrossEntropy()
    with pytest.raises(ValueError, match=r"CrossEntropy.forward: targets has shape \(2,\), expected \(3,\)"):
        ce.forward(np.zeros((3, 4)), np.zeros(2, np.int64))
    with pytest.raises(ValueError, match=r"targets holds values in \[-1, 0\]"):
        ce.forward(np.zeros((2, 4)), np.array([0, -1]))


# ---- the backward split in B and W --------------------------------------------------------------

def test_backward_split_in_b_and_w_equals_backward_bit_for_bit():
    """Every layer, as a zero-bubble pipeline runs it (three micro-batches' forwards, their B, then their
    W), gives the input gradients and weight gradients of forward-backward per micro-batch exactly."""
    from gradcheck import split_equals_fused
    from pycollect.moe import MoELayer
    from pycollect.nn.dropout import dropout_mask
    r = rng(7)
    x3 = [r.standard_normal((2, 3, 5)) for _ in range(3)]
    x8 = [r.standard_normal((2, 4, 8)) for _ in range(3)]
    idx = [r.integers(0, 6, (2, 4)) for _ in range(3)]
    dy = lambda xs, c: [r.standard_normal(x.shape[:-1] + (c,)) for x in xs]  # noqa: E731
    mask = dropout_mask((1, 2), 0.3, (2, 2, 4, 4), (0, 0, 0, 0), (2, 2, 4, 4), np.float64)
    cases = {
        "Linear": (lambda: make_linear(True), x3, dy(x3, 4)),
        "Linear without bias": (lambda: make_linear(False), x3, dy(x3, 4)),
        "LayerNorm": (lambda: nn.LayerNorm(1 + 0.3 * rng(3).standard_normal(5), rng(4).standard_normal(5)), x3,
                      dy(x3, 5)),
        "GeLU": (lambda: nn.GeLU("none"), x3, dy(x3, 5)),
        "Softmax": (nn.Softmax, x3, dy(x3, 5)),
        "CausalSelfAttention": (lambda: make_attention(C=8, NH=2), x8, dy(x8, 8)),
        "Embedding": (lambda: nn.Embedding.create(6, 4, 8, rng=5, dtype=np.float64), idx,
                      [r.standard_normal((2, 4, 8)) for _ in range(3)]),
        "MoELayer": (lambda: MoELayer(8, 12, 4, top_k=2, capacity_factor=1.0, rng=3, dtype=np.float64), x8,
                     dy(x8, 8)),
    }
    problems = []
    for name, (make, xs, dys) in cases.items():
        problems += [f"{name}: {p}" for p in split_equals_fused(make, xs, dys)]
    attn = dict(forward=lambda layer, i, x: layer.forward(x, drop=mask))
    problems += [f"attention with dropout: {p}" for p in
                 split_equals_fused(lambda: make_attention(C=8, NH=2), x8, dy(x8, 8), **attn)]
    drop = dict(forward=lambda layer, i, x: layer.forward(x, key=(3, i)))
    problems += [f"Dropout: {p}" for p in split_equals_fused(lambda: nn.Dropout(0.4), x3, dy(x3, 5), **drop)]
    assert not problems, problems


def test_b_and_w_out_of_order_are_refused():
    layer = make_linear()
    with pytest.raises(RuntimeError, match="Linear.backward_weight: backward_weight called before backward_input"):
        layer.backward_weight()
    layer.forward(np.zeros((2, 5)))
    layer.backward_input(np.zeros((2, 4)))
    with pytest.raises(RuntimeError, match="Linear.backward: backward_input called again before backward_weight"):
        layer.backward_input(np.zeros((2, 4)))
    layer.backward_weight()
    with pytest.raises(RuntimeError, match="backward_weight called before backward_input"):
        layer.backward_weight()  # W took what B kept


def test_linear_of_no_columns_or_no_rows():
    """A shard of no output columns (or no input rows), as a tensor-parallel rank holds when the width is smaller
    than the group: forward and backward give the empty and zero arrays they must (before, the weight gradient's
    reshape(-1, 0) raised 'cannot reshape array of size 0')."""
    from pycollect.nn.linear import linear_backward_input, linear_backward_weight, linear_forward
    rng = np.random.default_rng(0)
    x, dy = rng.standard_normal((2, 3, 4)), np.zeros((2, 3, 0))
    w = np.zeros((4, 0))
    assert linear_forward(x, w, np.zeros(0)).shape == (2, 3, 0)
    dw, db = linear_backward_weight(dy, x)
    assert dw.shape == (4, 0) and db.shape == (0,)
    assert np.array_equal(linear_backward_input(dy, w), np.zeros((2, 3, 4)))
    dw, db = linear_backward_weight(rng.standard_normal((2, 3, 5)), np.zeros((2, 3, 0)))   # no input rows
    assert dw.shape == (0, 5) and db.shape == (5,)

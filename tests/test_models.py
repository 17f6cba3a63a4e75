"""The model layer without MPI: the GPT twin against finite differences, AdamW against its formula,
the tasks, the configuration's errors, and the call recorder on a communicator of one."""
import math

import numpy as np
import pytest

import pycollect as pc
from pycollect.models import GPTConfig, ReferenceGPT, init_params, no_decay_names, param_shapes
from pycollect.models.data import IGNORE, reverse_batch, shard_rows, text_batch
from pycollect.training import TrainConfig, train_reference
from pycollect.optim import AdamW, clip_grad_norm

SMALL = GPTConfig(vocab_size=11, block_size=6, n_layer=2, n_head=2, n_embd=8, ffn=12)


def noisy_params(config, seed=1):
    p = init_params(config, seed=seed, dtype=np.float64)
    rng = np.random.default_rng(seed)
    return {k: v + 0.1 * rng.standard_normal(v.shape) for k, v in p.items()}


def test_reference_gpt_gradients_match_finite_differences():
    """Central differences (h = 1e-6) on 4 entries of every parameter, ignored targets included."""
    params = noisy_params(SMALL)
    model = ReferenceGPT(SMALL, params)
    rng = np.random.default_rng(0)
    idx = rng.integers(0, 11, (2, 5))
    targets = rng.integers(0, 11, (2, 5))
    targets[0, 1] = IGNORE
    model.forward(idx, targets)
    model.backward()
    for name, a in params.items():
        for j in rng.choice(a.size, min(4, a.size), replace=False):
            old = a.flat[j]
            a.flat[j] = old + 1e-6
            up = float(model.forward(idx, targets))
            a.flat[j] = old - 1e-6
            down = float(model.forward(idx, targets))
            a.flat[j] = old
            fd = (up - down) / 2e-6
            assert abs(fd - model.grads[name].flat[j]) < 1e-8 + 1e-6 * abs(fd), (name, j, fd, model.grads[name].flat[j])


def test_reference_gpt_head_is_tied_to_the_embedding():
    params = noisy_params(SMALL)
    model = ReferenceGPT(SMALL, params)
    idx = np.zeros((1, 3), np.int64)
    before = model.logits(idx)
    params["wte"][:, 0] += 1.0  # moves both the embedding and the head
    assert not np.allclose(model.logits(idx), before)


def adamw_by_hand(p, grads, lr, b1, b2, eps, wd):
    """Loshchilov & Hutter's Algorithm 2 with bias correction, written out independently."""
    m = np.zeros_like(p)
    v = np.zeros_like(p)
    for t, g in enumerate(grads, start=1):
        p = p * (1 - lr * wd)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g ** 2
        p = p - lr * (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps)
    return p


def test_adamw_follows_the_decoupled_update():
    rng = np.random.default_rng(0)
    p0 = rng.standard_normal((3, 4))
    gs = [rng.standard_normal((3, 4)) for _ in range(5)]
    b0 = rng.standard_normal(4)
    gbs = [rng.standard_normal(4) for _ in range(5)]
    params, grads = {"w": p0.copy(), "b": b0.copy()}, {"w": np.zeros((3, 4)), "b": np.zeros(4)}
    opt = AdamW(params, grads, lr=0.1, betas=(0.8, 0.9), eps=1e-6, weight_decay=0.05, no_decay=["b"])
    for g, gb in zip(gs, gbs):
        grads["w"][...], grads["b"][...] = g, gb
        opt.step()
    expected = adamw_by_hand(p0, gs, 0.1, 0.8, 0.9, 1e-6, 0.05)
    np.testing.assert_allclose(params["w"], expected, rtol=1e-12)
    # no_decay: b (nonzero, with gradients) follows the update without decay, and differs from one with it
    np.testing.assert_allclose(params["b"], adamw_by_hand(b0, gbs, 0.1, 0.8, 0.9, 1e-6, 0.0), rtol=1e-12)
    assert not np.allclose(params["b"], adamw_by_hand(b0, gbs, 0.1, 0.8, 0.9, 1e-6, 0.05), rtol=1e-6)


def test_adamw_first_step_moves_each_weight_by_lr_against_its_gradient():
    params, grads = {"w": np.zeros(5)}, {"w": np.array([3.0, -2.0, 1e-3, -7.0, 0.5])}
    AdamW(params, grads, lr=0.01, weight_decay=0.0, eps=1e-12).step()
    np.testing.assert_allclose(params["w"], -0.01 * np.sign(grads["w"]), rtol=1e-6)


@pytest.mark.parametrize("kwargs, message", [
    ({"lr": -1.0}, "lr"), ({"betas": (0.9, 1.0)}, "betas"), ({"eps": 0.0}, "eps"),
    ({"weight_decay": -0.1}, "weight_decay"), ({"no_decay": ["nope"]}, "no_decay"),
])
def test_adamw_rejects_bad_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        AdamW({"w": np.zeros(2)}, {"w": np.zeros(2)}, **kwargs)


def test_adamw_rejects_mismatched_grads():
    with pytest.raises(ValueError, match="grad of 'w'"):
        AdamW({"w": np.zeros(2)}, {"w": np.zeros(3)})
    with pytest.raises(ValueError, match="different arrays"):
        AdamW({"w": np.zeros(2)}, {"v": np.zeros(2)})


def test_clip_grad_norm_scales_to_the_limit():
    grads = {"a": np.array([3.0, 0.0]), "b": np.array([4.0])}
    assert clip_grad_norm(grads, 1.0) == pytest.approx(5.0)
    assert math.sqrt(sum(float((g ** 2).sum()) for g in grads.values())) == pytest.approx(1.0, rel=1e-5)
    assert clip_grad_norm(grads, 10.0) == pytest.approx(1.0, rel=1e-5)  # under the limit: unchanged


def test_reverse_task_scores_only_the_predictable_tokens():
    idx, targets = reverse_batch(3, 8, 10, seed=0, step=4)
    k = 4
    assert idx.shape == targets.shape == (3, 8)
    assert np.all(targets[:, :k - 1] == IGNORE) and np.all(targets[:, k - 1] == 0)
    np.testing.assert_array_equal(targets[:, k:], idx[:, :k][:, ::-1])
    again, _ = reverse_batch(3, 8, 10, seed=0, step=4)
    other, _ = reverse_batch(3, 8, 10, seed=0, step=5)
    assert np.array_equal(idx, again) and not np.array_equal(idx, other)
    with pytest.raises(ValueError, match="even"):
        reverse_batch(3, 7, 10, 0, 0)


def test_text_batch_windows_and_rows():
    data = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz", np.uint8)
    idx, targets = text_batch(data, 4, 5, seed=1, step=0)
    np.testing.assert_array_equal(idx[:, 1:], targets[:, :-1])
    assert np.all(targets - idx == 1)  # consecutive letters
    top, bottom = shard_rows((idx, targets), 1, 2)
    np.testing.assert_array_equal(top, idx[2:])
    with pytest.raises(ValueError, match="divide"):
        shard_rows((idx,), 0, 3)


@pytest.mark.parametrize("kwargs, message", [
    ({"n_embd": 10, "n_head": 4}, "divide by n_head"), ({"n_layer": 0}, "n_layer"),
    ({"approximate": "erf"}, "approximate"), ({"vocab_size": 2.5}, "vocab_size"),
])
def test_config_rejects_bad_sizes(kwargs, message):
    base = dict(vocab_size=16, block_size=8, n_layer=1, n_head=2, n_embd=8)
    with pytest.raises(ValueError, match=message):
        GPTConfig(**{**base, **kwargs})


def test_config_names_what_tensor_parallelism_cannot_split():
    config = GPTConfig(vocab_size=15, block_size=8, n_layer=1, n_head=3, n_embd=12, ffn=20)
    with pytest.raises(ValueError, match="n_head = 3.*vocab_size = 15"):
        config.check_tensor_parallel(2)
    config.check_tensor_parallel(1)


def test_params_count_and_no_decay():
    shapes = param_shapes(SMALL)
    c, f, L = 8, 12, 2
    per_layer = 4 * c + 3 * c * c + 3 * c + c * c + c + 2 * c * f + f + c  # ln, qkv, proj, mlp
    assert SMALL.num_params() == 11 * c + 6 * c + L * per_layer + 2 * c
    assert set(no_decay_names(SMALL)) == {n for n, s in shapes.items() if len(s) == 1}  # wpe decays (nanoGPT)
    moe = GPTConfig(vocab_size=16, block_size=8, n_layer=1, n_head=2, n_embd=8, n_experts=2)
    assert set(no_decay_names(moe)) == {n for n, s in param_shapes(moe).items() if len(s) == 1} | {"h0.b1", "h0.b2"}


def test_training_learns_the_reverse_task():
    config = GPTConfig(vocab_size=16, block_size=16, n_layer=2, n_head=4, n_embd=64)
    _, _, history = train_reference(config, TrainConfig(steps=120, batch=16, lr=3e-3, dtype="float32"))
    assert history[0]["loss"] > 2.5 and history[-1]["loss"] < 0.5, [h["loss"] for h in history[::20]]


def test_record_logs_calls_in_order_and_nests():
    from pycollect.recording import summarize
    comm = pc.Communicator()
    x = np.ones((2, 3))
    with comm.record() as outer:
        comm.allreduce(x)
        with comm.record() as inner:
            comm.iallreduce(np.ones(4, np.float32)).wait()
            comm.allgather(x)
    comm.allreduce(x)  # not recorded
    assert [(r.collective, r.blocking, r.elements) for r in outer] == [
        ("allreduce", True, 6), ("allreduce", False, 4), ("allgather", True, 6)]
    assert summarize(inner) == {("allreduce", 4): 1, ("allgather", 6): 1}
    assert "allreduce" not in vars(comm)  # the instance is as before
    comm.free()


def test_dropout_drops_about_p_and_scales_the_rest():
    from pycollect.nn.dropout import dropout_mask
    mask = dropout_mask((1, 2), 0.3, (200, 500), (0, 0), (200, 500), np.float64)
    assert abs(float((mask == 0).mean()) - 0.3) < 0.01  # 100000 draws: 0.01 is > 6 sigma
    assert set(np.unique(mask)) == {0.0, 1 / 0.7}
    other = dropout_mask((1, 3), 0.3, (200, 500), (0, 0), (200, 500), np.float64)
    assert 0.35 < float(((mask == 0) != (other == 0)).mean()) < 0.49  # independent keys: 2p(1-p) = 0.42


def test_dropout_mask_of_a_block_is_the_block_of_the_mask():
    """What lets a rank holding a slice (rows, a part of the sequence, some heads) agree with one process."""
    from pycollect.nn.dropout import dropout_mask
    full = dropout_mask((5,), 0.5, (6, 4, 8, 8), (0, 0, 0, 0), (6, 4, 8, 8), np.float32)
    block = dropout_mask((5,), 0.5, (2, 2, 8, 3), (3, 1, 0, 5), (100, 4, 8, 8), np.float32)
    np.testing.assert_array_equal(block, full[3:5, 1:3, :, 5:8])
    with pytest.raises(ValueError, match="does not fit"):
        dropout_mask((5,), 0.5, (2, 5), (0, 4), (2, 8), np.float32)


def test_dropout_layer_forward_backward_and_rate_checks():
    from pycollect.nn.dropout import Dropout
    x = np.random.default_rng(0).standard_normal((3, 4, 5))
    d = Dropout(0.5)
    y = d.forward(x, key=(1, 2))
    np.testing.assert_array_equal(d.backward(np.ones_like(x)), y / np.where(x == 0, 1, x) * (x != 0))
    assert d.forward(x) is x and Dropout(0.0).forward(x, key=(1,)) is x  # evaluation, or p = 0
    for bad in (1.0, -0.1, float("nan"), True):
        with pytest.raises(ValueError, match="dropout rate"):
            Dropout(bad)


def test_reference_gpt_with_dropout_matches_finite_differences():
    """Masks are a function of (key, position): fixed under a perturbation, so differences apply."""
    import dataclasses
    config = dataclasses.replace(SMALL, dropout=0.3)
    params = noisy_params(config)
    model = ReferenceGPT(config, params)
    rng = np.random.default_rng(2)
    idx, targets = rng.integers(0, 11, (2, 5)), rng.integers(0, 11, (2, 5))
    base = float(model.forward(idx, targets, dropout_key=(4, 0), first_row=6))
    assert abs(base - float(model.forward(idx, targets))) > 1e-3  # dropout changed the loss
    model.zero_grad()
    model.forward(idx, targets, dropout_key=(4, 0), first_row=6)
    model.backward()
    for name in ("wte", "h0.w_qkv", "h1.b2", "lnf_w"):
        a = params[name]
        for j in rng.choice(a.size, 3, replace=False):
            old = a.flat[j]
            a.flat[j] = old + 1e-6
            up = float(model.forward(idx, targets, (4, 0), 6))
            a.flat[j] = old - 1e-6
            down = float(model.forward(idx, targets, (4, 0), 6))
            a.flat[j] = old
            fd = (up - down) / 2e-6
            assert abs(fd - model.grads[name].flat[j]) < 1e-8 + 1e-6 * abs(fd), (name, j)

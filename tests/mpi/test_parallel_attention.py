"""Head-parallel attention and the transformer block (pycollect.parallel.attention) against single-process twins.

Groups of 1, 2 and 4 ranks split from the world (ranks left over sit the test out but still agree;
sizes larger than the world skip on every rank). Every rank draws the same full weights and
inputs; forward, dx and every full gradient are compared with nn.CausalSelfAttention, and for the
block with LayerNorm + CausalSelfAttention + LayerNorm + Linear + GeLU + Linear composed here, by
relative error in the 2-norm, float64 to 1e-10.
"""
import numpy as np
import pytest

from helpers import agree, carved, count_calls, rel_close
from pycollect.nn import CausalSelfAttention
from pycollect.models.reference import ReferenceBlock
from pycollect.parallel.attention import ParallelAttention, ParallelBlock

B, T, NH, HS, F = 2, 5, 4, 3, 16  # NH and F divide by every group size tested
C = NH * HS
DTYPE = np.dtype("f8")
RTOL = 1e-10
ATTN = ("w_qkv", "b_qkv", "w_proj", "b_proj")


@pytest.fixture(scope="module", params=[1, 2, 4])
def group(request, comm):
    """The tp group of this rank as a Communicator, or None when this rank is left over."""
    with carved(comm, request.param) as g:
        yield g


@pytest.fixture
def count_allreduce(monkeypatch):
    """``count_allreduce(group)`` wraps ``group.allreduce`` and returns a list holding its call count."""
    return lambda group: count_calls(monkeypatch, group)


def close(got, expected) -> bool:
    return rel_close(got, expected, RTOL)


def full_params(seed=1234) -> dict:
    """The same well-conditioned full parameters on every rank, every name of ParallelBlock."""
    rng = np.random.default_rng(seed)
    shapes = {"ln1_w": (C,), "ln1_b": (C,), "w_qkv": (C, 3 * C), "b_qkv": (3 * C,), "w_proj": (C, C),
              "b_proj": (C,), "ln2_w": (C,), "ln2_b": (C,), "w1": (C, F), "b1": (F,), "w2": (F, C), "b2": (C,)}
    p = {k: 0.3 * rng.standard_normal(s) for k, s in shapes.items()}
    p["ln1_w"] += 1.0
    p["ln2_w"] += 1.0
    return p


def inputs(seed=99):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((B, T, C)), rng.standard_normal((B, T, C))  # x, dy


def run(layer, group, x, dy, count_allreduce):
    """forward, backward and full_grads, with the allreduces of each pass counted."""
    calls = count_allreduce(group)
    y = layer.forward(x)
    fwd = calls[0]
    dx = layer.backward(dy)
    return y, dx, layer.full_grads(), fwd, calls[0] - fwd


def counts_ok(group, fwd, bwd, n) -> bool:
    """A group of one may skip its allreduces; larger groups have exactly ``n`` each way."""
    want = (n,) if group.size > 1 else (0, n)
    return fwd in want and bwd in want


def test_attention_matches_single_process(comm, group, count_allreduce):
    """y, dx and every full gradient as nn.CausalSelfAttention; one allreduce each way."""
    if group is None:
        return agree(comm, True, "left over")
    full = {k: v for k, v in full_params().items() if k in ATTN}
    x, dy = inputs()
    ref = CausalSelfAttention(*(full[k].copy() for k in ATTN), NH)
    y_ref = ref.forward(x)  # (B, T, C)
    dx_ref = ref.backward(dy)

    attn = ParallelAttention.from_full(full, nh=NH, group=group)
    y, dx, grads, fwd, bwd = run(attn, group, x, dy, count_allreduce)
    p = group.size
    ok = close(y, y_ref) and close(dx, dx_ref)
    ok = ok and sorted(grads) == sorted(ATTN) and all(close(grads[k], ref.grads[k]) for k in ATTN)
    ok = ok and attn.params["w_qkv"].shape == (C, 3 * C // p) and attn.params["w_proj"].shape == (C // p, C)
    ok = ok and counts_ok(group, fwd, bwd, 1)
    agree(comm, ok, f"ParallelAttention p={p}: allreduces {fwd} forward, {bwd} backward")


def test_attention_grads_accumulate_until_zero_grad(comm, group):
    if group is None:
        return agree(comm, True, "left over")
    full = {k: v for k, v in full_params(seed=5).items() if k in ATTN}
    x, dy = inputs(seed=6)
    attn = ParallelAttention.from_full(full, nh=NH, group=group)
    attn.forward(x)
    attn.backward(dy)
    once = {k: g.copy() for k, g in attn.grads.items()}
    attn.forward(x)
    attn.backward(dy)
    ok = all(close(attn.grads[k], 2 * once[k]) for k in once)
    ok = ok and attn.qkv.grads["w"] is attn.grads["w_qkv"] and attn.proj.grads["b"] is attn.grads["b_proj"]
    attn.zero_grad()
    ok = ok and all(not g.any() for g in attn.grads.values())
    ok = ok and all(not g.any() for g in attn.full_grads().values())
    agree(comm, ok, f"ParallelAttention p={group.size}: accumulation and zero_grad")


def test_block_matches_single_process(comm, group, count_allreduce):
    """Pre-LN block: y, dx and every full gradient as ReferenceBlock's (nn layers); two allreduces each way."""
    if group is None:
        return agree(comm, True, "left over")
    full = full_params(seed=4321)
    x, dy = inputs(seed=77)
    twin = ReferenceBlock({k: v.copy() for k, v in full.items()}, NH)  # the GPT twin's block, from nn layers
    y_ref = twin.forward(x)  # (B, T, C)
    dx_ref = twin.backward(dy)  # (B, T, C)
    ref = twin.named("grads")

    blk = ParallelBlock.from_full(full, NH, group)
    y, dx, grads, fwd, bwd = run(blk, group, x, dy, count_allreduce)
    ok = close(y, y_ref) and close(dx, dx_ref)
    bad = [k for k in ref if k not in grads or not close(grads[k], ref[k])]
    ok = ok and not bad and sorted(grads) == sorted(ref) and counts_ok(group, fwd, bwd, 2)
    agree(comm, ok, f"ParallelBlock p={group.size}: gradients off {bad}, allreduces {fwd} forward, {bwd} backward")


def test_heads_that_do_not_divide_raise(comm):
    """NH not divisible by the group size: ValueError naming NH and the group size, on every rank."""
    if comm.size == 1:
        pytest.skip("every NH divides by a group of one")
    p = comm.size
    nh = p + 1  # p >= 2 never divides p + 1
    c = nh * 2
    rng = np.random.default_rng(3)
    attn = {"w_qkv": rng.standard_normal((c, 3 * c)), "b_qkv": rng.standard_normal(3 * c),
            "w_proj": rng.standard_normal((c, c)), "b_proj": rng.standard_normal(c)}
    blk = {**attn, "ln1_w": np.ones(c), "ln1_b": np.zeros(c), "ln2_w": np.ones(c), "ln2_b": np.zeros(c),
           "w1": rng.standard_normal((c, 4 * p)), "b1": np.zeros(4 * p), "w2": rng.standard_normal((4 * p, c)),
           "b2": np.zeros(c)}
    bad = []
    for name, make in (("ParallelAttention", lambda: ParallelAttention.from_full(attn, nh=nh, group=comm)),
                       ("ParallelBlock", lambda: ParallelBlock.from_full(blk, nh, comm))):
        try:
            make()
            bad.append(f"{name}: no error")
        except ValueError as e:
            msg = str(e)
            if not (f"NH = {nh}" in msg and f"group size {p}" in msg):
                bad.append(msg)
    agree(comm, not bad, f"head divisibility errors: {bad}")


def test_backward_split_in_b_and_w_equals_backward_bit_for_bit(comm, group):
    """The tensor-parallel layers and whole GPT chunks (dense with and without sequence parallelism,
    experts over the group), run as a zero-bubble pipeline runs them (three micro-batches' forwards,
    their B, then their W), give the input and weight gradients of backward per micro-batch exactly:
    every communication sits in B, so both orders move the same data."""
    if group is None:
        return agree(comm, True, "left over")
    import dataclasses
    from gradcheck import split_equals_fused
    from pycollect.models import GPTConfig, init_params
    from pycollect.models.chunk import GPTChunk, MicroBatches
    from pycollect.parallel import ProcessMesh
    from pycollect.parallel.tensor import ColumnParallelLinear, RowParallelLinear
    from pycollect.parallel.vocab import VocabParallelEmbedding
    rng = np.random.default_rng(5)
    p, t4 = full_params(), 4  # T = 4 divides by every group size: sequence parallelism
    xs, x4 = [rng.standard_normal((B, T, C)) for _ in range(3)], [rng.standard_normal((B, t4, C)) for _ in range(3)]
    shard = [x[:, group.rank * t4 // group.size:(group.rank + 1) * t4 // group.size].copy() for x in x4]
    idx = [rng.integers(0, 8, (B, t4)) for _ in range(3)]
    w, b = rng.standard_normal((C, F)), rng.standard_normal(F)
    cases = {
        "block": (lambda: ParallelBlock.from_full(p, NH, group, dropout=0.2), xs, xs),
        "block, sequence parallel": (lambda: ParallelBlock.from_full(p, NH, group, sequence_parallel=True),
                                     shard, shard),
        "column, gathered": (lambda: ColumnParallelLinear.from_full({"w": w, "b": b}, group, gather_output=True),
                             xs, [rng.standard_normal((B, T, F)) for _ in range(3)]),
        "row, replicated input": (lambda: RowParallelLinear.from_full({"w": w.T.copy(), "b": b[:C].copy()}, group,
                                                                      input_is_parallel=False),
                                  [rng.standard_normal((B, T, F)) for _ in range(3)], xs),
        "embedding, sequence parallel": (lambda: VocabParallelEmbedding.from_full(
            {"wte": rng.standard_normal((8, C)), "wpe": rng.standard_normal((t4, C))}, group, sequence_parallel=True),
            idx, shard),
    }
    problems = []
    for name, (make, inputs, dys) in cases.items():
        key = dict(forward=lambda layer, i, x: layer.forward(x, (1, i))) if name == "block" else {}
        if name.startswith("embedding"):  # one draw of the weights for both copies
            make = (lambda layer: lambda: VocabParallelEmbedding(layer.params["wte"].copy(), layer.params["wpe"].copy(),
                                                                 group, sequence_parallel=True))(make())
        problems += [f"{name}: {m}" for m in split_equals_fused(make, inputs, dys, **key)]
    dense = GPTConfig(vocab_size=16, block_size=8, n_layer=2, n_head=4, n_embd=16, ffn=32, dropout=0.1)
    moe = dataclasses.replace(dense, n_experts=4, moe_top_k=2, moe_capacity_factor=1.0)
    mesh = ProcessMesh(group, tp=1, dp=group.size) if group.size > 1 else ProcessMesh(group)
    tp_mesh = ProcessMesh(group, tp=group.size)
    ids = [rng.integers(0, 16, (2, 8)) for _ in range(3)]
    chunks = (("dense chunk", dense, tp_mesh, False), ("dense chunk, sp", dense, tp_mesh, True),
              ("experts chunk", moe, mesh, False))
    for name, config, m, sp in chunks if group.size > 1 or comm.size == 1 else ():  # groups of one: once
        params = init_params(config, seed=3, dtype=np.float64)

        def make():
            chunk = GPTChunk(config, params, m, range(config.n_layer), True, True, sp)
            chunk.set_data(MicroBatches(ids, [np.roll(i, 1, axis=1) for i in ids], (7, 0), [0, 2, 4], 1 / 3))
            return chunk
        problems += [f"{name}: {msg}" for msg in split_equals_fused(
            make, [None] * 3, [None] * 3, forward=lambda c, i, x: c.forward(None, i),
            backward=lambda c, i, dy: c.backward(None, i), backward_input=lambda c, i, dy: c.backward_input(None, i),
            backward_weight=lambda c, i: c.backward_weight(i))]
    mesh.free()
    tp_mesh.free()
    agree(comm, not problems, "; ".join(problems))

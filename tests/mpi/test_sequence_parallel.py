"""Sequence parallelism (``sequence_parallel=True``) in the tensor-parallel layers against single-process twins.

Groups: the whole world (when it is not 1, 2 or 4 ranks) and sub-communicators of 1, 2 and 4 ranks
split from it (ranks left over sit the test out but still agree; sizes larger than the world skip
on every rank). Every rank draws the same full weights and inputs and feeds its part of the
sequence, positions r*T/p:(r+1)*T/p; the output shards and dx gathered along T, and ``full_grads()``,
are compared with the pycollect.nn twin run on the whole sequence in one process, by relative error
in the 2-norm: float64 to 1e-10, float32 to 1e-5. The collectives of each pass are counted on the
group: one allgather and one reduce-scatter per column/row pair each way and no allreduce; the
partial gradients are summed by exactly one allreduce in ``full_grads``.
"""
import numpy as np
import pytest

from helpers import agree, carved, count_calls, rel_close
from pycollect.nn import CausalSelfAttention, Embedding, GeLU, Linear
from pycollect.models.reference import ReferenceBlock
from pycollect.parallel.attention import ParallelAttention, ParallelBlock
from pycollect.parallel.mappings import allgather_along, allreduce_partial_grads
from pycollect.parallel.tensor import ColumnParallelLinear, ParallelMLP, RowParallelLinear
from pycollect.parallel.vocab import VocabParallelEmbedding

B, HS, F, V = 2, 3, 120, 120  # F and V divide by every group size up to 8 except 7
RTOL = {np.dtype("f8"): 1e-10, np.dtype("f4"): 1e-5}
DTYPES = [np.dtype("f8"), np.dtype("f4")]
COLLECTIVES = ("allgather", "reduce_scatter", "allreduce")
ATTN = ("w_qkv", "b_qkv", "w_proj", "b_proj")
BLOCK_PARTIAL = ("ln1_w", "ln1_b", "b_proj", "ln2_w", "ln2_b", "b2")


@pytest.fixture(scope="module", params=["world", 1, 2, 4])
def group(request, comm):
    """The tp group of this rank as a Communicator, or None when this rank is left over."""
    p = comm.size if request.param == "world" else request.param
    if request.param == "world" and comm.size in (1, 2, 4):
        pytest.skip(f"the world ({comm.size}) is one of the sub-group sizes")
    if 120 % p and p <= comm.size:
        pytest.skip(f"T = 120 does not divide by a group of {p}")
    with carved(comm, p) as g:
        yield g


@pytest.fixture
def counter(monkeypatch):
    """``counter(group)`` wraps the group's allgather, reduce_scatter and allreduce; returns a reader of
    their call counts as a tuple in that order."""
    def wrap(group):
        calls = [count_calls(monkeypatch, group, name) for name in COLLECTIVES]
        return lambda: tuple(c[0] for c in calls)
    return wrap


def dims(p: int) -> tuple:
    """(T, NH, C): T = 8 and 4 heads for groups of 1, 2, 4; T = 120 and p heads for a world of 3, 5, 8."""
    t, nh = (8, 4) if 4 % p == 0 else (120, p)
    return t, nh, nh * HS


def close(got, expected, dtype) -> bool:
    return rel_close(got, expected, RTOL[dtype])


def seq(x, group):
    """This rank's part of the sequence (axis 1) of ``x`` (B, T, ...)."""
    n = x.shape[1] // group.size
    return np.ascontiguousarray(x[:, group.rank * n:(group.rank + 1) * n])


def full_params(c: int, dtype, seed: int) -> dict:
    """The same well-conditioned full parameters on every rank, every name of ParallelBlock."""
    rng = np.random.default_rng(seed)
    shapes = {"ln1_w": (c,), "ln1_b": (c,), "w_qkv": (c, 3 * c), "b_qkv": (3 * c,), "w_proj": (c, c),
              "b_proj": (c,), "ln2_w": (c,), "ln2_b": (c,), "w1": (c, F), "b1": (F,), "w2": (F, c), "b2": (c,)}
    p = {k: 0.3 * rng.standard_normal(s) for k, s in shapes.items()}
    p["ln1_w"] += 1.0
    p["ln2_w"] += 1.0
    return {k: v.astype(dtype) for k, v in p.items()}


def inputs(t: int, c: int, dtype, seed: int):
    """x (B, T, C) and dy (B, T, C), the same on every rank."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal((B, t, c)).astype(dtype), rng.standard_normal((B, t, c)).astype(dtype)


def run(layer, group, x, dy, counter):
    """forward and backward on this rank's sequence shards, then full_grads, with each pass's collectives
    counted; the output and dx come back gathered along T."""
    read = counter(group)
    y = layer.forward(x)
    fwd = read()
    dx = layer.backward(dy)
    bwd = tuple(b - a for a, b in zip(fwd, read()))
    before = read()
    full = layer.full_grads()
    reduce = read()[2] - before[2]
    shards_ok = y.shape == x.shape and dx.shape == x.shape
    return allgather_along(y, 1, group), allgather_along(dx, 1, group), full, fwd, bwd, reduce, shards_ok


def want(group, allgathers: int, reduce_scatters: int) -> tuple:
    """Expected (allgather, reduce_scatter, allreduce) counts of one pass; a group of one communicates nothing."""
    return (allgathers, reduce_scatters, 0) if group.size > 1 else (0, 0, 0)


def grads_off(full: dict, ref: dict, dtype) -> list:
    """Names whose gradient is missing or off, plus any name not expected."""
    return [k for k in ref if k not in full or not close(full[k], ref[k], dtype)] + sorted(set(full) - set(ref))


# -- each layer against its twin ----------------------------------------------------------------------
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_column_row_pair_matches_single_process(comm, group, dtype, bias, counter):
    """Column then Row with sequence parallelism: allgather + reduce-scatter each way, as Linear, Linear."""
    if group is None:
        return agree(comm, True, "left over")
    t, _, c = dims(group.size)
    rng = np.random.default_rng(21)
    w1, b1, w2, b2 = (rng.standard_normal(s).astype(dtype) for s in ((c, F), (F,), (F, c), (c,)))
    x, dy = inputs(t, c, dtype, seed=22)
    if not bias:
        b1 = b2 = None
    fc = Linear(w1.copy(), None if b1 is None else b1.copy())
    proj = Linear(w2.copy(), None if b2 is None else b2.copy())
    y_ref = proj.forward(fc.forward(x))  # (B, T, C)
    dx_ref = fc.backward(proj.backward(dy))  # (B, T, C)

    full = {"w": w1} if b1 is None else {"w": w1, "b": b1}
    col = ColumnParallelLinear.from_full(full, group, sequence_parallel=True)
    row = RowParallelLinear.from_full({"w": w2} if b2 is None else {"w": w2, "b": b2}, group,
                                      sequence_parallel=True)
    read = counter(group)
    h = col.forward(seq(x, group))  # (B, T, F/p)
    y = row.forward(h)  # (B, T/p, C)
    fwd = read()
    dh = row.backward(seq(dy, group))  # (B, T, F/p)
    dx = col.backward(dh)  # (B, T/p, C)
    bwd = tuple(b - a for a, b in zip(fwd, read()))
    before = read()[2]
    gc, gr = col.full_grads(), row.full_grads()
    reduce = read()[2] - before
    p = group.size
    ok = h.shape == (B, t, F // p) and y.shape == (B, t // p, c) and dx.shape == (B, t // p, c)
    ok = ok and close(allgather_along(y, 1, group), y_ref, dtype)
    ok = ok and close(allgather_along(dx, 1, group), dx_ref, dtype)
    off = grads_off(gc, fc.grads, dtype) + grads_off(gr, proj.grads, dtype)
    ok = ok and not off and fwd == want(group, 1, 1) and bwd == want(group, 1, 1)
    ok = ok and col.partial_grads == () and row.partial_grads == (("b",) if bias else ())
    ok = ok and reduce == (1 if bias and p > 1 else 0)
    agree(comm, ok, f"Column+Row p={p} {dtype} bias={bias}: grads off {off}, (allgather, reduce_scatter, "
                    f"allreduce) {fwd} forward, {bwd} backward, {reduce} allreduces in full_grads")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_mlp_matches_single_process(comm, group, dtype, counter):
    """ParallelMLP with sequence parallelism: y, dx, every full gradient as Linear+GeLU+Linear."""
    if group is None:
        return agree(comm, True, "left over")
    t, _, c = dims(group.size)
    full = {k: v for k, v in full_params(c, dtype, seed=31).items() if k in ("w1", "b1", "w2", "b2")}
    x, dy = inputs(t, c, dtype, seed=32)
    fc, act, proj = Linear(full["w1"].copy(), full["b1"].copy()), GeLU(), Linear(full["w2"].copy(), full["b2"].copy())
    y_ref = proj.forward(act.forward(fc.forward(x)))  # (B, T, C)
    dx_ref = fc.backward(act.backward(proj.backward(dy)))  # (B, T, C)
    ref = {"w1": fc.grads["w"], "b1": fc.grads["b"], "w2": proj.grads["w"], "b2": proj.grads["b"]}

    mlp = ParallelMLP.from_full(full, group, sequence_parallel=True)
    y, dx, grads, fwd, bwd, reduce, shards_ok = run(mlp, group, seq(x, group), seq(dy, group), counter)
    off = grads_off(grads, ref, dtype)
    ok = shards_ok and close(y, y_ref, dtype) and close(dx, dx_ref, dtype) and not off
    ok = ok and fwd == want(group, 1, 1) and bwd == want(group, 1, 1)
    ok = ok and mlp.partial_grads == ("b2",) and reduce == (1 if group.size > 1 else 0)
    agree(comm, ok, f"ParallelMLP p={group.size} {dtype}: grads off {off}, counts {fwd} forward, {bwd} backward, "
                    f"{reduce} allreduces in full_grads")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_attention_matches_single_process(comm, group, dtype, counter):
    """ParallelAttention with sequence parallelism: y, dx, every full gradient as nn.CausalSelfAttention."""
    if group is None:
        return agree(comm, True, "left over")
    t, nh, c = dims(group.size)
    full = {k: v for k, v in full_params(c, dtype, seed=41).items() if k in ATTN}
    x, dy = inputs(t, c, dtype, seed=42)
    ref = CausalSelfAttention(*(full[k].copy() for k in ATTN), nh)
    y_ref = ref.forward(x)  # (B, T, C)
    dx_ref = ref.backward(dy)  # (B, T, C)

    attn = ParallelAttention.from_full(full, nh, group, sequence_parallel=True)
    y, dx, grads, fwd, bwd, reduce, shards_ok = run(attn, group, seq(x, group), seq(dy, group), counter)
    off = grads_off(grads, ref.grads, dtype)
    ok = shards_ok and close(y, y_ref, dtype) and close(dx, dx_ref, dtype) and not off
    ok = ok and fwd == want(group, 1, 1) and bwd == want(group, 1, 1)
    ok = ok and attn.partial_grads == ("b_proj",) and reduce == (1 if group.size > 1 else 0)
    agree(comm, ok, f"ParallelAttention p={group.size} {dtype}: grads off {off}, counts {fwd} forward, "
                    f"{bwd} backward, {reduce} allreduces in full_grads")


def block_reference(full: dict, nh: int, x, dy):
    """The GPT twin's pre-LN block (ReferenceBlock, nn layers): (y, dx, grads by ParallelBlock's names)."""
    twin = ReferenceBlock({k: v.copy() for k, v in full.items()}, nh)
    y = twin.forward(x)  # (B, T, C)
    dx = twin.backward(dy)  # (B, T, C)
    return y, dx, twin.named("grads")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_block_matches_single_process(comm, group, dtype, counter):
    """ParallelBlock with sequence parallelism: 2 allgathers + 2 reduce-scatters each way, no allreduce."""
    if group is None:
        return agree(comm, True, "left over")
    t, nh, c = dims(group.size)
    full = full_params(c, dtype, seed=51)
    x, dy = inputs(t, c, dtype, seed=52)
    y_ref, dx_ref, ref = block_reference(full, nh, x, dy)

    blk = ParallelBlock.from_full(full, nh, group, sequence_parallel=True)
    y, dx, grads, fwd, bwd, reduce, shards_ok = run(blk, group, seq(x, group), seq(dy, group), counter)
    off = grads_off(grads, ref, dtype)
    ok = shards_ok and close(y, y_ref, dtype) and close(dx, dx_ref, dtype) and not off
    ok = ok and fwd == want(group, 2, 2) and bwd == want(group, 2, 2)
    ok = ok and blk.partial_grads == BLOCK_PARTIAL and reduce == (1 if group.size > 1 else 0)
    agree(comm, ok, f"ParallelBlock p={group.size} {dtype}: grads off {off}, counts {fwd} forward, {bwd} backward, "
                    f"{reduce} allreduces in full_grads")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_embedding_matches_single_process(comm, group, dtype, counter):
    """VocabParallelEmbedding with sequence parallelism: one reduce-scatter forward, one allgather backward;
    gradients accumulated over two backwards as nn.Embedding's, with repeated tokens."""
    if group is None:
        return agree(comm, True, "left over")
    t, _, c = dims(group.size)
    rng = np.random.default_rng(61)
    wte, wpe = rng.standard_normal((V, c)).astype(dtype), rng.standard_normal((t + 3, c)).astype(dtype)
    dout = rng.standard_normal((B, t, c)).astype(dtype)
    idx = rng.integers(0, V, (B, t))
    idx[1, :2] = idx[0, 0]  # repeated tokens within a row and across rows
    idx[0, -1] = V - 1  # the last shard is always hit
    ref = Embedding(wte.copy(), wpe.copy())
    y_ref = ref.forward(idx)  # (B, T, C)
    ref.backward(dout)
    ref.backward(dout)

    emb = VocabParallelEmbedding.from_full({"wte": wte, "wpe": wpe}, group, sequence_parallel=True)
    read = counter(group)
    y = emb.forward(idx)  # (B, T/p, C)
    fwd = read()
    emb.backward(seq(dout, group))
    emb.backward(seq(dout, group))
    bwd = tuple(b - a for a, b in zip(fwd, read()))
    before = read()[2]
    full = emb.full_grads()
    reduce = read()[2] - before
    p = group.size
    off = grads_off(full, ref.grads, dtype)
    ok = y.shape == (B, t // p, c) and close(allgather_along(y, 1, group), y_ref, dtype) and not off
    ok = ok and fwd == want(group, 0, 1) and bwd == want(group, 2, 0)  # one allgather per backward
    ok = ok and emb.partial_grads == ("wpe",) and reduce == (1 if p > 1 else 0)
    emb.zero_grad()
    ok = ok and all(not g.any() for g in emb.full_grads().values())
    agree(comm, ok, f"VocabParallelEmbedding p={p} {dtype}: grads off {off}, counts {fwd} forward, {bwd} for "
                    f"two backwards, {reduce} allreduces in full_grads")


# -- partial gradients -----------------------------------------------------------------------------------
def test_partial_grads_names(comm, group):
    """``partial_grads`` names exactly the gradients that cover only this rank's tokens; none without SP."""
    if group is None:
        return agree(comm, True, "left over")
    _, nh, c = dims(group.size)
    full = full_params(c, np.dtype("f8"), seed=71)
    mlp = {k: full[k] for k in ("w1", "b1", "w2", "b2")}
    attn = {k: full[k] for k in ATTN}
    emb = {"wte": np.ones((V, c)), "wpe": np.ones((8, c))}
    got = {}
    for sp in (False, True):
        got[sp] = (ColumnParallelLinear.from_full({"w": full["w1"], "b": full["b1"]}, group, sequence_parallel=sp),
                   RowParallelLinear.from_full({"w": full["w2"], "b": full["b2"]}, group, sequence_parallel=sp),
                   RowParallelLinear.from_full({"w": full["w2"]}, group, sequence_parallel=sp),
                   ParallelMLP.from_full(mlp, group, sequence_parallel=sp),
                   ParallelAttention.from_full(attn, nh, group, sequence_parallel=sp),
                   ParallelBlock.from_full(full, nh, group, sequence_parallel=sp),
                   VocabParallelEmbedding.from_full(emb, group, sequence_parallel=sp))
    names = {sp: [layer.partial_grads for layer in layers] for sp, layers in got.items()}
    ok = names[False] == [()] * 7
    ok = ok and names[True] == [(), ("b",), (), ("b2",), ("b_proj",), BLOCK_PARTIAL, ("wpe",)]
    ok = ok and all(k in layer.grads for layer in got[True] for k in layer.partial_grads)
    agree(comm, ok, f"partial_grads p={group.size}: {names}")


def test_sum_partial_false_leaves_partial_grads(comm, group, counter):
    """full_grads(sum_partial=False) copies the partial gradients as they are, without an allreduce;
    summing those copies in place gives full_grads()."""
    if group is None:
        return agree(comm, True, "left over")
    dtype = np.dtype("f8")
    t, nh, c = dims(group.size)
    full = full_params(c, dtype, seed=81)
    x, dy = inputs(t, c, dtype, seed=82)
    blk = ParallelBlock.from_full(full, nh, group, sequence_parallel=True)
    blk.forward(seq(x, group))
    blk.backward(seq(dy, group))
    read = counter(group)
    raw = blk.full_grads(sum_partial=False)
    raw_reduce = read()[2]
    summed = blk.full_grads()
    ok = raw_reduce == 0 and sorted(raw) == sorted(summed)
    ok = ok and all(np.array_equal(raw[k], blk.grads[k]) and raw[k] is not blk.grads[k] for k in BLOCK_PARTIAL)
    ok = ok and all(np.array_equal(raw[k], summed[k]) for k in raw if k not in BLOCK_PARTIAL)
    allreduce_partial_grads([raw[k] for k in BLOCK_PARTIAL], group)
    ok = ok and all(close(raw[k], summed[k], dtype) for k in BLOCK_PARTIAL)
    if group.size > 1:  # each rank's tokens give a different share
        ok = ok and not np.allclose(blk.grads["ln1_w"], summed["ln1_w"])
    agree(comm, ok, f"ParallelBlock p={group.size}: sum_partial=False, {raw_reduce} allreduces")


def test_allreduce_partial_grads_in_place(comm, group, counter):
    """The arrays themselves become their sum over the group, one allreduce for all; exact for integers."""
    if group is None:
        return agree(comm, True, "left over")
    shapes = [(3,), (2, 4), (), (0,), (5, 1, 2)]

    def draw(rank):
        rng = np.random.default_rng([91, rank])
        return [rng.integers(-4, 5, s).astype(np.float64) for s in shapes]
    grads = draw(group.rank)
    base = np.arange(6.0).reshape(2, 3) * (group.rank + 1)
    grads.append(base.T)  # a strided view: summed into its base
    ids = [id(g) for g in grads]
    expected = [sum(parts) for parts in zip(*(draw(r) for r in range(group.size)))]
    expected.append(np.arange(6.0).reshape(2, 3).T * sum(r + 1 for r in range(group.size)))
    read = counter(group)
    allreduce_partial_grads(grads, group)
    calls = read()
    allreduce_partial_grads([], group)
    ok = calls == (0, 0, 1 if group.size > 1 else 0) and read() == calls
    ok = ok and [id(g) for g in grads] == ids and all(g.shape == e.shape for g, e in zip(grads, expected))
    ok = ok and all(np.array_equal(g, e) for g, e in zip(grads, expected)) and np.array_equal(base.T, expected[-1])
    errors = []
    for bad in ([np.zeros(2), np.zeros(2, np.float32)], [np.zeros(2), [1.0, 2.0]]):
        try:
            allreduce_partial_grads(bad, group)
            errors.append("no error")
        except TypeError as e:
            if "grads[1]" not in str(e) and "list" not in str(e):
                errors.append(str(e))
    try:
        allreduce_partial_grads([np.zeros(2)], comm.mpi)
        errors.append("an mpi4py communicator was taken")
    except TypeError:
        pass
    a, frozen = np.ones(2), np.ones(2)
    frozen.flags.writeable = False
    try:   # refused before any is written (a was summed, then NumPy's error on the read-only one)
        allreduce_partial_grads([a, frozen], group)
        errors.append("a read-only gradient was taken")
    except ValueError as e:
        if "grads[1] is read-only" not in str(e) or not (a == 1).all():
            errors.append(f"{e}; a = {a}")
    agree(comm, ok and not errors, f"allreduce_partial_grads p={group.size}: calls {calls}, errors {errors}")


def test_block_grads_accumulate_until_zero_grad(comm, group):
    if group is None:
        return agree(comm, True, "left over")
    dtype = np.dtype("f8")
    t, nh, c = dims(group.size)
    blk = ParallelBlock.from_full(full_params(c, dtype, seed=101), nh, group, sequence_parallel=True)
    x, dy = inputs(t, c, dtype, seed=102)
    blk.forward(seq(x, group))
    blk.backward(seq(dy, group))
    once = {k: g.copy() for k, g in blk.grads.items()}
    blk.forward(seq(x, group))
    blk.backward(seq(dy, group))
    ok = all(close(blk.grads[k], 2 * once[k], dtype) for k in once)
    blk.zero_grad()
    ok = ok and all(not g.any() for g in blk.full_grads().values())
    agree(comm, ok, f"ParallelBlock p={group.size}: accumulation and zero_grad")


def test_without_sequence_parallel_unchanged(comm, group, counter):
    """Without sequence parallelism the block keeps two allreduces each way, no allgather or
    reduce-scatter, and full_grads adds no allreduce."""
    if group is None:
        return agree(comm, True, "left over")
    dtype = np.dtype("f8")
    t, nh, c = dims(group.size)
    full = full_params(c, dtype, seed=111)
    x, dy = inputs(t, c, dtype, seed=112)
    y_ref, dx_ref, ref = block_reference(full, nh, x, dy)
    blk = ParallelBlock.from_full(full, nh, group)
    read = counter(group)
    y = blk.forward(x)
    fwd = read()
    dx = blk.backward(dy)
    bwd = tuple(b - a for a, b in zip(fwd, read()))
    before = read()[2]
    grads = blk.full_grads()
    reduce = read()[2] - before
    two = (0, 0, 2) if group.size > 1 else (0, 0, 0)
    off = grads_off(grads, ref, dtype)
    ok = close(y, y_ref, dtype) and close(dx, dx_ref, dtype) and not off
    ok = ok and fwd == two and bwd == two and reduce == 0
    agree(comm, ok, f"ParallelBlock p={group.size} without SP: grads off {off}, counts {fwd}, {bwd}, {reduce}")


# -- bad input ---------------------------------------------------------------------------------------------
def expect_error(cases) -> list:
    """Run each ``(label, make, exc, words)``; the messages of those that do not raise ``exc`` naming all ``words``."""
    bad = []
    for label, make, exc, words in cases:
        try:
            make()
            bad.append(f"{label}: no error")
        except exc as e:
            if not all(w in str(e) for w in words):
                bad.append(f"{label}: {e}")
    return bad


def test_bad_input_raises(comm, group, counter):
    """T not divisible, gather_output with SP, SP without input_is_parallel, mixed SP, wrong shard shapes:
    clear errors on every rank of the group, before any communication but the agreement of the arguments."""
    if group is None:
        return agree(comm, True, "left over")
    p, dtype = group.size, np.dtype("f8")
    t, nh, c = dims(p)
    full = full_params(c, dtype, seed=121)
    w1, b1, w2, b2 = full["w1"], full["b1"], full["w2"], full["b2"]
    col = ColumnParallelLinear.from_full({"w": w1, "b": b1}, group, sequence_parallel=True)
    row = RowParallelLinear.from_full({"w": w2, "b": b2}, group, sequence_parallel=True)
    emb = VocabParallelEmbedding.from_full({"wte": np.ones((V, c)), "wpe": np.ones((4 * t, c))}, group,
                                           sequence_parallel=True)
    cases = [
        ("gather_output from_full", lambda: ColumnParallelLinear.from_full(
            {"w": w1, "b": b1}, group, gather_output=True, sequence_parallel=True), ValueError,
         ("gather_output", "sequence_parallel")),
        ("gather_output", lambda: ColumnParallelLinear(col.params["w"], col.params["b"], group, True, True),
         ValueError, ("gather_output", "sequence_parallel")),
        ("input_is_parallel", lambda: RowParallelLinear.from_full(
            {"w": w2, "b": b2}, group, input_is_parallel=False, sequence_parallel=True), ValueError,
         ("input_is_parallel", "sequence_parallel")),
        ("mixed MLP", lambda: ParallelMLP(col, RowParallelLinear.from_full({"w": w2, "b": b2}, group)),
         ValueError, ("sequence_parallel",)),
        ("2-D x", lambda: col.forward(np.ones((t, c))), ValueError, ("x has shape", str(c))),
        ("x of wrong C_in", lambda: col.forward(np.ones((B, t // p, c + 1))), ValueError, ("x has shape",)),
        ("2-D x of Row", lambda: row.forward(np.ones((t, F // p))), ValueError, ("x has shape",)),
    ]
    if p > 1:
        t_bad = p * 3 + 1
        cases += [
            ("T of Row", lambda: row.forward(np.ones((B, t_bad, F // p))), ValueError,
             ("T (the sequence length", f"= {t_bad}", f"group size {p}")),
            ("T of embedding", lambda: emb.forward(np.zeros((B, t_bad), np.int64)), ValueError,
             ("T (the sequence length", f"= {t_bad}", f"group size {p}")),
        ]
    read = counter(group)
    bad = expect_error(cases)
    calls = read()
    if p > 1:  # backward given the full sequence instead of this rank's part
        row.forward(np.ones((B, t, F // p)))
        emb.forward(np.zeros((B, t), np.int64))
        blk = ParallelBlock.from_full(full, nh, group, sequence_parallel=True)
        blk.forward(np.ones((B, t // p, c)))
        before = read()
        bad += expect_error([
            ("dy of Row", lambda: row.backward(np.ones((B, t, c))), ValueError, ("dy has shape", f"{t // p}")),
            ("dout of embedding", lambda: emb.backward(np.ones((B, t, c))), ValueError,
             ("dout has shape", f"{t // p}")),
            ("dy of block", lambda: blk.backward(np.ones((B, t, c))), ValueError, ("dy has shape",)),
        ])
        calls = tuple(a + c - b for a, b, c in zip(calls, before, read()))
    # the three cases built by from_full agree their arguments first (one allgather of a digest each, where a
    # rank's own refused argument is raised so that no rank waits); nothing else communicates
    ok = not bad and calls == (3 if p > 1 else 0, 0, 0)
    agree(comm, ok, f"p={p}: {bad}, collectives run on errors {calls}")

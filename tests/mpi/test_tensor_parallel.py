"""Tensor parallelism (pycollect.parallel.tensor) against its single-process twin from pycollect.nn.

Groups: the whole world, and sub-communicators of 1, 2 and 4 ranks split from it (ranks left over
when the world does not divide sit the test out; sizes larger than the world skip on every rank).
Every rank draws the same full weights and inputs; forward, dx and every full gradient are compared
with Linear + GeLU + Linear run in one process, by relative error in the 2-norm:
float64 to 1e-10, float32 to 1e-5.
"""
import math

import numpy as np
import pytest
from mpi4py import MPI

from helpers import agree, carved, count_calls, rel_close
from pycollect.nn import GeLU, Linear
from pycollect.parallel.tensor import ColumnParallelLinear, ParallelMLP, RowParallelLinear

B, T, C = 2, 3, 8
F = math.lcm(120, MPI.COMM_WORLD.Get_size())  # divides by every group size: the world, 1, 2, 4
RTOL = {np.dtype("f8"): 1e-10, np.dtype("f4"): 1e-5}
DTYPES = [np.dtype("f8"), np.dtype("f4")]


@pytest.fixture(scope="module", params=["world", 1, 2, 4])
def group(request, comm):
    """The tp group of this rank as a Communicator, or None when this rank is left over."""
    p = comm.size if request.param == "world" else request.param
    if request.param == "world" and comm.size in (1, 2, 4):
        pytest.skip(f"the world ({comm.size}) is one of the sub-group sizes")
    with carved(comm, p) as g:
        yield g


@pytest.fixture
def count_allreduce(monkeypatch):
    """``count_allreduce(group)`` wraps ``group.allreduce`` and returns a list holding its call count."""
    return lambda group: count_calls(monkeypatch, group)


def close(got, expected, dtype) -> bool:
    return rel_close(got, expected, RTOL[dtype])


def draw(dtype, *shapes, seed=1234):
    """The same arrays on every rank."""
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(dtype) for s in shapes]


def block(x, group, axis=-1):
    """This rank's block of ``x`` along ``axis`` split over the group."""
    n = x.shape[axis] // group.size
    return np.take(x, np.arange(group.rank * n, (group.rank + 1) * n), axis=axis)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_mlp_matches_single_process(comm, group, dtype, count_allreduce):
    """ParallelMLP: y, dx, every full gradient as Linear+GeLU+Linear; one allreduce each way."""
    if group is None:
        return agree(comm, True, "left over")
    w1, b1, w2, b2, x, dy = draw(dtype, (C, F), (F,), (F, C), (C,), (B, T, C), (B, T, C))
    fc, act, proj = Linear(w1.copy(), b1.copy()), GeLU(), Linear(w2.copy(), b2.copy())
    y_ref = proj.forward(act.forward(fc.forward(x)))  # (B, T, C)
    dx_ref = fc.backward(act.backward(proj.backward(dy)))  # (B, T, C)
    ref = {"w1": fc.grads["w"], "b1": fc.grads["b"], "w2": proj.grads["w"], "b2": proj.grads["b"]}

    mlp = ParallelMLP.from_full({"w1": w1, "b1": b1, "w2": w2, "b2": b2}, group=group)
    calls = count_allreduce(group)
    y = mlp.forward(x)
    forward_calls = calls[0]
    dx = mlp.backward(dy)
    backward_calls = calls[0] - forward_calls
    full = mlp.full_grads()
    ok = close(y, y_ref, dtype) and close(dx, dx_ref, dtype)
    ok = ok and sorted(full) == sorted(ref) and all(close(full[k], ref[k], dtype) for k in ref)
    # A group of one may skip its allreduces; larger groups have exactly one each way.
    want = (1,) if group.size > 1 else (0, 1)
    ok = ok and forward_calls in want and backward_calls in want
    agree(comm, ok, f"ParallelMLP p={group.size} {dtype}: allreduces {forward_calls} forward, "
                    f"{backward_calls} backward")


def test_mlp_grads_accumulate_until_zero_grad(comm, group):
    if group is None:
        return agree(comm, True, "left over")
    dtype = np.dtype("f8")
    w1, b1, w2, b2, x, dy = draw(dtype, (C, F), (F,), (F, C), (C,), (B, T, C), (B, T, C), seed=7)
    mlp = ParallelMLP.from_full({"w1": w1, "b1": b1, "w2": w2, "b2": b2}, group=group)
    mlp.forward(x)
    mlp.backward(dy)
    once = {k: g.copy() for k, g in mlp.grads.items()}
    mlp.forward(x)
    mlp.backward(dy)
    ok = all(close(mlp.grads[k], 2 * once[k], dtype) for k in once)
    ok = ok and mlp.fc.grads["w"] is mlp.grads["w1"] and mlp.proj.grads["b"] is mlp.grads["b2"]
    mlp.zero_grad()
    ok = ok and all(not g.any() for g in mlp.grads.values())
    ok = ok and all(not g.any() for g in mlp.full_grads().values())
    agree(comm, ok, f"ParallelMLP p={group.size}: accumulation and zero_grad")


@pytest.mark.parametrize("gather_output", [True, False])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_column_parallel_linear(comm, group, dtype, gather_output):
    if group is None:
        return agree(comm, True, "left over")
    w, b, x, dy = draw(dtype, (C, F), (F,), (B, T, C), (B, T, F), seed=11)
    lin = Linear(w.copy(), b.copy())
    y_ref = lin.forward(x)  # (B, T, F)
    dx_ref = lin.backward(dy)  # (B, T, C)
    col = ColumnParallelLinear.from_full({"w": w, "b": b}, group=group, gather_output=gather_output)
    y = col.forward(x)  # (B, T, F) or (B, T, F/p)
    dx = col.backward(dy if gather_output else block(dy, group))
    full = col.full_grads()
    ok = close(y, y_ref if gather_output else block(y_ref, group), dtype) and close(dx, dx_ref, dtype)
    ok = ok and sorted(full) == ["b", "w"] and all(close(full[k], lin.grads[k], dtype) for k in full)
    ok = ok and col.params["w"].shape == (C, F // group.size)
    agree(comm, ok, f"ColumnParallelLinear p={group.size} {dtype} gather_output={gather_output}")


@pytest.mark.parametrize("input_is_parallel", [True, False])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_row_parallel_linear(comm, group, dtype, input_is_parallel, count_allreduce):
    if group is None:
        return agree(comm, True, "left over")
    w, b, x, dy = draw(dtype, (F, C), (C,), (B, T, F), (B, T, C), seed=13)
    lin = Linear(w.copy(), b.copy())
    y_ref = lin.forward(x)  # (B, T, C)
    dx_ref = lin.backward(dy)  # (B, T, F)
    row = RowParallelLinear.from_full({"w": w, "b": b}, group=group, input_is_parallel=input_is_parallel)
    calls = count_allreduce(group)
    y = row.forward(block(x, group) if input_is_parallel else x)  # (B, T, C)
    dx = row.backward(dy)  # (B, T, F/p) or (B, T, F)
    full = row.full_grads()
    ok = close(y, y_ref, dtype) and close(dx, block(dx_ref, group) if input_is_parallel else dx_ref, dtype)
    ok = ok and sorted(full) == ["b", "w"] and all(close(full[k], lin.grads[k], dtype) for k in full)
    ok = ok and calls[0] in ((1,) if group.size > 1 else (0, 1))
    agree(comm, ok, f"RowParallelLinear p={group.size} {dtype} input_is_parallel={input_is_parallel}, "
                    f"{calls[0]} allreduces")


def test_sizes_that_do_not_divide_raise(comm):
    """F, C_out, C_in not divisible by the group size: ValueError naming the dimension, size and group size."""
    if comm.size == 1:
        pytest.skip("every size divides by a group of one")
    p, bad = comm.size, comm.size * 3 + 1
    w1, b1, w2, b2 = draw(np.dtype("f8"), (C, bad), (bad,), (bad, C), (C,))
    cases = [
        (lambda: ParallelMLP.from_full({"w1": w1, "b1": b1, "w2": w2, "b2": b2}, group=comm), "F"),
        (lambda: ColumnParallelLinear.from_full({"w": w1, "b": b1}, group=comm), "C_out"),
        (lambda: RowParallelLinear.from_full({"w": w2, "b": b2}, group=comm), "C_in"),
    ]
    bad_messages = []
    for make, dim in cases:
        try:
            make()
            bad_messages.append(f"{dim}: no error")
        except ValueError as e:
            msg = str(e)
            if not (f"{dim} " in msg and str(bad) in msg and f"group size {p}" in msg):
                bad_messages.append(msg)
    agree(comm, not bad_messages, f"divisibility errors: {bad_messages}")


def test_uneven_shards_built_by_hand(comm, group):
    """Shards built by hand with np.array_split (F = 7, which no group of 2 or more divides): an MLP of a column
    and a row layer needs no equal widths (each rank's columns are its own) and matches the single process,
    full_params and full_grads included (the widths are exchanged). A column layer with gather_output, whose
    gathered output and split gradient need equal widths, refuses them at its first forward on every rank,
    naming the widths (before: the job ended inside MPI's allgather, a message truncated); built by hand with
    equal widths it agrees and gathers."""
    if group is None:
        return agree(comm, True, "left over")
    dtype, f = np.dtype("f8"), 7
    w1, b1, w2, b2, x, dy = draw(dtype, (C, f), (f,), (f, C), (C,), (B, T, C), (B, T, C), seed=21)
    fc, act, proj = Linear(w1.copy(), b1.copy()), GeLU(), Linear(w2.copy(), b2.copy())
    y_ref = proj.forward(act.forward(fc.forward(x)))  # (B, T, C)
    dx_ref = fc.backward(act.backward(proj.backward(dy)))
    ref = {"w1": fc.grads["w"], "b1": fc.grads["b"], "w2": proj.grads["w"], "b2": proj.grads["b"]}
    mine = np.array_split(np.arange(f), group.size)[group.rank]
    mlp = ParallelMLP(ColumnParallelLinear(w1[:, mine].copy(), b1[mine].copy(), group),
                      RowParallelLinear(w2[mine].copy(), b2.copy(), group))
    y, dx = mlp.forward(x), mlp.backward(dy)
    grads, params = mlp.full_grads(), mlp.full_params()
    full = {"w1": w1, "b1": b1, "w2": w2, "b2": b2}
    problems = [] if close(y, y_ref, dtype) and close(dx, dx_ref, dtype) else ["y or dx differ"]
    problems += [f"full_grads {k}" for k in ref if not close(grads[k], ref[k], dtype)]
    problems += [f"full_params {k}" for k in full if not np.array_equal(params[k], full[k])]
    equal = np.arange(group.rank * 2, group.rank * 2 + 2)       # two columns each, of 2p
    w, b = draw(dtype, (C, 2 * group.size), (2 * group.size,), seed=22)
    col = ColumnParallelLinear(w[:, equal].copy(), b[equal].copy(), group, gather_output=True)
    problems += [] if close(col.forward(x), x @ w + b, dtype) else ["equal shards by hand: gathered y differs"]
    if group.size > 1:
        try:
            ColumnParallelLinear(w1[:, mine].copy(), b1[mine].copy(), group, gather_output=True).forward(x)
            problems.append("gather_output with uneven shards accepted")
        except ValueError as e:
            widths = [len(s) for s in np.array_split(np.arange(f), group.size)]
            if "differ in width" not in str(e) or str(widths) not in str(e):
                problems.append(str(e))
    agree(comm, not problems, f"p={group.size}: {problems}")


def test_layers_built_otherwise_on_some_ranks_are_refused(comm):
    """The last rank builds its layer from full parameters of other shapes (another F, or another C and dtype with
    the same bytes a row), other settings (another gelu, another ignore_index, other MoE routing) or an argument
    only it refuses: ValueError on every rank where the layer is built (before, every rank returned outputs and
    gradients computed from mismatched shards without an error, or the others waited)."""
    from pycollect.moe import MoELayer
    from pycollect.moe.layer import init_full
    from pycollect.parallel.attention import ParallelBlock
    from pycollect.parallel.vocab import VocabParallelCrossEntropy

    n = comm.size
    if n == 1:
        return
    last = comm.rank == n - 1
    rng = np.random.default_rng(3)
    c, f = 4, 4 * n

    def mlp(c, f, dtype=np.float64):
        return {"w1": rng.standard_normal((c, f)).astype(dtype), "b1": np.zeros(f, dtype),
                "w2": rng.standard_normal((f, c)).astype(dtype), "b2": np.zeros(c, dtype)}

    block = {"ln1_w": np.ones(c), "ln1_b": np.zeros(c), "ln2_w": np.ones(c), "ln2_b": np.zeros(c),
             "w_qkv": np.ones((c, 3 * c)), "b_qkv": np.zeros(3 * c), "w_proj": np.ones((c, c)), "b_proj": np.zeros(c),
             **mlp(c, f)}
    moe = init_full(c, 8, 2 * n, rng=0)
    cases = [
        ("another F", lambda: ParallelMLP.from_full(mlp(c, 2 * f if last else f), comm)),
        ("another C and dtype, the same row bytes",
         lambda: ParallelMLP.from_full(mlp(2 * c, f, np.float32) if last else mlp(c, f), comm)),
        ("another gelu", lambda: ParallelMLP.from_full(mlp(c, f), comm, approximate="none" if last else "tanh")),
        ("another row of a column-parallel weight", lambda: ColumnParallelLinear.from_full(
            {"w": np.ones((c + last, f))}, comm)),
        ("another LayerNorm", lambda: ParallelBlock.from_full(
            {**block, **({"ln2_w": np.ones(c + 1), "ln2_b": np.zeros(c + 1)} if last else {})}, n, comm)),
        ("another ignore_index", lambda: VocabParallelCrossEntropy(comm, ignore_index=3 if last else -100)),
        ("another top_k", lambda: MoELayer.from_full(moe, top_k=2 if last else 1, group=comm)),
    ]
    problems = []
    for what, build in cases:
        try:
            build()
            problems.append(f"{what}: built")
        except ValueError as e:
            if "differ" not in str(e):
                problems.append(f"{what}: {e}")
    try:   # an argument only the last rank refuses: its own error there, the others name it
        ParallelMLP.from_full(mlp(c, f + 1 if last else f), comm)
        problems.append("one rank's F not dividing: built")
    except ValueError as e:
        want = "does not divide by the group size" if last else f"rank(s) [{n - 1}] of the group refused"
        if want not in str(e):
            problems.append(f"one rank's F not dividing: {e}")
    ParallelMLP.from_full(mlp(c, f), comm)   # alike everywhere: built
    agree(comm, not problems, "; ".join(problems))


def test_a_refused_dy_leaves_the_forward_for_a_second_backward(comm):
    """backward with a dy of the wrong dtype or shape (every rank alike): TypeError / ValueError naming dy before
    any collective (the dtype went to MPI and ended the job there), and the forward's cache stays, so backward
    with the right dy then gives what a layer that never saw the bad one gives (it said "backward called before
    forward")."""
    from pycollect.parallel.attention import ParallelBlock

    n, c, t = comm.size, 4, 3
    rng = np.random.default_rng(5)
    full = {"w1": rng.standard_normal((c, 4 * n)), "b1": rng.standard_normal(4 * n),
            "w2": rng.standard_normal((4 * n, c)), "b2": rng.standard_normal(c)}
    block = {"ln1_w": np.ones(c), "ln1_b": np.zeros(c), "ln2_w": np.ones(c), "ln2_b": np.zeros(c),
             "w_qkv": rng.standard_normal((c, 3 * c)), "b_qkv": np.zeros(3 * c), "w_proj": rng.standard_normal((c, c)),
             "b_proj": np.zeros(c), **full}
    x, dy = rng.standard_normal((2, t, c)), rng.standard_normal((2, t, c))
    problems = []
    builds = [("ParallelMLP", lambda: ParallelMLP.from_full(full, comm))]
    if 4 % n == 0:   # heads: nh = 4 divides C and the group
        builds.append(("ParallelBlock", lambda: ParallelBlock.from_full(block, 4, comm)))
    for name, build in builds:
        layer, twin = build(), build()
        layer.forward(x)
        twin.forward(x)
        for bad, error in ((dy.astype(np.float32), TypeError), (dy[:, :2], ValueError)):
            try:
                layer.backward(bad)
                problems.append(f"{name}: {bad.dtype}{bad.shape} taken")
            except error as e:
                if "dy" not in str(e):
                    problems.append(f"{name}: {e}")
        if not np.array_equal(layer.backward(dy), twin.backward(dy)) or any(
                not np.array_equal(layer.grads[k], twin.grads[k]) for k in layer.grads):
            problems.append(f"{name}: the second backward differs")
    agree(comm, not problems, "; ".join(problems))

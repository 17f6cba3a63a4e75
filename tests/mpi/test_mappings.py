"""The conjugate communication pairs against a single-process reference, their adjointness and errors."""
import numpy as np
import pytest

from pycollect.parallel import (ProcessMesh, copy_to_group, gather_from_group, gather_from_sequence,
                                reduce_from_group, reduce_scatter_to_sequence, scatter_to_group,
                                scatter_to_sequence)

from helpers import agree

# x -> y: "rep" is the same array on every rank of the group (counted once), "part" each rank's own.
PAIRS = {
    "copy_to_group": (copy_to_group, "rep", "part"),
    "reduce_from_group": (reduce_from_group, "part", "rep"),
    "scatter_to_group": (scatter_to_group, "rep", "part"),
    "gather_from_group": (gather_from_group, "part", "rep"),
    "scatter_to_sequence": (scatter_to_sequence, "rep", "part"),
    "gather_from_sequence": (gather_from_sequence, "part", "part"),
    "reduce_scatter_to_sequence": (reduce_scatter_to_sequence, "part", "part"),
}
B, T, C = 2, 3, 5   # per-part lengths: full lengths are multiples of the group size


@pytest.fixture(scope="module", params=["world", "tp"])
def group(request, comm):
    """The whole world, or the tp groups of a mesh (tp = smallest proper divisor > 1 of the world size)."""
    if request.param == "world":
        yield comm
        return
    n = comm.size
    tp = next((d for d in range(2, n) if n % d == 0), None)
    if tp is None:
        pytest.skip(f"world size {n} has no proper divisor for tp groups")
    mesh = ProcessMesh(comm, tp=tp, dp=n // tp)
    yield mesh.tp
    mesh.free()


def shapes(name, n):
    """Shapes of x (forward input) and dy (backward input) for a group of ``n``."""
    if name in ("copy_to_group", "reduce_from_group"):
        return (B, T, C), (B, T, C)
    if name == "scatter_to_group":
        return (B, T, C * n), (B, T, C)
    if name == "gather_from_group":
        return (B, T, C), (B, T, C * n)
    if name == "scatter_to_sequence":
        return (B, T * n, C), (B, T, C)
    if name == "gather_from_sequence":
        return (B, T, C), (B, T * n, C)
    return (B, T * n, C), (B, T, C)   # reduce_scatter_to_sequence


def draw(group, shape, kind, seed, integers):
    """Replicated arrays share a seed across the group; partial ones differ by group rank."""
    rng = np.random.default_rng([seed, 0 if kind == "rep" else 1 + group.rank])
    if integers:
        return rng.integers(-4, 5, shape).astype(np.float64)
    return rng.standard_normal(shape)


def part(a, axis, n, r):
    k = a.shape[axis] // n
    return np.take(a, np.arange(r * k, (r + 1) * k), axis=axis)


def reference(name, xs, dys, r):
    """Forward and backward of rank ``r`` from every rank's inputs, by hand."""
    n = len(xs)
    x, dy = xs[r], dys[r]
    if name == "copy_to_group":
        return x, sum(dys)
    if name == "reduce_from_group":
        return sum(xs), dy
    if name == "scatter_to_group":
        return part(x, -1, n, r), np.concatenate(dys, axis=-1)
    if name == "gather_from_group":
        return np.concatenate(xs, axis=-1), part(dy, -1, n, r)
    if name == "scatter_to_sequence":
        return part(x, 1, n, r), np.concatenate(dys, axis=1)
    if name == "gather_from_sequence":
        return np.concatenate(xs, axis=1), part(sum(dys), 1, n, r)
    return part(sum(xs), 1, n, r), np.concatenate(dys, axis=1)   # reduce_scatter_to_sequence


@pytest.mark.parametrize("name", list(PAIRS))
def test_mappings_match_reference(comm, group, name):
    cls, x_kind, y_kind = PAIRS[name]
    n = group.size
    x_shape, dy_shape = shapes(name, n)
    x = draw(group, x_shape, x_kind, 1, True)
    dy = draw(group, dy_shape, y_kind, 2, True)
    x_in, dy_in = x.copy(), dy.copy()
    f = cls(group)
    y, dx = f.forward(x), f.backward(dy)
    xs, dys = group.mpi.allgather(x), group.mpi.allgather(dy)   # MPI's own, every rank's inputs
    y_ref, dx_ref = reference(name, xs, dys, group.rank)
    ok = (y.shape == y_ref.shape and dx.shape == dx_ref.shape and y.dtype == dx.dtype == np.float64
          and np.array_equal(y, y_ref) and np.array_equal(dx, dx_ref)
          and np.array_equal(x, x_in) and np.array_equal(dy, dy_in))   # inputs left alone
    agree(comm, ok, f"{name} on a group of {n}: y {y.shape} vs {y_ref.shape}, dx {dx.shape} vs {dx_ref.shape}")


def inner(group, a, b, kind):
    """<a, b> over the group: summed over ranks for partial arrays, once for replicated ones."""
    local = float(np.vdot(a, b))
    return group.mpi.allreduce(local) if kind == "part" else local


@pytest.mark.parametrize("name", list(PAIRS))
def test_mappings_are_adjoint(comm, group, name):
    """<f(x), y> == <x, f*(y)> in float64, with the convention of each side."""
    cls, x_kind, y_kind = PAIRS[name]
    x_shape, dy_shape = shapes(name, group.size)
    x = draw(group, x_shape, x_kind, 3, False)
    y = draw(group, dy_shape, y_kind, 4, False)
    f = cls(group)
    lhs = inner(group, f.forward(x), y, y_kind)
    rhs = inner(group, x, f.backward(y), x_kind)
    # replicated results must really be the same on every rank
    same = group.mpi.allgather((lhs, rhs))
    ok = np.isclose(lhs, rhs, rtol=1e-12, atol=1e-12) and all(np.isclose(v, same[0], rtol=1e-12).all() for v in same)
    agree(comm, ok, f"{name}: <f(x), y> = {lhs!r}, <x, f*(y)> = {rhs!r}")


@pytest.mark.parametrize("seq_axis", [0, 2, -1])
def test_mappings_seq_axis(comm, group, seq_axis):
    n = group.size
    shape = [B, T, C]
    shape[seq_axis] *= n
    x = draw(group, tuple(shape), "part", 5, True)
    f = reduce_scatter_to_sequence(group, seq_axis=seq_axis)
    y = f.forward(x)
    want = part(sum(group.mpi.allgather(x)), seq_axis, n, group.rank)
    g = gather_from_sequence(group, seq_axis=seq_axis).forward(y)
    ok = np.array_equal(y, want) and np.array_equal(g, sum(group.mpi.allgather(x)))
    agree(comm, ok, f"seq_axis={seq_axis}")


def test_mappings_divisibility_errors(comm, group):
    n = group.size
    if n == 1:
        pytest.skip("every length divides by a group of 1")
    bad_last = np.zeros((B, T, C * n + 1))
    bad_seq = np.zeros((B, T * n + 1, C))
    cases = [(scatter_to_group(group).forward, bad_last, -1),
             (gather_from_group(group).backward, bad_last, -1),
             (scatter_to_sequence(group).forward, bad_seq, 1),
             (gather_from_sequence(group).backward, bad_seq, 1),
             (reduce_scatter_to_sequence(group).forward, bad_seq, 1)]
    problems = []
    for fn, x, axis in cases:
        try:
            fn(x)
            problems.append(f"{fn.__qualname__}: no error")
        except ValueError as e:
            msg = str(e)
            length = x.shape[axis]
            if not (f"axis {axis}" in msg or f"axis {axis % x.ndim}" in msg) or str(length) not in msg \
                    or f"group size {n}" not in msg:
                problems.append(msg)
    with pytest.raises(ValueError, match="out of range"):
        scatter_to_sequence(group, seq_axis=3).forward(np.zeros((B, T * n, C)))
    with pytest.raises(TypeError, match="pycollect Communicator"):
        copy_to_group(group.mpi)
    agree(comm, not problems, str(problems))

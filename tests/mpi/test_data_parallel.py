"""Data parallelism (pycollect.parallel.data) against the single-process model on the global batch.

Model: Linear(C, F) + GeLU + Linear(F, C) from pycollect.nn, the same weights on every rank. Loss:
the MEAN over the global batch of 0.5 * ||y - t||^2. Every rank holds an equal slice of N rows of
the global batch (P * N rows) and backpropagates the mean over its own slice; DataParallel's
average (sum / P) then gives the gradient of the global mean. Each rank also runs the whole global
batch alone as the reference; gradients must agree in float64 to 1e-12 relative (2-norm).
"""
import numpy as np
import pytest

from helpers import agree, rel_close
from pycollect.nn import GeLU, Linear
from pycollect.parallel.data import DataParallel, plan_buckets

N, C, F = 3, 4, 8  # rows per rank, model width, hidden width
RTOL = 1e-12
NAMES = ["fc1.w", "fc1.b", "fc2.w", "fc2.b"]  # forward order of use


def model(seed=7):
    rng = np.random.default_rng(seed)
    return [Linear.create(C, F, std=0.5, rng=rng, dtype=np.float64), GeLU(),
            Linear.create(F, C, std=0.5, rng=rng, dtype=np.float64)]


def params_of(layers):
    fc1, _, fc2 = layers
    return [(f"{p}.{k}", layer.params[k], layer.grads[k]) for p, layer in (("fc1", fc1), ("fc2", fc2))
            for k in ("w", "b")]


def global_batch(rows, seed=11):
    """The same (x, t) on every rank."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal((rows, C)), rng.standard_normal((rows, C))


def step(layers, x, t, scale, dp=None):
    """Forward, backward of scale * 0.5 * sum ||y - t||^2; grad_ready in backward order as each layer ends."""
    fc1, act, fc2 = layers
    y = fc2(act(fc1(x)))
    dh = fc2.backward(scale * (y - t))
    if dp is not None:
        dp.grad_ready("fc2.b")
        dp.grad_ready("fc2.w")
    fc1.backward(act.backward(dh))
    if dp is not None:
        dp.grad_ready("fc1.b")
        dp.grad_ready("fc1.w")


def reference(x, t):
    layers = model()
    step(layers, x, t, 1.0 / len(x))
    return {n: g for n, _, g in params_of(layers)}


def close(got, expected) -> bool:
    return rel_close(got, expected, RTOL, same_dtype=False)


def mine(a, comm, rows):
    return a[comm.rank * rows:(comm.rank + 1) * rows]


@pytest.fixture
def count_iallreduce(monkeypatch):
    """Wrap ``group.iallreduce`` to count its calls; returns a list holding the count."""
    def wrap(group):
        calls = [0]
        inner = group.iallreduce

        def counted(*args, **kwargs):
            calls[0] += 1
            return inner(*args, **kwargs)
        monkeypatch.setattr(group, "iallreduce", counted)
        return calls
    return wrap


def test_plan_buckets_without_mpi():
    f8, f4 = np.dtype("f8"), np.dtype("f4")
    entries = [("a", f8, 100), ("b", f4, 10), ("c", f8, 100), ("d", f4, 10)]
    assert plan_buckets(entries, 10**6) == [[3, 1], [2, 0]]  # one per dtype, by completion
    assert plan_buckets(entries, 1) == [[3], [2], [1], [0]]
    assert plan_buckets(entries, 150) == [[3, 1], [2, 0]]
    assert plan_buckets([], 1) == []


@pytest.mark.parametrize("bucket_bytes", [1, 200, 25 * 2**20])
def test_gradients_match_global_batch(comm, bucket_bytes):
    x, t = global_batch(comm.size * N)
    expected = reference(x, t)
    layers = model()
    dp = DataParallel(params_of(layers), comm, bucket_bytes=bucket_bytes)
    step(layers, mine(x, comm, N), mine(t, comm, N), 1.0 / N, dp)
    dp.finish()
    bad = [n for n, _, g in params_of(layers) if not close(g, expected[n])]
    agree(comm, not bad, f"gradients differ from the global-batch model: {bad}")
    # a second step reuses the buffers: zero, run again, same result
    for layer in layers:
        layer.zero_grad()
    step(layers, mine(x, comm, N), mine(t, comm, N), 1.0 / N, dp)
    dp.finish()
    bad = [n for n, _, g in params_of(layers) if not close(g, expected[n])]
    agree(comm, not bad, f"second step differs: {bad}")


def test_sum_without_average_and_dict_form(comm):
    g = {"a": np.full((2, 3), comm.rank + 1.0), "b": np.full(5, 2.0 * comm.rank)}
    dp = DataParallel(g, comm, average=False)
    dp.grad_ready("b")
    dp.grad_ready("a")
    dp.finish()
    p = comm.size
    ok = np.all(g["a"] == p * (p + 1) / 2) and np.all(g["b"] == p * (p - 1))
    agree(comm, ok, "average=False did not give the sum")


def test_buckets_reverse_order_and_overlap(comm, count_iallreduce):
    layers = model()
    dp = DataParallel(params_of(layers), comm, bucket_bytes=200)  # fc2.b 32 B, fc2.w 256 B, fc1.b 64 B, fc1.w 256 B
    agree(comm, dp.buckets == [["fc2.b", "fc2.w"], ["fc1.b", "fc1.w"]], f"buckets {dp.buckets}")
    agree(comm, DataParallel(params_of(layers), comm, bucket_bytes=1).buckets == [[n] for n in NAMES[::-1]],
          "bucket_bytes=1 should give one bucket per gradient, in reverse order")
    agree(comm, DataParallel(params_of(layers), comm).buckets == [NAMES[::-1]], "default: one bucket")
    # the gradients, and the last bucket's flag of a step some rank did not complete
    agree(comm, dp.traffic() == (0 if comm.size == 1 else 8 * (C * F + F + F * C + C + 1)), f"traffic {dp.traffic()}")
    calls = count_iallreduce(comm)
    x, t = global_batch(N)
    one = 0 if comm.size == 1 else 1  # a group of one communicates nothing
    seen = []
    for name in ["fc2.b", "fc2.w", "fc1.b", "fc1.w"]:
        seen.append(calls[0])
        dp.grad_ready(name)
    seen.append(calls[0])
    dp.finish()
    seen.append(calls[0])
    agree(comm, seen == [0, 0, one, one, 2 * one, 2 * one],
          f"iallreduce calls before each grad_ready / after the last / after finish: {seen}")


def test_out_of_order_ready_keeps_bucket_order(comm, count_iallreduce):
    """A later bucket completed first waits, so every rank starts the collectives in one order."""
    x, t = global_batch(comm.size * N)
    expected = reference(x, t)
    layers = model()
    dp = DataParallel(params_of(layers), comm, bucket_bytes=1)
    calls = count_iallreduce(comm)
    step(layers, mine(x, comm, N), mine(t, comm, N), 1.0 / N)  # backward first, marks afterwards
    dp.grad_ready("fc1.w")  # the last bucket complete, buckets 0-2 not: nothing may start
    started = calls[0]
    for name in ["fc2.b", "fc2.w", "fc1.b"]:
        dp.grad_ready(name)
    dp.finish()
    bad = [n for n, _, g in params_of(layers) if not close(g, expected[n])]
    agree(comm, started == 0 and not bad, f"started {started} early; wrong gradients {bad}")


def test_no_sync_accumulation(comm, count_iallreduce):
    """Three micro-batches (the loss a mean over all of them) equal one big batch; only the last communicates."""
    micro = 3
    x, t = global_batch(comm.size * N * micro)
    expected = reference(x, t)
    layers = model()
    dp = DataParallel(params_of(layers), comm, bucket_bytes=200)
    calls = count_iallreduce(comm)
    xs, ts = mine(x, comm, N * micro), mine(t, comm, N * micro)
    scale = 1.0 / (N * micro)
    with dp.no_sync():
        for m in range(micro - 1):
            step(layers, xs[m * N:(m + 1) * N], ts[m * N:(m + 1) * N], scale, dp)
            dp.finish()
    quiet = calls[0]
    step(layers, xs[-N:], ts[-N:], scale, dp)
    dp.finish()
    bad = [n for n, _, g in params_of(layers) if not close(g, expected[n])]
    want = 0 if comm.size == 1 else 2
    agree(comm, quiet == 0 and calls[0] == want and not bad,
          f"calls inside no_sync {quiet}, after {calls[0]} (want {want}); wrong gradients {bad}")


def test_errors(comm):
    layers = model()
    dp = DataParallel(params_of(layers), comm, bucket_bytes=1)
    with pytest.raises(ValueError, match="'fc3.w' is not a parameter"):
        dp.grad_ready("fc3.w")
    dp.grad_ready("fc2.b")
    with pytest.raises(RuntimeError, match="'fc2.b' was already marked ready"):
        dp.grad_ready("fc2.b")
    with pytest.raises(RuntimeError, match="no_sync: entered in the middle of a step"):
        with dp.no_sync():
            pass
    dp.grad_ready("fc2.w")
    with pytest.raises(RuntimeError, match=r"2 gradient\(s\) never marked ready .*'fc1.w', 'fc1.b'"):
        dp.finish()
    # the failed step was drained and reset: a full step works again
    for name in NAMES[::-1]:
        dp.grad_ready(name)
    dp.finish()
    g = np.zeros(3)
    with pytest.raises(ValueError, match="bucket_bytes must be a positive integer"):
        DataParallel({"a": g}, comm, bucket_bytes=0)
    with pytest.raises(ValueError, match="'a' appears twice"):
        DataParallel([("a", g, g), ("a", g, g)], comm)
    with pytest.raises(ValueError, match=r"grad of 'a' has shape \(3,\), expected \(4,\)"):
        DataParallel([("a", np.zeros(4), g)], comm)
    with pytest.raises(TypeError, match="expected a floating dtype"):
        DataParallel({"a": np.zeros(3, np.int32)}, comm)
    with pytest.raises(TypeError, match=r"must be \(name, param, grad\)"):
        DataParallel([("a", g)], comm)


def test_a_rank_that_misses_a_gradient_voids_the_step_on_every_rank(comm):
    """The last rank skips grad_ready('fc1.w') (its bucket never starts there): it raises at finish naming it,
    and every other rank raises too, from the last bucket's flag, with no gradient written back (before, the
    others waited for ever in finish for allreduces that rank never started). The next full step is right."""
    layers = model()
    dp = DataParallel(params_of(layers), comm, bucket_bytes=1)   # one bucket per gradient: fc1.w's starts last
    x, t = global_batch(comm.size * N)
    mine = slice(comm.rank * N, (comm.rank + 1) * N)
    fc1, act, fc2 = layers
    dh = fc2.backward((fc2(act(fc1(x[mine]))) - t[mine]) / N)
    fc1.backward(act.backward(dh))
    before = {n: g.copy() for n, _, g in params_of(layers)}
    skipper = comm.size - 1
    for name in NAMES[::-1]:
        if not (comm.rank == skipper and name == "fc1.w"):
            dp.grad_ready(name)
    problem = ""
    want = ("1 gradient(s) never marked ready in this step (rank {}): 'fc1.w'; no gradient written back"
            if comm.rank == skipper else "another rank of the group did not complete this step").format(
        comm.rank)
    try:
        dp.finish()
        problem = "finish returned"
    except RuntimeError as e:
        problem = "" if want in str(e) else f"RuntimeError without {want!r}: {e}"
    written = [n for n, _, g in params_of(layers) if not np.array_equal(g, before[n])]
    agree(comm, not problem and not written, f"{problem}; gradients written back: {written}")
    for layer in (fc1, fc2):
        layer.zero_grad()
    step(layers, x[mine], t[mine], 1.0 / N, dp)
    dp.finish()
    expected = reference(x, t)
    agree(comm, all(close(g, expected[n]) for n, _, g in params_of(layers)), "the full step after it")


def test_read_only_gradients_are_refused_and_leave_no_stale_step(comm):
    """A read-only gradient is refused where DataParallel is built; one made read-only later is refused at
    finish, naming it, with no gradient written back, and the next step reduces its own gradients (before,
    NumPy's error left the step's buckets behind, and the next finish wrote them back over the new gradients
    without communicating: the sum of the step before, silently)."""
    frozen = np.zeros(2)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="grad of 'b' is read-only"):
        DataParallel({"a": np.zeros(3), "b": frozen}, comm)
    r, p = comm.rank, comm.size
    a, b = np.full(3, 1.0 + r), np.full(2, 1.0 + r)
    dp = DataParallel({"a": a, "b": b}, comm, bucket_bytes=8, average=False)
    b.flags.writeable = False
    dp.all_ready()
    error = ""
    try:
        dp.finish()
    except ValueError as e:
        error = str(e)
    ok = (a == 1.0 + r).all() and (error == "" if p == 1 else   # a group of one writes nothing back
                                   "grads ['b'] are read-only" in error and "no gradient written back" in error)
    b.flags.writeable = True
    a[...], b[...] = 10.0 * (r + 1), 10.0 * (r + 1)
    dp.all_ready()
    dp.finish()
    want = 10.0 * p * (p + 1) / 2
    agree(comm, ok and (a == want).all() and (b == want).all(), f"error {error!r}; a {a}, b {b}, want {want}")


def test_a_gradient_read_only_on_one_rank_voids_the_step_on_every_rank(comm):
    """One rank's gradient made read-only after DataParallel was built: that rank raises naming it, every other rank
    raises too, and no rank writes anything back (before 2026-12-05 the others wrote the reduced gradients back and
    went on, a step the rank that raised never took: the replicas parted without an error on their side)."""
    r, p = comm.rank, comm.size
    if p == 1:
        pytest.skip("a group of one has no other rank")
    last = r == p - 1
    a, b = np.full(3, 1.0 + r), np.full(2, 1.0 + r)
    dp = DataParallel({"a": a, "b": b}, comm, bucket_bytes=8, average=False)
    if last:
        b.flags.writeable = False
    dp.all_ready()
    error = ""
    try:
        dp.finish()
    except (ValueError, RuntimeError) as e:
        error = str(e)
    expected = "grads ['b'] are read-only" if last else "another rank of the group did not complete this step"
    ok = expected in error and "no gradient written back" in error and (a == 1.0 + r).all() and (b == 1.0 + r).all()
    b.flags.writeable = True
    dp.all_ready()
    dp.finish()
    want = p * (p + 1) / 2
    agree(comm, ok and (a == want).all() and (b == want).all(), f"error {error!r}; a {a}, b {b}, want {want}")


def test_mixed_dtypes_separate_buckets(comm):
    r = comm.rank + 1.0
    g = {"a": np.full(4, r), "b": np.full(3, 2 * r, np.float32), "c": np.full((2, 2), 3 * r),
         "d": np.full(5, 4 * r, np.float32)}
    dp = DataParallel(g, comm)
    agree(comm, dp.buckets == [["d", "b"], ["c", "a"]], f"buckets {dp.buckets}")
    for name in "dcba":
        dp.grad_ready(name)
    dp.finish()
    mean = (comm.size + 1) / 2
    ok = all(g[n].dtype == d and np.allclose(g[n], k * mean, rtol=1e-6)
             for n, d, k in (("a", "f8", 1), ("b", "f4", 2), ("c", "f8", 3), ("d", "f4", 4)))
    agree(comm, ok, f"mixed dtypes reduced wrongly: {g}")


def test_a_rank_refusing_its_arguments_alone_stops_every_rank(comm):
    """A bad bucket_bytes (or gradient, or accumulate) on the last rank alone: it raises its own error, every other
    rank raises naming it (the check used to come before the agreement: the others waited in it for ever)."""
    g = np.zeros(3)
    last = comm.rank == comm.size - 1
    for bad, match in [({"bucket_bytes": 0}, "bucket_bytes must be a positive integer"),
                       ({"accumulate": "float64"}, "accumulate must be None or 'float32'")]:
        settings = bad if last else {}
        with pytest.raises(ValueError, match=match if last or comm.size == 1 else
                           rf"rank\(s\) \[{comm.size - 1}\] of the group refused their arguments"):
            DataParallel({"a": g}, comm, **settings)
    with pytest.raises((TypeError, ValueError), match="expected a floating dtype" if last or comm.size == 1 else
                       "refused their arguments"):
        DataParallel({"a": np.zeros(3, np.int32) if last else g}, comm)
    with pytest.raises((TypeError, ValueError), match="'a': expected a NumPy or CuPy array, got list" if last or
                       comm.size == 1 else "refused their arguments"):   # an AttributeError named nothing before
        DataParallel([("a", [0.0] * 3 if last else g, g)], comm)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_accumulate_reduces_low_precision_gradients_in_float32(comm, dtype):
    """big + 1 + 1 ...: each sum rounded once to the dtype (in its partial sums big + 1 is big), then averaged."""
    import ml_dtypes
    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    big = 256.0 if dtype == "bfloat16" else 2048.0
    g = {n: np.full(k, big if comm.rank == 0 else 1.0, dt) for n, k in (("a", 5), ("b", 3))}
    dp = DataParallel(g, comm, bucket_bytes=6, average=False, accumulate="float32")
    for name in "ba":
        dp.grad_ready(name)
    dp.finish()
    want = np.float64(big + comm.size - 1).astype(dt)
    agree(comm, all(a.dtype == dt and (a == want).all() for a in g.values()), f"accumulated {g}, want {want}")

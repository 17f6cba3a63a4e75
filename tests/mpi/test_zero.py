"""ZeroAdamW (pycollect.zero) at stages 0-3 against plain data-parallel AdamW and a single process.

Groups: sub-communicators of 1, 2, 3 and 4 consecutive ranks carved from the world (ranks left
over sit the test out; sizes larger than the world skip on every rank). The parameter set has
73 elements in five tensors, so the flat buffer is padded at every group size above one (73 is
odd and divides by neither 3 nor 4: shards of 37, 25, 19 elements, padded to 74, 75, 76).
Every rank draws the same parameters; rank r of the group draws its own gradient for step t from
the seed (t, r), so every rank can also compute the group's mean gradient by itself.

References, each run beside the optimizer under test for the same 20 steps:

- plain data parallelism: ``DataParallel`` averaging the local gradients over the group, then
  ``pycollect.optim.AdamW`` on full replicated parameters;
- a single process: ``pycollect.optim.AdamW`` on the mean gradient (computed in float64, cast to
  the dtype), clipped by ``pycollect.optim.clip_grad_norm`` where the optimizer clips.

Relative error in the 2-norm per tensor (``helpers.rel_close``). Tolerances, measured at group
sizes 1-4 and stages 0-3 with lr 1e-2, 20 steps, weight decay, clipping:

- float64: 1e-12 (asked for; measured at most 5.3e-17, from the order of the sums);
- float32: 2e-7 (measured at most 3.8e-8, against the single process and against DP alike: the
  mean gradient rounded once there, summed in float32 by the reduce-scatter here);
- float16 parameters (float32 master weights): 1e-3 on the parameters (measured 3.1e-4, 3.9e-4
  with dynamic loss scaling: rounding the result to float16 alone costs up to 2^-12 relative),
  1e-4 on the master weights (measured 1.6e-5: the gradient summed in float16);
- bfloat16: 8e-3 on the parameters (measured 2.6e-3; bfloat16 keeps 8 bits), 1e-3 on the master
  weights (measured 1.3e-4).

The bugs found while writing these tests are at the end of the file; each is fixed.
"""
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

from helpers import agree, carved, carved_mesh, raises, rel_close
from pycollect.optim import AdamW, clip_grad_norm
from pycollect.parallel.data import DataParallel
from pycollect.zero import ZeroAdamW

SHAPES = {"fc1.w": (5, 7), "fc1.b": (7,), "fc2.w": (7, 3), "fc2.b": (3,), "ln.g": (7,)}  # forward order
NAMES = list(SHAPES)
P = 73  # elements in all
LAYERS = [("fc1.w", "fc1.b"), ("fc2.w", "fc2.b"), ("ln.g",)]  # contiguous runs, forward order
NO_DECAY = ("fc1.b", "fc2.b", "ln.g")
STEPS = 20
LR, WD, MAX_NORM = 1e-2, 0.1, 4.0
SCALES = (0.1, 1.0, 3.0)  # gradient scale at step t % 3: some steps clipped, some not
BUCKET_ELEMS = 6  # small buckets: [66, P'), [42, 66), [35, 42), [0, 35), every one crossing a shard border
BF16 = np.dtype(ml_dtypes.bfloat16)
F2, F4, F8 = np.dtype("f2"), np.dtype("f4"), np.dtype("f8")
RTOL = {F8: 1e-12, F4: 2e-7}
RTOL_LOW = {F2: (1e-3, 1e-4), BF16: (8e-3, 1e-3)}  # (parameters, master weights) against float32


@pytest.fixture(scope="module", params=[1, 2, 3, 4])
def group(request, comm):
    """This rank's data-parallel group of ``p`` consecutive ranks, or None when it is left over."""
    with carved(comm, request.param) as g:
        yield g


def initial(dtype, seed=3) -> dict:
    """The same parameters on every rank."""
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(s).astype(dtype) for n, s in SHAPES.items()}


def local_grads(t: int, r: int, dtype, scale: float = 1.0) -> dict:
    """Rank r's gradient at step t (any rank can draw any other's)."""
    rng = np.random.default_rng([17, t, r])
    return {n: (rng.standard_normal(s) * SCALES[t % 3] * scale).astype(dtype) for n, s in SHAPES.items()}


def mean_grads(t: int, p: int, dtype, ref_dtype=None, scale: float = 1.0) -> dict:
    """The group's mean gradient at step t from the gradients as handed in, summed in float64."""
    each = [local_grads(t, r, dtype, scale) for r in range(p)]
    return {n: (sum(g[n].astype(F8) for g in each) / p).astype(ref_dtype or dtype) for n in NAMES}


def padded(p: int) -> int:
    """P' = p * ceil(P / p): the flat buffer's length at group size p."""
    return p * -(-P // p)


def close_all(got: dict, expected: dict, rtol: float) -> bool:
    return sorted(got) == sorted(expected) and all(rel_close(got[n], expected[n], rtol, same_dtype=False)
                                                   for n in expected)


def worst(got: dict, expected: dict) -> float:
    return max(float(np.linalg.norm(got[n].astype(F8) - expected[n].astype(F8)) / np.linalg.norm(expected[n].astype(F8)))
               for n in expected)


def hand_in(opt, grads: dict, mode: str):
    """One step's gradients in the way ``mode`` says; returns step()'s result."""
    if mode == "dict":
        return opt.step(grads)
    if mode == "early":  # every gradient through grad_ready, backward order, then step() with no argument
        for n in reversed(NAMES):
            opt.grad_ready(n, grads[n])
        return opt.step()
    # "partial": the last layer's gradients early, the rest (and the early ones again) in step(grads)
    for n in ("ln.g", "fc2.b"):
        opt.grad_ready(n, grads[n])
    return opt.step(grads)


# -- 20 steps against data parallelism and a single process ---------------------------------------------
MODES = {  # mode -> (bucket elements, max_grad_norm); None: the default bucket_bytes (one bucket)
    "dict": (None, None),
    "early": (BUCKET_ELEMS, MAX_NORM),
    "partial": (BUCKET_ELEMS, MAX_NORM),
}


@pytest.mark.parametrize("dtype, mode", [(F8, "dict"), (F8, "early"), (F8, "partial"), (F4, "dict"), (F4, "early")],
                         ids=lambda v: str(v))
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_twenty_steps_match_data_parallel_and_single_process(comm, group, stage, dtype, mode):
    """Weight decay with no_decay names; in "early" and "partial" also clipping and 6-element buckets."""
    if group is None:
        return agree(comm, True, "left over")
    p, r = group.size, group.rank
    elems, max_norm = MODES[mode]
    kw = dict(lr=LR, weight_decay=WD, no_decay=NO_DECAY)
    params = initial(dtype)
    opt = ZeroAdamW(params, group, stage=stage, max_grad_norm=max_norm,
                    **({} if elems is None else {"bucket_bytes": elems * dtype.itemsize}), **kw)
    dp_params, dp_grads = initial(dtype), {n: np.zeros(s, dtype) for n, s in SHAPES.items()}
    dp = DataParallel(dp_grads, group, bucket_bytes=elems * dtype.itemsize if elems else 25 << 20)
    dp_opt = AdamW(dp_params, dp_grads, **kw)
    ref_params, ref_grads = initial(dtype), {n: np.zeros(s, dtype) for n, s in SHAPES.items()}
    ref = AdamW(ref_params, ref_grads, **kw)
    norms, results = [], []
    for t in range(STEPS):
        mine = local_grads(t, r, dtype)
        results.append(hand_in(opt, mine, mode))
        for n in reversed(NAMES):
            dp_grads[n][...] = mine[n]
            dp.grad_ready(n)
        dp.finish()
        if max_norm is not None:
            clip_grad_norm(dp_grads, max_norm, group=None)  # replicated: every rank's norm is the global one
        dp_opt.step()
        for n, g in mean_grads(t, p, dtype).items():
            ref_grads[n][...] = g
        if max_norm is not None:
            norms.append(clip_grad_norm(ref_grads, max_norm))
        ref.step()
    full, state = opt.full_params(), opt.full_state()
    tol = RTOL[dtype]
    ok = all(results) and opt.t == STEPS and opt.skipped == 0
    ok = ok and close_all(full, ref_params, tol) and close_all(dp_params, ref_params, tol)
    ok = ok and close_all(full, dp_params, tol) and all(full[n].dtype == dtype for n in NAMES)
    ok = ok and close_all(state["master"], ref_params, tol) and close_all(state["m"], ref.m, tol)
    ok = ok and close_all(state["v"], ref.v, tol)
    if stage < 3:  # the caller's arrays are the parameters, updated in place
        ok = ok and all(np.array_equal(params[n], full[n]) for n in NAMES)
    else:  # the caller's arrays are not kept: only the shard
        ok = ok and all(np.array_equal(params[n], initial(dtype)[n]) for n in NAMES)
    if max_norm is not None:  # the clipping was exercised both ways
        ok = ok and any(x > max_norm for x in norms) and any(x <= max_norm for x in norms)
    agree(comm, ok, f"stage {stage} p={p} {dtype} {mode}: worst relative error against the single process "
                    f"{worst(full, ref_params):.2e} (tolerance {tol:g}), against DP {worst(full, dp_params):.2e}; "
                    f"norms {[round(x, 2) for x in norms]}")


# -- stage 3: parameters gathered just in time ----------------------------------------------------------
def test_gathered_and_prefetch_give_the_full_parameters(comm, group):
    """Stage 3: gathered(names) per layer, of every name at once, and after prefetch, equal full_params()."""
    if group is None:
        return agree(comm, True, "left over")
    opt = ZeroAdamW(initial(F8), group, stage=3, lr=LR, bucket_bytes=BUCKET_ELEMS * 8)
    for t in range(3):
        opt.step(local_grads(t, group.rank, F8))
    full = opt.full_params()
    ok = True
    for names in [*LAYERS, NAMES, ("fc1.b", "fc2.w")]:
        with opt.gathered(names) as got:
            ok = ok and list(got) == list(names) and all(np.array_equal(got[n], full[n]) for n in names)
        opt.prefetch(names)
        with opt.gathered(names) as got:
            ok = ok and list(got) == list(names) and all(np.array_equal(got[n], full[n]) for n in names)
    # as a model would: prefetch the next layer while the current one computes, forward then backward
    order = LAYERS + LAYERS[::-1]
    opt.prefetch(order[0])
    for i, names in enumerate(order):
        with opt.gathered(names) as got:
            if i + 1 < len(order):
                opt.prefetch(order[i + 1])
            ok = ok and all(np.array_equal(got[n], full[n]) and got[n].shape == SHAPES[n] for n in names)
    agree(comm, ok, f"gathered at p={group.size}")


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_gathered_below_stage_3_is_the_parameters(comm, stage):
    params = initial(F8)
    opt = ZeroAdamW(params, comm, stage=stage)
    opt.prefetch(LAYERS[0])  # nothing to do
    with opt.gathered(LAYERS[0]) as got:
        assert all(got[n] is params[n] for n in LAYERS[0])


# -- mixed precision ------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [F2, BF16], ids=str)
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_mixed_precision_matches_float32(comm, group, stage, dtype):
    """float16 / bfloat16 parameters, float32 master weights and moments: 20 steps against float32
    AdamW from the same (cast) parameters on the mean of the same (cast) gradients."""
    if group is None:
        return agree(comm, True, "left over")
    p, r = group.size, group.rank
    kw = dict(lr=LR, weight_decay=WD, no_decay=NO_DECAY)
    params = initial(dtype)
    opt = ZeroAdamW(params, group, stage=stage, bucket_bytes=BUCKET_ELEMS * dtype.itemsize, **kw)
    ref_params = {n: a.astype(F4) for n, a in initial(dtype).items()}
    ref_grads = {n: np.zeros(s, F4) for n, s in SHAPES.items()}
    ref = AdamW(ref_params, ref_grads, **kw)
    for t in range(STEPS):
        opt.step(local_grads(t, r, dtype))
        for n, g in mean_grads(t, p, dtype, F4).items():
            ref_grads[n][...] = g
        ref.step()
    full, state = opt.full_params(), opt.full_state()
    tol_p, tol_m = RTOL_LOW[dtype]
    ok = opt.master_dtype == F4 and all(full[n].dtype == dtype for n in NAMES)
    ok = ok and all(state[k][n].dtype == F4 for k in ("master", "m", "v") for n in NAMES)
    ok = ok and close_all(full, ref_params, tol_p) and close_all(state["master"], ref_params, tol_m)
    agree(comm, ok, f"stage {stage} p={p} {dtype}: parameters {worst(full, ref_params):.2e} (tolerance {tol_p:g}), "
                    f"master {worst(state['master'], ref_params):.2e} (tolerance {tol_m:g})")


@pytest.mark.parametrize("dtype", [F2, BF16], ids=str)
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_accumulate_reduces_low_precision_gradients_in_float32(comm, group, stage, dtype):
    """accumulate="float32": each element's gradient sum over the group rounded once to the dtype (big + 1 + 1 ...;
    in the dtype's partial sums big + 1 is big), in buckets that cross the shard borders; the padding stays 0."""
    if group is None:
        return agree(comm, True, "left over")
    p, r = group.size, group.rank
    big = 2048.0 if dtype == F2 else 256.0
    opt = ZeroAdamW(initial(dtype), group, stage=stage, bucket_bytes=BUCKET_ELEMS * dtype.itemsize,
                    accumulate="float32")
    opt.step({n: np.full(s, big if r == 0 else 1.0, dtype) for n, s in SHAPES.items()})
    lo, hi = opt.layout.shard_span(opt.rank)
    want = np.where(np.arange(lo, hi) < P, big + p - 1, 0.0).astype(dtype)
    agree(comm, opt.grad_shard.dtype == dtype and np.array_equal(opt.grad_shard, want),
          f"stage {stage} p={p} {dtype}: reduced {opt.grad_shard}, want {want}")


@pytest.mark.parametrize("bad", [np.inf, np.nan], ids=["inf", "nan"])
@pytest.mark.parametrize("where", ["first", "last"])  # the element in the first shard or in the last one
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_dynamic_loss_scale_skips_a_step_bad_on_one_rank(comm, group, stage, where, bad):
    """float16, loss_scale="dynamic", growth_interval 2. Steps: good, good (scale doubles), bad on the
    group's last rank only (skipped on every rank: False, parameters and state unchanged, scale halved,
    skipped 1), good, good (doubles again). The good steps match float32 AdamW on the unscaled mean."""
    if group is None:
        return agree(comm, True, "left over")
    p, r = group.size, group.rank
    params = initial(F2)
    opt = ZeroAdamW(params, group, stage=stage, lr=LR, loss_scale="dynamic", growth_interval=2,
                    bucket_bytes=BUCKET_ELEMS * 2)
    ref_params = {n: a.astype(F4) for n, a in initial(F2).items()}
    ref_grads = {n: np.zeros(s, F4) for n, s in SHAPES.items()}
    ref = AdamW(ref_params, ref_grads, lr=LR)
    small = 1e-3  # scaled by up to 2^17 the gradients stay finite in float16, summed too
    log, ok = [], opt.loss_scale == 2.0 ** 16
    for t, good in enumerate([True, True, False, True, True]):
        scale = opt.loss_scale
        mine = local_grads(t, r, F2, small * scale)
        if not good and r == p - 1:
            name, i = ("fc1.w", (0, 1)) if where == "first" else ("ln.g", (5,))
            mine[name][i] = bad
        before, state_before = opt.full_params(), opt.full_state()
        result = opt.step(mine)
        after, state_after = opt.full_params(), opt.full_state()
        log.append((result, opt.loss_scale, opt.skipped, opt.t))
        if good:
            for n, g in mean_grads(t, p, F2, F4, small * scale).items():
                ref_grads[n][...] = g / scale
            ref.step()
        else:
            ok = ok and all(np.array_equal(before[n], after[n]) for n in NAMES)
            ok = ok and all(np.array_equal(state_before[k][n], state_after[k][n]) for k in state_before for n in NAMES)
            if stage < 3:
                ok = ok and all(np.array_equal(params[n], before[n]) for n in NAMES)
    s = 2.0 ** 16
    ok = ok and log == [(True, s, 0, 1), (True, 2 * s, 0, 2), (False, s, 1, 2), (True, s, 1, 3), (True, 2 * s, 1, 4)]
    tol_p, tol_m = RTOL_LOW[F2]
    full, state = opt.full_params(), opt.full_state()
    ok = ok and close_all(full, ref_params, tol_p) and close_all(state["master"], ref_params, tol_m)
    agree(comm, ok, f"stage {stage} p={p} bad {bad} in the {where} shard: (returned, scale, skipped, t) {log}; "
                    f"master error {worst(state['master'], ref_params):.2e}")


# -- memory ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [F4, F2], ids=str)
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_memory_report_equals_the_formulas(comm, group, stage, dtype):
    """memory_report() == expected_memory() for each category it covers, and both == the formulas
    written here. With float16 parameters (c = 2, float32 state), against the paper's per-rank bytes
    with P the unpadded size and N the group size, the difference is exactly the padding D = P' - P
    (P' = N ceil(P/N), so 0 <= D < N; stage 0 keeps its own unpadded buffer):

        stage 0  (2 + 2 + 12) P            exactly
        stage 1  4P + 12P/N     + 2D + 12D/N   (the full gradient buffer is padded; state per shard)
        stage 2  2P + 14P/N     + 14D/N
        stage 3  16P/N          + 16D/N
    """
    if group is None:
        return agree(comm, True, "left over")
    n = group.size
    opt = ZeroAdamW(initial(dtype), group, stage=stage)
    report, expected = opt.memory_report(), opt.expected_memory()
    keys = ("parameters", "gradients", "master_weights", "moments")
    c, f = dtype.itemsize, 4 if dtype == F2 else dtype.itemsize
    pp = P if stage == 0 else padded(n)
    s = pp if stage == 0 else pp // n
    mine = {"parameters": c * (s if stage == 3 else P), "gradients": c * (pp if stage <= 1 else s),
            "master_weights": f * s, "moments": 2 * f * s}
    ok = set(expected) == set(keys) and all(report[k] == expected[k] == mine[k] for k in keys)
    total = sum(report[k] for k in keys)
    if dtype == F2:
        d, N = padded(n) - P, Fraction(n)
        paper = {0: 16 * P, 1: 4 * P + 12 * P / N, 2: 2 * P + 14 * P / N, 3: 16 * P / N}[stage]
        padding = {0: 0, 1: 2 * d + 12 * d / N, 2: 14 * d / N, 3: 16 * d / N}[stage]
        ok = ok and total == paper + padding and 0 <= d < n and (d > 0 if n > 1 else d == 0)
    agree(comm, ok, f"stage {stage} p={n} {dtype}: report {report}, expected {expected}, formulas {mine}")


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_memory_report_total_is_every_array_held(comm, stage):
    """The report's total equals the bytes of every array the optimizer holds (its attributes, its
    lists of arrays) plus, at stages 0-2, the caller's parameters, which it writes."""
    params = initial(F2)
    opt = ZeroAdamW(params, comm, stage=stage, bucket_bytes=BUCKET_ELEMS * 2)
    held = 0
    for v in vars(opt).values():
        if isinstance(v, np.ndarray):
            held += v.nbytes
        elif isinstance(v, list) and v and all(isinstance(a, np.ndarray) for a in v):
            held += sum(a.nbytes for a in v)
    held += sum(a.nbytes for a in params.values()) if stage < 3 else 0
    report = opt.memory_report()
    assert report["total"] == held, (report, held)


# -- traffic of one step --------------------------------------------------------------------------------
def bucket_sizes(pp: int) -> list[int]:
    """The 6-element buckets from the end of the flat buffer: [66, P'), [42, 66), [35, 42), [0, 35)."""
    return [pp - 66, 24, 7, 35]


def piece(lo: int, hi: int, rank: int, n: int) -> int:
    """Elements of [lo, hi) in rank's shard at group size n."""
    s = -(-P // n)
    return max(0, min(hi, (rank + 1) * s) - max(lo, rank * s))


def span(names) -> tuple[int, int]:
    offsets, at = {}, 0
    for n, shape in SHAPES.items():
        offsets[n] = at
        at += int(np.prod(shape))
    return offsets[names[0]], offsets[names[-1]] + int(np.prod(SHAPES[names[-1]]))


VOTE = ("allreduce", 2, "int64")  # a step's vote: (some rank refused the step, some rank's shard overflowed)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_one_step_traffic(comm, group, stage):
    """Elements handed to each collective in one step, from ``group.record()``.

    Stages 1 and 2: a reduce-scatter per bucket, the buckets summing to P', and one allgather of the
    rank's shard P'/N (a ring sends (N-1)/N P' for each: about 2P' per rank, an allreduce's cost).
    After the reductions, the step's vote (``VOTE``: some rank refused, some shard overflowed), every stage.
    Stage 3: the same reduce-scatters and no allgather in the step; gathering every layer once for
    forward and once for backward with gathered() hands each rank's piece of each layer to an
    allgather, the pieces summing over ranks to 2P (the padding is never gathered; P <= P'), so a
    ring moves about 3P' per rank. Stage 0: allreduces of the buckets summing to P (= P' at stage 0).
    A group of one communicates nothing.
    """
    if group is None:
        return agree(comm, True, "left over")
    n, r = group.size, group.rank
    opt = ZeroAdamW(initial(F4), group, stage=stage, bucket_bytes=BUCKET_ELEMS * 4)
    with group.record() as log:
        order = LAYERS + LAYERS[::-1] if stage == 3 else []
        for names in order[:3]:  # forward
            with opt.gathered(names):
                pass
        grads = local_grads(0, r, F4)
        for names in order[3:]:  # backward: a layer's parameters, then its gradients
            with opt.gathered(names):
                pass
            for name in reversed(names):
                opt.grad_ready(name, grads[name])
        opt.step(grads)
    got = [(x.collective, x.elements, x.dtype) for x in log]
    pp, s = padded(n), padded(n) // n
    if n == 1:
        want = []
    elif stage == 0:
        want = [("allreduce", e, "float32") for e in bucket_sizes(P)] + [VOTE]
    else:
        want = [("reduce_scatter", e, "float32") for e in bucket_sizes(pp)]
        if stage == 3:
            want = [("allgather", piece(*span(names), r, n), "float32") for names in order[:3]] + [
                x for names in order[3:] for x in [("allgather", piece(*span(names), r, n), "float32")]] + want
        else:
            want.append(("allgather", s, "float32"))
        want.append(VOTE)
    ok = sorted(got) == sorted(want) and (stage != 3 or got[:3] == want[:3])
    # totals over the group: what the docstring says
    sums = {}
    for c, e, _ in got:
        sums[c] = sums.get(c, 0) + e
    group_allgather = sum(group.mpi.allgather(sums.get("allgather", 0)))
    if n > 1:
        ok = ok and sums.get("reduce_scatter", 0) == (0 if stage == 0 else pp)
        ok = ok and sums.get("allreduce", 0) == (P if stage == 0 else 0) + VOTE[1]
        ok = ok and group_allgather == {0: 0, 1: pp, 2: pp, 3: 2 * P}[stage]
    agree(comm, ok, f"stage {stage} p={n} rank {r}: got {got}, expected {want}; allgathered over the group "
                    f"{group_allgather}")


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_one_step_traffic_with_loss_scaling_and_clipping(comm, group, stage):
    """Dynamic loss scaling adds no call (the overflow flag rides in the step's vote); clipping one more
    allreduce (the sum of squares, float64). At stage 0 every rank holds the whole gradient: no norm to sum."""
    if group is None:
        return agree(comm, True, "left over")
    n, r = group.size, group.rank
    opt = ZeroAdamW(initial(F2), group, stage=stage, loss_scale="dynamic", max_grad_norm=1.0)
    with group.record() as log:
        opt.step(local_grads(0, r, F2, 1e-4))
    got = [(x.collective, x.elements, x.dtype) for x in log]
    pp = padded(n)
    if n == 1:
        want = []
    elif stage == 0:
        want = [("allreduce", P, "float16"), VOTE]  # every rank holds the whole reduced gradient: no norm sum
    else:
        want = [("reduce_scatter", pp, "float16"), VOTE, ("allreduce", 1, "float64")]
        want += [] if stage == 3 else [("allgather", pp // n, "float16")]
    agree(comm, got == want, f"stage {stage} p={n}: got {got}, expected {want}")


# -- bad input: clear errors naming the argument, before any communication --------------------------------
BAD_SETTINGS = [
    ({"stage": 5}, ValueError, "stage must be one of"),
    ({"stage": True}, ValueError, "stage must be one of"),
    ({"stage": 1.0}, ValueError, r"stage must be one of \(0, 1, 2, 3\), got 1.0"),
    ({"lr": -1e-3}, ValueError, "lr must be"),
    ({"lr": float("nan")}, ValueError, "lr must be"),
    ({"betas": (0.9, 1.0)}, ValueError, "betas must be"),
    ({"betas": (-0.1, 0.999)}, ValueError, "betas must be"),
    ({"betas": (0.9,)}, ValueError, "betas must be"),
    ({"eps": 0}, ValueError, "eps must be"),
    ({"weight_decay": -0.1}, ValueError, "weight_decay must be"),
    ({"max_grad_norm": 0.0}, ValueError, "max_grad_norm must be"),
    ({"bucket_bytes": 0}, ValueError, "bucket_bytes must be"),
    ({"loss_scale": "static"}, ValueError, "loss_scale must be"),
    ({"loss_scale": 0}, ValueError, "loss_scale must be"),
    ({"accumulate": "float64"}, ValueError, "accumulate must be None or 'float32'"),
    ({"no_decay": ("nope",)}, ValueError, r"no_decay names \['nope'\]"),
    ({"no_decay": "ln.g"}, TypeError, "no_decay must be a collection of parameter names, got 'ln.g'"),
    ({"model_parallel": "tp"}, TypeError, "model_parallel must be a pycollect Communicator"),
    ({"norm_skip": ("ln.g",)}, ValueError, "norm_skip needs model_parallel"),
    ({"norm_skip": "ln.g"}, TypeError, "norm_skip must be a collection of parameter names"),
    ({"norm_skip": ("nope",)}, ValueError, r"norm_skip names \['nope'\] that are not parameters"),
    ({"owned_params": {"fc1.w": np.zeros((5, 7))}, "owned_grads": {"fc1.w": np.zeros((5, 7))}}, ValueError,
     r"\['fc1.w'\] are both sharded params and owned_params"),
    ({"owned_params": {"e": np.zeros(3)}}, ValueError, "owned_params and owned_grads must be dicts with the same names"),
    ({"owned_params": {"e": np.zeros(3)}, "owned_grads": {"e": np.zeros(3, np.float32)}}, TypeError,
     r"owned_grads\['e'\] is numpy float32; the parameters are numpy float64"),
    ({"owned_params": {"e": np.zeros(3)}, "owned_grads": {"e": np.zeros(4)}}, ValueError,
     r"owned_grads\['e'\] has shape \(4,\), the parameter \(3,\)"),
]


@pytest.mark.parametrize("settings, error, match", BAD_SETTINGS, ids=lambda v: str(v)[:30])
def test_bad_settings(comm, settings, error, match):
    with pytest.raises(error, match=match):
        ZeroAdamW(initial(F8), comm, **settings)


@pytest.mark.parametrize("params, error, match", [
    ({"a": np.zeros(3), "b": np.zeros(3, np.float32)}, TypeError, r"parameter 'b' is numpy float32, the first was numpy float64"),
    ({"a": np.zeros(3, np.int32)}, TypeError, r"parameter 'a' has dtype int32, expected a floating dtype"),
    ({"a": np.zeros(3, np.complex128)}, TypeError, r"parameter 'a' has dtype complex128"),
    ({}, ValueError, "params must be a non-empty dict"),
    ([np.zeros(3)], ValueError, "params must be a non-empty dict"),
], ids=["mixed-dtypes", "int", "complex", "empty", "list"])
def test_bad_params(comm, params, error, match):
    with pytest.raises(error, match=match):
        ZeroAdamW(params, comm)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_bad_grads(comm, stage):
    """Wrong shape, wrong dtype, an unknown name, a name handed twice, missing grads: errors naming
    the gradient; ``grad_ready`` communicates nothing (one bucket: it starts only when every gradient is in),
    ``step`` refuses the step on every rank (here every rank refuses alike)."""
    opt = ZeroAdamW(initial(F8), comm, stage=stage)
    grads = local_grads(0, comm.rank, F8)
    with pytest.raises(ValueError, match=r"grad of 'fc1.b' is float64\(6,\), expected float64\(7,\)"):
        opt.grad_ready("fc1.b", np.zeros(6))
    with pytest.raises(ValueError, match=r"grad of 'fc1.b' is float32\(7,\), expected float64\(7,\)"):
        opt.grad_ready("fc1.b", np.zeros(7, np.float32))
    with pytest.raises(ValueError, match=r"grad of 'ln.g' is float32"):
        opt.step({**grads, "ln.g": grads["ln.g"].astype(np.float32)})  # through step(grads) too
    with pytest.raises(ValueError, match=r"'nope' is not a parameter"):
        opt.grad_ready("nope", np.zeros(7))
    opt = ZeroAdamW(initial(F8), comm, stage=stage)
    opt.grad_ready("ln.g", grads["ln.g"])
    with pytest.raises(RuntimeError, match=r"'ln.g' was already handed in this step"):
        opt.grad_ready("ln.g", grads["ln.g"])
    with pytest.raises(ValueError, match=r"grads lack \['fc1.b', 'fc1.w', 'fc2.b', 'fc2.w'\]"):
        opt.step({"ln.g": grads["ln.g"]})
    assert opt.handed_in() == 0   # a refused step drops what was handed in: hand it in again
    opt.grad_ready("ln.g", grads["ln.g"])
    with pytest.raises(ValueError, match=r"no grads given and 4 never handed in \(first \['fc1.b', 'fc1.w', 'fc2.b'\]\)"):
        opt.step()
    assert opt.step(grads) is True and opt.t == 1  # and the step still works after them


def state_of(opt) -> bytes:
    """Everything a step changes: parameters, master weights, moments, step count, loss scale (collective)."""
    full = opt.full_state()
    arrays = [a for p in opt.full_params().values() for a in [p]] + [
        a for part in full.values() for a in part.values()]
    return b"".join(a.tobytes() for a in arrays) + repr((opt.t, opt.loss_scale, opt.skipped)).encode()


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_a_rank_missing_gradients_refuses_the_step_on_every_rank(comm, group, stage):
    """The group's last rank misses gradients three ways (``step()`` with one never handed in; ``grads``
    lacking one; one of the wrong shape) while the others hand theirs in with ``grad_ready``, so their first
    buckets are in flight: every rank raises (the others hung in their reduce-scatters before), nothing
    changes anywhere (float16, dynamic loss scale), and the next step equals an untouched optimizer's."""
    if group is None:
        return agree(comm, True, "left over")
    n, r = group.size, group.rank
    kw = dict(stage=stage, bucket_bytes=BUCKET_ELEMS * 2, loss_scale="dynamic", lr=LR)
    opt, twin = ZeroAdamW(initial(F2), group, **kw), ZeroAdamW(initial(F2), group, **kw)
    before, problems = state_of(opt), []
    for how in ("never handed in", "grads lack one", "wrong shape"):
        grads = local_grads(0, r, F2, 1e-4)
        args = grads
        if r == n - 1:
            if how == "never handed in":
                opt.grad_ready("ln.g", grads["ln.g"])
                args = None
            elif how == "grads lack one":
                args = {k: v for k, v in grads.items() if k != "fc1.w"}
            else:
                args = {**grads, "fc2.w": grads["fc2.w"].T.copy()}
        else:
            for name in reversed(NAMES[1:]):   # backward order; fc1.w left for step
                opt.grad_ready(name, grads[name])
        try:
            opt.step(args)
            problems.append(f"{how}: no error")
        except ValueError as e:
            own = r == n - 1 and n > 1
            words = {"never handed in": "never handed in", "grads lack one": "grads lack ['fc1.w']",
                     "wrong shape": "grad of 'fc2.w' is float16(3, 7), expected float16(7, 3)"}[how]
            expected = words if own or n == 1 else "another rank of the group had gradients missing or refused"
            if expected not in str(e) or "nothing updated" not in str(e):
                problems.append(f"{how}: {e}")
    if state_of(opt) != before:
        problems.append("the refused steps changed the optimizer")
    grads = local_grads(1, r, F2, 1e-4)
    opt.step(grads)
    twin.step(grads)
    if state_of(opt) != state_of(twin):
        problems.append("the step after differs from an untouched optimizer's")
    agree(comm, not problems, f"stage {stage} p={n} rank {r}: {problems}")


def test_a_refused_step_spans_model_parallel(comm, tp_mesh):
    """A data-parallel rank of one tensor-parallel column misses a gradient: its tensor-parallel partners,
    in other data-parallel groups, refuse too (else their shards of the model would step alone)."""
    mesh = tp_mesh
    if mesh is None:
        return agree(comm, True, "left over")
    tp, k = mesh.tp_size, mesh.tp_rank
    whole = {"w": np.full((4, TP_COLS * tp), 0.5), "ln.g": np.ones(5)}
    opt = ZeroAdamW(tp_shard(whole, k), mesh.dp, stage=2, lr=LR, model_parallel=mesh.tp)
    g = tp_shard(full_tp_grads(0, mesh.dp_rank, tp), k)
    lacking = k == 0 and mesh.dp_rank == 0
    err = None
    try:
        opt.step({"w": g["w"]} if lacking else g)
    except ValueError as e:
        err = str(e)
    want = "grads lack ['ln.g']" if lacking else "another rank of the group or of model_parallel"
    ok = err is not None and want in err and opt.t == 0
    opt.step(g)
    agree(comm, ok and opt.t == 1, f"tp rank {k} dp rank {mesh.dp_rank}: {err!r}, t={opt.t}")


@pytest.mark.parametrize("names", [("fc1.w", "fc2.w"), ("fc1.w", "ln.g"), ("fc1.b", "fc2.b")])
def test_gathered_of_non_contiguous_names(comm, names):
    opt = ZeroAdamW(initial(F8), comm, stage=3)
    with pytest.raises(ValueError, match=r"gathered: \[.*\] are not contiguous in the parameter order"):
        with opt.gathered(names):
            pass
    with pytest.raises(ValueError, match="are not contiguous"):
        opt.prefetch(names)
    with opt.gathered(LAYERS[0]) as got:  # still usable
        assert list(got) == list(LAYERS[0])


# -- bugs found (each fixed; the tests keep them fixed) --------------------------------------------------
def test_zero_size_parameter_last(comm):
    params = {"w": np.ones(comm.size), "empty": np.ones((0,))}  # numel = N: no padding at any world size
    opt = ZeroAdamW(params, comm, stage=2, lr=LR)
    assert opt.step({"w": np.ones(comm.size), "empty": np.ones((0,))}) is True
    assert opt.t == 1


def test_growth_interval_is_checked(comm):
    for bad in (0, -1, 2.5):
        with pytest.raises(ValueError, match="growth_interval"):
            ZeroAdamW(initial(F2), comm, loss_scale="dynamic", growth_interval=bad)


def test_prefetch_before_step_is_not_stale(comm):
    """A model may prefetch the first layer of the next forward at the end of backward, before step()."""
    opt = ZeroAdamW(initial(F8), comm, stage=3, lr=0.1)
    opt.prefetch(LAYERS[0])
    opt.step(local_grads(0, comm.rank, F8))
    full = opt.full_params()
    with opt.gathered(LAYERS[0]) as got:
        fresh = all(np.array_equal(got[n], full[n]) for n in LAYERS[0])
    agree(comm, True, "")  # every rank got here
    assert fresh, "gathered() after step() returned the pre-step parameters of a prefetch"


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_gathered_checks_names_at_every_stage(comm, stage):
    opt = ZeroAdamW(initial(F8), comm, stage=stage)
    with pytest.raises(ValueError, match="not contiguous"):
        with opt.gathered(("fc1.w", "fc2.w")):
            pass


def test_gathered_of_no_names(comm):
    opt = ZeroAdamW(initial(F8), comm, stage=3)
    with pytest.raises(ValueError, match="gathered"):
        with opt.gathered([]):
            pass


# -- under tensor parallelism: the model's shards skip and clip alike -------------------------------------
TP_COLS = 3  # columns of "w" per tensor-parallel rank; "ln.g" is replicated


@pytest.fixture(scope="module", params=[(2, 1), (2, 2)], ids=lambda m: f"tp{m[0]}-dp{m[1]}")
def tp_mesh(request, comm):
    tp, dp = request.param
    with carved_mesh(comm, tp=tp, dp=dp) as mesh:
        yield mesh


def full_tp_grads(t: int, r: int, tp: int, dtype=F8) -> dict:
    """Data-parallel rank r's gradient of the whole model at step t: w (4, 3*tp), ln.g (5,)."""
    rng = np.random.default_rng([29, t, r])
    return {"w": (rng.standard_normal((4, TP_COLS * tp)) * SCALES[t % 3]).astype(dtype),
            "ln.g": (rng.standard_normal(5) * SCALES[t % 3]).astype(dtype)}


def tp_shard(full: dict, k: int) -> dict:
    return {"w": full["w"][:, k * TP_COLS:(k + 1) * TP_COLS].copy(), "ln.g": full["ln.g"].copy()}


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_clipping_spans_the_tensor_parallel_shards(comm, tp_mesh, stage):
    """Each tensor-parallel rank's ZeroAdamW holds its columns of w and the whole ln.g: with
    ``model_parallel=mesh.tp, norm_skip=("ln.g",)`` on tp ranks other than 0 the norm is the whole
    model's (ln.g once), so 20
    clipped steps equal one process's AdamW on the whole model, clipped by its norm (float64, 1e-12)."""
    mesh = tp_mesh
    if mesh is None:
        return agree(comm, True, "left over")
    tp, dp, k = mesh.tp_size, mesh.dp_size, mesh.tp_rank
    rng = np.random.default_rng(5)
    whole = {"w": rng.standard_normal((4, TP_COLS * tp)), "ln.g": rng.standard_normal(5)}
    opt = ZeroAdamW(tp_shard(whole, k), mesh.dp, stage=stage, lr=LR, weight_decay=WD, max_grad_norm=1.0,
                    model_parallel=mesh.tp, norm_skip=("ln.g",) if k else (), bucket_bytes=BUCKET_ELEMS * 8)
    ref_grads = {n: np.zeros_like(a) for n, a in whole.items()}
    ref = AdamW(whole, ref_grads, lr=LR, weight_decay=WD)
    norms = []
    for t in range(STEPS):
        opt.step(tp_shard(full_tp_grads(t, mesh.dp_rank, tp), k))
        each = [full_tp_grads(t, r, tp) for r in range(dp)]
        for n in whole:
            ref_grads[n][...] = sum(g[n] for g in each) / dp
        norms.append(clip_grad_norm(ref_grads, 1.0))
        ref.step()
    got = opt.full_params()
    ok = close_all(got, tp_shard(whole, k), 1e-12) and min(norms) < 1.0 < max(norms)
    agree(comm, ok, f"stage {stage} tp={tp} dp={dp}: error {worst(got, tp_shard(whole, k)):.2e}, "
                    f"reference norms {min(norms):.2f}..{max(norms):.2f}")


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_overflow_on_one_tensor_parallel_rank_skips_every_shard(comm, tp_mesh, stage):
    """float16, dynamic loss scale: an inf in the last tensor-parallel rank's shard only makes every
    rank of the model skip the step (else the shards would drift apart)."""
    mesh = tp_mesh
    if mesh is None:
        return agree(comm, True, "left over")
    tp, k = mesh.tp_size, mesh.tp_rank
    whole = {"w": np.full((4, TP_COLS * tp), 0.5, F2), "ln.g": np.ones(5, F2)}
    opt = ZeroAdamW(tp_shard(whole, k), mesh.dp, stage=stage, lr=LR, loss_scale="dynamic",
                    model_parallel=mesh.tp, norm_skip=("ln.g",) if k else ())
    log = []
    for t, good in enumerate([True, False, True]):
        g = tp_shard(full_tp_grads(t, mesh.dp_rank, tp, F2), k)
        g = {n: (a * 1e-4).astype(F2) for n, a in g.items()}
        if not good and k == tp - 1:
            g["w"][0, 0] = np.inf
        log.append((opt.step(g), opt.skipped, opt.t))
    agree(comm, log == [(True, 0, 1), (False, 1, 1), (True, 1, 2)], f"stage {stage} tp rank {k}: {log}")


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_a_gradient_buffer_reused_after_grad_ready(comm, stage):
    """One scratch array refilled for each gradient handed in: every stage steps on the values handed in (before,
    stages 2 and 3 kept the caller's array until its bucket started, so 'b' stepped on 'a's gradient, without
    an error, while stages 0 and 1 copied at once). ``copy=False`` keeps the array itself, as documented."""
    params = {"a": np.ones(4), "b": np.ones(4)}
    opt = ZeroAdamW({k: v.copy() for k, v in params.items()}, comm, stage=stage, lr=0.1, weight_decay=0.0)
    scratch = np.empty(4)
    for name, value in (("b", 1.0), ("a", -1.0)):           # backward order: 'b' first; one bucket for both
        scratch[...] = value
        opt.grad_ready(name, scratch)
    opt.step()
    with opt.gathered(("a", "b")) as full:     # every stage: the full parameters
        got = {n: np.array(full[n]) for n in params}
    ref = AdamW({k: v.copy() for k, v in params.items()}, {"a": -np.ones(4), "b": np.ones(4)}, lr=0.1,
                weight_decay=0.0)
    ref.step()
    agree(comm, all(np.allclose(got[n], ref.params[n], rtol=1e-12) for n in params),
          f"stage {stage}: {got} against {ref.params}")


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_a_read_only_parameter_is_refused_where_the_optimizer_is_built(comm, stage):
    """A read-only parameter at stages 0 to 2 (each step writes the updated values into the parameters): refused
    at construction naming it, on every rank when the last rank alone passes it, its arrays untouched (before: built,
    and step() raised numpy's "assignment destination is read-only" after t, master weights and moments moved)."""
    from helpers import refused_alone
    params = initial(F8)
    if comm.rank == comm.size - 1:
        params["fc2.w"].flags.writeable = False
    before = {n: p.copy() for n, p in params.items()}
    refused_alone(comm, lambda: ZeroAdamW(params, comm, stage=stage),
                  [f"ZeroAdamW: parameter 'fc2.w' is read-only; at stage {stage} each step writes"])
    agree(comm, all(np.array_equal(params[n], before[n]) for n in NAMES), "a parameter written")
    ZeroAdamW(params, comm, stage=3).step(local_grads(0, comm.rank, F8))   # stage 3 keeps only its shard


def test_ranks_whose_layouts_differ_are_refused(comm):
    """Parameters (or data-parallel gradients) in another order on some ranks, or of other shapes, or another
    stage: ValueError on every rank where the optimizer is built (one allgather of a digest); before, the
    reduce-scatter summed one name's gradient into another's and every rank stepped on it without an error.
    A group that is not a pycollect Communicator: TypeError naming the argument (before: AttributeError)."""
    names = ["a", "b", "c"] if comm.rank % 2 == 0 else ["c", "b", "a"]
    shuffled = {n: np.ones(3 + (n == "b")) for n in names}
    wide = {"a": np.ones(3 + (comm.rank == comm.size - 1))}
    words = ["differ", "must pass the same"]
    if comm.size > 1:
        raises(comm, lambda: ZeroAdamW(shuffled, comm, stage=2), ValueError, ["ZeroAdamW"] + words)
        raises(comm, lambda: ZeroAdamW(wide, comm, stage=1), ValueError, ["ZeroAdamW"] + words)
        raises(comm, lambda: ZeroAdamW({"a": np.ones(3)}, comm, stage=1 + (comm.rank == 0)), ValueError,
               ["ZeroAdamW", "stage"] + words)
        raises(comm, lambda: DataParallel(shuffled, comm), ValueError, ["DataParallel"] + words)
        last = comm.rank == comm.size - 1
        for other in ({"lr": 0.5}, {"max_grad_norm": 1.0}, {"weight_decay": 0.0}, {"no_decay": ("a",)},
                      {"loss_scale": "dynamic"}):   # settings that would step the shards apart, or hang a step
            raises(comm, lambda: ZeroAdamW({"a": np.ones(3)}, comm, stage=1, **(other if last else {})), ValueError,
                   ["ZeroAdamW", "settings"] + words)
        # one rank's own bad argument: it raises its error, every other rank raises naming it (they waited before)
        for bad, own in (({"lr": -1.0}, "lr must be"), ({"owned_params": {"e": np.ones(2)}}, "owned_grads")):
            raises(comm, lambda: ZeroAdamW({"a": np.ones(3)}, comm, stage=1, **(bad if last else {})), ValueError,
                   [own] if last else [f"rank(s) [{comm.size - 1}] of the group refused their arguments"])
    ZeroAdamW({n: np.ones(3) for n in "abc"}, comm, stage=2)      # the same on every rank: built
    DataParallel({n: np.ones(3) for n in "abc"}, comm)
    for bad in (None, comm.mpi):
        raises(comm, lambda: ZeroAdamW({"a": np.ones(3)}, bad), TypeError,
               ["ZeroAdamW", "group must be a pycollect Communicator", type(bad).__name__])
        raises(comm, lambda: DataParallel({"a": np.ones(3)}, bad), TypeError,
               ["DataParallel", "group must be a pycollect Communicator"])

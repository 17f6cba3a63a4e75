"""Tensor-parallel MLP (ParallelMLP) forward+backward against its single-process twin, in one run.

Run with one BLAS thread per rank, one rank per core::

    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 mpiexec -n 2 python bench/tp_mlp.py --json results/tp-mlp.json

The model is y = gelu(x @ w1 + b1) @ w2 + b2 with x (B, T, C), w1 (C, F), w2 (F, C); one step is a
forward and a backward of a fixed upstream gradient dy (B, T, C). Four variants are timed in
``--warmup`` untimed then ``--trials`` x ``--iters`` timed rounds; a round is one step of each
variant (the order rotating from round to round), with a barrier before every step:

- ``single_solo``: the twin (pycollect.nn Linear + GeLU + Linear, the full weights) on rank 0 alone
  while every other rank sleeps: t1 on an otherwise idle machine;
- ``single_both``: the twin on every rank at once: t1 under the same contention for memory
  bandwidth and caches as the tensor-parallel run (the fair baseline);
- ``tp``: ``pycollect.parallel.ParallelMLP.from_full`` over the world group: t2; the time inside the
  group's blocking collectives (the two allreduces) is counted as communication;
- ``shard_solo``: one rank's share of the tp work (Linear(C, F/p) + GeLU + Linear(F/p, C), no
  communication) on rank 0 alone: how well the narrower matrices run, without contention.

A step's time is the slowest rank's (for ``single_solo`` and ``shard_solo``: rank 0's); the
reported time is the median over every timed step (min, max and the median of each block of
``--iters`` rounds are kept). Scaling efficiency is t1 / (p * t2) for both t1's. Each step is also
split into linear (the matmuls and bias adds, communication excluded), gelu (the rest: GeLU forward
and backward) and communication. Before timing, and once more after the timed steps, one step of tp and of the twin
from zeroed gradients are compared (relative 2-norm error of y, dx and the gathered full weight
gradients; the worse of the two runs is reported, each run's kept as ``err_before`` and
``err_after``); if an error exceeds the tolerance of the dtype, the summary's ``failed`` names it,
its efficiencies and ``t2_ms`` are null and the exit status is 1.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np
from mpi4py import MPI

import pycollect as pc
from pycollect.nn import GeLU, Linear
from pycollect.parallel import ParallelMLP
from pycollect.tools.common import int_at_least
from pycollect.tools.report import format_table, run_header, write_json

VARIANTS = ("single_solo", "single_both", "tp", "shard_solo")
TOLERANCE = {"float32": 1e-4, "float64": 1e-10}
COLLECTIVES = ("allreduce", "allgather", "reduce_scatter", "broadcast")  # blocking calls timed as communication


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int_at_least(1), default=4, help="B (default 4)")
    p.add_argument("--seq", type=int_at_least(1), default=256, help="T (default 256)")
    p.add_argument("--hidden", type=int_at_least(1), default=1024, help="C, the model width (default 1024)")
    p.add_argument("--ffn", type=int_at_least(1), default=4096, help="F, the hidden width of the MLP (default 4096)")
    p.add_argument("--iters", type=int_at_least(1), default=10, help="timed rounds per trial (default 10)")
    p.add_argument("--warmup", type=int_at_least(0), default=2, help="untimed rounds before them (default 2)")
    p.add_argument("--trials", type=int_at_least(1), default=1,
                   help="blocks of --iters rounds, each with its own median in the JSON (default 1)")
    p.add_argument("--dtype", choices=sorted(TOLERANCE), default="float32")
    p.add_argument("--approximate", choices=("tanh", "none"), default="tanh", help="GeLU variant (default tanh)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default="results/tp-mlp.json")
    return p.parse_args(argv)


class Clock:
    """Seconds accumulated by key; ``wrap`` times an instance's method into a key."""

    def __init__(self):
        self.t = {}
        self.calls = {}

    def reset(self):
        self.t, self.calls = {}, {}

    def add(self, key, dt):
        self.t[key] = self.t.get(key, 0.0) + dt
        self.calls[key] = self.calls.get(key, 0) + 1

    def wrap(self, obj, name, key):
        inner = getattr(obj, name)

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.add(key, time.perf_counter() - t0)
        setattr(obj, name, timed)  # an instance attribute: only this object is timed


class Twin:
    """Linear(C, F) + GeLU + Linear(F, C) from pycollect.nn, each layer timed."""

    def __init__(self, w1, b1, w2, b2, approximate, clock):
        self.fc, self.act, self.proj = Linear(w1, b1), GeLU(approximate), Linear(w2, b2)
        self.layers = (self.fc, self.proj)
        self.clock = clock
        for layer in self.layers:
            clock.wrap(layer, "forward", "linear")
            clock.wrap(layer, "backward", "linear")

    def step(self, x, dy):
        y = self.proj.forward(self.act.forward(self.fc.forward(x)))
        return y, self.fc.backward(self.act.backward(self.proj.backward(dy)))

    def zero_grad(self):
        for layer in self.layers:
            layer.zero_grad()


class TP:
    """ParallelMLP over ``group``; its sublayers and the group's blocking collectives timed."""

    def __init__(self, full, group, approximate, clock):
        self.mlp = ParallelMLP.from_full(full, group, approximate)
        self.clock = clock
        for layer in (self.mlp.fc, self.mlp.proj):  # the MLP's backward runs each sublayer's B, then their W
            for method in ("forward", "backward_input", "backward_weight"):
                clock.wrap(layer, method, "linear")
        for name in COLLECTIVES:
            if hasattr(group, name):
                clock.wrap(group, name, "comm")

    def step(self, x, dy):
        return self.mlp.forward(x), self.mlp.backward(dy)

    def zero_grad(self):
        self.mlp.zero_grad()


def rel_err(got, expected) -> float:
    got, expected = np.asarray(got, np.float64), np.asarray(expected, np.float64)
    return float(np.linalg.norm(got - expected) / max(np.linalg.norm(expected), np.finfo(np.float64).tiny))


def idle_until_released(world):
    """Sleep (not MPI's busy poll) until every rank has reached the matching Ibarrier."""
    req = world.Ibarrier()
    while not req.Test():
        time.sleep(0.002)


def one_step(world, model, x, dy, clock, solo: bool):
    """One timed step: this rank's total, linear and comm seconds (None on a rank that sat it out)."""
    model.zero_grad()
    clock.reset()
    world.Barrier()
    if solo and world.rank != 0:
        idle_until_released(world)
        return None
    t0 = time.perf_counter()
    model.step(x, dy)
    total = time.perf_counter() - t0
    if solo:
        world.Ibarrier().Wait()
    return {"total": total, "linear": clock.t.get("linear", 0.0), "comm": clock.t.get("comm", 0.0),
            "comm_calls": clock.calls.get("comm", 0)}


def combine(per_rank: list[list[dict]]) -> list[dict]:
    """One entry per step: the slowest rank's time and that rank's split of it; comm_max: the most any rank spent in communication."""
    ranks = [s for s in per_rank if s]
    out = []
    for steps in zip(*ranks):
        slow = max(steps, key=lambda s: s["total"])
        out.append({"total": slow["total"], "linear": slow["linear"] - slow["comm"], "comm": slow["comm"],
                    "comm_max": max(s["comm"] for s in steps),
                    "comm_calls": slow["comm_calls"], "gelu": slow["total"] - slow["linear"],
                    "per_rank": [s["total"] for s in steps]})
    return out


def check(world, twin, tp, x, dy, dtype) -> dict:
    """One step of each from zeroed gradients: relative errors of y, dx and the full weight gradients."""
    twin.zero_grad()
    tp.zero_grad()
    y1, dx1 = twin.step(x, dy)
    y2, dx2 = tp.step(x, dy)
    full = tp.mlp.full_grads()
    ref = {"w1": twin.fc.grads["w"], "b1": twin.fc.grads["b"], "w2": twin.proj.grads["w"], "b2": twin.proj.grads["b"]}
    errs = {"err_y": rel_err(y2, y1), "err_dx": rel_err(dx2, dx1),
            "err_grads": max(rel_err(full[k], ref[k]) for k in ref)}
    return {k: world.allreduce(v, op=MPI.MAX) for k, v in errs.items()}


def main(argv) -> int:
    args = parse(argv)
    world = MPI.COMM_WORLD
    group = pc.Communicator()
    p = world.size
    B, T, C, F = args.batch, args.seq, args.hidden, args.ffn
    if F % p:
        if world.rank == 0:
            print(f"tp_mlp.py: --ffn {F} does not divide by the {p} ranks", file=sys.stderr)
        return 2
    dtype = np.dtype(args.dtype)
    rng = np.random.default_rng(args.seed)  # the same on every rank
    full = {"w1": (rng.standard_normal((C, F)) * C ** -0.5).astype(dtype),
            "b1": (rng.standard_normal(F) * 0.1).astype(dtype),
            "w2": (rng.standard_normal((F, C)) * F ** -0.5).astype(dtype),
            "b2": (rng.standard_normal(C) * 0.1).astype(dtype)}
    x = rng.standard_normal((B, T, C)).astype(dtype)
    dy = rng.standard_normal((B, T, C)).astype(dtype)

    clock = Clock()
    twin = Twin(full["w1"], full["b1"], full["w2"], full["b2"], args.approximate, clock)
    tp = TP(full, group, args.approximate, clock)
    n, lo = F // p, world.rank * (F // p)
    shard = Twin(full["w1"][:, lo:lo + n].copy(), full["b1"][lo:lo + n].copy(), full["w2"][lo:lo + n].copy(),
                 full["b2"].copy(), args.approximate, clock)

    first = check(world, twin, tp, x, dy, dtype)
    tol = TOLERANCE[args.dtype]

    models = {"single_solo": (twin, True), "single_both": (twin, False), "tp": (tp, False), "shard_solo": (shard, True)}
    # Interleaved step by step (the order rotating each round), so that load from elsewhere, which
    # comes and goes over seconds on a shared machine, falls on every variant alike.
    mine = {v: [] for v in VARIANTS}
    for r in range(args.warmup + args.trials * args.iters):
        for v in VARIANTS[r % len(VARIANTS):] + VARIANTS[:r % len(VARIANTS)]:
            model, solo = models[v]
            got = one_step(world, model, x, dy, clock, solo)
            if r >= args.warmup and got is not None:
                mine[v].append(got)
    steps = {v: combine(world.allgather(mine[v])) for v in VARIANTS}
    trial_medians = {v: [statistics.median(e["total"] for e in steps[v][k * args.iters:(k + 1) * args.iters]) * 1e3
                         for k in range(args.trials)] for v in VARIANTS}

    # the same allreduce as the tp step's, alone: what the communication costs without skew between ranks
    buf = np.ones((B, T, C), dtype)
    ar = []
    for _ in range(args.warmup + args.iters):
        world.Barrier()
        t0 = time.perf_counter()
        group.allreduce(buf, out=buf)
        ar.append(world.allreduce(time.perf_counter() - t0, op=MPI.MAX))
    allreduce_alone_ms = statistics.median(ar[args.warmup:]) * 1e3
    # once more after the timed steps: a result that goes wrong after the first step shows too (the worse counts)
    after = check(world, twin, tp, x, dy, dtype)
    errors = {k: max(first[k], after[k]) for k in first}
    failed = [f"{k} {errors[k]:.2e} > {tol:g}" for k in ("err_y", "err_dx", "err_grads") if not errors[k] <= tol]

    flops_fwd = 2 * 2 * B * T * C * F  # two matmuls
    records = []
    for v in VARIANTS:
        s = steps[v]
        med = lambda key: statistics.median(e[key] for e in s) * 1e3  # noqa: E731
        ranks = {"single_solo": 1, "single_both": p, "tp": p, "shard_solo": 1}[v]
        records.append({
            "variant": v, "ranks_computing": ranks, "tp": p if v == "tp" else 1,
            "batch": B, "seq": T, "hidden": C, "ffn": F, "dtype": args.dtype, "iters": len(s),
            "time_ms": med("total"), "time_ms_min": min(e["total"] for e in s) * 1e3,
            "time_ms_max": max(e["total"] for e in s) * 1e3, "trial_medians_ms": trial_medians[v],
            "linear_ms": med("linear"), "gelu_ms": med("gelu"), "comm_ms": med("comm"),
            "comm_ms_max": med("comm_max"),
            "comm_calls": s[0]["comm_calls"], "rank_medians_ms": [statistics.median(e["per_rank"][r] for e in s) * 1e3
                                                                   for r in range(len(s[0]["per_rank"]))],
            "gflops_per_rank": 3 * flops_fwd / (p if v in ("tp", "shard_solo") else 1) / (med("total") * 1e-3) / 1e9})
    by = {r["variant"]: r for r in records}
    t2 = by["tp"]["time_ms"]
    summary = {
        "t1_solo_ms": by["single_solo"]["time_ms"], "t1_both_ms": by["single_both"]["time_ms"], "t2_ms": t2,
        "efficiency_solo": by["single_solo"]["time_ms"] / (p * t2),
        "efficiency_both": by["single_both"]["time_ms"] / (p * t2),
        "efficiency_solo_min": by["single_solo"]["time_ms_min"] / (p * by["tp"]["time_ms_min"]),
        "efficiency_both_min": by["single_both"]["time_ms_min"] / (p * by["tp"]["time_ms_min"]),
        "comm_ms": by["tp"]["comm_ms"], "comm_share": by["tp"]["comm_ms"] / t2,
        "allreduce_alone_ms": allreduce_alone_ms, "allreduce_bytes": buf.nbytes,
        "contention": by["single_both"]["time_ms"] / by["single_solo"]["time_ms"],
        "shard_efficiency": by["single_solo"]["time_ms"] / (p * by["shard_solo"]["time_ms"]),
        **errors, "tolerance": tol, "target_efficiency": 0.85,
        "err_before": first, "err_after": after, "failed": failed,
    }
    ok = not failed
    if not ok:   # a wrong tp step's time is no figure: the headline ratios say so
        for k in ("efficiency_solo", "efficiency_both", "efficiency_solo_min", "efficiency_both_min", "t2_ms"):
            summary[k] = None
    if world.rank == 0:
        print(f"# tp_mlp: B={B} T={T} C={C} F={F} {args.dtype}, {p} ranks, {len(steps['tp'])} timed steps per variant"
              f" ({args.trials} trial(s) x {args.iters}), median per step")
        cols = [("variant", "variant", "{}"), ("ranks_computing", "ranks", "{}"), ("time_ms", "ms", "{:.1f}"),
                ("time_ms_min", "min ms", "{:.1f}"), ("linear_ms", "linear", "{:.1f}"), ("gelu_ms", "gelu", "{:.1f}"),
                ("comm_ms", "comm", "{:.2f}"), ("gflops_per_rank", "GFLOP/s/rank", "{:.1f}")]
        print("\n".join(format_table(records, cols)))
        sm = summary
        if ok:
            print(f"efficiency t1/(p*t2): vs solo t1 {sm['efficiency_solo']:.3f} (min-based "
                  f"{sm['efficiency_solo_min']:.3f}), vs same-contention t1 {sm['efficiency_both']:.3f} (min-based "
                  f"{sm['efficiency_both_min']:.3f}); target >= {sm['target_efficiency']}")
        print(f"communication {sm['comm_ms']:.2f} ms/step ({100 * sm['comm_share']:.1f}% of t2;"
              f" the same allreduce alone {allreduce_alone_ms:.2f} ms x 2); contention t1_both/t1_solo"
              f" {sm['contention']:.3f}; shard alone vs t1_solo/p {sm['shard_efficiency']:.3f}")
        print(f"relative error tp vs single, the worse of before and after the timed steps: y {errors['err_y']:.2e},"
              f" dx {errors['err_dx']:.2e}, grads {errors['err_grads']:.2e} (tolerance {tol:g})"
              f"{'' if ok else '  FAILED: ' + '; '.join(failed) + ' (efficiencies not given)'}")
        head = run_header(group, argv, iters=args.iters, warmup=args.warmup, trials=args.trials, seed=args.seed,
                          approximate=args.approximate)
        path = write_json(args.json, "tp_mlp", head, records, summary=summary)
        print(f"wrote {path}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Data-parallel training step: gradient allreduce overlapped with backward, against one reduction at the end.

Run with one BLAS thread per rank, one rank per core::

    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 mpiexec -n 2 python bench/dp_overlap.py --json results/dp-overlap.json

The model is a stack of ``--layers`` pycollect.nn Linear(C, C) + GeLU, the same weights on every
rank; each rank takes its own ``--batch`` rows (different on every rank) and backpropagates a fixed
upstream gradient of its own. Gradients are reduced (averaged) by
``pycollect.parallel.DataParallel`` in buckets of ``--bucket-bytes``. Variants, each ``--warmup``
untimed rounds then ``--trials`` x ``--iters`` timed rounds; a round is one step of every variant
(the order rotating from round to round), with a barrier before every step:

- ``compute``: forward and backward only, no communication (the floor);
- ``no_overlap``: forward, the whole backward, then every ``grad_ready`` and ``finish()``: one
  reduction phase at the end;
- ``overlap``: ``grad_ready`` right after each layer's backward, so a bucket's allreduce starts
  while the layers below are still being differentiated, and each later ``grad_ready`` advances
  the buckets in flight (``Request.test()``);
- ``overlap_no_progress``: the same with ``DataParallel(progress=False)``: buckets start early but
  nothing advances them until ``finish()``;
- ``comm_only``: every ``grad_ready`` and ``finish()`` with no forward or backward: the cost of the
  reduction alone (packing, allreduce, unpacking).

A step's time is the slowest rank's; the reported time is the median over all timed steps (min,
max and the median of each block of ``--iters`` rounds kept). The communication exposed in a
variant is its time minus ``compute``'s; ``hidden`` is the share of ``no_overlap``'s exposed
communication that ``overlap`` no longer shows. The ``paired_*`` figures take the median over
rounds of per-round ratios or differences, steadier under load from elsewhere. Before timing, and
once more after the timed steps, one step of each variant from zeroed gradients is compared with the
mean over ranks of the local gradients (relative 2-norm error; the worse of the two runs is
reported, each run's kept as ``err_before`` and ``err_after``); if an error exceeds the dtype's
tolerance, the summary's ``failed`` names it, its speedups, ``hidden`` and paired ratios are null and
the exit status is 1.
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
from pycollect.parallel import DataParallel
from pycollect.tools.common import int_at_least, size_arg
from pycollect.tools.report import format_table, human_size, run_header, write_json

VARIANTS = ("compute", "no_overlap", "overlap", "overlap_no_progress", "comm_only")
TOLERANCE = {"float32": 1e-5, "float64": 1e-12}


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int_at_least(1), default=8, help="L, Linear+GeLU layers (default 8)")
    p.add_argument("--width", type=int_at_least(1), default=1024, help="C, every layer's width (default 1024)")
    p.add_argument("--batch", type=int_at_least(1), default=64, help="rows per rank (default 64)")
    p.add_argument("--bucket-bytes", type=size_arg, default=4 << 20,
                   help="DataParallel bucket size (default 4M: one bucket per layer at C=1024)")
    p.add_argument("--iters", type=int_at_least(1), default=10, help="timed rounds per trial (default 10)")
    p.add_argument("--warmup", type=int_at_least(0), default=2, help="untimed rounds before them (default 2)")
    p.add_argument("--trials", type=int_at_least(1), default=1,
                   help="blocks of --iters rounds, each with its own median in the JSON (default 1)")
    p.add_argument("--dtype", choices=sorted(TOLERANCE), default="float32")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default="results/dp-overlap.json")
    return p.parse_args(argv)


class Model:
    """L x (Linear(C, C) + GeLU), the same weights on every rank; params named l{i}.w, l{i}.b in forward order."""

    def __init__(self, layers, width, dtype, seed):
        rng = np.random.default_rng(seed)
        self.fcs = [Linear((rng.standard_normal((width, width)) * width ** -0.5).astype(dtype),
                           (rng.standard_normal(width) * 0.1).astype(dtype)) for _ in range(layers)]
        self.acts = [GeLU() for _ in range(layers)]

    def params(self):
        return [(f"l{i}.{k}", fc.params[k], fc.grads[k]) for i, fc in enumerate(self.fcs) for k in ("w", "b")]

    def zero_grad(self):
        for fc in self.fcs:
            fc.zero_grad()

    def forward(self, x):
        for fc, act in zip(self.fcs, self.acts):
            x = act.forward(fc.forward(x))
        return x

    def backward(self, dy, ready=None):
        """Layers in reverse; ``ready(i)`` after layer i's Linear backward (its gradients are final)."""
        for i in reversed(range(len(self.fcs))):
            dy = self.fcs[i].backward(self.acts[i].backward(dy))
            if ready is not None:
                ready(i)
        return dy


def mark(dp, i):
    dp.grad_ready(f"l{i}.b")
    dp.grad_ready(f"l{i}.w")


def step(variant, model, dps, x, dy, t):
    """One training step; ``t`` collects seconds spent in grad_ready ("ready") and finish ("finish")."""
    def timed(key, fn, *a):
        t0 = time.perf_counter()
        fn(*a)
        t[key] = t.get(key, 0.0) + time.perf_counter() - t0

    if variant == "comm_only":
        dp = dps["no_overlap"]
        timed("ready", lambda: [mark(dp, i) for i in reversed(range(len(model.fcs)))])
        timed("finish", dp.finish)
        return
    model.forward(x)
    if variant == "compute":
        model.backward(dy)
    elif variant == "no_overlap":
        dp = dps[variant]
        model.backward(dy)
        timed("ready", lambda: [mark(dp, i) for i in reversed(range(len(model.fcs)))])
        timed("finish", dp.finish)
    else:  # overlap, overlap_no_progress
        dp = dps[variant]
        model.backward(dy, lambda i: timed("ready", mark, dp, i))
        timed("finish", dp.finish)


def rel_err(got, expected) -> float:
    got, expected = np.asarray(got, np.float64), np.asarray(expected, np.float64)
    return float(np.linalg.norm(got - expected) / max(np.linalg.norm(expected), np.finfo(np.float64).tiny))


def check(world, model, dps, x, dy) -> dict:
    """Each reducing variant's gradients after one step against the mean over ranks of the local ones."""
    model.zero_grad()
    step("compute", model, dps, x, dy, {})
    local = {n: g.astype(np.float64) for n, _, g in model.params()}
    expected = {}
    for n, g in local.items():
        total = np.empty_like(g)
        world.Allreduce(g, total)
        expected[n] = total / world.size
    errs = {}
    for v in ("no_overlap", "overlap", "overlap_no_progress"):
        model.zero_grad()
        step(v, model, dps, x, dy, {})
        errs[v] = max(rel_err(g, expected[n]) for n, _, g in model.params())
    # comm_only reduces whatever the grads hold: the local gradients again
    model.zero_grad()
    step("compute", model, dps, x, dy, {})
    step("comm_only", model, dps, x, dy, {})
    errs["comm_only"] = max(rel_err(g, expected[n]) for n, _, g in model.params())
    return {v: world.allreduce(e, op=MPI.MAX) for v, e in errs.items()}


def main(argv) -> int:
    args = parse(argv)
    world = MPI.COMM_WORLD
    group = pc.Communicator()
    dtype = np.dtype(args.dtype)
    L, C, N = args.layers, args.width, args.batch
    model = Model(L, C, dtype, args.seed)
    rng = np.random.default_rng([args.seed, 1 + world.rank])  # each rank its own rows
    x = rng.standard_normal((N, C)).astype(dtype)
    dy = (rng.standard_normal((N, C)) / N).astype(dtype)
    params = model.params()
    dps = {"no_overlap": DataParallel(params, group, bucket_bytes=args.bucket_bytes),
           "overlap": DataParallel(params, group, bucket_bytes=args.bucket_bytes),
           "overlap_no_progress": DataParallel(params, group, bucket_bytes=args.bucket_bytes, progress=False)}
    first = check(world, model, dps, x, dy)
    tol = TOLERANCE[args.dtype]

    # Interleaved step by step (the order rotating each round), so that load from elsewhere, which
    # comes and goes over seconds on a shared machine, falls on every variant alike.
    steps = {v: [] for v in VARIANTS}
    for r in range(args.warmup + args.trials * args.iters):
        for v in VARIANTS[r % len(VARIANTS):] + VARIANTS[:r % len(VARIANTS)]:
            model.zero_grad()
            t = {}
            world.Barrier()
            t0 = time.perf_counter()
            step(v, model, dps, x, dy, t)
            total = time.perf_counter() - t0
            if r >= args.warmup:
                steps[v].append((total, t.get("ready", 0.0), t.get("finish", 0.0)))
    for v in VARIANTS:
        steps[v] = [max(per_rank) for per_rank in zip(*world.allgather(steps[v]))]  # the slowest rank's step
    # once more after the timed steps: a result that goes wrong after the first step shows too (the worse counts)
    after = check(world, model, dps, x, dy)
    errors = {v: max(first[v], after[v]) for v in first}
    failed = [f"{v} {e:.1e} > {tol:g}" for v, e in errors.items() if not e <= tol]
    trial_medians = {v: [statistics.median(e[0] for e in steps[v][k * args.iters:(k + 1) * args.iters]) * 1e3
                         for k in range(args.trials)] for v in VARIANTS}

    dp = dps["overlap"]
    records = []
    for v in VARIANTS:
        s = steps[v]
        records.append({
            "variant": v, "layers": L, "width": C, "batch": N, "dtype": args.dtype, "bucket_bytes": args.bucket_bytes,
            "buckets": len(dp.buckets), "traffic_bytes": dp.traffic(), "iters": len(s),
            "time_ms": statistics.median(e[0] for e in s) * 1e3, "time_ms_min": min(e[0] for e in s) * 1e3,
            "time_ms_max": max(e[0] for e in s) * 1e3, "trial_medians_ms": trial_medians[v],
            "ready_ms": statistics.median(e[1] for e in s) * 1e3, "finish_ms": statistics.median(e[2] for e in s) * 1e3,
            "err": errors.get(v, 0.0)})
    by = {r["variant"]: r["time_ms"] for r in records}
    exposed_sync = by["no_overlap"] - by["compute"]

    def paired(a, b):  # median over rounds of a's step over b's step in the same round
        return statistics.median(ea[0] / eb[0] for ea, eb in zip(steps[a], steps[b]))

    def paired_exposed(v):  # median over rounds of (v's step - compute's step in the same round), ms
        return statistics.median(ev[0] - ec[0] for ev, ec in zip(steps[v], steps["compute"])) * 1e3
    summary = {
        "compute_ms": by["compute"], "no_overlap_ms": by["no_overlap"], "overlap_ms": by["overlap"],
        "overlap_no_progress_ms": by["overlap_no_progress"], "comm_only_ms": by["comm_only"],
        "speedup": by["no_overlap"] / by["overlap"], "speedup_no_progress": by["no_overlap"] / by["overlap_no_progress"],
        "progress_gain": by["overlap_no_progress"] / by["overlap"],
        "exposed_no_overlap_ms": exposed_sync, "exposed_overlap_ms": by["overlap"] - by["compute"],
        "exposed_overlap_no_progress_ms": by["overlap_no_progress"] - by["compute"],
        "hidden": 1 - (by["overlap"] - by["compute"]) / exposed_sync if exposed_sync > 0 else None,
        "hidden_no_progress": 1 - (by["overlap_no_progress"] - by["compute"]) / exposed_sync if exposed_sync > 0 else None,
        "paired_speedup": paired("no_overlap", "overlap"),
        "paired_speedup_no_progress": paired("no_overlap", "overlap_no_progress"),
        "paired_progress_gain": paired("overlap_no_progress", "overlap"),
        "paired_exposed_ms": {v: paired_exposed(v) for v in ("no_overlap", "overlap", "overlap_no_progress")},
        "max_err": max(errors.values()), "tolerance": tol, "buckets": dp.buckets,
        "err_before": first, "err_after": after, "failed": failed,
    }
    ok = not failed
    if not ok:   # a step that reduced wrongly is no figure: the headline ratios say so
        for k in ("speedup", "speedup_no_progress", "progress_gain", "hidden", "hidden_no_progress", "paired_speedup",
                  "paired_speedup_no_progress", "paired_progress_gain"):
            summary[k] = None
    if world.rank == 0:
        print(f"# dp_overlap: {L} x Linear({C}, {C}) + GeLU, {N} rows per rank, {args.dtype}, {world.size} ranks, "
              f"{len(dp.buckets)} buckets of ~{human_size(args.bucket_bytes)} ({dp.traffic() / 2**20:.1f} MiB per step),"
              f" {args.trials} trial(s) x {args.iters} steps, median per step")
        cols = [("variant", "variant", "{}"), ("time_ms", "ms", "{:.2f}"), ("time_ms_min", "min ms", "{:.2f}"),
                ("ready_ms", "in grad_ready", "{:.2f}"), ("finish_ms", "in finish", "{:.2f}"), ("err", "rel err", "{:.1e}")]
        print("\n".join(format_table(records, cols)))
        sm = summary
        hid = lambda h: "n/a" if h is None else f"{100 * h:.0f}%"  # noqa: E731
        if ok:
            print(f"overlap speedup (no_overlap / overlap) {sm['speedup']:.3f}; without progress "
                  f"{sm['speedup_no_progress']:.3f}; progress pokes: {sm['progress_gain']:.3f}x")
            print(f"paired by round (median of per-round ratios): speedup {sm['paired_speedup']:.3f}, without progress"
                  f" {sm['paired_speedup_no_progress']:.3f}, progress pokes {sm['paired_progress_gain']:.3f}x; exposed ms "
                  + ", ".join(f"{v} {e:.2f}" for v, e in sm["paired_exposed_ms"].items()))
        print(f"communication exposed: no_overlap {sm['exposed_no_overlap_ms']:.2f} ms, overlap {sm['exposed_overlap_ms']:.2f} ms"
              f" (hidden {hid(sm['hidden'])}), overlap_no_progress {sm['exposed_overlap_no_progress_ms']:.2f} ms"
              f" (hidden {hid(sm['hidden_no_progress'])}); reduction alone {sm['comm_only_ms']:.2f} ms")
        print(f"gradients vs mean of local gradients, the worse of before and after the timed steps: max relative "
              f"error {sm['max_err']:.1e} (tolerance {tol:g})"
              f"{'' if ok else '  FAILED: ' + '; '.join(failed) + ' (speedups not given)'}")
        head = run_header(group, argv, iters=args.iters, warmup=args.warmup, trials=args.trials, seed=args.seed)
        path = write_json(args.json, "dp_overlap", head, records, summary=summary)
        print(f"wrote {path}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""ZeRO stages 0-3 (ZeroAdamW) against plain data parallelism: step time, memory and traffic per rank.

Run with one BLAS thread per rank, one rank per core::

    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 mpiexec -n 2 python bench/zero.py --json results/zero.json

The parameter set is ``--layers`` pairs (weight (C, C), bias (C,)), named l{i}.w, l{i}.b in forward
order, with C chosen so that the total is about ``--params`` elements; the same values on every
rank. Each rank draws its own gradients once and hands the same ones in at every step (there is no
model: the step is the optimizer's and its communication's). Variants, all built at once:

- ``dp``: plain data parallelism: ``DataParallel`` averaging the gradients (allreduce in buckets of
  ``--bucket-bytes``), then ``pycollect.optim.AdamW`` on the full replicated parameters. With float16
  parameters it keeps float32 master weights and gradients (cast in, AdamW, cast out), as mixed
  precision training must. Its gradients are refreshed before each step, untimed: backward writes them;
- ``stage0`` .. ``stage3``: ``ZeroAdamW`` at that stage over the same group and buckets; every
  gradient handed to ``grad_ready`` in backward order, then ``step()``. At stage 3 a step also
  gathers every layer with ``gathered()`` once for forward and once for backward (prefetching the
  next layer, as a model would), since the parameters exist only in shards.

``--warmup`` untimed then ``--iters`` timed rounds; a round is one step of each variant (the order
rotating from round to round, so load from elsewhere falls on all alike), a barrier before each
step. A step's time is the slowest rank's; the reported time is the median (min, max and every
step's time kept), split into ``ready`` (grad_ready calls), ``gather`` (stage 3's gathers) and
``step`` (step(), or finish() and AdamW). Then one more step of each variant runs under
``group.record()``: per collective, the calls, the elements and bytes this rank handed in, and the
bytes a ring would send per rank (allreduce 2(N-1)/N of the input; reduce-scatter (N-1)/N of the
input; allgather (N-1)/N of the gathered output). Memory: ``memory_report()`` of each stage, and
for ``dp`` the same categories from its arrays (DataParallel's bucket buffers as communication
buffers). Ratios are to ``dp``. Last, every variant's parameters are compared with ``dp``'s
(``err``: relative 2-norm error, worst tensor), and every variant's parameters, first and second
moments with those of one process's ``pycollect.optim.AdamW`` run as many steps on the gradient
averaged by hand (every rank's gradients summed by MPI in float64, divided by the ranks):
``err_ref``, ``err_m``, ``err_v``. The moments scale with the averaged gradient (a sum instead of a
mean doubles m), which AdamW's parameters hardly show; their tolerance is 1e-5 at float32, 1e-2 at
float16 (gradients summed in float16). If an error exceeds the dtype's tolerance, or
a variant took another number of steps, the summary's ``failed`` names it, its ratios to ``dp``
(every variant's, when ``dp`` is wrong) are null and the exit status is 1.
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
import time

import numpy as np
from mpi4py import MPI

import pycollect as pc
from pycollect.optim import AdamW
from pycollect.parallel import DataParallel
from pycollect.tools.common import int_at_least, size_arg
from pycollect.tools.report import format_table, human_size, run_header, write_json
from pycollect.zero import ZeroAdamW

VARIANTS = ("dp", "stage0", "stage1", "stage2", "stage3")
TOLERANCE = {"float32": 1e-5, "float16": 2e-3}  # worst tensor's relative error against dp's parameters
# the moments' against one process's AdamW on the gradient averaged by hand: float16 gradients are summed in float16
# (each addition rounds, more of them with more ranks); a sum instead of a mean is off by p - 1 >= 1
MOMENT_TOLERANCE = {"float32": 1e-5, "float16": 1e-2}
LR, WEIGHT_DECAY = 1e-3, 1e-2


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--params", type=size_arg, default=24 << 20,
                   help="about this many parameter elements (K, M binary; default 24M)")
    p.add_argument("--layers", type=int_at_least(1), default=8, help="(weight, bias) pairs (default 8)")
    p.add_argument("--dtype", choices=sorted(TOLERANCE), default="float32",
                   help="parameter dtype; float16 keeps float32 master weights (default float32)")
    p.add_argument("--bucket-bytes", type=size_arg, default=4 << 20,
                   help="gradient bucket size, for DataParallel and ZeroAdamW alike (default 4M)")
    p.add_argument("--iters", type=int_at_least(1), default=5, help="timed rounds (default 5)")
    p.add_argument("--warmup", type=int_at_least(0), default=1, help="untimed rounds before them (default 1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default="results/zero.json")
    return p.parse_args(argv)


def shapes(params: int, layers: int) -> dict:
    """l{i}.w (C, C), l{i}.b (C,) with layers * (C*C + C) close to ``params``."""
    c = max(1, round((math.sqrt(1 + 4 * params / layers) - 1) / 2))
    return {name: shape for i in range(layers) for name, shape in ((f"l{i}.w", (c, c)), (f"l{i}.b", (c,)))}


def draw(shape_of: dict, dtype, seed) -> dict:
    rng = np.random.default_rng(seed)
    return {n: (rng.standard_normal(s, dtype=np.float32) * 0.02).astype(dtype) for n, s in shape_of.items()}


class PlainDP:
    """DataParallel + pycollect.optim.AdamW (on float32 masters when the parameters are float16)."""

    def __init__(self, params: dict, group, bucket_bytes: int):
        self.params = params
        self.grads = {n: np.zeros_like(p) for n, p in params.items()}
        self.dp = DataParallel(self.grads, group, bucket_bytes=bucket_bytes)
        low = next(iter(params.values())).dtype != np.float32
        self.master = {n: p.astype(np.float32) for n, p in params.items()} if low else params
        # float16: the float32 gradients exist during the update only (as ZeroAdamW's do)
        self.master_grads = {n: np.zeros_like(p) for n, p in self.master.items()} if low else self.grads
        self.opt = AdamW(self.master, self.master_grads, lr=LR, weight_decay=WEIGHT_DECAY)
        if low:
            self.master_grads.clear()

    def load(self, grads: dict) -> None:
        """What backward would have written: the local gradients."""
        for n, g in grads.items():
            self.grads[n][...] = g

    def grad_ready(self, name: str, grad) -> None:
        self.dp.grad_ready(name)

    def step(self) -> None:
        self.dp.finish()
        if self.master is not self.params:
            self.master_grads.update({n: g.astype(np.float32) for n, g in self.grads.items()})
        self.opt.step()
        if self.master is not self.params:
            self.master_grads.clear()
            for n, p in self.params.items():
                p[...] = self.master[n]

    def full_params(self) -> dict:
        return self.params

    def memory_report(self) -> dict:
        nbytes = lambda d: sum(a.nbytes for a in d.values())  # noqa: E731
        low = self.master is not self.params
        report = {"parameters": nbytes(self.params),
                  "gradients": nbytes(self.grads),
                  "master_weights": nbytes(self.master) if low else 0,
                  "moments": nbytes(self.opt.m) + nbytes(self.opt.v),
                  "communication_buffers": sum(b.buf.nbytes for b in self.dp._buckets)}
        report["total"] = sum(report.values())
        return report


def one_step(variant: str, opt, grads: dict, layers: list, t: dict) -> None:
    """Every gradient in backward order, then the step; stage 3 gathers each layer for forward and backward."""
    def timed(key, fn, *a):
        t0 = time.perf_counter()
        fn(*a)
        t[key] = t.get(key, 0.0) + time.perf_counter() - t0

    gather = variant == "stage3"
    if gather:  # forward: each layer's full parameters, the next one prefetched meanwhile
        timed("gather", opt.prefetch, layers[0])
        for i, names in enumerate(layers):
            t0 = time.perf_counter()
            with opt.gathered(names):
                opt.prefetch(layers[i + 1] if i + 1 < len(layers) else layers[-1])  # the last again: backward's first
            t["gather"] = t.get("gather", 0.0) + time.perf_counter() - t0
    for i in reversed(range(len(layers))):
        names = layers[i]
        if gather:  # backward needs the layer's parameters again
            t0 = time.perf_counter()
            with opt.gathered(names):
                if i > 0:
                    opt.prefetch(layers[i - 1])
            t["gather"] = t.get("gather", 0.0) + time.perf_counter() - t0
        for n in reversed(names):
            timed("ready", opt.grad_ready, n, grads[n])
    timed("step", opt.step)


def ring_bytes(log, out_elements, n: int, itemsize: int) -> float:
    """Bytes a ring would send from this rank for the calls in ``log`` (see the module docstring);
    ``itemsize``: the compute dtype's, for calls to which this rank handed no element."""
    total = 0.0
    for rec, out in zip(log, out_elements):
        itemsize = rec.nbytes // rec.elements if rec.elements else itemsize
        if rec.collective == "allreduce":
            total += 2 * (n - 1) / n * rec.nbytes
        elif rec.collective == "reduce_scatter":
            total += (n - 1) / n * rec.nbytes
        elif rec.collective == "allgather":
            total += (n - 1) / n * out * itemsize
    return total


def traffic(world, variant, opt, group, grads, layers) -> dict:
    """One step under group.record(): per collective calls, elements and bytes handed in; ring bytes."""
    if isinstance(opt, PlainDP):
        opt.load(grads)
    with group.record() as log:
        one_step(variant, opt, grads, layers, {})
    # every rank makes the same calls in the same order: an allgather's output is the sum of the pieces
    pieces = world.allgather([rec.elements for rec in log])
    out = [sum(p[i] for p in pieces) for i in range(len(log))]
    per = {}
    for rec in log:
        c = per.setdefault(rec.collective, {"calls": 0, "elements": 0, "bytes": 0})
        c["calls"] += 1
        c["elements"] += rec.elements
        c["bytes"] += rec.nbytes
    sent = world.allreduce(ring_bytes(log, out, world.size, next(iter(grads.values())).itemsize), op=MPI.MAX)
    return {"collectives": per, "elements": sum(c["elements"] for c in per.values()),
            "bytes": sum(c["bytes"] for c in per.values()), "ring_bytes": sent,
            "allgather_output_elements": sum(o for rec, o in zip(log, out) if rec.collective == "allgather")}


def reference(world, shape_of: dict, dtype, seed, grads: dict, steps: int) -> AdamW:
    """One process's ``pycollect.optim.AdamW`` (float32, as the masters are) from the same initial parameters, on the
    gradient averaged by hand (every rank's own, summed by MPI in float64, divided by the ranks), ``steps`` steps."""
    params = {n: p.astype(np.float32) for n, p in draw(shape_of, dtype, seed).items()}
    mean = {}
    for n, g in grads.items():
        total = np.empty(g.shape, np.float64)
        world.Allreduce(np.ascontiguousarray(g, np.float64), total, op=MPI.SUM)
        mean[n] = (total / world.size).astype(np.float32)
    opt = AdamW(params, mean, lr=LR, weight_decay=WEIGHT_DECAY)
    for _ in range(steps):
        opt.step()
    return opt


def moment_errors(world, opt, ref: AdamW) -> dict:
    """Relative 2-norm errors (worst tensor) of a variant's first and second moments against ``ref``'s: they scale
    with the averaged gradient (m linearly, v as its square), which the parameters barely show (AdamW divides one by
    the other). ZeroAdamW's are its shard's (the whole at stage 0), DataParallel + AdamW's its AdamW's."""
    names = list(ref.m)
    sq = np.zeros((2, 2, len(names)))   # (m, v) x (difference, reference) x tensor, summed over ranks
    for k, key in enumerate(("m", "v")):
        theirs = getattr(ref, key)
        for i, n in enumerate(names):
            r = theirs[n].reshape(-1).astype(np.float64)
            if isinstance(opt, PlainDP):
                mine, r = getattr(opt.opt, key)[n].reshape(-1), r
            else:
                lo, hi = opt.layout.shard_span(opt.rank)
                a, b = opt.layout.span(n)
                x, y = max(a, lo), min(b, hi)
                mine, r = getattr(opt, key)[max(0, x - lo):max(0, y - lo)], r[max(0, x - a):max(0, y - a)]
            d = mine.astype(np.float64) - r
            sq[k, 0, i] += d @ d
            sq[k, 1, i] += r @ r
    world.Allreduce(MPI.IN_PLACE, sq, op=MPI.SUM)
    err = np.sqrt(sq[:, 0]) / np.maximum(np.sqrt(sq[:, 1]), np.finfo(np.float64).tiny)   # (2, tensors)
    return {"m": float(err[0].max()), "v": float(err[1].max())}


def rel_err(got: dict, expected: dict) -> float:
    worst = 0.0
    for n, e in expected.items():
        g, e = np.asarray(got[n], np.float64), np.asarray(e, np.float64)
        worst = max(worst, float(np.linalg.norm(g - e) / max(np.linalg.norm(e), np.finfo(np.float64).tiny)))
    return worst


def main(argv) -> int:
    args = parse(argv)
    world = MPI.COMM_WORLD
    group = pc.Communicator()
    dtype = np.dtype(args.dtype)
    shape_of = shapes(args.params, args.layers)
    names = list(shape_of)
    layers = [names[i:i + 2] for i in range(0, len(names), 2)]
    P = sum(math.prod(s) for s in shape_of.values())
    grads = draw(shape_of, dtype, [args.seed, 1 + world.rank])  # this rank's own gradients
    opts = {"dp": PlainDP(draw(shape_of, dtype, args.seed), group, args.bucket_bytes)}
    for stage in range(4):
        opts[f"stage{stage}"] = ZeroAdamW(draw(shape_of, dtype, args.seed), group, stage=stage, lr=LR,
                                          weight_decay=WEIGHT_DECAY, bucket_bytes=args.bucket_bytes)

    steps = {v: [] for v in VARIANTS}  # (total, ready, gather, step) seconds per timed step, this rank
    for r in range(args.warmup + args.iters):
        for v in VARIANTS[r % len(VARIANTS):] + VARIANTS[:r % len(VARIANTS)]:
            if v == "dp":
                opts[v].load(grads)
            t = {}
            world.Barrier()
            t0 = time.perf_counter()
            one_step(v, opts[v], grads, layers, t)
            total = time.perf_counter() - t0
            if r >= args.warmup:
                steps[v].append((total, t.get("ready", 0.0), t.get("gather", 0.0), t.get("step", 0.0)))
    for v in VARIANTS:  # the slowest rank's step
        steps[v] = [tuple(max(x) for x in zip(*per_rank)) for per_rank in zip(*world.allgather(steps[v]))]
    comm = {v: traffic(world, v, opts[v], group, grads, layers) for v in VARIANTS}
    finals = {v: opts[v].full_params() for v in VARIANTS}
    errors = {v: world.allreduce(rel_err(finals[v], finals["dp"]), op=MPI.MAX) for v in VARIANTS}
    taken = {v: opts[v].opt.t if v == "dp" else opts[v].t for v in VARIANTS}
    ref = reference(world, shape_of, dtype, args.seed, grads, taken["dp"])
    ref_errors = {v: {"params": world.allreduce(rel_err(finals[v], ref.params), op=MPI.MAX),
                      **moment_errors(world, opts[v], ref)} for v in VARIANTS}
    tol, moment_tol = TOLERANCE[args.dtype], MOMENT_TOLERANCE[args.dtype]
    failed = [f"{v}: {what} {e:.1e} > {bound:g}" for v in VARIANTS
              for what, e, bound in [("parameters vs dp", errors[v], tol), ("parameters vs reference",
                                                                            ref_errors[v]["params"], tol),
                                     ("m vs reference", ref_errors[v]["m"], moment_tol),
                                     ("v vs reference", ref_errors[v]["v"], moment_tol)]
              if not e <= bound]
    failed += [f"{v}: {taken[v]} steps, the reference {taken['dp']}" for v in VARIANTS if taken[v] != taken["dp"]]
    bad = {v for v in VARIANTS if any(f.startswith(f"{v}:") for f in failed)}
    bad = set(VARIANTS) if "dp" in bad else bad   # the ratios are to dp's
    memory = {v: opts[v].memory_report() for v in VARIANTS}
    memory_max = {v: world.allreduce(memory[v]["total"], op=MPI.MAX) for v in VARIANTS}

    records = []
    for v in VARIANTS:
        s, opt = steps[v], opts[v]
        median = lambda i: statistics.median(e[i] for e in s) * 1e3  # noqa: E731
        records.append({
            "variant": v, "stage": None if v == "dp" else int(v[-1]), "dtype": args.dtype, "params": P,
            "padded": P if v == "dp" else opt.layout.padded, "tensors": len(names), "width": shape_of["l0.w"][0],
            "bucket_bytes": args.bucket_bytes, "iters": len(s), "time_ms": median(0),
            "time_ms_min": min(e[0] for e in s) * 1e3, "time_ms_max": max(e[0] for e in s) * 1e3,
            "times_ms": [round(e[0] * 1e3, 3) for e in s],
            "ready_ms": median(1), "gather_ms": median(2), "step_ms": median(3),
            "memory": memory[v], "memory_total_max": memory_max[v], "memory_bytes_per_param": memory[v]["total"] / P,
            "comm": comm[v]["collectives"], "comm_elements": comm[v]["elements"], "comm_bytes": comm[v]["bytes"],
            "allgather_output_elements": comm[v]["allgather_output_elements"], "ring_bytes": comm[v]["ring_bytes"],
            "ring_elements_per_param": comm[v]["ring_bytes"] / (P * dtype.itemsize),
            "time_vs_dp": None, "memory_vs_dp": None, "ring_bytes_vs_dp": None, "err": errors[v],
            "err_ref": ref_errors[v]["params"], "err_m": ref_errors[v]["m"], "err_v": ref_errors[v]["v"],
            "steps_taken": taken[v]})
    base = records[0]
    for rec in records:
        if rec["variant"] in bad:   # a wrong variant's step is no figure
            continue
        rec["time_vs_dp"] = rec["time_ms"] / base["time_ms"]
        rec["memory_vs_dp"] = rec["memory"]["total"] / base["memory"]["total"]
        rec["ring_bytes_vs_dp"] = rec["ring_bytes"] / base["ring_bytes"] if base["ring_bytes"] else None
    summary = {"params": P, "layers": args.layers, "width": shape_of["l0.w"][0], "world_size": world.size,
               "max_err": max(errors.values()), "tolerance": tol,
               "max_err_ref": max(e["params"] for e in ref_errors.values()),
               "max_err_moments": max(max(e["m"], e["v"]) for e in ref_errors.values()),
               "moment_tolerance": moment_tol, "failed": failed,
               "time_vs_dp": {r["variant"]: r["time_vs_dp"] for r in records},
               "memory_vs_dp": {r["variant"]: r["memory_vs_dp"] for r in records},
               "ring_bytes_vs_dp": {r["variant"]: r["ring_bytes_vs_dp"] for r in records}}
    ok = not failed
    if world.rank == 0:
        mib = 2.0 ** 20
        print(f"# zero: {P} parameters ({P * dtype.itemsize / mib:.1f} MiB {args.dtype}) in {len(names)} tensors "
              f"({args.layers} x ({shape_of['l0.w'][0]}^2 + {shape_of['l0.w'][0]})), {world.size} ranks, buckets of "
              f"~{human_size(args.bucket_bytes)}, {args.iters} steps (median, slowest rank), rank 0's memory")
        rows = [dict(r, mem_mib=r["memory"]["total"] / mib, ring_mib=r["ring_bytes"] / mib,
                     handed_mib=r["comm_bytes"] / mib) for r in records]
        cols = [("variant", "variant", "{}"), ("time_ms", "ms", "{:.1f}"), ("ready_ms", "ready", "{:.1f}"),
                ("gather_ms", "gather", "{:.1f}"), ("step_ms", "step", "{:.1f}"), ("time_vs_dp", "x dp", "{:.2f}"),
                ("mem_mib", "memory MiB", "{:.1f}"), ("memory_bytes_per_param", "B/param", "{:.2f}"),
                ("memory_vs_dp", "x dp", "{:.2f}"), ("handed_mib", "handed MiB", "{:.1f}"),
                ("ring_mib", "ring MiB", "{:.1f}"), ("ring_bytes_vs_dp", "x dp", "{:.2f}"), ("err", "err", "{:.1e}")]
        print("\n".join(format_table(rows, cols)))
        for r in records:
            calls = ", ".join(f"{c} {x['calls']} calls {x['elements']} elements" for c, x in r["comm"].items())
            print(f"{r['variant']}: {calls or 'no communication'}; memory {r['memory']}")
        print(f"parameters vs dp: max relative error {summary['max_err']:.1e}; vs one process's AdamW on the gradient "
              f"averaged by hand: parameters {summary['max_err_ref']:.1e} (tolerance {tol:g}), moments "
              f"{summary['max_err_moments']:.1e} (tolerance {moment_tol:g})"
              f"{'' if ok else '  FAILED: ' + '; '.join(failed) + ' (their ratios to dp not given)'}")
        head = run_header(group, argv, iters=args.iters, warmup=args.warmup, seed=args.seed, lr=LR,
                          weight_decay=WEIGHT_DECAY, bucket_bytes=args.bucket_bytes, dtype=args.dtype)
        path = write_json(args.json, "zero", head, records, summary=summary)
        print(f"wrote {path}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

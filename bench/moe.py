"""Mixture-of-experts dispatch and combine against MPI's own Alltoallv on the same counts.

Run with one BLAS thread per rank, one rank per core::

    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 mpiexec -n 2 python bench/moe.py --json results/moe.json

Every rank routes ``--tokens`` tokens of width ``--hidden`` to ``--experts`` experts (top ``--top-k``)
spread over the world as ``pycollect.moe.MoELayer`` spreads them (E/p per rank). The router's
logits are synthetic: Gumbel noise plus a bias per expert, 0 for ``balanced`` routing and
-s*log(e+1) for ``skewed`` (Zipf, s = ``--skew``; the same on every rank, so the first experts,
on the first ranks, are hot). The choices, gates, capacity and dropping are those of
``pycollect.moe.router``, with capacity (``--capacity-factor``, choices beyond it dropped by
position) or dropless. For each routing x mode three variants are timed, interleaved step by step
(the order rotating, a barrier before each step), a step's time being the slowest rank's:

- ``dispatch_combine``: what the layer runs, ``pycollect.moe.dispatch``: the choices sorted by
  expert and every rank's per-expert counts allgathered, the rows sent to the experts' ranks
  (``alltoall`` given the whole count matrix: no count exchange inside) and back (the experts compute on the rows where they
  land: no regrouping copy);
- ``pc_alltoall``: the two uneven ``Communicator.alltoall`` calls alone, each given only its own row of
  counts so it exchanges them (``--algorithm``, default auto);
- ``mpi``: two ``MPI_Alltoallv`` on the same counts (precomputed), each into a new array, as pycollect's calls
  return theirs (a layer's counts change every step; the same handling of outputs on both sides: preallocated
  buffers on MPI's side alone made it 1.4x faster here, from the pages a fresh 32 MiB array faults in).

Throughput: the bytes the busiest rank sends in the two exchanges (its rows out plus the rows it
returns) over the step time. Before timing, and once more after the timed steps, one step of every
variant (the very function timed) is checked: the rows at every expert against one MPI_Alltoallv
made before any timing, and the rows returned against the rows sent. A record's ``wrong`` is the
ranks where its variant differed, the worse of the two checks; a wrong variant's ``vs_mpi`` (every
variant's, when ``mpi`` is wrong) is null in the records and the summary, the JSON's ``failed``
names it, and the exit status is 1.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np
from mpi4py import MPI

import pycollect as pc
from pycollect.moe import dispatch, router
from pycollect.nn.attention import softmax_forward
from pycollect.tools.common import finite_number, int_at_least
from pycollect.tools.report import format_table, run_header, write_json

VARIANTS = ("dispatch_combine", "pc_alltoall", "mpi")
ROUTINGS = ("balanced", "skewed")
MODES = ("capacity", "dropless")


positive_float = finite_number(0.0, strict=True)


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int_at_least(1), default=4096, help="T per rank (default 4096)")
    p.add_argument("--hidden", type=int_at_least(1), default=1024, help="C, the row width (default 1024)")
    p.add_argument("--experts", type=int_at_least(1), default=8, help="E, a multiple of the ranks (default 8)")
    p.add_argument("--top-k", type=int_at_least(1), default=2, help="k (default 2)")
    p.add_argument("--capacity-factor", type=positive_float, default=1.25, help="(default 1.25)")
    p.add_argument("--skew", type=positive_float, default=1.0, help="Zipf exponent of skewed routing (default 1.0)")
    p.add_argument("--algorithm", default="auto", help="pycollect's alltoall algorithm (default auto)")
    p.add_argument("--iters", type=int_at_least(1), default=10, help="timed rounds per trial (default 10)")
    p.add_argument("--warmup", type=int_at_least(0), default=2, help="untimed rounds before them (default 2)")
    p.add_argument("--trials", type=int_at_least(1), default=1, help="blocks of --iters rounds (default 1)")
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default="results/moe.json")
    return p.parse_args(argv)


def route(args, routing: str, mode: str, rank: int):
    """expert (T, k), keep (T, k) of this rank's tokens, and the capacity (None when dropless)."""
    rng = np.random.default_rng(args.seed * 7919 + rank)
    e = args.experts
    bias = np.zeros(e) if routing == "balanced" else -args.skew * np.log(np.arange(1, e + 1))
    probs = softmax_forward(bias + rng.gumbel(size=(args.tokens, e)))  # (T, E)
    expert, _ = router.top_k(probs, args.top_k)
    cap = router.capacity(args.tokens, e, args.top_k, args.capacity_factor) if mode == "capacity" else None
    return expert, router.keep_mask(expert, probs, e, cap, "position"), cap


class MpiPair:
    """Two MPI_Alltoallv on ``plan``'s counts: rows out to the experts' ranks and back."""

    def __init__(self, world, plan, width, dtype):
        self.world = world
        row = lambda counts: [int(c) * width for c in counts]  # noqa: E731
        self.send, self.recv = row(plan.send), row(plan.recv)
        self.send_at = list(np.cumsum([0] + self.send[:-1]))
        self.recv_at = list(np.cumsum([0] + self.recv[:-1]))
        self.shapes = (plan.rows_received, width), (plan.rows_sent, width)
        self.dtype = dtype

    def run(self, rows):
        self.inbox, self.back = (np.empty(shape, self.dtype) for shape in self.shapes)   # new, as pycollect's
        self.world.Alltoallv([rows, (self.send, self.send_at)], [self.inbox, (self.recv, self.recv_at)])
        self.world.Alltoallv([self.inbox, (self.recv, self.recv_at)], [self.back, (self.send, self.send_at)])
        return self.back


def variants(group, args, expert, keep, rows, plan, mpi_pair) -> dict:
    """Per variant, one step: a function returning ``(inbox, back)``, the rows where the experts get them and the
    rows returned to this rank (in ``plan.order``)."""
    def layer_path():
        q = dispatch.make_plan(expert, keep, args.experts, group)  # sort by expert, counts exchanged
        inbox = dispatch.to_experts(rows, q, group, args.algorithm)
        return inbox, dispatch.from_experts(inbox, q, group, args.algorithm)

    def pc_alltoall():
        inbox = group.alltoall(rows, counts=plan.send, algorithm=args.algorithm)
        return inbox, group.alltoall(inbox, counts=plan.recv, algorithm=args.algorithm)

    def mpi():
        back = mpi_pair.run(rows)
        return mpi_pair.inbox, back

    return {"dispatch_combine": layer_path, "pc_alltoall": pc_alltoall, "mpi": mpi}


def reference(world, plan, rows, width, dtype):
    """The rows every expert's rank gets, by one MPI_Alltoallv on the plan's counts into a buffer of its own."""
    ref = MpiPair(world, plan, width, dtype)
    ref.run(rows)
    return ref.inbox.copy()


def check(world, steps: dict, rows, inbox) -> dict[str, int]:
    """Per variant, the ranks (of all) whose step put other rows at the experts than ``inbox`` (MPI's Alltoallv
    before any timing), or returned other rows than ``rows``: one step of each, its outputs compared whole."""
    wrong = np.zeros(len(VARIANTS), np.int64)
    for i, v in enumerate(VARIANTS):
        got, back = steps[v]()
        wrong[i] = not (np.array_equal(got, inbox) and np.array_equal(back, rows))
    world.Allreduce(MPI.IN_PLACE, wrong, op=MPI.SUM)
    return {v: int(w) for v, w in zip(VARIANTS, wrong)}


def time_point(world, args, steps: dict):
    """Per variant: the slowest rank's seconds of each timed step."""
    mine = {v: [] for v in VARIANTS}
    for r in range(args.warmup + args.trials * args.iters):
        for v in VARIANTS[r % len(VARIANTS):] + VARIANTS[:r % len(VARIANTS)]:
            world.Barrier()
            t0 = time.perf_counter()
            steps[v]()
            dt = time.perf_counter() - t0
            if r >= args.warmup:
                mine[v].append(dt)
    return {v: [max(ts) for ts in zip(*world.allgather(mine[v]))] for v in VARIANTS}


def measure(world, group, args, routing, mode, dtype) -> list[dict]:
    p = world.size
    expert, keep, cap = route(args, routing, mode, world.rank)
    plan = dispatch.make_plan(expert, keep, args.experts, group)
    rng = np.random.default_rng(args.seed + 17 * world.rank)
    rows = rng.standard_normal((plan.rows_sent, args.hidden)).astype(dtype)  # (N, C) this rank's rows in plan.order
    mpi_pair = MpiPair(world, plan, args.hidden, dtype)
    inbox = reference(world, plan, rows, args.hidden, dtype)
    steps = variants(group, args, expert, keep, rows, plan, mpi_pair)
    first = check(world, steps, rows, inbox)

    load = world.allreduce(np.bincount(expert.reshape(-1), minlength=args.experts))  # (E,) before dropping
    dropped = world.allreduce(router.dropped_per_expert(expert, keep, args.experts))  # (E,)
    gone = world.allreduce(int((~keep.any(axis=1)).sum()))
    row_bytes = args.hidden * np.dtype(dtype).itemsize
    moved = world.allgather((plan.rows_sent + plan.rows_received) * row_bytes)  # per rank, both exchanges
    recv_rows = world.allgather(plan.rows_received)
    total_rows = world.allreduce(plan.rows_sent)
    resolved = group.auto_algorithm("alltoall", total_rows * row_bytes // p, dtype) \
        if args.algorithm == "auto" else args.algorithm
    times = time_point(world, args, steps)
    # once more after the timed steps: a step that goes wrong after the first shows too (the worse counts)
    after = check(world, steps, rows, inbox)
    wrong = {v: max(first[v], after[v]) for v in VARIANTS}

    assignments = p * args.tokens * args.top_k
    common = {"routing": routing, "mode": mode, "tokens": args.tokens, "hidden": args.hidden, "experts": args.experts,
              "top_k": args.top_k, "capacity_factor": args.capacity_factor if mode == "capacity" else None,
              "capacity": cap, "skew": args.skew if routing == "skewed" else 0.0, "dtype": np.dtype(dtype).name,
              "dropped_rate": float(dropped.sum()) / assignments, "tokens_dropped_rate": gone / (p * args.tokens),
              "dropped_per_expert": dropped.tolist(), "load_per_expert": load.tolist(),
              "load_imbalance": float(load.max() / load.mean()),
              "recv_rows_per_rank": recv_rows, "bytes_busiest_rank": max(moved)}
    mpi_ms = statistics.median(times["mpi"]) * 1e3
    records = []
    for v in VARIANTS:
        ts = times[v]
        ms = statistics.median(ts) * 1e3
        records.append({**common, "wrong": wrong[v], "variant": v,
                        "algorithm": "mpi" if v == "mpi" else args.algorithm,
                        "resolved": "mpi" if v == "mpi" else resolved,
                        "iters": len(ts), "time_ms": ms, "time_ms_min": min(ts) * 1e3, "time_ms_max": max(ts) * 1e3,
                        "trial_medians_ms": [statistics.median(ts[k * args.iters:(k + 1) * args.iters]) * 1e3
                                             for k in range(args.trials)],
                        "GBps": max(moved) / (ms * 1e-3) / 1e9,
                        "vs_mpi": None if wrong[v] or wrong["mpi"] else mpi_ms / ms})
    return records


def main(argv) -> int:
    args = parse(argv)
    world = MPI.COMM_WORLD
    group = pc.Communicator()
    dtype = np.dtype(args.dtype)
    problems = []
    if args.experts % world.size:
        problems.append(f"--experts {args.experts} does not divide by the {world.size} ranks")
    if args.top_k > args.experts:
        problems.append(f"--top-k {args.top_k} is larger than --experts {args.experts}")
    if args.algorithm not in ("auto", "mpi") + tuple(pc.algorithms("alltoall")):
        problems.append(f"--algorithm {args.algorithm!r} is not an alltoall algorithm "
                        f"({', '.join(('auto', 'mpi') + tuple(pc.algorithms('alltoall')))})")
    if problems:
        print(f"moe.py: {'; '.join(problems)}", file=sys.stderr)
        return 2
    records = [r for routing in ROUTINGS for mode in MODES for r in measure(world, group, args, routing, mode, dtype)]
    failed = [f"{r['routing']} {r['mode']} {r['variant']}: {r['wrong']} rank(s)" for r in records if r["wrong"]]
    by = {(r["routing"], r["mode"], r["variant"]): r for r in records}
    summary = {f"{routing}_{mode}": {"vs_mpi_dispatch_combine": by[(routing, mode, "dispatch_combine")]["vs_mpi"],
                                     "vs_mpi_pc_alltoall": by[(routing, mode, "pc_alltoall")]["vs_mpi"],
                                     "dropped_rate": by[(routing, mode, "mpi")]["dropped_rate"],
                                     "load_imbalance": by[(routing, mode, "mpi")]["load_imbalance"]}
               for routing in ROUTINGS for mode in MODES}
    if world.rank == 0:
        print(f"# moe dispatch+combine: {world.size} ranks, T={args.tokens} per rank, C={args.hidden}, "
              f"E={args.experts}, top-{args.top_k}, capacity factor {args.capacity_factor}, {args.dtype}, "
              f"{args.trials * args.iters} timed steps, median of the slowest rank")
        cols = [("routing", "routing", "{}"), ("mode", "mode", "{}"), ("variant", "variant", "{}"),
                ("resolved", "alg", "{}"), ("time_ms", "ms", "{:.2f}"), ("time_ms_min", "min ms", "{:.2f}"),
                ("GBps", "GB/s", "{:.2f}"), ("vs_mpi", "vs_mpi", "{:.2f}"), ("load_imbalance", "imbalance", "{:.2f}"),
                ("dropped_rate", "dropped", "{:.3f}"), ("wrong", "#wrong", "{}")]
        print("\n".join(format_table(records, cols)))
        if failed:
            print(f"FAILED: rows moved wrongly (before or after the timed steps; its vs_mpi not given): "
                  f"{'; '.join(failed)}")
        head = run_header(group, argv, iters=args.iters, warmup=args.warmup, trials=args.trials, seed=args.seed,
                          algorithm=args.algorithm)
        print(f"wrote {write_json(args.json, 'moe', head, records, summary=summary, failed=failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

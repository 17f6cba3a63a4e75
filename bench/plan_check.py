"""The planner against this machine: predicted and measured step time of the GPT on every mesh that fits.

    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 mpiexec -n 2 python -m pycollect bench fit \\
        --json results/fit-2ranks.json
    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 mpiexec -n 2 python bench/plan_check.py \\
        --tuning results/fit-2ranks.json --json results/plan-check.json

Two ranks on two cores: the meshes that fit are (dp, tp, pp) = (1,1,1), (2,1,1), (1,2,1), (1,1,2)
(1f1b and gpipe). Each step is the model's forward and backward over the global batch in
``--micro`` micro-batches and its gradient reductions (the optimizer's update is not in the planner's
step and not timed). The planner (``pycollect.plan.predict``) gets:

- the links fitted by ``pycollect bench fit`` (``--tuning``; both ranks share a node: one tier);
- the compute rate measured here: the model FLOPs of the (1,1,1) step (6 x parameters x tokens, as
  the planner counts them) over its measured time, with both ranks running it at once (the cores
  share memory bandwidth, as they do in every two-rank mesh). The (1,1,1) ratio is 1 by this
  calibration; the other meshes are predictions from it.

Each record: mesh, predicted and measured seconds (median of ``--steps``, the slowest rank's), the ratio,
the planner's breakdown. Target (the issue): every ratio within 30%.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np
from mpi4py import MPI

import pycollect as pc
from pycollect import plan
from pycollect.models import GPTConfig, init_params
from pycollect.models.data import reverse_batch, shard_rows
from pycollect.models.gpt import GPT
from pycollect.models.gpt_pipeline import PipelinedGPT
from pycollect.parallel import ProcessMesh
from pycollect.tools.report import format_table, run_header, write_json

MESHES = [(1, 1, 1, "1f1b"), (2, 1, 1, "1f1b"), (1, 2, 1, "1f1b"), (1, 1, 2, "1f1b"), (1, 1, 2, "gpipe")]


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tuning", required=True, help="the JSON `pycollect bench fit --json` wrote here (its fitted model)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--embd", type=int, default=256)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--batch", type=int, default=16, help="global batch (default 16)")
    p.add_argument("--micro", type=int, default=4, help="micro-batches per step (default 4)")
    p.add_argument("--steps", type=int, default=5, help="timed steps per mesh, median kept (default 5)")
    p.add_argument("--json", default="results/plan-check.json")
    return p.parse_args(argv)


def build(config, params, mesh, schedule, micro):
    if mesh.pp_size > 1:
        return PipelinedGPT.from_full(config, params, mesh, schedule=schedule, microbatches=micro)
    return GPT.from_full(config, params, mesh, sequence_parallel=mesh.tp_size > 1)


def one_step(model, mesh, idx, targets, micro) -> None:
    model.zero_grad()
    if isinstance(model, PipelinedGPT):
        model.step(idx, targets)
        return
    for j, (mi, mt) in enumerate(zip(np.split(idx, micro), np.split(targets, micro))):
        if j < micro - 1:
            with model.no_sync():
                model.forward(mi, mt)
                model.backward(1.0 / micro)
        else:
            model.forward(mi, mt)
            model.backward(1.0 / micro)
    model.finish_grads()


def time_mesh(world, config, params, mesh_shape, args) -> float:
    """Median over steps of the slowest rank's step seconds; ranks outside the mesh run their own copy
    of it (the (1,1,1) mesh: both ranks compute at once) or wait."""
    dp, tp, pp, schedule = mesh_shape
    n = dp * tp * pp
    color = 0 if world.rank < n else 1
    sub = world.mpi.Split(color, world.rank)
    group = pc.Communicator(sub)
    mesh = ProcessMesh(group, tp=tp, dp=dp, pp=pp) if (color == 0 or n == 1) else None
    model = build(config, params, mesh, schedule, args.micro) if mesh is not None else None
    idx, targets = reverse_batch(args.batch, config.block_size, config.vocab_size, 0, 0)
    if mesh is not None:
        idx, targets = shard_rows((idx, targets), mesh.dp_rank, dp)
        one_step(model, mesh, idx, targets, args.micro)  # warm-up
    times = []
    for _ in range(args.steps):
        world.mpi.Barrier()
        t0 = time.perf_counter()
        if mesh is not None:
            one_step(model, mesh, idx, targets, args.micro)
        times.append(world.mpi.allreduce(time.perf_counter() - t0, op=MPI.MAX))
    if mesh is not None:
        mesh.free()
    group.free()
    sub.Free()
    return statistics.median(times)


def main(argv) -> int:
    args = parse(argv)
    world = pc.Communicator()
    if world.size != 2:
        sys.stderr.write("plan_check: run with mpiexec -n 2 (the meshes that fit two cores)\n")
        return 2
    config = GPTConfig(vocab_size=args.vocab, block_size=args.seq, n_layer=args.layers, n_head=args.heads,
                       n_embd=args.embd)
    params = init_params(config, seed=0, dtype=np.float32)
    spec = plan.ModelSpec.from_gpt(config, batch=args.batch, micro=args.batch // args.micro, precision="fp32")
    measured = {m: time_mesh(world, config, params, m, args) for m in MESHES}
    rate = plan.train_flops(spec) / measured[MESHES[0]]  # FLOP/s of one rank with both cores busy
    records = []
    for m, seconds in measured.items():
        dp, tp, pp, schedule = m
        n = dp * tp * pp
        cluster = plan.ClusterSpec.from_tuning(args.tuning, gpus=n, gpus_per_node=n, memory=64e9, flops=rate)
        pred = plan.predict(spec, cluster, plan.ParallelConfig(dp=dp, tp=tp, pp=pp, schedule=schedule,
                                                                sp=tp > 1, recompute="none"))
        records.append({"dp": dp, "tp": tp, "pp": pp, "schedule": schedule, "measured_s": seconds,
                        "predicted_s": pred.step_time, "ratio": pred.step_time / seconds,
                        "predicted": {k: float(v) for k, v in pred.times.items()},
                        "bubble": {k: v for k, v in pred.bubble.items() if isinstance(v, (int, float))}})
    if world.rank == 0:
        print(f"# plan check: {spec.describe() if hasattr(spec, 'describe') else config}, "
              f"rate {rate / 1e9:.2f} GFLOP/s per rank (calibrated on (1,1,1), both cores busy)")
        cols = [("dp", "dp", "{}"), ("tp", "tp", "{}"), ("pp", "pp", "{}"), ("schedule", "schedule", "{}"),
                ("measured_s", "measured s", "{:.4f}"), ("predicted_s", "predicted s", "{:.4f}"),
                ("ratio", "predicted/measured", "{:.3f}")]
        print("\n".join(format_table(records, cols)))
        worst = max(abs(r["ratio"] - 1) for r in records)
        print(f"largest deviation {worst:.1%} (target 30%)")
        header = run_header(world, sys.argv, model=config.to_dict(), batch=args.batch, micro=args.micro,
                            rate_flops=rate, tuning=args.tuning)
        print("wrote", write_json(args.json, "plan_check", header, records, worst_deviation=worst))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

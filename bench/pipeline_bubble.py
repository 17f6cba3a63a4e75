"""Pipeline bubble, measured against the formula and the simulator, and activation memory per stage.

    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 mpiexec -n 2 python bench/pipeline_bubble.py \\
        --json results/pipeline-bubble.json [--schedules 1f1b,zb-h1,zb-h2,zbv]

Each of the p ranks (p = 2 on two cores) is one stage running ``pycollect.parallel.Pipeline`` with
synthetic chunks: ``--layers`` Linear(C, C) + GeLU on (rows, C) float64, so that per micro-batch
compute dominates the point-to-point messages. For every schedule of ``--schedules`` (gpipe, 1f1b,
interleaved with 2 chunks per stage, whose per-chunk work is half a stage's; the zero-bubble zb-h1,
zb-h2 and zbv, whose chunks split each backward into B, the input gradient, and W, the weight
gradient; zbv's two chunks per stage placed V-wise) and m in ``--microbatches``:

- ``bubble_measured``: 1 - (F, B and W time summed over the stages) / (p x the step's span, from the
  start after a barrier to the last stage's last compute), median of ``--trials``; per stage too;
- ``span_bubble_measured``: 1 - the same busy time / the sum of the stages' own spans (first compute
  to last): what is lost inside the stages, the figure ZB-H2 and ZB-V bring to zero (the bubble
  above also counts each stage's wait for its first input and the drain after its last compute);
- ``bubble_formula``: (p-1)/(m+p-1), interleaved (p-1)/(m*v+p-1), zb-h1 and zb-h2 (p-1)/(3m+p-1),
  zbv (p-1)/(6m+p-1) (``pipeline.simulate.bubble_formula``, at F = B = W);
- ``bubble_simulated``, ``span_bubble_simulated``: the simulator on the same lists with the measured
  mean F, B and W time per chunk and the measured one-way message time (this is what the measured
  values should match; the formulas assume equal costs and free messages);
- ``peak_in_flight`` and ``peak_activation_bytes`` per stage: (micro-batch, chunk) pairs whose caches
  were held at once, and their bytes (GPipe holds m, 1F1B at most p - stage).
"""
from __future__ import annotations

import argparse
import statistics
import sys

import numpy as np
from mpi4py import MPI

import pycollect as pc
from pycollect.nn import GeLU, Linear
from pycollect.parallel import Pipeline
from pycollect.pipeline.actions import Action, model_chunk
from pycollect.pipeline.schedules import vshaped
from pycollect.pipeline.simulate import bubble_formula, simulate
from pycollect.tools.common import allgather_json
from pycollect.tools.report import format_table, run_header, write_json

SCHEDULES = {"gpipe": 1, "1f1b": 1, "interleaved": 2, "zb-h1": 1, "zb-h2": 1, "zbv": 2}  # name: chunks per stage


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--schedules", default="gpipe,1f1b,interleaved",
                   help=f"comma list of {', '.join(SCHEDULES)} (default gpipe,1f1b,interleaved)")
    p.add_argument("--microbatches", default="1,2,4,8,16", help="comma list of m (default 1,2,4,8,16)")
    p.add_argument("--rows", type=int, default=128, help="rows of a micro-batch (default 128)")
    p.add_argument("--width", type=int, default=1024, help="C (default 1024: matrix products dominate, not memory traffic)")
    p.add_argument("--layers", type=int, default=4, help="Linear+GeLU pairs per stage (default 4)")
    p.add_argument("--trials", type=int, default=3, help="steps per point, median kept (default 3)")
    p.add_argument("--json", default="results/pipeline-bubble.json")
    p.add_argument("--plot", help="draw the measured timeline of each schedule's last point but gpipe's to "
                                  "FILE-<schedule>.png (FILE without .png; matplotlib)")
    args = p.parse_args(argv)
    args.microbatches = [int(m) for m in args.microbatches.split(",")]
    args.schedules = args.schedules.split(",")
    unknown = [s for s in args.schedules if s not in SCHEDULES]
    if unknown:
        p.error(f"--schedules: unknown {', '.join(unknown)}; expected some of {', '.join(SCHEDULES)}")
    return args


class Chunk:
    """``n`` Linear + GeLU pairs; model chunk 0 makes its input, the last returns mean(y) as the loss."""

    def __init__(self, n, width, rows, first, last, seed):
        rng = np.random.default_rng(seed)
        self.layers = []
        for _ in range(n):
            self.layers += [Linear(rng.standard_normal((width, width)) / np.sqrt(width), np.zeros(width)),
                            GeLU("tanh")]
        self.first, self.last, self.rows, self.width = first, last, rows, width
        self.x0 = rng.standard_normal((rows, width))

    def input_spec(self):
        return None if self.first else ((self.rows, self.width), "float64")

    def output_spec(self):
        return None if self.last else ((self.rows, self.width), "float64")

    def forward(self, x, micro):
        x = self.x0 if self.first else x
        for layer in self.layers:
            x = layer.forward(x)
        return np.asarray(x.mean()) if self.last else x

    def backward(self, dy, micro):
        dx = self.backward_input(dy, micro)
        self.backward_weight(micro)
        return dx

    def backward_input(self, dy, micro):
        """B: the input gradient; each Linear keeps (x, dy) for its W."""
        if self.last:
            dy = np.full((self.rows, self.width), 1.0 / (self.rows * self.width))
        for layer in reversed(self.layers):
            dy = layer.backward_input(dy)
        return None if self.first else dy

    def backward_weight(self, micro):
        """W: the Linear layers' weight gradients (one (C, rows) x (rows, C) product each)."""
        for layer in reversed(self.layers):
            layer.backward_weight()


def one_way_seconds(group, rows, width, iters=20) -> float:
    """Half the round trip of one activation between stages 0 and 1 (0 on one stage)."""
    if group.size == 1:
        return 0.0
    x = np.zeros((rows, width))
    group.mpi.Barrier()
    t0 = MPI.Wtime()
    for _ in range(iters):
        if group.rank == 0:
            group.send(x, 1, 7)
            group.recv(x, 1, 7)
        elif group.rank == 1:
            group.recv(x, 0, 7)
            group.send(x, 0, 7)
    return (MPI.Wtime() - t0) / iters / 2


def measure(group, schedule, v, m, args) -> dict:
    p, stage = group.size, group.rank
    per_chunk = max(1, args.layers // v)  # an interleaved or V-placed chunk does 1/v of a stage's work
    ks = [model_chunk(stage, c, p, vshaped(schedule)) for c in range(v)]
    chunks = [Chunk(per_chunk, args.width, args.rows, k == 0, k == p * v - 1, seed=k) for k in ks]
    pipe = Pipeline(chunks, group, schedule, m, v)
    bubbles, span_bubbles, stage_bubbles, spans, f_times, b_times, w_times = [], [], [], [], [], [], []
    for trial in range(args.trials + 1):  # the first is a warm-up
        group.mpi.Barrier()  # the stages' clocks start together (to within a barrier)
        pipe.run()
        busy = sum(e - s for s, e, _ in pipe.timeline)
        span = pipe.timeline[-1][1]
        own = span - pipe.timeline[0][0]  # this stage's own span, first compute to last
        every = group.mpi.allgather((busy, span, own))
        makespan = max(r[1] for r in every)
        if trial:
            for op, times in (("F", f_times), ("B", b_times), ("W", w_times)):
                times += [e - s for s, e, a in pipe.timeline if a.op == op]
            bubbles.append(1 - sum(r[0] for r in every) / (p * makespan))  # the simulator's definition
            span_bubbles.append(1 - sum(r[0] for r in every) / sum(r[2] for r in every))
            stage_bubbles.append(1 - busy / makespan)
            spans.append(makespan)
    every = group.mpi.allgather((statistics.median(stage_bubbles), statistics.median(spans), statistics.mean(f_times),
                                 statistics.mean(b_times), pipe.peak_in_flight, pipe.peak_activation_bytes,
                                 statistics.mean(w_times) if w_times else 0.0))
    f = statistics.mean(r[2] for r in every)
    b = statistics.mean(r[3] for r in every)
    w = statistics.mean(r[6] for r in every)
    comm = one_way_seconds(group, args.rows, args.width)
    # the simulator's B is the whole backward; a split one runs b of it, its W the rest
    costs = {"F": f, "B": b + w, "W": w, "comm": comm} if w_times else {"F": f, "B": b, "comm": comm}
    sim = simulate(schedule, p, m, v, costs=costs)
    timelines = allgather_json(group.mpi, [(s, e, list(a)) for s, e, a in pipe.timeline])
    measure.last[schedule] = [[(s, e, Action(*a)) for s, e, a in stage] for stage in timelines]
    return {"schedule": schedule, "virtual_stages": v, "stages": p, "microbatches": m,
            "bubble_measured": statistics.median(bubbles),
            "bubble_measured_per_stage": [r[0] for r in every],
            "bubble_formula": bubble_formula(schedule, p, m, v), "bubble_simulated": sim.bubble,
            "span_bubble_measured": statistics.median(span_bubbles), "span_bubble_simulated": sim.span_bubble,
            "step_ms": max(r[1] for r in every) * 1e3, "forward_ms": f * 1e3, "backward_ms": b * 1e3,
            "weight_ms": w * 1e3, "message_ms": comm * 1e3, "peak_in_flight": [r[4] for r in every],
            "peak_in_flight_simulated": sim.peak_chunk_activations,
            "peak_activation_bytes": [r[5] for r in every]}


measure.last = {}  # schedule -> every stage's measured timeline of its last point


def plot(path_stem: str, p: int) -> None:
    from pycollect.pipeline.plot import plot_timeline
    for schedule, timeline in measure.last.items():
        if schedule == "gpipe":
            continue
        m = 1 + max(a.micro for stage in timeline for _, _, a in stage)
        busy = sum(e - s for stage in timeline for s, e, _ in stage)
        span = max(stage[-1][1] for stage in timeline)
        caption = (f"measured: bubble {1 - busy / (p * span):.3f}, formula "
                   f"{bubble_formula(schedule, p, m, SCHEDULES[schedule]):.3f}")
        print("wrote", plot_timeline(timeline, p, title=f"{schedule}, {p} stages, m = {m} (measured)",
                                     caption=caption, path=f"{path_stem}-{schedule}.png"))


def main(argv) -> int:
    args = parse(argv)
    world = pc.Communicator()
    records = []
    for schedule in args.schedules:
        v = SCHEDULES[schedule]
        for m in args.microbatches:
            if schedule == "interleaved" and m % world.size or schedule.startswith("zb") and m < world.size:
                continue  # interleaving here in groups of p; the zero-bubble schedules need m >= p
            records.append(measure(world, schedule, v, m, args))
    if world.rank == 0:
        cols = [("schedule", "schedule", "{}"), ("microbatches", "m", "{}"), ("bubble_measured", "measured", "{:.3f}"),
                ("bubble_simulated", "simulated", "{:.3f}"), ("bubble_formula", "formula", "{:.3f}"),
                ("span_bubble_measured", "span meas.", "{:.3f}"), ("span_bubble_simulated", "span sim.", "{:.3f}"),
                ("step_ms", "step ms", "{:.1f}"), ("forward_ms", "F ms", "{:.2f}"), ("backward_ms", "B ms", "{:.2f}"),
                ("weight_ms", "W ms", "{:.2f}"), ("peak_in_flight", "in flight", "{}"),
                ("peak_activation_bytes", "activation bytes", "{}")]
        print(f"# pipeline bubble: {world.size} stages, rows {args.rows}, width {args.width}, "
              f"{args.layers} Linear+GeLU per stage, median of {args.trials} steps")
        print("\n".join(format_table(records, cols)))
        header = run_header(world, sys.argv, rows=args.rows, width=args.width, layers=args.layers, trials=args.trials)
        print("wrote", write_json(args.json, "pipeline_bubble", header, records))
        if args.plot:
            plot(args.plot.removesuffix(".png"), world.size)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

"""``pycollect bench fit``: fit latency and bandwidth per tier, predict every algorithm, write a tuning file.

1. Ping-pong between every pair at every size of the sweep (``bench tiers``' part 1), and
   ``np.add`` timed on every rank at once (gamma: the median rank's seconds per byte reduced).
2. Fit alpha (latency) and beta (seconds per byte) per tier by relative least squares on the
   one-way times (``pycollect.tools.costmodel``), and print them.
3. Time every algorithm of each collective at every size of the sweep (MPI's own too; a call's
   time is the slowest rank's median) and print the model's prediction beside each measurement.
4. Per size: the algorithm that measured fastest (MPI's own included) goes into the tuning file
   (``{"table": {collective: [[max_bytes, algorithm], ..., [null, algorithm]]}}``, read by
   ``PYCOLLECT_TUNING`` / ``Communicator(tuning=)``); beside it, the algorithm the model would
   pick and its predicted times (the why), and what ``auto`` runs now.
"""
from __future__ import annotations

import sys

from . import tiers
from .common import allgather_json, gather_json, pyplot, save_figure, size_sweep
from .report import format_table, human_size


def add_arguments(parser) -> None:
    tiers.add_sweep_arguments(parser, "4M", 10)
    parser.add_argument("--tuning-out", metavar="F", help="write the tuning file (best measured algorithm per size) to F")


def check_args(args) -> str | None:
    error = tiers.check_args(args)
    if error is None and len(size_sweep(args.min_bytes, args.max_bytes, args.factor)) < 2:
        error = (f"the sweep {human_size(args.min_bytes)}..{human_size(args.max_bytes)} by {args.factor} has one size; "
                 "fitting latency and bandwidth needs at least two")
    return error


# -- measuring ------------------------------------------------------------------------------------------
def measure_gamma(world) -> float:
    """Seconds per byte of ``np.add``, timed on every rank at once; the median rank's (on every rank)."""
    import statistics

    from .costmodel import measure_gamma as one_rank
    world.barrier()
    return statistics.median(allgather_json(world.mpi, one_rank()))


def sizes_of(collective: str, sizes: list[int], n: int) -> list[int]:
    """The sweep's sizes as the calls will really have them (split collectives round to n elements), deduplicated."""
    import numpy as np
    return list(dict.fromkeys(tiers.buffers(collective, s, n, np)[2] * 4 for s in sizes))


def measure(world, collectives: list[str], sizes: list[int], iters: int) -> list[dict] | None:
    """Every algorithm (MPI's own first) of every collective at every size; rows on rank 0 (None elsewhere)."""
    import numpy as np

    import pycollect as pc
    points, mine = [], []
    for collective in collectives:
        for size in sizes_of(collective, sizes, world.size):
            for algorithm in ["mpi", *(a for a in pc.algorithms(collective) if a not in ("mpi", "auto"))]:
                x, out, count = tiers.buffers(collective, size, world.size, np)
                world.barrier()
                mine.append(tiers.time_calls(world, collective, x, out, algorithm, iters, lambda: None))
                points.append((collective, count * 4, algorithm))
    everyone = gather_json(world.mpi, mine)
    if everyone is None:
        return None
    return [{"collective": c, "size_bytes": s, "algorithm": a, "iters": iters,
             "measured_us": max(m[i] for m in everyone) * 1e6} for i, (c, s, a) in enumerate(points)]


# -- model and choices (rank 0) -------------------------------------------------------------------------
def add_predictions(rows: list[dict], model, world) -> None:
    """``predicted_us`` on every schedule row (None on MPI's own, which has no schedule), in place."""
    from .costmodel import predict
    for r in rows:
        r["predicted_us"] = None if r["algorithm"] == "mpi" else predict(
            model, r["collective"], r["algorithm"], world.topology, r["size_bytes"], 4, world.pipeline_bytes) * 1e6


def calibrate_overhead(rows: list[dict], model, world):
    """The model with its per-round overhead fitted on each collective's smallest size (schedules only)."""
    import dataclasses

    from .costmodel import critical_rounds, fit_overhead
    smallest = {}
    for r in rows:
        if r["predicted_us"] is not None:
            smallest[r["collective"]] = min(smallest.get(r["collective"], r["size_bytes"]), r["size_bytes"])
    points = [(r["measured_us"] / 1e6, r["predicted_us"] / 1e6,
               critical_rounds(r["collective"], r["algorithm"], world.topology, r["size_bytes"], 4, world.pipeline_bytes))
              for r in rows if r["predicted_us"] is not None and r["size_bytes"] == smallest[r["collective"]]]
    return dataclasses.replace(model, overhead=fit_overhead(points))


def choices(rows: list[dict], world) -> list[dict]:
    """Per collective and size: fastest measured, the model's pick with its predictions, and what auto runs now."""
    out = []
    for key in dict.fromkeys((r["collective"], r["size_bytes"]) for r in rows):
        here = [r for r in rows if (r["collective"], r["size_bytes"]) == key]
        best = min(here, key=lambda r: r["measured_us"])
        predicted = {r["algorithm"]: r["predicted_us"] for r in here if r["predicted_us"] is not None}
        model_pick = min(predicted, key=predicted.__getitem__)
        measured_pick_predicted = predicted.get(best["algorithm"])
        out.append({"collective": key[0], "size_bytes": key[1], "measured_best": best["algorithm"],
                    "measured_best_us": best["measured_us"], "model_pick": model_pick,
                    "model_pick_measured_us": next(r["measured_us"] for r in here if r["algorithm"] == model_pick),
                    "predicted_us": dict(sorted(predicted.items(), key=lambda kv: kv[1])),
                    "measured_best_predicted_us": measured_pick_predicted,
                    "auto_now": world.auto_algorithm(key[0], key[1])})
    return out


def tuning_table(picks: list[dict]) -> dict[str, list]:
    """``{collective: [[max_bytes, algorithm], ..., [None, algorithm]]}``: runs of the same best merged.

    A row's limit is the largest measured size of its run; sizes between two measured ones go to the larger's pick.
    """
    table: dict[str, list] = {}
    for p in picks:
        rows = table.setdefault(p["collective"], [])
        if rows and rows[-1][1] == p["measured_best"]:
            rows[-1][0] = p["size_bytes"]
        else:
            rows.append([p["size_bytes"], p["measured_best"]])
    for rows in table.values():
        rows[-1][0] = None
    return table


def write_tuning(path: str, table: dict, world) -> str:
    """Write the tuning file, then read it back through ``select.load_tuning`` (which checks it)."""
    import datetime
    import json
    import os

    from ..engine.select import load_tuning
    path = os.path.abspath(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    doc = {"table": table, "source": "pycollect bench fit: the fastest measured algorithm per size",
           "world_size": world.size, "topology": world.topology.describe(),
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    load_tuning(path)
    return path


# -- output ---------------------------------------------------------------------------------------------
def model_table(model) -> list[str]:
    rows = [{"tier": t, "alpha": k.alpha * 1e6, "beta": k.beta * 1e9, "bw": k.bandwidth / 1e9,
             "samples": model.samples.get(t, 0)} for t, k in model.links.items()]
    return format_table(rows, [("tier", "tier", "{}"), ("alpha", "alpha us", "{:.2f}"),
                               ("beta", "beta ns/byte", "{:.4f}"), ("bw", "1/beta GB/s", "{:.3f}"),
                               ("samples", "samples", "{}")])


def rows_table(rows: list[dict]) -> list[str]:
    shown = [dict(r, size=human_size(r["size_bytes"]),
                  ratio=None if r["predicted_us"] is None else r["predicted_us"] / r["measured_us"]) for r in rows]
    return format_table(shown, [("collective", "collective", "{}"), ("size", "size", "{}"),
                                ("algorithm", "algorithm", "{}"), ("measured_us", "measured us", "{:.1f}"),
                                ("predicted_us", "predicted us", "{:.1f}"), ("ratio", "predicted/measured", "{:.2f}")])


def why_lines(picks: list[dict]) -> list[str]:
    lines = []
    for p in picks:
        pred = ", ".join(f"{a} {t:.1f}" for a, t in p["predicted_us"].items())
        agree = "agrees" if p["model_pick"] == p["measured_best"] else \
            f"measured {p['model_pick_measured_us']:.1f} us"
        lines.append(f"  {p['collective']} {human_size(p['size_bytes'])}: tuning -> {p['measured_best']} "
                     f"(measured {p['measured_best_us']:.1f} us); model picks {p['model_pick']} ({agree}); "
                     f"predicted us: {pred}; auto now runs {p['auto_now']}")
    return lines


def plot(path: str, rows: list[dict], title: str) -> str:
    """Measured (solid) and predicted (dashed) time against size, one panel per collective, log-log."""
    plt = pyplot()
    collectives = list(dict.fromkeys(r["collective"] for r in rows))
    fig, axes = plt.subplots(1, len(collectives), figsize=(5.5 * len(collectives), 4.2), squeeze=False)
    for ax, coll in zip(axes[0], collectives):
        here = [r for r in rows if r["collective"] == coll]
        for i, alg in enumerate(dict.fromkeys(r["algorithm"] for r in here)):
            line = [r for r in here if r["algorithm"] == alg]
            color = f"C{i}"
            ax.plot([r["size_bytes"] for r in line], [r["measured_us"] for r in line], "-o", color=color,
                    label=f"{alg} measured")
            pred = [r for r in line if r["predicted_us"] is not None]
            if pred:
                ax.plot([r["size_bytes"] for r in pred], [r["predicted_us"] for r in pred], "--x", color=color,
                        label=f"{alg} predicted")
        ax.set_title(coll)
        tiers.size_axis(ax, [r["size_bytes"] for r in here])
        ax.set_yscale("log")
        ax.set_xlabel("size (bytes)")
        ax.set_ylabel("time (us)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=6)
    fig.suptitle(title)
    fig.tight_layout()
    return save_figure(fig, path)


# -- the command ----------------------------------------------------------------------------------------
def run(args) -> int:
    error = check_args(args)
    if error:
        return tiers.usage_error(args, error)
    import pycollect as pc

    from .costmodel import fit_model
    from .report import run_header, write_json
    world = pc.Communicator()
    if world.size < 2:
        if world.rank == 0:
            sys.stderr.write(f"{args._prog}: error: fitting needs pairs of ranks; run under mpiexec -n 2 or more\n")
        return 1
    if args.plot and not tiers.plot_available(world):
        if world.rank == 0:
            sys.stderr.write(f"{args._prog}: error: --plot needs matplotlib (pip install 'pycollect[plot]')\n")
        return 1
    sizes = size_sweep(args.min_bytes, args.max_bytes, args.factor)
    pairs = tiers.measure_pairs(world, sizes, args.iters)
    gamma = measure_gamma(world)
    rows = measure(world, args.collectives, sizes, args.iters)
    if world.rank != 0:
        return 0
    model = fit_model(tiers.samples_by_tier(pairs), gamma)
    print(f"pycollect bench fit: {world.topology.describe()}")
    print(f"\ncost model (one-way time = alpha + bytes x beta per tier, from {len(pairs)} ping-pong samples; "
          f"reduction gamma = {gamma * 1e9:.4f} ns/byte = {1 / gamma / 1e9:.2f} GB/s)")
    print("\n".join(model_table(model)))
    picks, table, tuning_path = [], {}, None
    if rows:
        add_predictions(rows, model, world)
        model = calibrate_overhead(rows, model, world)
        add_predictions(rows, model, world)
        print(f"executor overhead per round (from the smallest calls): {model.overhead * 1e6:.1f} us")
        picks = choices(rows, world)
        table = tuning_table(picks)
        print("\npredicted beside measured (float32; measured = slowest rank's median call; mpi has no schedule to predict)")
        print("\n".join(rows_table(rows)))
        print("\nper size: the tuning file's choice (fastest measured), the model's pick and why")
        print("\n".join(why_lines(picks)))
        if args.tuning_out:
            tuning_path = write_tuning(args.tuning_out, table, world)
            print(f"\nwrote {tuning_path} (use: PYCOLLECT_TUNING={tuning_path} or Communicator(tuning=...))")
    elif args.tuning_out:
        print("\n--collectives none: no tuning file written")
    head = run_header(world, sizes=sizes, iters=args.iters, pipeline_bytes=world.pipeline_bytes)
    if args.json:
        path = write_json(args.json, "fit", head, rows or [], model=model.to_dict(), pairs=pairs, choices=picks,
                          tuning=table)
        print(f"wrote {path}")
    if args.plot:
        print(f"wrote {plot(args.plot, rows or [], world.topology.describe())}")
    sys.stdout.flush()
    return 0

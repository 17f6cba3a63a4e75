"""``pycollect bench fit``: fit the cost model, say how well it predicts sizes it did not see, write a tuning file.

1. Ping-pong between every pair at every size of the sweep (``bench tiers``' part 1), and
   ``np.add`` timed on every rank at once (gamma: the median rank's seconds per byte reduced).
2. Fit alpha (latency) and beta (seconds per byte) per tier by relative least squares on the
   one-way times (``pycollect.costmodel``): the ping-pong model.
3. Time every algorithm of each collective at every size of the sweep (MPI's own too; a call's
   time is the slowest rank's median).
4. Fit the model's terms on those calls (``pycollect.tools.costfit``: far rates past a crossover,
   copies, reductions, the bytes beside a round's slowest message, window fences, per-round and
   per-call overhead; alpha from step 2). Held
   out: the fit on half of the sizes predicts the other half, and the other way round; the
   error distribution is printed and written to the JSON (``heldout``). The model fitted on every
   size is the one printed beside the measurements and written (``model``).
5. Per measured size, the algorithm that measured fastest (MPI's own included); between two
   measured sizes, at their geometric mean, the model's pick (MPI's own time there interpolated
   from its two measured neighbours, as it has no schedule to price). Both go into the tuning file
   (``{"table": {collective: [[max_bytes, algorithm], ..., [null, algorithm]]}, "entries": [...]}``,
   each entry ``measured`` or ``predicted``; read by ``PYCOLLECT_TUNING`` / ``Communicator(tuning=)``);
   beside each measured size, the model's pick and its predicted times (the why), and what ``auto`` runs now.

``--from F`` (tools/refit.py) does steps 2-5 again, without MPI, from the measurements a run wrote to its JSON file F
(its ping-pong model, its calls with every pass's time, its topology): a change to the model or the fit
is judged on the same measurements, and a point's error set beside its own noise (``spread``: how far
the median pass sits above the fastest).
"""
from __future__ import annotations

import sys
from typing import Sequence

from . import tiers
from ..plotting import pyplot, save_figure
from .common import allgather_json, communicator, gather_json, int_at_least, refused_outputs, size_sweep
from .report import format_table, human_size


def add_arguments(parser) -> None:
    tiers.add_sweep_arguments(parser, "4M", 10)
    parser.add_argument("--passes", type=int_at_least(1), default=3, metavar="P",
                        help="measure every call P times over, in passes; each point keeps its fastest pass (default 3)")
    parser.add_argument("--tuning-out", metavar="F", help="write the tuning file (best measured algorithm per measured size, the model's pick between) to F")
    parser.add_argument("--from", dest="from_file", metavar="F",
                        help="measure nothing: fit again from the measurements in F (a `bench fit --json` file); no MPI")
    parser.set_defaults(measuring_defaults={dest: parser.get_default(dest) for dest in MEASURING})


# what only measuring reads (``--from`` refuses them): the flag of each
MEASURING = {"min_bytes": "-b/--min-bytes", "max_bytes": "-e/--max-bytes", "factor": "-f/--step-factor",
             "iters": "-n/--iters", "collectives": "--collectives", "passes": "--passes"}


def measuring_flags_given(args) -> list[str]:
    """The measuring flags set to other than their defaults (``--from`` measures nothing, so they would be lost)."""
    return [flag for dest, flag in MEASURING.items() if getattr(args, dest) != args.measuring_defaults[dest]]


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

    from ..costmodel import measure_gamma as one_rank
    world.barrier()
    return statistics.median(allgather_json(world.mpi, one_rank()))


def sizes_of(collective: str, sizes: list[int], n: int) -> list[int]:
    """The sweep's sizes as the calls will really have them (split collectives round to n elements), deduplicated."""
    import numpy as np
    return list(dict.fromkeys(tiers.buffers(collective, s, n, np)[2] * 4 for s in sizes))


def measure(world, collectives: list[str], sizes: list[int], iters: int, passes: int = 1) -> list[dict] | None:
    """Every algorithm (MPI's own first) of every collective at every size, ``passes`` times over; rows on rank 0.

    A pass's time of a call is the slowest rank's median; the row's ``measured_us`` is the least over
    the passes (``passes_us``): on a shared machine a neighbour's burst slows whole stretches of a
    pass, several seconds long, which a median over calls in a row cannot outvote.
    """
    import numpy as np

    import pycollect as pc
    points, mine = [], []
    for _ in range(passes):
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
    per_pass: dict[tuple, list[float]] = {}
    for i, key in enumerate(points):
        per_pass.setdefault(key, []).append(max(m[i] for m in everyone) * 1e6)
    return [{"collective": c, "size_bytes": s, "algorithm": a, "iters": iters, "measured_us": min(t), "passes_us": t}
            for (c, s, a), t in per_pass.items()]


# -- model and choices (rank 0) -------------------------------------------------------------------------
def degenerate(model) -> list[str]:
    """Why a fitted ping-pong model cannot be used, one line per tier: no cost per byte (1/beta infinite: the
    sweep's sizes did not show the bandwidth), or no cost at all."""
    out = []
    for tier, link in model.links.items():
        if link.beta <= 0 and not (link.beta_far or 0) > 0:
            out.append(f"the fit of tier {tier} is degenerate (beta 0 s/byte, 1/beta infinite, alpha "
                       f"{link.alpha * 1e6:.2f} us): the sweep's sizes did not show its bandwidth; measure larger "
                       f"messages (--max-bytes) or more calls (--iters); nothing was written")
    return out



def spread(row: dict) -> float | None:
    """How far the median pass of a row sits above its fastest (``passes_us``): the point's own noise."""
    import statistics
    passes = row.get("passes_us") or []
    return statistics.median(passes) / min(passes) - 1 if len(passes) > 1 else None


TRIM = 0.5   # a call the fit misses by more than this (and 4x the median miss) is set aside and the fit redone


def fit_calls(rows: list[dict], start, world):
    """``(model fitted on every size, held-out records, their statistics, the calls it set aside)`` from the
    schedules' rows; every held-out record carries its row's ``spread``. The fit finds the memory regime
    and sets aside the calls it misses by more than ``TRIM`` (``costfit.fit_trimmed``); they are still predicted
    and counted in the held-out error."""
    from . import costfit
    schedules = [r for r in rows if r["algorithm"] != "mpi"]
    points = [costfit.Point(r["collective"], r["algorithm"], r["size_bytes"], r["measured_us"] * 1e-6) for r in schedules]
    calls = costfit.Calls(points, world.topology, 4, world.tree_segment_bytes)
    model = costfit.fit(calls, start, memory=None, trim=TRIM)
    aside = [{"collective": p.collective, "algorithm": p.algorithm, "size_bytes": p.nbytes}
             for p, out in zip(points, costfit.outliers(model, calls, TRIM)) if out]
    if len(set(costfit.halves(points))) < 2:   # one size: nothing to hold out
        return model, [], None, aside
    held, _ = costfit.heldout(calls, start, memory=None, trim=TRIM)
    for record, row in zip(held, schedules):
        record["spread"] = spread(row)
    return model, held, costfit.summarize(held), aside


def add_predictions(rows: list[dict], model, world, held: Sequence[dict] = ()) -> None:
    """``predicted_us`` (and ``heldout_us``, ``heldout_error`` where ``held`` has the point) on every schedule
    row; None on MPI's own, which has no schedule. In place."""
    from ..costmodel import predict
    by_key = {(h["collective"], h["algorithm"], h["size_bytes"]): h for h in held}
    for r in rows:
        r["predicted_us"] = None if r["algorithm"] == "mpi" else predict(
            model, r["collective"], r["algorithm"], world.topology, r["size_bytes"], 4, world.tree_segment_bytes) * 1e6
        h = by_key.get((r["collective"], r["algorithm"], r["size_bytes"]))
        r["heldout_us"], r["heldout_error"] = (h["predicted_us"], h["error"]) if h else (None, None)


def choices(rows: list[dict], world) -> list[dict]:
    """Per collective and size: fastest measured, the model's pick with its predictions, and what auto runs now."""
    out = []
    for key in dict.fromkeys((r["collective"], r["size_bytes"]) for r in rows):
        here = [r for r in rows if (r["collective"], r["size_bytes"]) == key]
        best = min(here, key=lambda r: r["measured_us"])
        predicted = {r["algorithm"]: r["predicted_us"] for r in here if r["predicted_us"] is not None}
        if not predicted:   # MPI's own alone at this size (a trimmed file): no schedule for the model to pick
            continue
        model_pick = min(predicted, key=predicted.__getitem__)
        measured_pick_predicted = predicted.get(best["algorithm"])
        out.append({"collective": key[0], "size_bytes": key[1], "measured_best": best["algorithm"],
                    "measured_best_us": best["measured_us"], "model_pick": model_pick,
                    "model_pick_measured_us": next(r["measured_us"] for r in here if r["algorithm"] == model_pick),
                    "predicted_us": dict(sorted(predicted.items(), key=lambda kv: kv[1])),
                    "measured_best_predicted_us": measured_pick_predicted,
                    "auto_now": world.auto_algorithm(key[0], key[1])})
    return out


def between(rows: list[dict], model, world) -> list[dict]:
    """The model's pick at the geometric mean of each two neighbouring measured sizes of a collective.

    Every schedule is priced by the model; MPI's own, which has no schedule, gets its time there
    interpolated in log-log from its two measured neighbours (so it can still win where it won both).
    """
    import math

    from ..costmodel import predict
    out = []
    for coll in dict.fromkeys(r["collective"] for r in rows):
        mpi = {r["size_bytes"]: r["measured_us"] for r in rows if r["collective"] == coll and r["algorithm"] == "mpi"}
        names = list(dict.fromkeys(r["algorithm"] for r in rows if r["collective"] == coll and r["algorithm"] != "mpi"))
        sizes = sorted({r["size_bytes"] for r in rows if r["collective"] == coll})
        step = 4 * (1 if coll == "allreduce" else world.size)     # whole elements, split evenly where split
        for lo, hi in zip(sizes, sizes[1:]):
            mid = int(math.sqrt(lo * hi)) // step * step
            if not lo < mid < hi:
                continue
            times = {a: predict(model, coll, a, world.topology, mid, 4, world.tree_segment_bytes) * 1e6 for a in names}
            if lo in mpi and hi in mpi:
                w = math.log(mid / lo) / math.log(hi / lo)
                times["mpi"] = math.exp((1 - w) * math.log(mpi[lo]) + w * math.log(mpi[hi]))
            pick = min(times, key=times.__getitem__)
            out.append({"collective": coll, "size_bytes": mid, "algorithm": pick, "source": "predicted",
                        "predicted_us": dict(sorted(times.items(), key=lambda kv: kv[1]))})
    return out


def tuning_entries(picks: list[dict], predicted: list[dict]) -> list[dict]:
    """The measured picks and the predicted ones in one list, by collective and size."""
    measured = [{"collective": p["collective"], "size_bytes": p["size_bytes"], "algorithm": p["measured_best"],
                 "source": "measured"} for p in picks]
    order = {c: i for i, c in enumerate(dict.fromkeys(p["collective"] for p in measured + predicted))}
    return sorted(measured + [{k: p[k] for k in ("collective", "size_bytes", "algorithm", "source")} for p in predicted],
                  key=lambda e: (order[e["collective"]], e["size_bytes"]))


def tuning_table(entries: list[dict]) -> dict[str, list]:
    """``{collective: [[max_bytes, algorithm], ..., [None, algorithm]]}`` from entries in size order; runs of the same
    algorithm merged. A row's limit is the largest size of its run; sizes between two entries go to the larger's."""
    table: dict[str, list] = {}
    for p in entries:
        rows = table.setdefault(p["collective"], [])
        if rows and rows[-1][1] == p["algorithm"]:
            rows[-1][0] = p["size_bytes"]
        else:
            rows.append([p["size_bytes"], p["algorithm"]])
    for rows in table.values():
        rows[-1][0] = None
    return table


def write_tuning(path: str, table: dict, entries: list[dict], world, model=None) -> str:
    """Write the tuning file, then read it back through ``select.load_tuning`` (which checks it). With ``model``
    it carries the fitted cost model too, so one file serves ``PYCOLLECT_TUNING`` (its table) and
    ``pycollect plan --tuning`` (its model)."""
    import datetime
    import json
    import os

    from ..select import load_tuning
    path = os.path.abspath(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    doc = {"table": table, "entries": entries,
           "source": "pycollect bench fit: the fastest measured algorithm per measured size; between two, the "
                     "cost model's pick (entries: measured or predicted)",
           "world_size": world.size, "topology": world.topology.describe(),
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    if model is not None:
        doc["model"] = model.to_dict()
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    load_tuning(path)
    return path


# -- output ---------------------------------------------------------------------------------------------
def model_table(model) -> list[str]:
    # no bandwidth where the fit put no cost per byte on the wire (it went to other terms): not "inf GB/s"
    rows = [{"tier": t, "alpha": k.alpha * 1e6, "beta": k.beta * 1e9, "bw": k.bandwidth / 1e9 if k.beta > 0 else None,
             "far": None if k.far_bytes is None else human_size(k.far_bytes),
             "beta_far": None if k.far_bytes is None else k.beta_far * 1e9,
             "shared": k.beta_shared * 1e9 if k.beta_shared else None,
             "samples": model.samples.get(t, 0)} for t, k in model.links.items()]
    return format_table(rows, [("tier", "tier", "{}"), ("alpha", "alpha us", "{:.2f}"),
                               ("beta", "beta ns/byte", "{:.4f}"), ("bw", "1/beta GB/s", "{:.3f}"),
                               ("far", "far from", "{}"), ("beta_far", "beta far ns/byte", "{:.4f}"),
                               ("shared", "beside the slowest ns/byte", "{:.4f}"),
                               ("samples", "samples", "{}")])


def local_line(model) -> str:
    """The terms a ping-pong does not see, in one line."""
    def rate(near, far):
        text = f"{near * 1e9:.4f}"
        return text if model.cache_bytes is None else f"{text} (past {human_size(model.cache_bytes)}: {far * 1e9:.4f})"
    memory = "" if model.memory_bytes is None else (
        f"; past a node's working set of {human_size(model.memory_bytes)}, from memory: reduce "
        f"{(model.gamma_memory or 0) * 1e9:.4f}, copy {(model.copy_memory or 0) * 1e9:.4f}"
        + "".join(f", {t} {k.beta_memory * 1e9:.4f}" for t, k in model.links.items() if k.beta_memory is not None)
        + " ns/byte")
    return (f"reduce {rate(model.gamma, model.gamma_far)} ns/byte; copy {rate(model.copy, model.copy_far)} ns/byte; "
            f"overhead {model.overhead * 1e6:.1f} us a round, {model.call_overhead * 1e6:.1f} us a call, "
            f"{model.fence * 1e6:.1f} us a window fence; data the call wrote, fetched by a peer {model.dirty * 1e9:.4f} "
            f"ns/byte more{memory}" + ("; a round that only sends pays no latency" if model.eager_sends else ""))


def rows_table(rows: list[dict]) -> list[str]:
    shown = [dict(r, size=human_size(r["size_bytes"]),
                  ratio=None if r["predicted_us"] is None else r["predicted_us"] / r["measured_us"],
                  held=None if r.get("heldout_error") is None else 100 * r["heldout_error"]) for r in rows]
    return format_table(shown, [("collective", "collective", "{}"), ("size", "size", "{}"),
                                ("algorithm", "algorithm", "{}"), ("measured_us", "measured us", "{:.1f}"),
                                ("predicted_us", "predicted us", "{:.1f}"), ("ratio", "predicted/measured", "{:.2f}"),
                                ("heldout_us", "held-out us", "{:.1f}"), ("held", "held-out error %", "{:+.0f}")])


def error_lines(stats: dict) -> list[str]:
    """The held-out error distribution: all sizes, from the target's size up, and per half fitted on."""
    def line(name, st):
        if not st["count"]:
            return f"  {name}: no points"
        return (f"  {name}: {st['count']} points, |error| median {100 * st['median']:.1f}%, p90 {100 * st['p90']:.1f}%, "
                f"max {100 * st['max']:.1f}%; within {100 * st['target']:.0f}%: {100 * st['within']:.0f}%")
    big = f">= {human_size(stats['from_bytes'])}"
    quiet = [line(f"{big}, quiet (median pass within {100 * stats['quiet_spread']:.0f}% of the fastest)", stats["quiet"])] \
        if "quiet" in stats else []
    misses = [f"  miss: {m['collective']} {m['algorithm']} {human_size(m['size_bytes'])} {100 * m['error']:+.0f}%"
              + ("" if m.get("spread") is None else f" (its median pass {100 * m['spread']:.0f}% above its fastest)")
              for m in stats.get("misses", [])]
    return [line("all sizes", stats["all"]), line(big, stats["from"])] + quiet + \
        [line(f"{big}, fitted on half {k}", st) for k, st in stats["by_half"].items()] + \
        [line(f"{big}, {name}", stats[key]) for key, name in (
            ("between", "sizes between the smallest and largest of the half fitted on (interpolated)"),
            ("beyond", "sizes beyond them (extrapolated)")) if key in stats] + \
        [line(f"{human_size(int(size))}", st) for size, st in stats["by_size"].items()] + misses


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
    from ..costmodel import fit_model
    world = communicator(args.prog_name)
    if world is None:
        return 2
    refused = refusal(args, world)
    if refused is None:
        refused = refused_outputs(world, args.prog_name, output_files(args))   # matplotlib too, for --plot
    if refused is not None:
        return refused
    sizes = size_sweep(args.min_bytes, args.max_bytes, args.factor)
    pairs = tiers.measure_pairs(world, sizes, args.iters)
    gamma = measure_gamma(world)
    rows = measure(world, args.collectives, sizes, args.iters, args.passes)
    if world.rank != 0:
        return 0
    assert pairs is not None and rows is not None   # rank 0 gathers every rank's records
    pingpong = fit_model(tiers.samples_by_tier(pairs), gamma)
    bad = degenerate(pingpong)
    if bad:   # a model with infinite bandwidth would go on into the tuning file and the planner: say so, stop
        for line in bad:
            sys.stderr.write(f"{args.prog_name}: error: {line}\n")
        return 1
    print(f"pycollect bench fit: {world.topology.describe()}")
    print(f"\nping-pong model (one-way time = alpha + bytes x beta per tier, from {len(pairs)} samples; "
          f"np.add gamma = {gamma * 1e9:.4f} ns/byte = {1 / gamma / 1e9:.2f} GB/s)")
    print("\n".join(model_table(pingpong)))
    fitted = {"model": pingpong, "choices": [], "tuning": {}, "tuning_entries": [], "held": [], "stats": None}
    if rows:
        fitted = fit_and_report(args, rows, pingpong, world)
    elif args.tuning_out:
        print("\n--collectives none: no tuning file written")
    if args.json:
        from .report import run_header
        head = run_header(world, sizes=sizes, iters=args.iters, passes=args.passes,
                          tree_segment_bytes=world.tree_segment_bytes)
        print(f"wrote {write_fit(args, head, rows, pingpong, pairs, fitted)}")
    if args.plot:
        print(f"wrote {plot(args.plot, rows or [], world.topology.describe())}")
    sys.stdout.flush()
    return 0


def output_files(args) -> tuple:
    """The files this command writes, by flag (None: not asked for)."""
    return (("--json", args.json), ("--tuning-out", args.tuning_out), ("--plot", args.plot))


def refusal(args, world) -> int | None:
    """Exit status 2 (rank 0 says why) for a world without pairs of ranks."""
    if world.size < 2:
        if world.rank == 0:
            sys.stderr.write(f"{args.prog_name}: error: fitting needs pairs of ranks; run under mpiexec -n 2 or more\n")
        return 2
    return None


def fit_and_report(args, rows: list[dict], pingpong, world) -> dict:
    """Rank 0: the model fitted on the measured calls, predictions beside measurements, held-out error, the
    tuning file's choices (written with ``--tuning-out``); returns what the JSON file holds of them."""
    model, held, stats, aside = fit_calls(rows, pingpong, world)
    add_predictions(rows, model, world, held)
    print("\nmodel fitted on the measured calls (alpha from the ping-pong)")
    print("\n".join(model_table(model)))
    print(local_line(model))
    if aside:
        print(f"set aside by the fit (missed by more than {100 * TRIM:.0f}% and 4x the median miss; still predicted "
              f"below): " + ", ".join(f"{a['collective']} {a['algorithm']} {human_size(a['size_bytes'])}" for a in aside))
    picks = choices(rows, world)
    entries = tuning_entries(picks, between(rows, model, world))
    table = tuning_table(entries)
    print("\npredicted beside measured (float32; measured = slowest rank's median call; mpi has no schedule to "
          "predict; predicted: the fit on every size; held-out: the fit on the other half of the sizes)")
    print("\n".join(rows_table(rows)))
    print("\nheld-out error (each size predicted by the fit on the other half of the sizes)")
    print("\n".join(error_lines(stats)) if stats else "  one size measured: nothing to hold out")
    print("\nper size: the tuning file's choice (fastest measured), the model's pick and why")
    print("\n".join(why_lines(picks)))
    if args.tuning_out:
        tuning_path = write_tuning(args.tuning_out, table, entries, world, model)
        print(f"\nwrote {tuning_path} ({sum(e['source'] == 'predicted' for e in entries)} of its {len(entries)} "
              f"entries predicted; use: PYCOLLECT_TUNING={tuning_path} or Communicator(tuning=...))")
    return {"model": model, "choices": picks, "tuning": table, "tuning_entries": entries, "held": held,
            "stats": stats, "set_aside": aside}


def write_fit(args, head: dict, rows: list[dict], pingpong, pairs, fitted: dict) -> str:
    """The ``--json`` file (kind ``fit``): the measured rows, both models, the pairs, the choices, held-out error."""
    from .report import write_json
    return write_json(args.json, "fit", head, rows or [], model=fitted["model"].to_dict(),
                      pingpong_model=pingpong.to_dict(), pairs=pairs, choices=fitted["choices"],
                      tuning=fitted["tuning"], tuning_entries=fitted["tuning_entries"],
                      heldout={"stats": fitted["stats"], "points": fitted["held"]}, set_aside=fitted.get("set_aside", []))


"""The cluster simulator (pycollect/clustersim.py) against measured calls on this machine.

    env OMP_NUM_THREADS=1 mpiexec -n 4 python3 bench/cluster_sim_check.py \\
        --json bench/results/<date>-cluster-sim-4ranks.json
    (two simulated nodes: MPIR_CVAR_NUM_CLIQUES=2 MPIR_CVAR_CLIQUES_BY_BLOCK=1 UCX_TLS=tcp,self before mpiexec)

1. Fit the model here, as ``pycollect bench fit`` does: ping-pong between every pair (alpha, beta per
   tier) and ``np.add`` (gamma), with the same functions.
2. Time every schedule of each collective at a few sizes (the slowest rank's median call).
3. Calibrate the per-round overhead on the smallest size (the median residue per critical round of the
   simulator's prediction), then predict every row with the simulator (NIC ports: a port a message, and
   ``--nics-per-node``) and, beside it, with ``costmodel.predict`` (each rank on its own).
4. Once more with links fitted only on the ping-pong sizes near the call's messages (``banded``): one
   straight line over 8 bytes..8 MiB misses how bandwidth falls off at large sizes here (out of cache),
   and the banded fit shows how much of the gap is the line rather than the simulator.
Rows of the calibration size fit the overhead, so their ratio is near 1 by construction; the other sizes
are the check. Window schedules (shm, one node) are priced as their messages, without the fence.
After the timing, every schedule timed makes one call of its collective at each size on inputs that differ by rank
and element, compared with MPI's own regular call (``wrong``); a wrong schedule's rows are left out of the
calibration, the rows and the summary, named in the JSON's ``failed``, and the exit status is 1 on every rank.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import sys

import pycollect as pc
from pycollect.tools import fit, tiers
from pycollect.clustersim import Cluster, predict
from pycollect.tools.common import size_sweep
from pycollect.costmodel import critical_rounds, fit_link, fit_model, fit_overhead
from pycollect.costmodel import predict as alpha_beta
from pycollect.tools.report import format_table, human_size, parse_size, run_header, write_json

COLLECTIVES = ("allreduce", "reduce_scatter", "allgather")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="1K,64K,1M,8M", help="call sizes, the first calibrates the overhead")
    p.add_argument("--pair-max", default="8M", help="largest ping-pong size (from 8 bytes by 4x)")
    p.add_argument("--iters", type=int, default=10, help="timed calls (and round trips) per point")
    p.add_argument("--collectives", default=",".join(COLLECTIVES))
    p.add_argument("--nics-per-node", type=int, default=1, help="the shared-NIC variant's ports per node")
    p.add_argument("--json", required=True)
    return p.parse_args(argv)


def simulated(model, nics, row, world) -> float:
    """Seconds the simulator predicts for a measured row."""
    got = predict(Cluster(model, nics), row["collective"], row["algorithm"], world.topology, row["size_bytes"], 4,
                  world.tree_segment_bytes)
    return got.seconds


def calibrate(model, rows, world):
    """The model with its per-round overhead fitted to the smallest calls through the simulator."""
    small = min(r["size_bytes"] for r in rows)
    points = [(r["measured_us"] / 1e6, simulated(model, None, r, world),
               critical_rounds(r["collective"], r["algorithm"], world.topology, r["size_bytes"], 4,
                               world.tree_segment_bytes))
              for r in rows if r["size_bytes"] == small]
    return dataclasses.replace(model, overhead=fit_overhead(points)), small


def banded(model, pairs, size: int, ranks: int):
    """The model with alpha and beta refitted on the ping-pong sizes from size/(4 ranks) to 4 size (the call's
    messages run from about size/ranks to size), widened to the nearest three sizes where fewer fall inside."""
    samples = tiers.samples_by_tier(pairs)
    links = {}
    for tier, points in samples.items():
        sizes = sorted({b for b, _ in points})
        inside = [b for b in sizes if size / (4 * ranks) <= b <= 4 * size]
        if len(inside) < 2:
            inside = sorted(sizes, key=lambda b: abs(math.log(b / size)))[:3]
        links[tier] = fit_link([(b, t) for b, t in points if b in inside])
    return dataclasses.replace(model, links=links)


def check_results(world, collectives, sizes) -> dict:
    """After the timing: every algorithm ``fit.measure`` timed, one call of each collective at each size (its
    buffers as ``tiers.buffers`` makes them, the input small integers different on every rank and along it, ``out``
    filled with NaN) against MPI's own regular call on the same input; wrong elements summed over ranks, keyed by
    (collective, size_bytes, algorithm). A changed input counts too."""
    import numpy as np
    from mpi4py import MPI
    mpi = {"allreduce": lambda x, o: world.mpi.Allreduce(x, o, MPI.SUM),
           "reduce_scatter": lambda x, o: world.mpi.Reduce_scatter_block(x, o, MPI.SUM),
           "allgather": lambda x, o: world.mpi.Allgather(x, o)}
    keys, wrong = [], []
    for collective in collectives:
        for size in fit.sizes_of(collective, sizes, world.size):
            x, out, count = tiers.buffers(collective, size, world.size, np)
            x[...] = np.arange(x.size) % 7 + 1 + world.rank
            given = x.copy()
            expected = np.full_like(out, np.nan)
            mpi[collective](given.copy(), expected)
            for algorithm in [a for a in pc.algorithms(collective) if a not in ("mpi", "auto")]:
                out[...] = np.nan
                getattr(world, collective)(x, algorithm=algorithm, out=out)
                keys.append((collective, count * 4, algorithm))
                wrong.append(int(np.count_nonzero(out != expected) + np.count_nonzero(x != given)))
                x[...] = given
    total = np.array(wrong, np.int64)
    world.mpi.Allreduce(MPI.IN_PLACE, total, op=MPI.SUM)
    return dict(zip(keys, total.tolist()))


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    world = pc.Communicator()
    collectives = args.collectives.split(",")
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    pairs = tiers.measure_pairs(world, size_sweep(8, parse_size(args.pair_max), 4), args.iters)
    gamma = fit.measure_gamma(world)
    measured = fit.measure(world, collectives, sizes, args.iters)
    wrong = check_results(world, collectives, sizes)   # after the timed calls, every schedule against MPI's own
    failed = [f"{c} {human_size(n)} {a}: {w} wrong elements" for (c, n, a), w in wrong.items() if w]
    if world.rank != 0:
        return 1 if failed else 0
    rows = [dict(r, wrong=wrong.get((r["collective"], r["size_bytes"], r["algorithm"]))) for r in measured
            if r["algorithm"] != "mpi" and not wrong.get((r["collective"], r["size_bytes"], r["algorithm"]))]
    model, small = calibrate(fit_model(tiers.samples_by_tier(pairs), gamma), rows, world)
    for r in rows:
        r["calibration"] = r["size_bytes"] == small
        r["simulated_us"] = simulated(model, None, r, world) * 1e6
        r["simulated_nics_us"] = simulated(model, args.nics_per_node, r, world) * 1e6
        r["alpha_beta_us"] = alpha_beta(model, r["collective"], r["algorithm"], world.topology, r["size_bytes"], 4,
                                        world.tree_segment_bytes) * 1e6
        r["ratio"] = r["simulated_us"] / r["measured_us"]
        r["ratio_nics"] = r["simulated_nics_us"] / r["measured_us"]
        near = banded(model, pairs, r["size_bytes"], world.size)
        r["simulated_banded_us"] = simulated(near, None, r, world) * 1e6
        r["ratio_banded"] = r["simulated_banded_us"] / r["measured_us"]
    checked = [r for r in rows if not r["calibration"]]
    summary = {"median_ratio": statistics.median(r["ratio"] for r in checked),
               "median_ratio_nics": statistics.median(r["ratio_nics"] for r in checked),
               "median_ratio_banded": statistics.median(r["ratio_banded"] for r in checked),
               "worst_over": max(r["ratio"] for r in checked), "worst_under": min(r["ratio"] for r in checked),
               "nics_per_node": args.nics_per_node, "calibration_bytes": small}
    print(f"cluster simulator against measurement: {world.topology.describe()}")
    links = ", ".join(f"{t} alpha {k.alpha * 1e6:.1f} us, {k.bandwidth / 1e9:.2f} GB/s" for t, k in model.links.items())
    print(f"model: {links}; gamma {model.gamma * 1e9:.3f} ns/B; overhead {model.overhead * 1e6:.1f} us/round "
          f"(fit at {human_size(small)})")
    shown = [dict(r, size=human_size(r["size_bytes"])) for r in rows]
    print("\n".join(format_table(shown, [
        ("collective", "collective", "{}"), ("size", "size", "{}"), ("algorithm", "algorithm", "{}"),
        ("measured_us", "measured us", "{:.1f}"), ("simulated_us", "simulated us", "{:.1f}"),
        ("ratio", "sim/meas", "{:.2f}"), ("simulated_nics_us", f"{args.nics_per_node} NIC us", "{:.1f}"),
        ("ratio_nics", "sim/meas", "{:.2f}"), ("simulated_banded_us", "banded us", "{:.1f}"),
        ("ratio_banded", "sim/meas", "{:.2f}"), ("alpha_beta_us", "alpha-beta us", "{:.1f}"),
        ("calibration", "calibrates", "{}")])))
    print(f"median simulated/measured outside calibration {summary['median_ratio']:.2f} "
          f"(range {summary['worst_under']:.2f}..{summary['worst_over']:.2f}); "
          f"with {args.nics_per_node} NIC(s) a node {summary['median_ratio_nics']:.2f}; "
          f"banded fit {summary['median_ratio_banded']:.2f}")
    head = run_header(world, sizes=sizes, iters=args.iters, tree_segment_bytes=world.tree_segment_bytes)
    if failed:
        print(f"FAILED: results differ from MPI's own after the timed calls (their rows left out): {'; '.join(failed)}")
    print(write_json(args.json, "cluster-sim-check", head, rows, model=model.to_dict(), summary=summary, pairs=pairs,
                     failed=failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

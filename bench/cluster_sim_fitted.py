"""The cluster simulator with the model ``pycollect bench fit`` fitted, against the calls that fit measured.

    python3 bench/cluster_sim_fitted.py bench/results/2026-12-01-fit-2ranks.json \\
        --json bench/results/2026-12-01-cluster-sim-fitted-2ranks.json

For every schedule row of the fit's JSON from ``--min-bytes`` up: the simulator's time (pycollect/clustersim.py,
a port a message, on the fit's own topology), the cost model's (``costmodel.predict``) and the measured one. The fit's model is fitted
on every size of the file, so these ratios are in-sample; ``bench fit``'s own held-out errors are the check on
sizes it was not fitted on. No MPI: it reads the file.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys

from pycollect.engine.topology import Topology
from pycollect.clustersim import Cluster, predict
from pycollect.costmodel import Model
from pycollect.costmodel import predict as cost_model
from pycollect.tools.report import host_header, parse_size, write_json


def compare(fit: dict, topology: Topology, min_bytes: int) -> list[dict]:
    model, ranks = Model.from_dict(fit["model"]), topology.size
    rows = []
    for r in fit["records"]:
        if r["algorithm"] == "mpi" or r["size_bytes"] < min_bytes or r["measured_us"] is None:
            continue
        simulated = predict(Cluster(model), r["collective"], r["algorithm"], topology, r["size_bytes"], 4).seconds
        priced = cost_model(model, r["collective"], r["algorithm"], topology, r["size_bytes"], 4)
        rows.append({"collective": r["collective"], "algorithm": r["algorithm"], "size_bytes": r["size_bytes"],
                     "ranks": ranks, "measured_us": r["measured_us"], "simulated_us": simulated * 1e6,
                     "cost_model_us": priced * 1e6, "ratio": simulated * 1e6 / r["measured_us"]})
    return rows


def summary(rows: list[dict]) -> dict:
    ratios = [r["ratio"] for r in rows]
    deciles = statistics.quantiles(ratios, n=10) if len(ratios) > 1 else ratios * 9
    return {"rows": len(rows), "median_ratio": statistics.median(ratios), "p10": deciles[0], "p90": deciles[-1],
            "within_25pct": sum(abs(x - 1) <= 0.25 for x in ratios) / len(ratios),
            "simulator_equals_cost_model": sum(abs(r["simulated_us"] - r["cost_model_us"]) <= 1e-6 * r["cost_model_us"]
                                               for r in rows)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("fit", help="a JSON file `pycollect bench fit --json` wrote")
    p.add_argument("--min-bytes", type=parse_size, default=32 << 10, help="smallest call compared (default 32K)")
    p.add_argument("--json", help="write the rows and their summary here")
    args = p.parse_args(argv)
    with open(args.fit) as f:
        fit = json.load(f)
    rows = compare(fit, Topology(tuple(fit["header"]["node_of"])), args.min_bytes)
    if not rows:
        p.error(f"no schedule rows of {args.fit} from {args.min_bytes} bytes")
    s = summary(rows)
    print(f"{args.fit}: {s['rows']} rows, simulated/measured median {s['median_ratio']:.2f} "
          f"(p10 {s['p10']:.2f}, p90 {s['p90']:.2f}), within 25%: {s['within_25pct']:.0%}; "
          f"simulator = cost model on {s['simulator_equals_cost_model']} rows")
    if args.json:
        print(write_json(args.json, "cluster-sim-fitted", host_header(sys.argv, fit=args.fit), rows, summary=s))
    return 0


if __name__ == "__main__":
    sys.exit(main())

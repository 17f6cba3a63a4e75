"""How long the tools take at cluster scale: ``pc.traffic`` of every schedule and ``pycollect plan`` searches.

    PYTHONPATH=. python3 bench/scale.py --json bench/results/<date>-scale.json

Each algorithm is counted at 512, 4096 and 16384 ranks (nodes of 8, 1 GiB of float32; the
all-to-alls 1 MiB a rank), from the smallest size up; a size is skipped when the one before it, scaled
as N^2, would take longer than ``--budget`` seconds. Then the planner's full
searches of issue 15 (gpt3-175b on 1024 GPUs, batch 1536; the 530B and 1T rows of Narayanan et al. 2021
on 2520 and 3072 GPUs). Then the cluster simulator (``pycollect explain ... --predict``) on every
schedule at 16384 ranks on 2048 nodes (nvlink4 and ib-ndr, 8 NICs a node): its counted forms in
lockstep, the others walked within its step limit or declined. Then ``pycollect explain COLLECTIVE
--algorithm all`` at the largest size (one process each, as a user runs it) beside ``import pycollect``
alone. No MPI but explain's; seconds of wall clock, each run once (a shared machine: compare orders of
magnitude, not percent).
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time

import pycollect as pc
from pycollect.algorithms import registry
from pycollect.engine.topology import Topology
from pycollect.tools.report import host_header, write_json

SIZES = (512, 4096, 16384)
PLANS = [("gpt3-175b", 1024, 1536), ("megatron-529.6b", 2520, 2520), ("megatron-1008b", 3072, 3072)]


def traffic_times(budget: float, sizes=SIZES) -> list[dict]:
    records = []
    for collective in registry.COLLECTIVES:
        for algorithm in registry.schedule_algorithms(collective):
            nbytes = (1 << 20) if collective == "alltoall" else (1 << 30)
            last, before = 0.0, 1
            for size in sizes:
                record = {"kind": "traffic", "collective": collective, "algorithm": algorithm, "ranks": size,
                          "nodes": size // 8, "seconds": None}
                if last * (size / before) ** 2 <= budget:   # as if O(N^2): what the slow ones are
                    before = size
                    start = time.perf_counter()
                    pc.traffic(collective, algorithm, size=size, nbytes=nbytes, topology=Topology.uniform(size, 8))
                    last = record["seconds"] = time.perf_counter() - start
                records.append(record)
                took = "skipped" if record["seconds"] is None else f"{record['seconds']:.3f} s"
                print(f"{collective:15s} {algorithm:20s} {size:6d} ranks: {took}", flush=True)
    return records


def simulate_times(size: int = 16384, per_node: int = 8) -> list[dict]:
    """Wall seconds of ``clustersim.predict`` for every schedule, and how it simulated (or why not)."""
    from pycollect.plan.config import links_from_presets
    from pycollect.clustersim import Cluster, predict
    cluster, topo = Cluster(links_from_presets("nvlink4", "ib-ndr"), 8), Topology.uniform(size, per_node)
    records = []
    for collective in registry.COLLECTIVES:
        for algorithm in registry.schedule_algorithms(collective):
            nbytes = (1 << 20) if collective == "alltoall" else (1 << 30)
            start = time.perf_counter()
            got = predict(cluster, collective, algorithm, topo, nbytes, 4, 1 << 20)
            seconds = time.perf_counter() - start
            records.append({"kind": "simulate", "collective": collective, "algorithm": algorithm, "ranks": size,
                            "nodes": topo.num_nodes, "seconds": seconds, "method": got.method,
                            "predicted_s": got.seconds, "busbw_GBps": got.to_dict()["busbw_GBps"], "note": got.note})
            print(f"simulate {collective:15s} {algorithm:20s} {size} ranks: {seconds:.2f} s ({got.method}"
                  f"{', ' + got.note if got.note else ''})", flush=True)
    return records


def plan_times() -> list[dict]:
    records = []
    for model, gpus, batch in PLANS:
        cmd = [sys.executable, "-m", "pycollect", "plan", "--model", model, "--gpus", str(gpus),
               "--gpus-per-node", "8", "--batch", str(batch), "--top", "1"]
        start = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        seconds = time.perf_counter() - start
        records.append({"kind": "plan", "model": model, "gpus": gpus, "batch": batch, "seconds": seconds,
                        "ok": proc.returncode == 0, "command": " ".join(cmd[1:])})
        print(f"plan {model} on {gpus} GPUs: {seconds:.1f} s (exit {proc.returncode})", flush=True)
    return records


def explain_times(size: int, per_node: int = 8) -> list[dict]:
    """Wall seconds of ``pycollect explain COLLECTIVE --algorithm all`` at ``size`` ranks, one process per
    collective as a user runs it, beside the interpreter's start and ``import pycollect`` alone (what every
    command pays before its work)."""
    base = [sys.executable, "-c", "import pycollect"]
    start = time.perf_counter()
    subprocess.run(base, check=True, capture_output=True, timeout=600)
    records = [{"kind": "import", "seconds": time.perf_counter() - start, "command": "python3 -c 'import pycollect'"}]
    print(f"import pycollect: {records[0]['seconds']:.2f} s", flush=True)
    for collective in registry.COLLECTIVES:
        nbytes = "1M" if collective == "alltoall" else "1G"
        cmd = [sys.executable, "-m", "pycollect", "explain", collective, "--algorithm", "all", "--size", str(size),
               "--bytes", nbytes, "--nodes", str(size // per_node)]
        start = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        seconds = time.perf_counter() - start
        records.append({"kind": "explain", "collective": collective, "ranks": size, "nodes": size // per_node,
                        "seconds": seconds, "ok": proc.returncode == 0, "command": " ".join(cmd[1:])})
        print(f"explain {collective:15s} {size} ranks: {seconds:.2f} s (exit {proc.returncode})", flush=True)
    return records


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--budget", type=float, default=30.0, help="skip a size whose count would take longer (s, as N^2)")
    p.add_argument("--sizes", default=",".join(map(str, SIZES)), help="rank counts, comma separated (multiples of 8)")
    p.add_argument("--no-plan", action="store_true", help="without the planner's searches")
    p.add_argument("--no-traffic", action="store_true", help="without the traffic counts")
    p.add_argument("--no-simulate", action="store_true", help="without the cluster simulator at 16384 ranks")
    p.add_argument("--no-explain", action="store_true", help="without pycollect explain --algorithm all at 16384 ranks")
    p.add_argument("--json", default="bench/results/scale.json")
    args = p.parse_args(argv)
    sizes = tuple(int(v) for v in args.sizes.split(","))
    records = (([] if args.no_traffic else traffic_times(args.budget, sizes)) + ([] if args.no_plan else plan_times())
               + ([] if args.no_simulate else simulate_times()) + ([] if args.no_explain else explain_times(max(sizes))))
    print(write_json(args.json, "scale", host_header(sys.argv), records))
    return 0


if __name__ == "__main__":
    sys.exit(main())

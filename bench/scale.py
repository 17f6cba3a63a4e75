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
alone. ``--shapes`` adds the shapes the counted forms once left to the walk (``shaped_call``: off powers of
two, uneven nodes, fewer elements than ranks, uneven counts) to the counts, and to explain where its flags
reach them. No MPI but explain's; seconds of wall clock, each run once (a shared machine: compare orders of
magnitude, not percent), and the CPU seconds of the counts and explain runs (``cpu_seconds``: what a loaded machine
leaves closer to a quiet one's wall clock). A plan or explain run that failed (a non-zero exit, or over its timeout:
``ok`` false) has no ``seconds`` (nor ``cpu_seconds``; the time it took is kept as ``seconds_failed``), is named in
the JSON's ``failed`` and makes the exit status 1.
"""
from __future__ import annotations

import argparse
import random
import resource
import subprocess
import sys
import time

import pycollect as pc
from dataclasses import replace

from pycollect.algorithms import registry
from pycollect.engine.shapes import even_problem
from pycollect.engine.topology import Topology
from pycollect.engine.traffic import count_summaries
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
                    start, cpu = time.perf_counter(), time.process_time()
                    pc.traffic(collective, algorithm, size=size, nbytes=nbytes, topology=Topology.uniform(size, 8))
                    last = record["seconds"] = time.perf_counter() - start
                    record["cpu_seconds"] = time.process_time() - cpu
                records.append(record)
                took = "skipped" if record["seconds"] is None else f"{record['seconds']:.3f} s"
                print(f"{collective:15s} {algorithm:20s} {size:6d} ranks: {took}", flush=True)
    return records


SHAPES = ("3/4", "minus-1", "uneven-nodes", "small", "uneven-counts", "segments")
SEGMENTED = ("allreduce", "broadcast", "reduce", "scan")   # the collectives with a schedule that cuts segments


def shaped_call(collective: str, shape: str, size: int, rng: random.Random):
    """``(problem, topology)`` of one of the shapes the counted forms once left to the walk, at about ``size`` ranks:
    "3/4" (3N/4 ranks on nodes of 8: off powers of two), "minus-1" (N-1 ranks on nodes of 8, the last of 7),
    "uneven-nodes" (N ranks on nodes of 4 to 12), "small" (N/2 elements: empty blocks), "uneven-counts" (each rank's
    block 1 to 2 x the mean at random; the collectives that take counts: reduce_scatter, allgather), "segments" (as
    "3/4", the collectives whose trees cut segments: 4 of them, fewer than 2 log2 N). None where the shape does not
    apply. The sizes of the uniform records otherwise: 1 GiB of float32 (the all-to-alls 1 MiB a
    rank)."""
    n = (1 << 18) if collective == "alltoall" else (1 << 28)
    if shape == "segments" and collective not in SEGMENTED:
        return None
    if shape in ("3/4", "segments"):
        size = 3 * size // 4
    elif shape == "minus-1":
        size -= 1
    topo = Topology.uniform(size, 8)
    if shape == "uneven-nodes":
        labels: list[int] = []
        while len(labels) < size:
            labels += [len(set(labels))] * rng.randrange(4, 13)
        topo = Topology.from_labels(labels[:size])
    if shape == "small":
        n = size // 2
    problem = even_problem(collective, 0, size, topo, n, tree_segment=-(-n // 4) if shape == "segments" else 0)
    if shape == "uneven-counts":
        if collective not in ("reduce_scatter", "allgather"):
            return None
        counts = tuple(rng.randrange(1, 2 * n // size) for _ in range(size))
        problem = replace(problem, n=sum(counts), counts=counts)
    return problem, topo


def shaped_times(budget: float, sizes=SIZES, shapes=SHAPES) -> list[dict]:
    """Wall seconds of every schedule's counts (what ``pc.traffic`` does: ``all_summaries`` counted) in each shape,
    from the smallest size up, skipped as ``traffic_times`` skips (as if O(N^2)); a size that runs out of memory is
    recorded so (``ulimit -v`` keeps the walk of an O(N^2) one from taking the machine)."""
    records = []
    for shape in shapes:
        for collective in registry.COLLECTIVES:
            for algorithm in registry.schedule_algorithms(collective):
                last, before, rng = 0.0, 1, random.Random(15)
                for size in sizes:
                    call = shaped_call(collective, shape, size, rng)
                    if call is None:
                        break
                    problem, topo = call
                    record = {"kind": "traffic", "shape": shape, "collective": collective, "algorithm": algorithm,
                              "ranks": topo.size, "nodes": topo.num_nodes, "seconds": None}
                    if last is not None and last * (size / before) ** 2 <= budget:
                        before = size
                        start, cpu = time.perf_counter(), time.process_time()
                        try:
                            count_summaries(registry.all_summaries(collective, algorithm, problem), topo, 4)
                            last = record["seconds"] = time.perf_counter() - start
                            record["cpu_seconds"] = time.process_time() - cpu
                        except MemoryError:
                            last, record["note"] = None, "out of memory"
                    records.append(record)
                    took = record.get("note", "skipped") if record["seconds"] is None else f"{record['seconds']:.3f} s"
                    print(f"{shape:13s} {collective:15s} {algorithm:20s} {topo.size:6d} ranks: {took}", flush=True)
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
        ok = proc.returncode == 0
        records.append({"kind": "plan", "model": model, "gpus": gpus, "batch": batch, "seconds": seconds if ok else None,
                        "ok": ok, "command": " ".join(cmd[1:]), **({} if ok else {"seconds_failed": seconds})})
        print(f"plan {model} on {gpus} GPUs: {seconds:.1f} s (exit {proc.returncode})", flush=True)
    return records


def explain_times(size: int, per_node: int = 8, shapes=("uniform",), timeout: float = 600) -> list[dict]:
    """Wall seconds of ``pycollect explain COLLECTIVE --algorithm all`` at ``size`` ranks, one process per
    collective as a user runs it, beside the interpreter's start and ``import pycollect`` alone (what every
    command pays before its work). ``shapes``: "uniform" (1 GiB, the all-to-alls 1 MiB a rank), "3/4" (as uniform
    on 3/4 of the ranks: off powers of two), "segments" (as "3/4", the trees' messages in 4 segments of 256 MiB) and
    "small" (N/2 elements: empty blocks), as far as explain's flags
    reach (uniform nodes, even blocks); a run over ``timeout`` seconds is recorded without its time."""
    base = [sys.executable, "-c", "import pycollect"]
    start = time.perf_counter()
    subprocess.run(base, check=True, capture_output=True, timeout=600)
    records = [{"kind": "import", "seconds": time.perf_counter() - start, "command": "python3 -c 'import pycollect'"}]
    print(f"import pycollect: {records[0]['seconds']:.2f} s", flush=True)
    for shape in shapes:
        ranks = 3 * size // 4 if shape in ("3/4", "segments") else size
        for collective in registry.COLLECTIVES if shape != "segments" else SEGMENTED:
            nbytes = str(4 * (ranks // 2)) if shape == "small" else "1M" if collective == "alltoall" else "1G"
            cmd = [sys.executable, "-m", "pycollect", "explain", collective, "--algorithm", "all", "--size",
                   str(ranks), "--bytes", nbytes, "--nodes", str(ranks // per_node)]
            cmd += ["--tree-segment-bytes", "256M"] if shape == "segments" else []
            start, cpu = time.perf_counter(), _children_cpu()
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
                seconds, ok = time.perf_counter() - start, proc.returncode == 0
            except subprocess.TimeoutExpired:
                seconds, ok = None, False
            cpu_seconds = _children_cpu() - cpu if seconds is not None else None
            records.append({"kind": "explain", "shape": shape, "collective": collective, "ranks": ranks,
                            "nodes": ranks // per_node, "seconds": seconds if ok else None, "ok": ok,
                            "command": " ".join(cmd[1:]), "cpu_seconds": cpu_seconds if ok else None,
                            **({} if ok else {"seconds_failed": seconds})})
            took = f"{seconds:.2f} s" if seconds is not None else f"over {timeout:g} s"
            print(f"explain {shape:8s} {collective:15s} {ranks} ranks: {took} (ok {ok})", flush=True)
    return records


def _children_cpu() -> float:
    """CPU seconds (user and system) of the finished child processes: beside the wall clock on a shared machine."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--budget", type=float, default=30.0, help="skip a size whose count would take longer (s, as N^2)")
    p.add_argument("--sizes", default=",".join(map(str, SIZES)), help="rank counts, comma separated (multiples of 8)")
    p.add_argument("--no-plan", action="store_true", help="without the planner's searches")
    p.add_argument("--no-traffic", action="store_true", help="without the traffic counts")
    p.add_argument("--no-simulate", action="store_true", help="without the cluster simulator at 16384 ranks")
    p.add_argument("--no-explain", action="store_true", help="without pycollect explain --algorithm all at 16384 ranks")
    p.add_argument("--shapes", default="", help="also the counts in these shapes, comma separated ("
                   f"{', '.join(SHAPES)}; 'all'), and explain in those it reaches (3/4, small, segments)")
    p.add_argument("--explain-timeout", type=float, default=600, help="seconds before an explain run is given up")
    p.add_argument("--json", default="bench/results/scale.json")
    args = p.parse_args(argv)
    sizes = tuple(int(v) for v in args.sizes.split(","))
    shapes = SHAPES if args.shapes == "all" else tuple(v for v in args.shapes.split(",") if v)
    if set(shapes) - set(SHAPES):
        p.error(f"--shapes: unknown {', '.join(sorted(set(shapes) - set(SHAPES)))}; expected some of {', '.join(SHAPES)}")
    explained = ("uniform",) + tuple(v for v in shapes if v in ("3/4", "small", "segments"))
    records = (([] if args.no_traffic else traffic_times(args.budget, sizes) + shaped_times(args.budget, sizes, shapes))
               + ([] if args.no_plan else plan_times()) + ([] if args.no_simulate else simulate_times())
               + ([] if args.no_explain else explain_times(max(sizes), shapes=explained, timeout=args.explain_timeout)))
    failed = [f"{r['kind']}: {r['command']}" for r in records if r.get("ok") is False]
    for line in failed:
        print(f"FAILED (its seconds left out): {line}")
    print(write_json(args.json, "scale", host_header(sys.argv), records, failed=failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""Speed of pycollect's collectives against MPI's own, nccl-tests style.

Run under MPI, for example ``mpiexec -n 2 python bench/collectives.py --collectives allreduce``.

What it measures: for every collective x message size x algorithm, the time of one blocking call
into a preallocated ``out=`` buffer, on the same input every iteration, after warmup. Sizes follow
nccl-tests: the whole vector for allreduce and reduce_scatter (the input), the gathered output for
allgather, each rank's send buffer for alltoall.

How: at each size every algorithm runs once into a sentinel-filled buffer and is compared with
MPI's result ("mpi" is always run; it is itself compared with a NumPy reference), inputs being
small integers so sums are exact. Then, algorithm after algorithm at that size (interleaved, so noise
hits them alike): warmup calls, a barrier, and ``iters`` back-to-back calls, ``iters`` chosen on rank 0
for about ``--seconds`` per point (at least 3, at most ``--iters``) and broadcast so every rank runs
the same count. A call's time is the largest of the ranks' means (min/avg/max across ranks are kept);
algbw = size / time, busbw = algbw x the nccl-tests factor, vs_mpi = busbw / busbw of "mpi" at that
size. Rank 0 prints a table and a summary of targets and writes a JSON file; any wrong element
makes the exit status 1.

With ``--backend cupy`` inputs and outputs are CuPy arrays on the GPU (device ``local rank mod
device count``); the clock stops after the current stream is synchronized, and results are
compared on host copies.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import sys
import time

import numpy as np
from mpi4py import MPI

import pycollect as pc
from pycollect.engine.select import Selector

COLLECTIVES = ("allreduce", "reduce_scatter", "allgather", "alltoall")
DTYPES = ("float32", "float64", "int32", "int64")
BACKENDS = ("numpy", "cupy")
KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
_UNITS = {"": 1, "K": KiB, "M": MiB, "G": GiB}
QUICK = {"sizes": "8,64,512,4K,32K,256K,1M", "iters": 20, "warmup": 2, "seconds": 0.01, "trials": 1}
DEFAULTS = {"min_bytes": 8, "max_bytes": 256 * MiB, "factor": 2, "iters": 1000, "warmup": 5, "seconds": 0.2,
            "trials": 3}
ENV_KEYS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MPIEXEC_TIMEOUT")
ENV_PREFIXES = ("MPIR_CVAR_", "PYCOLLECT_", "UCX_")


# -- command line -------------------------------------------------------------------------------------
def parse_size(text: str) -> int:
    """``"8"``, ``"32K"``, ``"64M"``, ``"1G"`` (binary units; a trailing ``B`` or ``iB`` is allowed) -> bytes."""
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = t[-1:] if t[-1:] in ("K", "M", "G") else ""
    try:
        value = int(t[: len(t) - len(unit)]) * _UNITS[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(f"size {text!r} is not an integer with optional K/M/G") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"size {text!r} must be positive")
    return value


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--collectives", default=",".join(COLLECTIVES), help="comma list (default: all four)")
    p.add_argument("--algorithms", default="all", help="comma list of names, or 'all' (mpi is always timed)")
    p.add_argument("--min-bytes", type=parse_size, help="smallest size (default 8)")
    p.add_argument("--max-bytes", type=parse_size, help="largest size (default 256M)")
    p.add_argument("--factor", type=int, help="ratio between sizes of the sweep (default 2)")
    p.add_argument("--sizes", help="explicit comma list of sizes instead of a sweep, e.g. 8,32K,64M")
    p.add_argument("--iters", type=int, help="most timed calls per point (default 1000)")
    p.add_argument("--warmup", type=int, help="untimed calls per point before timing (default 5)")
    p.add_argument("--seconds", type=float, help="aim for this much timed work per point (default 0.2)")
    p.add_argument("--trials", type=int, help="interleaved timing trials per point; each algorithm keeps its best (default 3)")
    p.add_argument("--dtype", default="float32", choices=DTYPES)
    p.add_argument("--backend", default="numpy", choices=BACKENDS,
                   help="array module of the buffers (cupy: device arrays, stream synchronized before each clock stop)")
    p.add_argument("--json", help="output file (default results/bench-<collective>-<N>ranks[-cupy].json)")
    p.add_argument("--quick", action="store_true", help="tiny sweep: 8 B to 1 MiB by 8x, at most 20 calls a point")
    args = p.parse_args(argv)
    sweep_given = any(v is not None for v in (args.sizes, args.min_bytes, args.max_bytes, args.factor))
    for key, value in (QUICK if args.quick else {}).items():
        if getattr(args, key) is None and not (key == "sizes" and sweep_given):
            setattr(args, key, value)
    for key, value in DEFAULTS.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    _check_args(p, args)
    return args


def _check_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    args.collectives = [c for c in args.collectives.split(",") if c]
    bad = [c for c in args.collectives if c not in COLLECTIVES]
    if bad or not args.collectives:
        p.error(f"--collectives: unknown {bad}; expected some of {', '.join(COLLECTIVES)}")
    if args.factor < 2:
        p.error(f"--factor must be at least 2, got {args.factor}")
    if args.iters < 1 or args.warmup < 0 or args.seconds < 0:
        p.error("--iters must be >= 1, --warmup and --seconds >= 0")
    if args.trials < 1:
        p.error(f"--trials must be >= 1, got {args.trials}")
    if args.sizes is None and args.min_bytes > args.max_bytes:
        p.error(f"--min-bytes {args.min_bytes} is above --max-bytes {args.max_bytes}")


def sweep(args: argparse.Namespace) -> list[int]:
    """The sizes in bytes: ``--sizes`` as given, else min, min*factor, ... up to max."""
    if args.sizes:
        return sorted({parse_size(s) for s in args.sizes.split(",") if s})
    sizes, s = [], args.min_bytes
    while s <= args.max_bytes:
        sizes.append(s)
        s *= args.factor
    return sizes


def algorithm_lists(collectives: list[str], wanted: str) -> dict[str, list[str]]:
    """Per collective: "mpi" first, then the asked names it has (names no collective has are errors)."""
    names = [a for a in wanted.split(",") if a]
    if wanted != "all":
        unknown = [a for a in names if not any(a in pc.algorithms(c) for c in collectives)]
        if unknown:
            known = sorted({a for c in collectives for a in pc.algorithms(c)})
            raise SystemExit(f"--algorithms: unknown {unknown}; expected some of {', '.join(known)} or 'all'")
    lists = {}
    for c in collectives:
        asked = pc.algorithms(c) if wanted == "all" else [a for a in names if a in pc.algorithms(c)]
        lists[c] = ["mpi"] + [a for a in dict.fromkeys(asked) if a != "mpi"]
    return lists


# -- array backend -------------------------------------------------------------------------------------
def array_module(name: str, local_rank: int = 0):
    """``numpy``, or ``cupy`` with this rank's device selected (local rank mod device count)."""
    if name == "numpy":
        return np
    try:
        import cupy
    except ImportError:
        raise SystemExit("--backend cupy: CuPy is not installed") from None
    if not cupy.cuda.is_available():
        raise SystemExit("--backend cupy: CuPy finds no usable CUDA device")
    cupy.cuda.Device(local_rank % cupy.cuda.runtime.getDeviceCount()).use()
    return cupy


def stream_sync(xp):
    """``sync()``: wait for the device work queued on the current stream (nothing to wait for on NumPy)."""
    if xp is np:
        return lambda: None
    stream = xp.cuda.get_current_stream()
    return stream.synchronize


def to_host(a) -> np.ndarray:
    return a if isinstance(a, np.ndarray) else a.get()


def device_info(xp) -> dict:
    if xp is np:
        return {}
    dev = xp.cuda.Device()
    name = xp.cuda.runtime.getDeviceProperties(dev.id)["name"]
    return {"cupy": xp.__version__, "device": dev.id,
            "device_name": name.decode() if isinstance(name, bytes) else str(name),
            "cuda_runtime": xp.cuda.runtime.runtimeGetVersion()}


# -- sizes, inputs and references ------------------------------------------------------------------------
def bus_factor(collective: str, n: int) -> float:
    """nccl-tests' busbw / algbw: allreduce 2(n-1)/n, the others (n-1)/n."""
    return 2 * (n - 1) / n if collective == "allreduce" else (n - 1) / n


def element_count(collective: str, nbytes: int, itemsize: int, n: int) -> int:
    """Elements of the sized buffer; split collectives round down to a multiple of n (at least n)."""
    count = max(1, nbytes // itemsize)
    return count if collective == "allreduce" else max(n, count // n * n)


def rank_input(collective: str, count: int, rank: int, n: int, dtype) -> np.ndarray:
    """Rank ``rank``'s input: integers 0..60 (period 61, so sums over ranks stay exact)."""
    length = count // n if collective == "allgather" else count
    period = ((np.arange(61) * 7 + rank * 13) % 61).astype(dtype)
    return np.resize(period, length)


def output_count(collective: str, count: int, n: int) -> int:
    return count // n if collective == "reduce_scatter" else count


def expected(collective: str, count: int, rank: int, n: int, dtype) -> np.ndarray:
    """This rank's correct result, computed with NumPy from every rank's input."""
    inputs = (rank_input(collective, count, r, n, dtype) for r in range(n))
    if collective in ("allreduce", "reduce_scatter"):
        total = sum(inputs)
        block = count // n
        return total if collective == "allreduce" else total[rank * block:(rank + 1) * block]
    if collective == "allgather":
        return np.concatenate(list(inputs))
    block = count // n
    return np.concatenate([x[rank * block:(rank + 1) * block] for x in inputs])


def caller(comm: pc.Communicator, collective: str, x: np.ndarray, out: np.ndarray):
    """``run(algorithm)``: one blocking collective on ``x`` into ``out``."""
    method = getattr(comm, collective)
    return lambda algorithm: method(x, algorithm=algorithm, out=out)


# -- measuring one size -------------------------------------------------------------------------------
def count_wrong(world: MPI.Intracomm, got, ref) -> int:
    """Elements that differ from ``ref``, summed over ranks (unwritten NaN sentinels count); host or device arrays."""
    return world.allreduce(int(np.count_nonzero(to_host(got) != to_host(ref))), op=MPI.SUM)


def sentinel(dtype) -> float:
    return np.nan if np.dtype(dtype).kind == "f" else -1


def check(world, run, out, algorithms, ref_numpy) -> dict[str, int]:
    """#wrong per algorithm: "mpi" against NumPy, the others against "mpi"'s result."""
    out.fill(sentinel(out.dtype))
    run("mpi")
    wrong = {"mpi": count_wrong(world, out, ref_numpy)}
    ref = out.copy()
    for algorithm in algorithms:
        if algorithm != "mpi":
            out.fill(sentinel(out.dtype))
            run(algorithm)
            wrong[algorithm] = count_wrong(world, out, ref)
    return wrong


def choose_iters(world, run, algorithm, args, sync=lambda: None) -> int:
    """Warm up, then pick on rank 0 how many calls fill ``--seconds`` (3..--iters); every rank gets it."""
    fastest = math.inf
    for _ in range(max(1, args.warmup)):
        t0 = time.perf_counter()
        run(algorithm)
        sync()
        fastest = min(fastest, time.perf_counter() - t0)
    iters = min(args.iters, max(3, math.ceil(args.seconds / max(fastest, 1e-9))))
    return world.bcast(iters, root=0)


def time_calls(world, run, algorithm, iters, sync=lambda: None) -> list[float] | None:
    """Each rank's mean seconds per call over ``iters`` back-to-back calls; the list on rank 0.

    ``sync()`` runs before the barrier and before the clock stops, so device work is counted.
    """
    sync()
    world.Barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        run(algorithm)
    sync()
    return world.gather((time.perf_counter() - t0) / iters, root=0)


def measure_size(world, comm, collective, nbytes, algorithms, args, xp=np) -> list[dict]:
    """Check, then time, every algorithm at one size; rows (times on rank 0 only)."""
    n, dtype = world.size, np.dtype(args.dtype)
    count = element_count(collective, nbytes, dtype.itemsize, n)
    x = xp.asarray(rank_input(collective, count, world.rank, n, dtype))
    out = xp.empty(output_count(collective, count, n), dtype)
    run = caller(comm, collective, x, out)
    sync = stream_sync(xp)
    wrong = check(world, run, out, algorithms, expected(collective, count, world.rank, n, dtype))
    iters = {a: choose_iters(world, run, a, args, sync) for a in algorithms}
    best: dict = {a: None for a in algorithms}
    # Trials interleave the algorithms, and each keeps its best trial: a burst of load from
    # elsewhere on a shared machine then spoils one trial of one algorithm, not the comparison.
    for _ in range(args.trials):
        for a in algorithms:
            means = time_calls(world, run, a, iters[a], sync)
            if means is not None and (best[a] is None or max(means) < max(best[a])):
                best[a] = means
    return [_row(collective, nbytes, count * dtype.itemsize, count, a, iters[a], best[a], wrong[a])
            for a in algorithms]


def _row(collective, nominal, nbytes, count, algorithm, iters, means, wrong) -> dict:
    row = {"collective": collective, "size_bytes": nbytes, "nominal_bytes": nominal, "count": count,
           "algorithm": algorithm, "iters": iters, "wrong": wrong}
    if means is not None:
        row.update(time_us=max(means) * 1e6, time_us_min=min(means) * 1e6,
                   time_us_avg=sum(means) / len(means) * 1e6, time_us_max=max(means) * 1e6)
    return row


def finish_rows(rows: list[dict], n: int, dtype: str, auto, backend: str = "numpy") -> None:
    """Add bandwidths, vs_mpi and what "auto" chose, in place (rank 0; rows of one size).

    ``auto`` is a Selector or a Communicator (whose ``auto_algorithm`` also knows its world size).
    """
    mpi = next(r for r in rows if r["algorithm"] == "mpi")
    for r in rows:
        seconds = r["time_us"] * 1e-6
        r["dtype"] = dtype
        r["backend"] = backend
        r["algbw_GBps"] = r["size_bytes"] / seconds / 1e9
        r["busbw_GBps"] = r["algbw_GBps"] * bus_factor(r["collective"], n)
        r["vs_mpi"] = 1.0 if r is mpi else mpi["time_us"] / r["time_us"]
        if r["algorithm"] == "auto":
            if hasattr(auto, "auto_algorithm"):
                r["resolved"] = auto.auto_algorithm(r["collective"], r["size_bytes"], dtype)
            else:
                r["resolved"] = auto.choose(r["collective"], r["size_bytes"])


# -- reporting ----------------------------------------------------------------------------------------
def human(nbytes: int) -> str:
    for unit, scale in (("G", GiB), ("M", MiB), ("K", KiB)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return str(nbytes)


HEADER = f"{'collective':<15}{'size':>7}{'count':>11}  {'algorithm':<26}{'time us':>11}{'algbw GB/s':>11}" \
         f"{'busbw GB/s':>11}{'vs_mpi':>8}{'#wrong':>8}"


def format_row(r: dict) -> str:
    name = f"auto ({r['resolved']})" if r["algorithm"] == "auto" else r["algorithm"]
    return (f"{r['collective']:<15}{human(r['size_bytes']):>7}{r['count']:>11}  {name:<26}{r['time_us']:>11.1f}"
            f"{r['algbw_GBps']:>11.3f}{r['busbw_GBps']:>11.3f}{r['vs_mpi']:>8.2f}{r['wrong']:>8}")


def _at(records, collective, algorithm, lo=0, hi=math.inf):
    return [r for r in records if r["collective"] == collective and r["algorithm"] == algorithm
            and lo <= r["nominal_bytes"] <= hi]


def _mpi_time(records, r) -> float:
    return next(m["time_us"] for m in _at(records, r["collective"], "mpi", r["nominal_bytes"], r["nominal_bytes"]))


def targets(records: list[dict]) -> dict[str, dict]:
    """The summary figures: see bench/README.md for what each one is compared with."""
    out = {}
    colls = dict.fromkeys(r["collective"] for r in records)
    if "allreduce" in colls:
        best = [r for r in _at_all(records, "allreduce", 64 * MiB) if r["algorithm"] not in ("mpi", "auto")]
        if best:
            top = max(best, key=lambda r: r["vs_mpi"])
            out["allreduce best schedule vs_mpi at 64M"] = {"value": top["vs_mpi"], "algorithm": top["algorithm"]}
        _min_vs_mpi(out, records, "allreduce", 32 * KiB, 256 * MiB)
        small = _at(records, "allreduce", "auto", 0, 32 * KiB - 1)
        if small:
            worst = max(small, key=lambda r: r["time_us"] - _mpi_time(records, r))
            out["allreduce auto extra latency us below 32K"] = {
                "value": worst["time_us"] - _mpi_time(records, worst), "size_bytes": worst["nominal_bytes"]}
    for coll in colls:
        if coll != "allreduce":
            _min_vs_mpi(out, records, coll, MiB, math.inf)
    return out


def _at_all(records, collective, nbytes):
    return [r for r in records if r["collective"] == collective and r["nominal_bytes"] == nbytes]


def _min_vs_mpi(out, records, collective, lo, hi) -> None:
    rows = _at(records, collective, "auto", lo, hi)
    if rows:
        worst = min(rows, key=lambda r: r["vs_mpi"])
        span = f"{human(lo)}..{human(hi)}" if hi != math.inf else f">= {human(lo)}"
        out[f"{collective} auto min vs_mpi {span}"] = {"value": worst["vs_mpi"], "size_bytes": worst["nominal_bytes"]}


def format_targets(found: dict[str, dict]) -> list[str]:
    lines = ["targets:"]
    for name, t in found.items():
        where = t.get("algorithm") or human(t["size_bytes"])
        lines.append(f"  {name}: {t['value']:.2f} ({where})")
    if len(lines) == 1:
        lines.append("  (none: the sweep has no auto rows or no sizes in the target ranges)")
    return lines


def header(world, comm, args, argv, xp=np) -> dict:
    env = {k: v for k, v in os.environ.items() if k in ENV_KEYS or k.startswith(ENV_PREFIXES)}
    head = {"world_size": world.size, "backend": args.backend, "topology": comm.topology.describe(),
            "mpi_library": MPI.Get_library_version().strip(), "mpi4py": _version("mpi4py"),
            "numpy": np.__version__, "pycollect": pc.__version__, "python": platform.python_version(),
            "host": platform.node(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "argv": argv, "dtype": args.dtype, "iters_max": args.iters, "warmup": args.warmup,
            "seconds_per_point": args.seconds, "segment_bytes": comm.segment_bytes,
            "pipeline_bytes": comm.pipeline_bytes, "env": env,
            "busbw_factors": {c: bus_factor(c, world.size) for c in COLLECTIVES}}
    head.update(device_info(xp))
    if xp is not np:
        head["staged_through_host"] = comm._staging(xp)
    return head


def _version(module: str) -> str:
    return getattr(sys.modules.get(module), "__version__", "?")


def json_path(args, n: int) -> str:
    if args.json:
        return args.json
    name = args.collectives[0] if len(args.collectives) == 1 else "collectives"
    suffix = "" if args.backend == "numpy" else f"-{args.backend}"
    return os.path.join("results", f"bench-{name}-{n}ranks{suffix}.json")


def write_json(path: str, head: dict, records: list[dict], found: dict) -> str:
    path = os.path.abspath(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"header": head, "records": records, "targets": found}, f, indent=1)
    return path


# -- main -------------------------------------------------------------------------------------------------
def bench(world, comm, args, lists, say, xp=np) -> list[dict]:
    """Every collective x size x algorithm; prints each size's rows on rank 0 as they finish."""
    # what comm's "auto" resolves to, for the report (older Communicators: a Selector like theirs)
    auto = comm if hasattr(comm, "auto_algorithm") else Selector(multi_node=comm.topology.num_nodes > 1)
    records = []
    say(HEADER)
    for collective in args.collectives:
        for nbytes in sweep(args):
            rows = measure_size(world, comm, collective, nbytes, lists[collective], args, xp)
            if world.rank == 0:
                finish_rows(rows, world.size, args.dtype, auto, args.backend)
                records += rows
                for r in rows:
                    say(format_row(r))
    return records


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    lists = algorithm_lists(args.collectives, args.algorithms)
    world = MPI.COMM_WORLD
    comm = pc.Communicator(world)
    xp = array_module(args.backend, comm.topology.local_rank(world.rank))
    say = (lambda line: print(line, flush=True)) if world.rank == 0 else (lambda line: None)
    head = header(world, comm, args, [sys.argv[0]] + argv, xp)
    device = ""
    if xp is not np:
        device = (f" ({head['device_name']}, cupy {head['cupy']}, "
                  f"{'staged through host' if head['staged_through_host'] else 'CUDA-aware MPI'})")
    say(f"# {head['topology']}; {head['mpi_library'].splitlines()[0]}; numpy {head['numpy']}; "
        f"backend {args.backend}{device}; {args.dtype}; {head['date']}")
    records = bench(world, comm, args, lists, say, xp)
    wrong = 0
    if world.rank == 0:
        found = targets(records)
        for line in format_targets(found):
            say(line)
        say(f"wrote {write_json(json_path(args, world.size), head, records, found)}")
        wrong = sum(r["wrong"] for r in records)
        if wrong:
            say(f"FAILED: {wrong} wrong elements (see the #wrong column)")
    comm.free()
    return 1 if world.bcast(wrong, root=0) else 0


if __name__ == "__main__":
    try:
        status = main(sys.argv[1:])
    except SystemExit:
        raise
    except BaseException:  # one rank failing would leave the others waiting in a collective forever
        import traceback
        traceback.print_exc()
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(1)
    sys.exit(status)

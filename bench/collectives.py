"""Speed of pycollect's collectives against MPI's own, nccl-tests style.

Run under MPI, for example ``mpiexec -n 2 python bench/collectives.py --collectives allreduce``.

A thin wrapper over ``pycollect bench`` (``pycollect/tools/sweep.py``, which does the checking,
timing, table and files): it keeps this script's flags, always times MPI's own collective as the
baseline, runs out of place unless ``--placement`` says otherwise, and picks the number of calls
per point from ``--seconds`` (at least 3, at most ``--iters``). See bench/README.md.
"""
from __future__ import annotations

import argparse
import os
import sys

from mpi4py import MPI

from pycollect.tools import report, sweep
from pycollect.tools.common import size_sweep

COLLECTIVES = ("allreduce", "reduce_scatter", "allgather", "alltoall")
QUICK = {"sizes": "8,64,512,4K,32K,256K,1M", "iters": 20, "warmup": 2, "seconds": 0.01, "trials": 1}
DEFAULTS = {"min_bytes": 8, "max_bytes": 256 * report.MiB, "factor": 2, "iters": 1000, "warmup": 5, "seconds": 0.2,
            "trials": 3}


def parse_size(text: str) -> int:
    """``"8"``, ``"32K"``, ``"64M"``, ``"1G"`` (binary units) -> bytes, at least 1."""
    try:
        value = report.parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"size {text!r} must be positive")
    return value


def _dtype(text: str) -> str:
    name = sweep.DTYPE_ALIASES.get(text, text)
    if name not in sweep.DTYPES:
        raise argparse.ArgumentTypeError(f"unknown dtype {text!r}; expected one of "
                                         f"{', '.join(list(sweep.DTYPES) + list(sweep.DTYPE_ALIASES))}")
    return name


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--collectives", default=",".join(COLLECTIVES),
                   help=f"comma list of {', '.join(sweep.COLLECTIVES)} (default: the first four)")
    p.add_argument("--algorithms", default="all", help="comma list of names, or 'all' (mpi is always timed)")
    p.add_argument("--min-bytes", type=parse_size, help="smallest size (default 8)")
    p.add_argument("--max-bytes", type=parse_size, help="largest size (default 256M)")
    p.add_argument("--factor", type=int, help="ratio between sizes of the sweep (default 2)")
    p.add_argument("--sizes", help="explicit comma list of sizes instead of a sweep, e.g. 8,32K,64M")
    p.add_argument("--iters", type=int, help="most timed calls per point (default 1000)")
    p.add_argument("--warmup", type=int, help="untimed calls per point before timing (default 5)")
    p.add_argument("--seconds", type=float, help="aim for this much timed work per point (default 0.2)")
    p.add_argument("--trials", type=int, help="interleaved timing trials per point; each algorithm keeps its best (default 3)")
    p.add_argument("--dtype", default="float32", type=_dtype, help="a NumPy name or nccl-tests' (float, half, ...)")
    p.add_argument("-a", "--average", type=int, choices=range(len(sweep.ACROSS_RANKS)), default=1, metavar="0|1|2|3",
                   help="a call's time from the ranks' means: 0 rank 0, 1 average (default), 2 minimum, 3 maximum")
    p.add_argument("--placement", choices=tuple(sweep.PLACEMENTS), default="out",
                   help="out (default: out of place), in (in place where the collective allows it), or both")
    p.add_argument("--backend", default="numpy", choices=sweep.BACKENDS,
                   help="array module of the buffers (cupy: device arrays, stream synchronized before each clock stop)")
    p.add_argument("--shared", action="store_true",
                   help="inputs and results in shared memory (Communicator.shared_empty) for every algorithm and MPI's own")
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
    bad = [c for c in args.collectives if c not in sweep.COLLECTIVES]
    if bad or not args.collectives:
        p.error(f"--collectives: unknown {bad}; expected some of {', '.join(sweep.COLLECTIVES)}")
    try:
        args.algorithms = sweep._algorithm_spec(args.algorithms)
    except argparse.ArgumentTypeError as e:
        p.error(f"--algorithms: {e}")
    if args.factor < 2:
        p.error(f"--factor must be at least 2, got {args.factor}")
    if args.iters < 1 or args.warmup < 0 or args.seconds < 0:
        p.error("--iters must be >= 1, --warmup and --seconds >= 0")
    if args.shared and args.backend != "numpy":
        p.error(f"--shared: shared memory holds host arrays; it cannot go with --backend {args.backend}")
    if args.trials < 1:
        p.error(f"--trials must be >= 1, got {args.trials}")
    if args.sizes is None and args.min_bytes > args.max_bytes:
        p.error(f"--min-bytes {args.min_bytes} is above --max-bytes {args.max_bytes}")
    try:
        args.sizes = sorted({parse_size(s) for s in args.sizes.split(",") if s}) if args.sizes else \
            size_sweep(args.min_bytes, args.max_bytes, args.factor)
    except argparse.ArgumentTypeError as e:
        p.error(f"--sizes: {e}")


def json_path(args, n: int) -> str:
    if args.json:
        return args.json
    name = args.collectives[0] if len(args.collectives) == 1 else "collectives"
    suffix = "" if args.backend == "numpy" else f"-{args.backend}"
    return os.path.join("results", f"bench-{name}-{n}ranks{suffix}.json")


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    settings = sweep.Settings(collectives=args.collectives, sizes=args.sizes, dtypes=[args.dtype], ops=["sum"],
                              algorithm=args.algorithms, iters=args.iters, warmup=args.warmup, trials=args.trials,
                              backend=args.backend, seconds=args.seconds, baseline=True, shared=args.shared,
                              placements=sweep.PLACEMENTS[args.placement],
                              time_across=sweep.ACROSS_RANKS[args.average])
    blocks, notes = sweep.plan(settings)
    if not blocks:
        sys.stderr.write(f"collectives.py: error: nothing to run: {'; '.join(notes)}\n")
        return 2
    outputs = sweep.Outputs(json=json_path(args, MPI.COMM_WORLD.Get_size()))
    return sweep.execute(settings, outputs, blocks, notes, argv=[sys.argv[0]] + argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

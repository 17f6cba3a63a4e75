"""pycollect's time per call over MPI's own for small allreduces, allgather, and small broadcast, reduce, scan,
exscan, scatter, reduce_scatter and alltoall (issue 14, item 5).

Run under MPI, for example::

    OMP_NUM_THREADS=1 mpiexec -n 2 python bench/lean_overhead.py

Each trial times, back to back and in the same order on every rank (each trial starting one case
further on), every case: the bare mpi4py call on a duplicate of the world (``Allreduce(x, out,
MPI.SUM)``, ``Allgather(x, out)``, ...) and pycollect's (``comm.allreduce(x)``,
``comm.allreduce(x, out=out)``; ``comm.allgather(x)``, ``comm.allgather(x, counts=[n] * p)``, ...).
``--algorithm`` times pycollect's calls with another algorithm than ``auto`` (e.g. ``ring``: the
schedule engine's cost per call beside MPI's own; at one rank, the Python of the path alone).
A case's time is the slowest rank's mean per call in a trial, and its figure the best trial: a
burst of load from elsewhere on a shared machine then spoils one trial of one case, not the
comparison. Sizes are float32 bytes of the allreduce buffer and of the allgather result (as
``bench/collectives.py`` counts them). Inputs are small integers, different on every rank and along
the array. After the trials every case makes one more call, its output filled with NaN first, and
its result is compared on every rank with the bare MPI call's on the same input (``wrong``: elements
summed over ranks; a reduce's result off the root and exscan's on rank 0 are not compared); a wrong
case has no ``extra_us`` or ``ratio`` (nor has any case of its collective and size where the bare
call is wrong), is named in the JSON's ``failed``, and makes the exit status 1 on every rank.
"""
from __future__ import annotations

import argparse
import datetime
import functools
import os
import sys
import time

import numpy as np
from mpi4py import MPI

import pycollect as pc
from pycollect.tools.report import format_table, human_size, parse_size, run_header, write_json
from pycollect.tools.sweep import rotated

ALLREDUCE_SIZES = "8,16,64,256,1K,4K,16K"
ALLGATHER_SIZES = "32K,1M"
OTHER_SIZES = "8,4K"
OTHERS = "broadcast,reduce,scan,exscan,scatter,reduce_scatter,alltoall"


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--allreduce-sizes", default=ALLREDUCE_SIZES, help=f"bytes (default {ALLREDUCE_SIZES})")
    p.add_argument("--allgather-sizes", default=ALLGATHER_SIZES, help=f"bytes of the result (default {ALLGATHER_SIZES})")
    p.add_argument("--other-sizes", default=OTHER_SIZES, help=f"bytes of x for --others (default {OTHER_SIZES})")
    p.add_argument("--others", default=OTHERS, help=f"other collectives, comma separated (default {OTHERS}; '' none)")
    p.add_argument("--iters", type=int, default=500, help="calls per trial below 32 KiB (default 500)")
    p.add_argument("--large-iters", type=int, default=200, help="calls per trial from 32 KiB (default 200)")
    p.add_argument("--trials", type=int, default=60, help="interleaved trials; each case keeps its best (default 60)")
    p.add_argument("--algorithm", default="auto",
                   help="pycollect's algorithm: a name for every collective, or collective=name pairs, comma "
                        "separated (the rest auto); default auto")
    p.add_argument("--out", help="JSON file (default bench/results/<date>-lean-overhead-<p>ranks.json)")
    args = p.parse_args(argv)
    args.allreduce_sizes = [parse_size(s) for s in args.allreduce_sizes.split(",") if s]
    args.allgather_sizes = [parse_size(s) for s in args.allgather_sizes.split(",") if s]
    args.other_sizes = [parse_size(s) for s in args.other_sizes.split(",") if s]
    args.others = [c for c in args.others.split(",") if c]
    unknown = set(args.others) - set(OTHERS.split(","))
    if unknown:
        p.error(f"--others: unknown collective(s) {', '.join(sorted(unknown))}; choose from {OTHERS}")
    timed = ["allreduce", "allgather"] + OTHERS.split(",")
    pairs = [a.split("=", 1) for a in args.algorithm.split(",") if "=" in a]
    args.algorithms = dict(pairs) if pairs else {c: args.algorithm for c in timed}
    if set(args.algorithms) - set(timed):
        p.error(f"--algorithm: unknown collective(s) {', '.join(sorted(set(args.algorithms) - set(timed)))}; "
                f"choose from {', '.join(timed)}")
    if args.iters < 1 or args.large_iters < 1 or args.trials < 1:
        p.error("--iters, --large-iters and --trials must be >= 1")
    return args


def cases(comm: pc.Communicator, raw: MPI.Intracomm, args) -> list[tuple[str, int, str, object, int, object]]:
    """``(collective, nbytes, variant, call, iters, out)``; ``call()`` makes one call, its buffers bound in; ``out``:
    the array it writes its result into (None: the result is what it returns)."""
    found = []
    for nbytes in args.allreduce_sizes:
        x = given(max(1, nbytes // 4), comm.rank)
        out = np.empty_like(x)
        bare, lean = raw.Allreduce, mine(comm, "allreduce", args)
        found += [("allreduce", nbytes, "mpi", lambda x=x, o=out, f=bare: f(x, o, MPI.SUM), args.iters, out),
                  ("allreduce", nbytes, "pycollect", lambda x=x, f=lean: f(x), args.iters, None),
                  ("allreduce", nbytes, "pycollect out=", lambda x=x, o=out, f=lean: f(x, out=o), args.iters, out)]
    for nbytes in args.allgather_sizes:
        n = max(1, nbytes // 4 // comm.size)
        x = given(n, comm.rank)
        out = np.empty(n * comm.size, np.float32)
        counts = [n] * comm.size
        bare, gather = raw.Allgather, mine(comm, "allgather", args)
        iters = args.iters if nbytes < 32 * 1024 else args.large_iters
        found += [("allgather", nbytes, "mpi", lambda x=x, o=out, f=bare: f(x, o), iters, out),
                  ("allgather", nbytes, "pycollect", lambda x=x, f=gather: f(x), iters, None),
                  ("allgather", nbytes, "pycollect counts=", lambda x=x, c=counts, f=gather: f(x, counts=c), iters,
                   None),
                  ("allgather", nbytes, "pycollect counts= out=",
                   lambda x=x, o=out, c=counts, f=gather: f(x, counts=c, out=o), iters, out)]
    for collective in args.others:
        for nbytes in args.other_sizes:
            found += other_cases(comm, raw, collective, nbytes, args.iters if nbytes < 32 * 1024 else args.large_iters,
                                 mine(comm, collective, args))
    return found


def mine(comm: pc.Communicator, collective: str, args):
    """pycollect's call of ``collective`` with the algorithm ``--algorithm`` gives it: the bound method itself for auto
    (its default; as a user calls it), else the method with the algorithm bound in."""
    method, algorithm = getattr(comm, collective), args.algorithms.get(collective, "auto")
    return method if algorithm == "auto" else functools.partial(method, algorithm=algorithm)


def other_cases(comm: pc.Communicator, raw: MPI.Intracomm, collective: str, nbytes: int, iters: int, call) -> list:
    """The bare call and pycollect's with and without ``out=`` for broadcast, reduce, scan, exscan, reduce_scatter,
    alltoall (``x`` of ``nbytes``) and scatter (each rank's block of ``nbytes``, counts given as the model layer gives
    them); root 0. ``call``: pycollect's method (its algorithm bound in)."""
    n, p = max(1, nbytes // 4), comm.size
    if collective == "scatter":
        x = given(n * p, comm.rank)
        out = np.empty(n, np.float32)
        counts = [n] * p
        bare = raw.Scatter
        return [(collective, nbytes, "mpi", lambda x=x, o=out, f=bare: f(x, o, 0), iters, out),
                (collective, nbytes, "pycollect counts=", lambda x=x, c=counts, f=call: f(x, counts=c), iters, None),
                (collective, nbytes, "pycollect counts= out=",
                 lambda x=x, o=out, c=counts, f=call: f(x, counts=c, out=o), iters, out)]
    if collective in ("reduce_scatter", "alltoall"):   # x of nbytes, even blocks (n rounded down to a multiple of p)
        x = given(max(p, n - n % p), comm.rank)
        out = np.empty(x.size // p if collective == "reduce_scatter" else x.size, np.float32)
        bare = (lambda x=x, o=out, f=raw.Reduce_scatter_block: f(x, o, MPI.SUM)) if collective == "reduce_scatter" \
            else (lambda x=x, o=out, f=raw.Alltoall: f(x, o))
        return [(collective, nbytes, "mpi", bare, iters, out),
                (collective, nbytes, "pycollect", lambda x=x, f=call: f(x), iters, None),
                (collective, nbytes, "pycollect out=", lambda x=x, o=out, f=call: f(x, out=o), iters, out)]
    x = given(n, comm.rank)
    out = np.empty_like(x)
    if collective == "broadcast":
        bare = lambda x=x, f=raw.Bcast: f(x, 0)   # noqa: E731
        return [(collective, nbytes, "mpi", bare, iters, x),
                (collective, nbytes, "pycollect out=x", lambda x=x, f=call: f(x, out=x), iters, x),
                (collective, nbytes, "pycollect", lambda x=x, f=call: f(x), iters, None)]
    bare = {"reduce": lambda x=x, o=out, f=raw.Reduce: f(x, o, MPI.SUM, 0),
            "scan": lambda x=x, o=out, f=raw.Scan: f(x, o, MPI.SUM),
            "exscan": lambda x=x, o=out, f=raw.Exscan: f(x, o, MPI.SUM)}[collective]
    return [(collective, nbytes, "mpi", bare, iters, out),
            (collective, nbytes, "pycollect", lambda x=x, f=call: f(x), iters, None),
            (collective, nbytes, "pycollect out=", lambda x=x, o=out, f=call: f(x, out=o), iters, out)]


def given(n: int, rank: int) -> np.ndarray:
    """A rank's input: small integers (exact in float32 sums), different on every rank and along the array."""
    return (np.arange(n) % 7 + 1 + rank).astype(np.float32)


EXPECTED = {   # the bare MPI call on a fresh copy of the input, into a fresh output: what every case must give
    "allreduce": lambda raw, x, p: _into(raw.Allreduce, x, x.size, MPI.SUM),
    "allgather": lambda raw, x, p: _into(raw.Allgather, x, x.size * p),
    "broadcast": lambda raw, x, p: _bcast(raw, x),
    "reduce": lambda raw, x, p: _into(raw.Reduce, x, x.size, MPI.SUM, 0),
    "scan": lambda raw, x, p: _into(raw.Scan, x, x.size, MPI.SUM),
    "exscan": lambda raw, x, p: _into(raw.Exscan, x, x.size, MPI.SUM),
    "scatter": lambda raw, x, p: _into(raw.Scatter, x, x.size // p, 0),
    "reduce_scatter": lambda raw, x, p: _into(raw.Reduce_scatter_block, x, x.size // p, MPI.SUM),
    "alltoall": lambda raw, x, p: _into(raw.Alltoall, x, x.size),
}


def _into(call, x, n: int, *rest) -> np.ndarray:
    out = np.full(n, np.nan, np.float32)
    call(x.copy(), out, *rest)
    return out


def _bcast(raw, x) -> np.ndarray:
    out = x.copy()
    raw.Bcast(out, 0)
    return out


def defined(collective: str, rank: int) -> bool:
    """Whether this rank's result is defined: a reduce's off the root and exscan's on rank 0 are not."""
    return not ((collective == "reduce" and rank != 0) or (collective == "exscan" and rank == 0))


def check(world: MPI.Intracomm, raw: MPI.Intracomm, found) -> list[int]:
    """Wrong elements of every case (summed over ranks), each making one more call after the timed ones: its output
    (``out``, or what it returns) filled with NaN first, then compared with the bare MPI call's result on the
    same input, computed afresh (pristine: ``given``; a broadcast's root keeps its own)."""
    wrong = np.zeros(len(found), np.int64)
    expected = {}
    for i, (collective, nbytes, variant, call, _, out) in enumerate(found):
        key = (collective, nbytes)
        if key not in expected:   # the input as cases() made it (a broadcast writes root 0's into x elsewhere)
            n = out.size * (world.size if collective in ("scatter", "reduce_scatter") else 1)
            n //= world.size if collective == "allgather" else 1
            expected[key] = EXPECTED[collective](raw, given(n, world.rank), world.size)
        if out is not None:   # a broadcast's out is x: root 0's input again, NaN elsewhere
            out[...] = given(out.size, 0) if collective == "broadcast" and world.rank == 0 else np.nan
        got = call()
        got = out if variant == "mpi" or got is None else got
        if defined(collective, world.rank):
            ref = expected[key]
            got = np.asarray(got)
            wrong[i] = ref.size if got.shape != ref.shape else np.count_nonzero(got != ref)
    world.Allreduce(MPI.IN_PLACE, wrong, op=MPI.SUM)
    return [int(w) for w in wrong]


def time_case(world: MPI.Intracomm, call, iters: int) -> float:
    """The slowest rank's mean seconds per call over ``iters`` back-to-back calls."""
    world.Barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        call()
    return world.allreduce((time.perf_counter() - t0) / iters, op=MPI.MAX)


def measure(world: MPI.Intracomm, found, trials: int) -> list[float]:
    """Best trial of every case, in microseconds; trials interleave the cases."""
    for _, _, _, call, iters, _ in found:   # warm up: first calls build caches and MPI's shared-memory queues
        for _ in range(min(iters, 100)):
            call()
    best = [float("inf")] * len(found)
    for trial in range(trials):   # each trial starts one case further on: the bare call does not always run first
        for i in rotated(list(range(len(found))), trial):
            call, iters = found[i][3], found[i][4]
            best[i] = min(best[i], time_case(world, call, iters))
    return [b * 1e6 for b in best]


def records_of(found, best: list[float], wrong: list[int]) -> list[dict]:
    """One record per case, ``extra_us`` over the bare MPI call of the same collective and size (no figure where
    the case, or the bare call, gave a wrong result)."""
    bare = {(c, n): us for (c, n, v, *_), us in zip(found, best) if v == "mpi"}
    bad = {(c, n) for (c, n, v, *_), w in zip(found, wrong) if v == "mpi" and w}
    return [{"collective": c, "bytes": n, "size": human_size(n), "variant": v, "iters": iters, "us": round(us, 3),
             "extra_us": None if w or (c, n) in bad else round(us - bare[(c, n)], 3),
             "ratio": None if w or (c, n) in bad else round(bare[(c, n)] / us, 3), "wrong": w}
            for (c, n, v, _, iters, _), us, w in zip(found, best, wrong)]


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    world = MPI.COMM_WORLD
    comm = pc.Communicator(world)
    raw = world.Dup()
    try:
        found = cases(comm, raw, args)
        best = measure(world, found, args.trials)
        records = records_of(found, best, check(world, raw, found))   # each case once more, after its timed calls
        failed = [f"{r['collective']} {r['size']} {r['variant']}: {r['wrong']} wrong elements" for r in records
                  if r["wrong"]]
        if world.rank == 0:
            columns = [("collective", "collective", "{}"), ("size", "size", "{}"), ("variant", "variant", "{}"),
                       ("us", "us/call", "{:.2f}"), ("extra_us", "extra us", "{:+.2f}"), ("ratio", "mpi/this", "{:.2f}"),
                       ("wrong", "#wrong", "{}")]
            print("\n".join(format_table(records, columns)))
            if failed:
                print(f"FAILED: results differ from the bare MPI call's after the timed calls: {'; '.join(failed)}")
            date = datetime.date.today().isoformat()
            path = args.out or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                            f"{date}-lean-overhead-{world.size}ranks.json")
            head = run_header(comm, argv, iters=args.iters, large_iters=args.large_iters, trials=args.trials,
                              dtype="float32", algorithms=args.algorithms)
            print("wrote", write_json(path, "lean_overhead", head, records, failed=failed))
    finally:
        raw.Free()
        comm.free()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

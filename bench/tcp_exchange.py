"""Messages between two simulated nodes over loopback TCP: one way, and both ways at once, size by size.

    MPIR_CVAR_NUM_CLIQUES=2 MPIR_CVAR_CLIQUES_BY_BLOCK=1 UCX_TLS=tcp,self OMP_NUM_THREADS=1 \\
        mpiexec -n 4 python3 bench/tcp_exchange.py --json bench/results/2026-12-02-late-tcp-exchange.json

Ranks (0,1) and (2,3) are the two nodes. Three patterns, each timed ``--repeats`` times per size, every
time kept (the spread is the point): ``one way`` (0 sends to 2, 2 answers with one byte: the ping-pong
`bench fit` fits its links on), ``both ways`` (0 and 2 send each other the size at once: a round of
recursive doubling or halving, or of a pairwise exchange), and ``two pairs`` (0-2 and 1-3 both ways at
once, as such a round of 4 ranks over two nodes runs), and ``two pairs polled`` (the same posted as
``Isend``/``Irecv`` and waited on as pycollect's executor waits, ``engine/progress.poll``: ``Testall``
with a yield, and short naps after 5 ms), and ``two pairs polled, no naps`` (the same without the naps:
``progress.SPIN_S`` set to infinity for the exchange). ``bench fit`` at 4 ranks on two simulated
nodes meets calls that stall by tens of milliseconds past a few MiB; a cost model that prices bytes
cannot predict a stall that comes and goes, and this shows which messages meet it. After every timed exchange
(outside its time) each rank that received compares the bytes with those its peer sent (the buffer zeroed before
each exchange); ``wrong`` counts the exchanges where some rank's differed, the JSON's ``failed`` names them and the
exit status is 1 on every rank.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

from pycollect.tools.report import host_header, parse_size, write_json

PATTERNS = ("one way", "both ways", "two pairs", "two pairs polled", "two pairs polled, no naps")


def exchange(comm, pattern: str, buf: np.ndarray, got: np.ndarray, one: np.ndarray) -> float:
    """Seconds of one exchange of ``pattern`` on this rank (every rank of ``comm`` calls)."""
    rank, peer = comm.rank, (comm.rank + 2) % 4
    comm.Barrier()
    t0 = time.perf_counter()
    if pattern == "one way":
        if rank == 0:
            comm.Send(buf, dest=2)
            comm.Recv(one, source=2)
        elif rank == 2:
            comm.Recv(got, source=0)
            comm.Send(one, dest=0)
    elif (pattern == "both ways" and rank in (0, 2)) or pattern == "two pairs":
        comm.Sendrecv(buf, dest=peer, recvbuf=got, source=peer)
    elif pattern.startswith("two pairs polled"):
        from pycollect.engine import progress
        spin, progress.SPIN_S = progress.SPIN_S, float("inf") if pattern.endswith("no naps") else progress.SPIN_S
        try:
            progress.poll([comm.Irecv(got, source=peer), comm.Isend(buf, dest=peer)])
        finally:
            progress.SPIN_S = spin
    return time.perf_counter() - t0


def payload(size: int, rank: int) -> np.ndarray:
    """What ``rank`` sends: bytes that differ from rank to rank and along the message."""
    return ((np.arange(size) * 7 + 31 * rank + 1) % 251).astype(np.uint8)


def receives(pattern: str, rank: int) -> bool:
    """Whether ``rank`` receives a message of the size in ``pattern`` (from its peer, rank +- 2)."""
    return rank == 2 if pattern == "one way" else rank in (0, 2) if pattern == "both ways" else True


def measure(comm, sizes: list[int], repeats: int) -> list[dict]:
    """Every exchange's slowest-rank seconds, per pattern and size (rank 0's list; others get []). After each
    exchange, outside its time, the bytes a rank received are compared with its peer's (``got`` is zeroed before
    each): ``wrong``, the exchanges in which some rank received other bytes."""
    rows = []
    for size in sizes:
        buf, got, one = payload(size, comm.rank), np.empty(size, np.uint8), np.zeros(1, np.uint8)
        expected = payload(size, (comm.rank + 2) % 4)
        for pattern in PATTERNS:
            exchange(comm, pattern, buf, got, one)                       # warm the connection and the pages
            times, wrong = [], 0
            for _ in range(repeats):
                got[...] = 0
                seconds = exchange(comm, pattern, buf, got, one)
                bad = receives(pattern, comm.rank) and not np.array_equal(got, expected)
                times.append(comm.allreduce(seconds, op=max_op()))
                wrong += comm.allreduce(int(bad), op=max_op())
            ms = sorted(t * 1e3 for t in times)
            rows.append({"pattern": pattern, "size_bytes": size, "times_ms": [t * 1e3 for t in times],
                         "min_ms": ms[0], "median_ms": statistics.median(ms), "max_ms": ms[-1],
                         "stalled": sum(t > ms[0] + 20 for t in ms),   # 20 ms over the fastest: a stall
                         "wrong": wrong})
    return rows if comm.rank == 0 else []


def max_op():
    from mpi4py import MPI
    return MPI.MAX


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="1M,2M,3M,4M,6M,8M", help="comma list of message sizes (default 1M..8M)")
    p.add_argument("--repeats", type=int, default=15, help="exchanges timed per pattern and size (default 15)")
    p.add_argument("--json", help="write every exchange's time here")
    args = p.parse_args(argv)
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    if comm.size != 4:
        if comm.rank == 0:
            sys.stderr.write("tcp_exchange.py: run it on 4 ranks (two simulated nodes of 2)\n")
        return 2
    rows = measure(comm, [parse_size(s) for s in args.sizes.split(",")], args.repeats)
    failed = comm.bcast([f"{r['pattern']} {r['size_bytes']} bytes: {r['wrong']} of {len(r['times_ms'])} exchanges"
                         for r in rows if r["wrong"]], root=0)
    if comm.rank != 0:
        return 1 if failed else 0
    for r in rows:
        print(f"{r['pattern']:>10} {r['size_bytes'] >> 10:>6} KiB: min {r['min_ms']:7.2f} ms, median {r['median_ms']:7.2f}, "
              f"max {r['max_ms']:7.2f}; {r['stalled']} of {len(r['times_ms'])} stalled (> fastest + 20 ms)"
              f"{'; ' + str(r['wrong']) + ' received wrong bytes' if r['wrong'] else ''}")
    if failed:
        print(f"FAILED: bytes received differ from those sent: {'; '.join(failed)}")
    if args.json:
        import os
        env = {k: v for k, v in os.environ.items() if k.startswith(("MPIR_", "UCX_"))}
        print(write_json(args.json, "tcp-exchange", host_header(sys.argv, env=env, ranks=comm.size), rows,
                         failed=failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""``pycollect bench tiers``: point-to-point latency and bandwidth per tier, and collectives per tier.

Part 1, every pair of ranks: a ping-pong at every size of the sweep. Pairs are scheduled as a
round-robin tournament (circle method), so each round measures ``N/2`` disjoint pairs at once
and ranks without a partner wait at the barrier that starts the next round (``--serial``: one
pair at a time). The lower rank of a pair times each round trip; a pair's time at a size is the
median round trip, one-way time half of it. Each pair is labelled with its tier
(``comm.topology``: intra-node or inter-node; with ``--backend cupy`` intra-node pairs are also
same or other device), and each tier reports latency (smallest size) and bandwidth (largest
size) as min / median / max over its pairs.

Part 2, each collective at a few sizes of the sweep, in three scopes: inside a node (a
communicator from ``Split_type(SHARED)``; every node runs at once), across node leaders (one
rank a node) and across the whole world, each with MPI's own and with ``auto`` (plus
``hierarchical`` allreduce across the world). A call's time is the largest of the ranks' median
times; busbw is nccl-tests' (allreduce 2(n-1)/n x algbw, the others (n-1)/n). A scope is
skipped when it has one rank, and the world when it is a single node (it is the intra-node scope).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import TYPE_CHECKING

from ..engine.shapes import bus_factor
from ..plotting import pyplot, save_figure
from .common import (allgather_json, backend, communicator, gather_json, int_at_least, refused_outputs, size_arg,
                     size_sweep)
from .report import GiB, format_table, human_size, parse_size, physical_memory

if TYPE_CHECKING:
    from ..comm import Communicator

COLLECTIVES = ("allreduce", "allgather", "reduce_scatter", "alltoall")
DEFAULT_COLLECTIVES = ("allreduce", "allgather", "reduce_scatter")
BACKENDS = ("numpy", "cupy")
COLL_SIZES = 4          # collective sizes taken from the sweep (its ends and evenly spaced between)
WARMUP = 2              # untimed calls / round trips before timing
MAX_PAIRS_SHOWN = 64    # larger worlds print the per-tier summary only
PAIR_COLUMNS = ["section", "a", "b", "tier", "device", "link", "size_bytes", "iters", "rtt_us_median", "rtt_us_min",
                "one_way_us", "bandwidth_GBps"]
COLL_COLUMNS = ["section", "scope", "ranks", "collective", "size_bytes", "count", "algorithm", "resolved",
                "iters", "time_us", "algbw_GBps", "busbw_GBps"]
CSV_COLUMNS = list(dict.fromkeys(PAIR_COLUMNS + COLL_COLUMNS))


# -- command line ---------------------------------------------------------------------------------------
def collective_list(text: str) -> list[str]:
    """``"allreduce,allgather"`` -> names (``"none"``: an empty list)."""
    if text.strip() == "none":
        return []
    names = [c for c in text.split(",") if c]
    bad = [c for c in names if c not in COLLECTIVES]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown {', '.join(bad) or 'empty list'}; "
                                         f"expected some of {', '.join(COLLECTIVES)}, or none")
    return list(dict.fromkeys(names))


def add_sweep_arguments(parser, max_default: str, iters_default: int) -> None:
    """The flags ``tiers`` and ``fit`` share: the size sweep, iterations, collectives, outputs."""
    parser.add_argument("-b", "--min-bytes", type=size_arg, default=8, metavar="MIN", help="smallest size (default 8)")
    parser.add_argument("-e", "--max-bytes", type=size_arg, default=parse_size(max_default), metavar="MAX",
                        help=f"largest size (default {max_default})")
    parser.add_argument("-f", "--step-factor", dest="factor", type=int_at_least(2), default=4, metavar="FACTOR",
                        help="ratio between sizes (default 4)")
    parser.add_argument("-n", "--iters", type=int_at_least(1), default=iters_default, metavar="ITERS",
                        help=f"timed round trips / calls per point (default {iters_default})")
    parser.add_argument("--collectives", type=collective_list, default=list(DEFAULT_COLLECTIVES),
                        help=f"comma list of {', '.join(COLLECTIVES)}, or none (default {','.join(DEFAULT_COLLECTIVES)})")
    parser.add_argument("--json", metavar="F", help="write the records (schema pycollect.bench/1) to F")
    parser.add_argument("--plot", metavar="F.png", help="write a plot (needs matplotlib)")
    parser.set_defaults(prog_name=parser.prog)


def add_arguments(parser) -> None:
    add_sweep_arguments(parser, "64M", 20)
    parser.add_argument("--csv", metavar="F", help="write the records as CSV to F")
    parser.add_argument("--backend", choices=BACKENDS, default="numpy",
                        help="array module of the buffers (cupy: intra-node pairs split into same/other device)")
    parser.add_argument("--serial", action="store_true",
                        help="measure one pair at a time instead of disjoint pairs at once")


def check_args(args) -> str | None:
    """The error of flags that only make sense together (None when fine)."""
    if args.min_bytes > args.max_bytes:
        return f"-b/--min-bytes {human_size(args.min_bytes)} is above -e/--max-bytes {human_size(args.max_bytes)}"
    memory = physical_memory()
    if memory is not None and args.max_bytes > memory:   # as the sweep refuses it (before: a MemoryError traceback)
        return (f"-e/--max-bytes {human_size(args.max_bytes)}: above this machine's memory ({memory / GiB:.1f} GiB), "
                f"and every rank holds buffers of the largest size")
    return None


def usage_error(args, message: str) -> int:
    sys.stderr.write(f"{args.prog_name}: error: {message}\n")
    return 2


def spread(sizes: list[int], k: int = COLL_SIZES) -> list[int]:
    """At most ``k`` of ``sizes``: both ends and evenly spaced (in the sweep's log scale) between."""
    if len(sizes) <= k:
        return list(sizes)
    idx = sorted({round(i * (len(sizes) - 1) / (k - 1)) for i in range(k)})
    return [sizes[i] for i in idx]


# -- array backend ----------------------------------------------------------------------------------------
# -- part 1: every pair -----------------------------------------------------------------------------------
def tournament(n: int, serial: bool = False) -> list[list[tuple[int, int]]]:
    """Rounds of disjoint pairs covering every pair of ``range(n)`` once (circle method).

    ``n - 1`` rounds (``n`` when odd; one rank sits out each round); ``serial``: one pair a round.
    """
    if serial:
        return [[(a, b)] for a in range(n) for b in range(a + 1, n)]
    players: list[int | None] = list(range(n)) + ([None] if n % 2 else [])
    m = len(players)
    rounds: list[list[tuple[int, int]]] = []
    for _ in range(m - 1):
        pairs = [(players[i], players[m - 1 - i]) for i in range(m // 2)]
        rounds.append([(min(a, b), max(a, b)) for a, b in pairs if a is not None and b is not None])
        players = [players[0], players[-1]] + players[1:-1]   # rotate all but the first
    return rounds


def pair_label(tier: str, device: str | None) -> str:
    return tier if device is None else f"{tier} ({device} device)"


def measure_pairs(comm, sizes: list[int], iters: int, xp=None, sync=lambda: None, devices=None,
                  serial: bool = False) -> list[dict] | None:
    """Ping-pong between every pair at every size; the records on rank 0 (None elsewhere).

    ``comm`` is a ``pycollect.Communicator``; ``devices[r]`` is rank r's GPU (None on the host).
    """
    import numpy as np
    xp = np if xp is None else xp
    buf = xp.zeros(max(sizes), xp.uint8)           # sent from
    got = xp.zeros(max(sizes), xp.uint8)           # received into
    mine = []
    for pairs in tournament(comm.size, serial):
        partner = next((b if a == comm.rank else a for a, b in pairs if comm.rank in (a, b)), None)
        for size in sizes:
            comm.barrier()
            if partner is None:
                continue
            rtts = _ping_pong(comm, partner, buf[:size], got[:size], iters, sync)
            if comm.rank < partner:
                mine.append(_pair_record(comm, partner, size, rtts, devices))
    everyone = gather_json(comm.mpi, mine)
    if everyone is None:
        return None
    return sorted((r for rs in everyone for r in rs), key=lambda r: (r["a"], r["b"], r["size_bytes"]))


def _ping_pong(comm, partner: int, send, recv, iters: int, sync) -> list[float]:
    """Round trips in seconds (timed on the lower rank; the higher one echoes and returns [])."""
    rtts = []
    first = comm.rank < partner
    for i in range(WARMUP + iters):
        if first:
            t0 = time.perf_counter()
            comm.send(send, partner, tag=1)
            comm.recv(recv, partner, tag=2)
            sync()
            if i >= WARMUP:
                rtts.append(time.perf_counter() - t0)
        else:
            comm.recv(recv, partner, tag=1)
            comm.send(send, partner, tag=2)
    return rtts


def _pair_record(comm, partner: int, size: int, rtts: list[float], devices) -> dict:
    a, b = comm.rank, partner
    tier = comm.topology.tier(a, b)
    device = None
    if devices is not None and devices[a] is not None and tier != "inter-node":
        device = "same" if devices[a] == devices[b] else "other"
    median = statistics.median(rtts)
    return {"section": "p2p", "a": a, "b": b, "tier": tier, "device": device, "link": pair_label(tier, device),
            "size_bytes": size, "iters": len(rtts), "rtt_us_median": median * 1e6, "rtt_us_min": min(rtts) * 1e6,
            "one_way_us": median / 2 * 1e6, "bandwidth_GBps": size / (median / 2) / 1e9}


def tier_summary(records: list[dict]) -> list[dict]:
    """Per link (tier, and device on GPUs): latency at the smallest size, bandwidth at the largest, over pairs."""
    out = []
    for link in dict.fromkeys(r["link"] for r in records):
        rows = [r for r in records if r["link"] == link]
        lo, hi = min(r["size_bytes"] for r in rows), max(r["size_bytes"] for r in rows)
        lat = [r["one_way_us"] for r in rows if r["size_bytes"] == lo]
        bw = [r["bandwidth_GBps"] for r in rows if r["size_bytes"] == hi]
        out.append({"link": link, "tier": rows[0]["tier"], "device": rows[0]["device"], "pairs": len(lat),
                    "latency_bytes": lo, "latency_us_min": min(lat), "latency_us_median": statistics.median(lat),
                    "latency_us_max": max(lat), "bandwidth_bytes": hi, "bandwidth_GBps_min": min(bw),
                    "bandwidth_GBps_median": statistics.median(bw), "bandwidth_GBps_max": max(bw)})
    order = {"intra-node": 0, "inter-node": 1}
    return sorted(out, key=lambda s: (order.get(s["tier"], 2), s["link"]))


def samples_by_tier(records: list[dict]) -> dict[str, list[tuple[int, float]]]:
    """``{tier: [(bytes, round-trip seconds), ...]}`` over all pairs and sizes: the cost model's input."""
    out: dict[str, list] = {}
    for r in records:
        out.setdefault(r["tier"], []).append((r["size_bytes"], r["rtt_us_median"] * 1e-6))
    return out


# -- part 2: collectives per scope ------------------------------------------------------------------------
def buffers(collective: str, nbytes: int, n: int, xp):
    """``(x, out, count)`` in float32; ``nbytes`` is the vector (allgather: the gathered output;
    alltoall: each rank's send buffer), rounded down to a multiple of n elements where split."""
    count = max(1, nbytes // 4)
    if collective != "allreduce":
        count = max(n, count // n * n)
    x = xp.ones(count // n if collective == "allgather" else count, xp.float32)
    out = xp.empty(count // n if collective == "reduce_scatter" else count, xp.float32)
    return x, out, count


def time_calls(comm, collective: str, x, out, algorithm: str, iters: int, sync) -> float:
    """This rank's median seconds per blocking call, after warmup (every rank of ``comm`` calls).

    The median, not the mean: on a shared machine one call descheduled for a time slice
    would otherwise decide the figure.
    """
    call = getattr(comm, collective)
    for _ in range(WARMUP):
        call(x, algorithm=algorithm, out=out)
    sync()
    comm.barrier()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        call(x, algorithm=algorithm, out=out)
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def scopes(world: Communicator) -> list[tuple[str, Communicator | None]]:
    """``[(name, Communicator or None where this rank is not in it)]``, the same names on every rank."""
    from mpi4py import MPI

    import pycollect as pc
    topo = world.topology
    out: list[tuple[str, Communicator | None]] = []
    local = world.mpi.Split_type(MPI.COMM_TYPE_SHARED, key=world.rank)
    if topo.ranks_per_node > 1:
        out.append(("intra-node", pc.Communicator(local) if local.size > 1 else None))
    if topo.num_nodes > 1:
        leaders = world.mpi.Split(0 if local.rank == 0 else MPI.UNDEFINED, world.rank)
        out.append(("inter-node", pc.Communicator(leaders) if leaders != MPI.COMM_NULL else None))
        out.append(("world", world))
    return out


def scope_algorithms(scope: str, collective: str, world) -> list[str]:
    names = ["mpi", "auto"]
    if scope == "world" and collective == "allreduce" and world.topology.num_nodes > 1:
        names.append("hierarchical")
    return names


def measure_collectives(world, collectives: list[str], sizes: list[int], iters: int, xp, sync) -> list[dict] | None:
    """Every collective x size x algorithm in every scope; the rows on rank 0 (None elsewhere)."""
    points = []
    mine: list[tuple[float, int, str] | None] = []   # (seconds, count, algorithm run); None outside the scope
    for scope, comm in scopes(world):
        n = max(allgather_json(world.mpi, comm.size if comm is not None else 0))
        for collective in collectives:
            for size in sizes:
                for algorithm in scope_algorithms(scope, collective, world):
                    points.append((scope, n, collective, size, algorithm))
                    world.barrier()
                    if comm is None:
                        mine.append(None)
                        continue
                    x, out, count = buffers(collective, size, comm.size, xp)
                    seconds = time_calls(comm, collective, x, out, algorithm, iters, sync)
                    resolved = comm.auto_algorithm(collective, count * 4) if algorithm == "auto" else algorithm
                    mine.append((seconds, count, resolved))
    everyone = gather_json(world.mpi, mine)
    if everyone is None:
        return None
    rows = []
    for i, (scope, n, collective, size, algorithm) in enumerate(points):
        got = [m[i] for m in everyone if m[i] is not None]
        seconds = max(g[0] for g in got)
        count, resolved = got[0][1], got[0][2]   # world rank 0 is in every scope, so got[0] is its
        algbw = count * 4 / seconds / 1e9
        rows.append({"section": "collective", "scope": scope, "ranks": n, "collective": collective,
                     "size_bytes": count * 4, "count": count, "algorithm": algorithm, "resolved": resolved,
                     "iters": iters, "time_us": seconds * 1e6, "algbw_GBps": algbw,
                     "busbw_GBps": algbw * bus_factor(collective, n)})
    return rows


# -- output -----------------------------------------------------------------------------------------------
def pair_table(records: list[dict], lo: int, hi: int) -> list[str]:
    rows = []
    for (a, b) in dict.fromkeys((r["a"], r["b"]) for r in records):
        at = {r["size_bytes"]: r for r in records if r["a"] == a and r["b"] == b}
        rows.append({"a": a, "b": b, "link": at[lo]["link"], "lat": at[lo]["one_way_us"], "bw": at[hi]["bandwidth_GBps"]})
    return format_table(rows, [("a", "a", "{}"), ("b", "b", "{}"), ("link", "tier", "{}"),
                               ("lat", f"latency us ({human_size(lo)})", "{:.1f}"),
                               ("bw", f"bandwidth GB/s ({human_size(hi)})", "{:.3f}")])


def summary_table(summary: list[dict]) -> list[str]:
    return format_table(summary, [
        ("link", "tier", "{}"), ("pairs", "pairs", "{}"),
        ("latency_us_min", "latency us min", "{:.1f}"), ("latency_us_median", "median", "{:.1f}"),
        ("latency_us_max", "max", "{:.1f}"), ("bandwidth_GBps_min", "bandwidth GB/s min", "{:.3f}"),
        ("bandwidth_GBps_median", "median", "{:.3f}"), ("bandwidth_GBps_max", "max", "{:.3f}")])


def collective_table(rows: list[dict]) -> list[str]:
    shown = [dict(r, size=human_size(r["size_bytes"]),
                  name=r["algorithm"] if r["algorithm"] != "auto" else f"auto ({r['resolved']})") for r in rows]
    return format_table(shown, [("scope", "scope", "{}"), ("ranks", "ranks", "{}"), ("collective", "collective", "{}"),
                                ("size", "size", "{}"), ("name", "algorithm", "{}"), ("time_us", "time us", "{:.1f}"),
                                ("busbw_GBps", "busbw GB/s", "{:.3f}")])


def p2p_curves(records: list[dict]) -> dict[str, dict[int, float]]:
    """``{link: {size: median bandwidth over pairs}}``."""
    out: dict[str, dict] = {}
    for link in dict.fromkeys(r["link"] for r in records):
        sizes = sorted({r["size_bytes"] for r in records if r["link"] == link})
        out[link] = {s: statistics.median(r["bandwidth_GBps"] for r in records
                                          if r["link"] == link and r["size_bytes"] == s) for s in sizes}
    return out


def plot(path: str, pairs: list[dict], rows: list[dict], title: str) -> str:
    """busbw against size (log2), one panel per tier, one line per algorithm; point-to-point bandwidth dashed."""
    plt = pyplot()
    curves = p2p_curves(pairs)
    panels = list(dict.fromkeys([r["scope"] for r in rows] + [c.split(" (")[0] for c in curves]))
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.2), squeeze=False)
    for ax, panel in zip(axes[0], panels):
        for link, curve in curves.items():
            if link.split(" (")[0] == panel:
                ax.plot(list(curve), list(curve.values()), "k--", marker=".", label=f"point-to-point {link}")
        here = [r for r in rows if r["scope"] == panel]
        for key in dict.fromkeys((r["collective"], r["algorithm"]) for r in here):
            line = [r for r in here if (r["collective"], r["algorithm"]) == key]
            ax.plot([r["size_bytes"] for r in line], [r["busbw_GBps"] for r in line], marker="o",
                    label=f"{key[0]} {key[1]}")
        ranks = next((r["ranks"] for r in here), None)
        ax.set_title(panel + (f" ({ranks} ranks)" if ranks else ""))
        size_axis(ax, [r["size_bytes"] for r in here] + [s for c in curves.values() for s in c])
        ax.set_xlabel("size (bytes)")
        ax.set_ylabel("busbw / bandwidth (GB/s)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    return save_figure(fig, path)


def size_axis(ax, sizes) -> None:
    """A log2 size axis labelled with the sizes measured (8, 32K, 1M, ...)."""
    ax.set_xscale("log", base=2)
    ticks = sorted(set(sizes))
    if ticks:
        ax.set_xticks(ticks, [human_size(s) for s in ticks], fontsize=7)
        ax.tick_params(axis="x", which="minor", bottom=False)


# -- the command ------------------------------------------------------------------------------------------
def run(args) -> int:
    error = check_args(args)
    if error:
        return usage_error(args, error)
    from .report import run_header, write_csv, write_json
    world = communicator(args.prog_name)
    if world is None:
        return 2
    outputs = (("--json", args.json), ("--csv", args.csv), ("--plot", args.plot))
    refused = refused_outputs(world, args.prog_name, outputs)   # matplotlib too, where --plot asks for it
    if refused is not None:
        return refused
    try:
        xp, sync, device = backend(args.backend, world.topology.local_rank(world.rank))
    except ValueError as e:
        raise SystemExit(str(e)) from None
    devices = allgather_json(world.mpi, device) if args.backend != "numpy" else None
    sizes = size_sweep(args.min_bytes, args.max_bytes, args.factor)
    pairs = measure_pairs(world, sizes, args.iters, xp, sync, devices, args.serial)
    rows = measure_collectives(world, args.collectives, spread(sizes), args.iters, xp, sync)
    if world.rank != 0:
        return 0
    summary = tier_summary(pairs) if pairs else []
    print(f"pycollect bench tiers: {world.topology.describe()}, backend {args.backend}")
    if pairs:
        print(f"\npoint-to-point, every pair ({'one at a time' if args.serial else 'disjoint pairs at once'}); "
              f"one-way = half the median round trip of {args.iters}")
        npairs = len({(r["a"], r["b"]) for r in pairs})
        if npairs <= MAX_PAIRS_SHOWN:
            print("\n".join(pair_table(pairs, sizes[0], sizes[-1])))
        else:
            print(f"({npairs} pairs: each one is in --json / --csv)")
        print("\nper tier (over pairs)")
        print("\n".join(summary_table(summary)))
    else:
        print("\npoint-to-point: one rank, no pairs")
    if rows:
        print("\ncollectives per scope (float32; time = slowest rank's median call)")
        print("\n".join(collective_table(rows)))
    records = (pairs or []) + (rows or [])
    head = run_header(world, backend=args.backend, sizes=sizes, iters=args.iters, serial=args.serial,
                      devices=devices)
    if args.json:
        print(f"\nwrote {write_json(args.json, 'tiers', head, records, tiers=summary)}")
    if args.csv:
        print(f"wrote {write_csv(args.csv, records, CSV_COLUMNS)}")
    if args.plot and (pairs or rows):
        print(f"wrote {plot(args.plot, pairs or [], rows or [], world.topology.describe())}")
    elif args.plot:
        print("no plot: one rank has no pairs and no scope of two ranks")
    sys.stdout.flush()
    return 0

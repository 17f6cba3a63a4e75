"""``pycollect explain``: one rank's rounds and every rank's traffic by tier, from the schedules, without MPI.

Nothing runs: the schedule of every rank is built for an even call of ``--bytes`` and walked,
as ``pc.traffic`` does. ``--bytes`` is the vector for allreduce, broadcast, reduce, scan, exscan and
reduce_scatter (reduce_scatter_block: equal blocks, reduce_scatter's schedules), the gathered total for
allgather and gather, the root's buffer for scatter, and each rank's send buffer for alltoall.
Messages are the schedule's; the executor may split each into ``PYCOLLECT_SEGMENT_BYTES`` pieces.

With ``--predict`` it prints instead the time and bus bandwidth the cluster simulator
(``clustersim.py``) predicts for the call: links from presets (``--links nvlink4,ib-ndr``,
the default) or a fitted model (``--model FILE``), ``--nics-per-node`` ports shared by a node's
inter-node messages; at scale from the algorithms' counted forms, and "not simulated" with the
reason for an algorithm that has none there.

``pycollect explain pipeline --schedule S --stages P --microbatches M [--virtual V]`` lists each
stage's forwards and backwards in order, simulates them (``pycollect.pipeline.simulate``: F, B
and message latency per chunk, non-blocking sends, blocking receives) and prints the bubble,
simulated and by formula, and each stage's peak activation memory; ``--plot`` draws the timeline.
Under ``mpiexec`` every rank checks the arguments and rank 0 prints.
"""
from __future__ import annotations

import argparse
import importlib.util
import math
import os
import sys
from collections import Counter, defaultdict, deque
from dataclasses import dataclass, replace

import numpy as np

from ..algorithms import registry
from ..engine import environment, ops
from ..engine import traffic as walk
from ..algorithms.registry import all_schedules, counted_summaries
from ..engine.summary import RankClasses, finish
from ..engine.schedule import Problem, Schedule, Slice
from ..engine.shapes import even_problem, segment_elements
from ..engine.topology import INTER, INTRA, Topology
from ..pipeline import schedules as pipeline_schedules
from . import report
from .common import finite_number, int_at_least
from .info import launcher_rank

PROG = "pycollect explain"
NOT_SCHEDULES = ("auto", "mpi")
PIPELINE = "pipeline"
# flags of one target that the other does not take (all default to None)
COLLECTIVE_FLAGS = ("algorithm", "size", "bytes", "nodes", "ranks_per_node", "tree_segment_bytes", "links", "nics_per_node",
                    "model")
DEFAULT_LINKS = "nvlink4,ib-ndr"
COLLECTIVE_REQUIRED = ("algorithm", "size", "bytes")
PIPELINE_FLAGS = ("schedule", "stages", "microbatches", "virtual", "forward_cost", "backward_cost", "weight_cost",
                  "comm_cost", "plot")
PIPELINE_REQUIRED = ("schedule", "stages", "microbatches")


def add_arguments(parser) -> None:
    targets = (*registry.NAMES, PIPELINE)
    parser.add_argument("collective", metavar="COLLECTIVE", choices=targets,
                        help=f"one of {', '.join(registry.NAMES)}; or {PIPELINE} for a pipeline schedule")
    parser.add_argument("--algorithm", metavar="A",
                        help="a schedule of the collective, or 'all' for one summary row each (required)")
    parser.add_argument("--size", type=_ranks, metavar="N", help=f"ranks (required; at most {MAX_RANKS})")
    parser.add_argument("--bytes", type=_size, metavar="B",
                        help="bytes of the call (8, 32K, 64M, 1G): the vector; allgather: the gathered total; "
                             "alltoall: each rank's send buffer")
    parser.add_argument("--nodes", type=_positive_int, metavar="K", help="K nodes of N/K ranks (default: one node)")
    parser.add_argument("--ranks-per-node", type=_positive_int, metavar="L", help="nodes of L ranks (L divides N)")
    parser.add_argument("--round-robin", action="store_true",
                        help="rank r on node r mod K (MPICH's cliques without CLIQUES_BY_BLOCK) instead of blocks")
    parser.add_argument("--root", type=int, default=0, metavar="R", help="root of broadcast and reduce (default 0)")
    parser.add_argument("--dtype", type=_dtype, default="float32", help="element type (default float32)")
    parser.add_argument("--tree-segment-bytes", "--pipeline-bytes", dest="tree_segment_bytes", type=_size, default=None,
                        metavar="B", help="segment of the segmented (pipelined) trees (default: "
                        "PYCOLLECT_TREE_SEGMENT_BYTES or 1M, as a call; --pipeline-bytes is its old name)")
    parser.add_argument("--rank", type=int, default=None, metavar="R",
                        help="whose rounds to print (default 0; one algorithm, without --predict)")
    parser.add_argument("--json", metavar="FILE", help="also write the tables as JSON (kind 'explain')")
    sim = parser.add_argument_group("explain COLLECTIVE --predict (the cluster simulator)")
    sim.add_argument("--predict", action="store_true",
                     help="print the simulated time and busbw of the call instead of its rounds and traffic")
    sim.add_argument("--links", metavar="INTRA,INTER",
                     help=f"link presets of the two tiers (default {DEFAULT_LINKS}; pycollect plan's names)")
    sim.add_argument("--nics-per-node", type=_positive_int, metavar="K",
                     help="inter-node ports a node's ranks share (default: none shared between ranks; the "
                          "presets' links give each rank one port a tier)")
    sim.add_argument("--model", metavar="FILE",
                     help="a fitted model ('pycollect bench fit --json' FILE) instead of --links")
    pipe = parser.add_argument_group("explain pipeline")
    pipe.add_argument("--schedule", choices=pipeline_schedules.ALL_SCHEDULES, help="the pipeline schedule (required)")
    pipe.add_argument("--stages", type=_positive_int, metavar="P", help="pipeline stages (required)")
    pipe.add_argument("--microbatches", type=_positive_int, metavar="M", help="micro-batches per step (required)")
    pipe.add_argument("--virtual", type=_positive_int, metavar="V",
                      help="chunks per stage of the interleaved schedule (default 2; zbv: 2; 1 elsewhere)")
    pipe.add_argument("--forward-cost", type=_cost, metavar="F", help="time of one chunk's forward (default 1)")
    pipe.add_argument("--backward-cost", type=_cost, metavar="B", help="time of one chunk's backward (default 2)")
    pipe.add_argument("--weight-cost", type=_cost, metavar="W",
                      help="time of the weight-gradient part of a backward, which zb-h1 and zb-h2 run apart "
                           "(default half of B; at most B)")
    pipe.add_argument("--comm-cost", type=_cost, metavar="C", help="latency of each message (default 0)")
    pipe.add_argument("--plot", metavar="FILE", help="draw the simulated timeline as FILE (PNG)")
    pipe.add_argument("--comm", action="store_true", help="list each stage's sends and receives too")


_positive_int = int_at_least(1)
MAX_RANKS = 1 << 20   # ranks are listed one by one (a topology, a shown rank's schedule): bounded, not endless
_ranks = int_at_least(1, MAX_RANKS, " (explain lists every rank one by one)")


# -- argument types (argparse turns their errors into one line and exit 2) ---------------------------
def _size(text: str) -> int:
    try:
        return report.parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


_cost = finite_number(0.0)


def _dtype(text: str) -> np.dtype:
    try:
        dtype = np.dtype(text)
    except TypeError:
        dtype = _extended_dtype(text)
    if ops.dtype_kind(dtype) == "?":
        raise argparse.ArgumentTypeError(f"dtype {dtype} is not supported; "
                                         "use an integer, float, complex or bfloat16 dtype")
    return dtype


def _extended_dtype(text: str) -> np.dtype:
    """A dtype NumPy knows once ml_dtypes is imported ("bfloat16"): imported only then, as it takes about half a
    second to import."""
    try:
        import ml_dtypes  # noqa: F401  (makes "bfloat16" a dtype name)
    except ImportError:
        pass
    try:
        return np.dtype(text)
    except TypeError:
        raise argparse.ArgumentTypeError(f"not a NumPy dtype: {text!r}") from None


# -- the call being explained ---------------------------------------------------------------------
@dataclass(frozen=True)
class Call:
    """One collective call of ``nbytes`` on ``topology``, everything a schedule walk needs."""

    collective: str
    topology: Topology
    nbytes: int
    dtype: np.dtype
    root: int
    tree_segment: int            # elements per segment of the segmented trees (0: one segment)

    @property
    def size(self) -> int:
        return self.topology.size

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    def problem(self) -> Problem:
        return even_problem(self.collective, 0, self.size, self.topology, self.nbytes // self.itemsize,
                            self.root, self.tree_segment)

    def schedules(self, algorithm: str) -> list[Schedule]:
        """``schedules[r]``: what rank r does."""
        return all_schedules(self.collective, algorithm, self.problem())

    def describe(self) -> str:
        n = self.nbytes // self.itemsize
        return (f"{self.collective} of {report.human_size(self.nbytes)} bytes ({n} {self.dtype}) "
                f"on {self.topology.describe()}")


def make_call(args) -> Call:
    """The call from checked arguments; ValueError names the argument at fault."""
    topology = make_topology(args.size, args.nodes, args.ranks_per_node, args.round_robin)
    if args.bytes % args.dtype.itemsize:
        raise ValueError(f"--bytes {args.bytes} is not a whole number of {args.dtype} "
                         f"elements ({args.dtype.itemsize} bytes each)")
    if args.collective == "reduce_scatter_block" and (args.bytes // args.dtype.itemsize) % args.size:
        raise ValueError(f"--bytes {args.bytes} does not split into --size {args.size} equal blocks of {args.dtype} "
                         "(reduce_scatter_block; reduce_scatter takes uneven ones)")
    if args.rank is not None and (args.algorithm == "all" or args.predict):
        raise ValueError(f"--rank {args.rank} picks whose rounds to print; "
                         f"{'--predict' if args.predict else '--algorithm all'} prints none")
    for flag, value in (("--root", args.root), ("--rank", args.rank or 0)):
        if not 0 <= value < args.size:
            raise ValueError(f"{flag} {value} is out of range for --size {args.size} (0..{args.size - 1})")
    seg = tree_segment_bytes(args.tree_segment_bytes)
    segment = segment_elements(seg, args.dtype.itemsize)
    return Call(args.collective, topology, args.bytes, args.dtype, args.root, segment)


def make_topology(size: int, nodes: int | None, per_node: int | None, round_robin: bool) -> Topology:
    """One node, or uniform nodes by block or round robin."""
    if nodes is None and per_node is None:
        if round_robin:
            raise ValueError("--round-robin needs --nodes or --ranks-per-node")
        return Topology.single_node(size)
    if nodes is not None:
        if size % nodes:
            raise ValueError(f"--nodes {nodes} does not divide --size {size}")
        if per_node is not None and per_node * nodes != size:
            raise ValueError(f"--nodes {nodes} x --ranks-per-node {per_node} is {nodes * per_node}, not --size {size}")
        per_node = size // nodes
    assert per_node is not None, "one of nodes and per_node is given here"
    if size % per_node:
        raise ValueError(f"--ranks-per-node {per_node} does not divide --size {size}")
    return Topology.uniform(size, per_node, by_block=not round_robin)


def tree_segment_bytes(flag: int | None) -> int:
    """``--tree-segment-bytes``, else what a call would use (``PYCOLLECT_TREE_SEGMENT_BYTES``, default 1 MiB)."""
    if flag is not None:
        return flag
    return environment.tree_segment_bytes()


def algorithm_names(collective: str, algorithm: str) -> list[str]:
    """The schedules to walk: one, or all of the collective's for ``all``."""
    names = registry.schedule_algorithms(collective)
    if algorithm == "all":
        return list(names)
    if algorithm in NOT_SCHEDULES:
        raise ValueError(f"--algorithm {algorithm!r} has no schedule to walk; choose one of {', '.join(names)}, or all")
    if algorithm not in names:
        raise ValueError(f"{collective} has no algorithm {algorithm!r}; expected one of {', '.join(names)}, or all")
    return [algorithm]


# -- the walk -------------------------------------------------------------------------------------
def critical_path(schedules: list[Schedule]) -> list[int]:
    """The round at which each rank finishes if every message takes one round and nothing else costs.

    A round starts when the rank's previous one ends and posts its sends then; it ends one round
    after the latest of its start and the start of each matching send (messages between a pair
    match in the order posted, as MPI's do). Rounds without messages take no time.
    """
    size = len(schedules)
    at, time, posted = [0] * size, [0] * size, [False] * size
    sent: dict = defaultdict(deque)     # (src, dst) -> start rounds of the sends not yet received
    moved = True
    while moved:
        moved = False
        for r, sched in enumerate(schedules):
            while at[r] < len(sched.rounds):
                rnd = sched.rounds[at[r]]
                if not posted[r]:
                    for s in rnd.sends:
                        sent[(r, s.peer)].append(time[r])
                    posted[r] = True
                if not _arrived(sent, r, rnd.recvs):
                    break
                start = max([time[r]] + [sent[(v.peer, r)].popleft() for v in rnd.recvs])
                time[r] = start + 1 if rnd.communicates else start
                at[r], posted[r], moved = at[r] + 1, False, True
    _check_drained(schedules, at, sent)
    return time


def _check_drained(schedules: list[Schedule], at: list[int], sent: dict) -> None:
    """RuntimeError naming a rank left waiting, or a message nobody receives."""
    for r, sched in enumerate(schedules):
        if at[r] < len(sched.rounds):
            raise RuntimeError(f"the schedules cannot finish: rank {r} waits in its round {at[r]} "
                               "for a message never sent")
    for (a, b), pending in sent.items():
        if pending:
            raise RuntimeError(f"the schedules do not match: rank {a} sends rank {b} "
                               f"{len(pending)} message(s) never received")


def _arrived(sent: dict, rank: int, recvs) -> bool:
    """Whether every receive of a round has a matching send posted."""
    if len(recvs) == 1:                  # the common case, without a Counter
        return bool(sent[(recvs[0].peer, rank)])
    return all(len(sent[(p, rank)]) >= k for p, k in Counter(v.peer for v in recvs).items())


def rank_records(call: Call, per_rank: list, finish: list[int]) -> list[dict]:
    """One row per rank: bytes and messages sent by tier, rounds, the round it finishes."""
    return [{"rank": t.rank, "node": call.topology.node_of[t.rank], "bytes_sent": t.bytes_sent,
             "bytes_sent_intra": t.sent_by_tier[INTRA], "bytes_sent_inter": t.sent_by_tier[INTER],
             "bytes_recv": t.bytes_recv, "messages_sent": t.messages_sent,
             "messages_intra": t.messages_by_tier[INTRA], "messages_inter": t.messages_by_tier[INTER],
             "rounds": t.rounds, "finish_round": finish[t.rank], "bytes_copied": t.bytes_copied}
            for t in per_rank]


def summarize(call: Call, algorithm: str, per_rank: list, finishes: list[int]) -> dict:
    """The textbook figures: the busiest rank's bytes (also as a multiple of the call) and the rounds, from every
    rank's counts and the round it finishes (no per-rank rows: ``--algorithm all`` prints none)."""
    return summarize_classes(call, algorithm, [(t, f, 1) for t, f in zip(per_rank, finishes)])


def summarize_classes(call: Call, algorithm: str, classes: list[tuple]) -> dict:
    """``summarize`` from ``(counts, finishing round, ranks)`` of each class of ranks that count alike: maxima over
    the classes, totals weighted by their ranks."""
    sent = [t.bytes_sent for t, _, _ in classes]
    intra = [t.sent_by_tier[INTRA] for t, _, _ in classes]
    inter = [t.sent_by_tier[INTER] for t, _, _ in classes]
    ranks = [m for _, _, m in classes]
    return {"collective": call.collective, "algorithm": algorithm, "size": call.size, "nbytes": call.nbytes,
            "max_bytes_sent": max(sent),
            "max_over_nbytes": max(sent) / call.nbytes if call.nbytes else None,
            "max_bytes_sent_intra": max(intra), "max_bytes_sent_inter": max(inter),
            "total_bytes": _weighted(sent, ranks), "total_bytes_intra": _weighted(intra, ranks),
            "total_bytes_inter": _weighted(inter, ranks), "max_messages_sent": max(t.messages_sent for t, _, _ in classes),
            "total_messages_inter": _weighted([t.messages_by_tier[INTER] for t, _, _ in classes], ranks),
            "rounds": max(t.rounds for t, _, _ in classes), "critical_path_rounds": max(f for _, f, _ in classes)}


def _weighted(values: list[int], ranks: list[int]) -> int:
    return sum(v * m for v, m in zip(values, ranks))


def explain(call: Call, algorithm: str, records: bool = True) -> tuple["list[Schedule] | _OneRank", list[dict] | None,
                                                                      dict]:
    """Schedules, per-rank records (None without ``records``) and summary of one algorithm.

    Above ``WALK_LIMIT`` ranks, an algorithm with a counted form (engine/summary.py) is counted without
    building every rank's rounds, and each rank finishes at its form's ``finish`` (its own round count, and the
    rounds it idles through in a tree): the formed schedules run in lockstep, as tests/test_summary.py checks
    against ``critical_path`` at small sizes. A form's classes of ranks are counted once each (the summary is
    theirs, weighted by their ranks; per-rank rows only with ``records``). Only the rank shown has its rounds
    built.
    """
    problem = call.problem()
    counted = counted_summaries(call.collective, algorithm, problem, in_step=False) if call.size > WALK_LIMIT else None
    schedules: list[Schedule] | _OneRank
    if counted is None:
        walked = schedules = call.schedules(algorithm)
        per_rank, finishes = walk.count(walked, call.topology, call.itemsize), critical_path(walked)
    elif isinstance(counted, RankClasses) and not records:
        ends = counted.finishes()
        classes = [(t, ends[c], m) for t, m, c in walk.count_classes(counted, call.itemsize)]
        return _OneRank(call.collective, algorithm, problem), None, summarize_classes(call, algorithm, classes)
    else:
        schedules = _OneRank(call.collective, algorithm, problem)
        per_rank, finishes = walk.count_summaries(counted, call.topology, call.itemsize), _finishes(counted)
    rows = rank_records(call, per_rank, finishes) if records else None
    return schedules, rows, summarize(call, algorithm, per_rank, finishes)


def _finishes(summaries) -> list[int]:
    """``finish`` of every rank's summary: once a class of a form's ``RankClasses``, else once for each summary
    object that ranks share."""
    if isinstance(summaries, RankClasses):
        ends = summaries.finishes()
        return [ends[c] for c in summaries.class_of]
    seen: dict = {}
    out = []
    for summary in summaries:
        hit = seen.get(id(summary))      # the list holds every summary, so no id is reused meanwhile
        if hit is None:
            hit = seen[id(summary)] = finish(summary)
        out.append(hit)
    return out


WALK_LIMIT = 1024


class _OneRank:
    """``schedules[r]`` built when asked: at scale, explain shows one rank's rounds."""

    def __init__(self, collective: str, algorithm: str, problem: Problem):
        self.build, self.problem = registry.get_schedule(collective, algorithm), problem
        self._made: dict[int, Schedule] = {}   # the printout asks for its rank twice: built once

    def __getitem__(self, rank: int) -> Schedule:
        if rank not in self._made:
            self._made[rank] = self.build(replace(self.problem, rank=rank))
        return self._made[rank]


# -- one rank's rounds ----------------------------------------------------------------------------
def round_rows(sched: Schedule, rank: int, topology: Topology, itemsize: int) -> list[dict]:
    """Every copy, send and receive of one rank, in the order a round runs them."""
    rows = []
    for i, rnd in enumerate(sched.rounds):
        rows += [_copy_row(i, "copy before", c, itemsize) for c in rnd.pre]
        rows += [_msg_row(i, "send", s.peer, topology.tier(rank, s.peer), s.src, _slice(s.src), itemsize)
                 for s in rnd.sends]
        rows += [_msg_row(i, "recv+reduce" if v.acc else "recv", v.peer, topology.tier(rank, v.peer), v.dst,
                          _recv_text(v), itemsize)
                 for v in rnd.recvs]
        rows += [_copy_row(i, "copy after", c, itemsize) for c in rnd.post]
    return rows


def _msg_row(i: int, op: str, peer: int, tier: str, s: Slice, where: str, itemsize: int) -> dict:
    return {"round": i, "op": op, "peer": peer, "tier": tier, "elements": s.n, "bytes": s.n * itemsize,
            "buffer": where}


def _copy_row(i: int, op: str, c, itemsize: int) -> dict:
    return {"round": i, "op": op, "peer": None, "tier": None, "elements": c.src.n, "bytes": c.src.n * itemsize,
            "buffer": f"{_slice(c.dst)} = " + (f"op({_slice(c.acc)}, {_slice(c.src)})" if c.acc else _slice(c.src))}


def _recv_text(v) -> str:
    """Where a receive lands, and how it is reduced (the lower ranks' operand first)."""
    if not v.acc:
        return _slice(v.dst)
    terms = ("msg", _slice(v.acc)) if v.incoming_first else (_slice(v.acc), "msg")
    return f"{_slice(v.dst)} = op({terms[0]}, {terms[1]})"


def _slice(s: Slice) -> str:
    return f"{s.buf}[{s.start}:{s.stop}]"


# -- printing -------------------------------------------------------------------------------------
def _b(nbytes) -> str:
    return report.human_size(nbytes)


def print_one(call: Call, rank: int, schedules, records, summary) -> None:
    algorithm = summary["algorithm"]
    print(f"{algorithm} {call.describe()}")
    print(f"\nrank {rank} (node {call.topology.node_of[rank]}): {len(schedules[rank].rounds)} rounds")
    rows = [dict(r, bytes=_b(r["bytes"])) for r in round_rows(schedules[rank], rank, call.topology, call.itemsize)]
    cols = [("round", "round", "{}"), ("op", "op", "{}"), ("peer", "peer", "{}"), ("tier", "tier", "{}"),
            ("elements", "elements", "{}"), ("bytes", "bytes", "{}"), ("buffer", "buffer", "{}")]
    print("\n".join(report.format_table(rows, cols)))
    print("\ntraffic per rank (bytes sent by tier; messages sent; rounds communicating; round it finishes):")
    print("\n".join(format_ranks(records)))
    print()
    print("\n".join(format_summary(call, summary)))


def format_ranks(records: list[dict]) -> list[str]:
    keys = ("bytes_sent_intra", "bytes_sent_inter", "bytes_sent", "bytes_recv", "messages_intra",
            "messages_inter", "bytes_copied")
    total = {"rank": "total", **{k: sum(r[k] for r in records) for k in keys}}
    byte_keys = [k for k in keys if k.startswith("bytes")]
    rows = [dict(r, **{k: _b(r[k]) for k in byte_keys}) for r in records + [total]]
    cols = [("rank", "rank", "{}"), ("node", "node", "{}"), ("bytes_sent_intra", "sent intra", "{}"),
            ("bytes_sent_inter", "sent inter", "{}"), ("bytes_sent", "sent", "{}"), ("bytes_recv", "received", "{}"),
            ("messages_intra", "msgs intra", "{}"), ("messages_inter", "msgs inter", "{}"),
            ("rounds", "rounds", "{}"), ("finish_round", "finishes", "{}"), ("bytes_copied", "copied", "{}")]
    return report.format_table(rows, cols)


def format_summary(call: Call, s: dict) -> list[str]:
    ratio = "" if s["max_over_nbytes"] is None else f" = {s['max_over_nbytes']:.4g} x {_b(call.nbytes)}"
    return [f"max bytes sent by one rank  {_b(s['max_bytes_sent'])}{ratio}"
            f"  (busiest rank per tier: intra-node {_b(s['max_bytes_sent_intra'])}, "
            f"inter-node {_b(s['max_bytes_sent_inter'])})",
            f"total bytes sent            {_b(s['total_bytes'])}"
            f"  (intra-node {_b(s['total_bytes_intra'])}, inter-node {_b(s['total_bytes_inter'])})",
            f"rounds                      {s['rounds']} on the busiest rank, "
            f"{s['critical_path_rounds']} on the critical path (one round per message hop)"]


def format_all(summaries: list[dict]) -> list[str]:
    rows = [dict(s, **{k: _b(s[k]) for k in s if k.startswith(("max_bytes", "total_bytes"))}) for s in summaries]
    cols = [("algorithm", "algorithm", "{}"), ("max_bytes_sent", "max sent/rank", "{}"),
            ("max_over_nbytes", "x B", "{:.4g}"), ("max_bytes_sent_inter", "max inter/rank", "{}"),
            ("total_bytes_intra", "total intra", "{}"), ("total_bytes_inter", "total inter", "{}"),
            ("max_messages_sent", "max msgs/rank", "{}"), ("rounds", "rounds", "{}"),
            ("critical_path_rounds", "critical path", "{}")]
    return report.format_table(rows, cols)


# -- the command ----------------------------------------------------------------------------------
def _error(message: str) -> int:
    sys.stderr.write(f"{PROG}: error: {message}\n")
    return 2


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def check_target_flags(args) -> None:
    """ValueError for a flag the target does not take, or a required one missing."""
    pipeline = args.collective == PIPELINE
    foreign = [_flag(k) for k in (COLLECTIVE_FLAGS if pipeline else PIPELINE_FLAGS) if getattr(args, k) is not None]
    foreign += ["--round-robin"] * (pipeline and args.round_robin) + ["--comm"] * (not pipeline and args.comm)
    foreign += ["--predict"] * (pipeline and args.predict)
    if foreign:
        where = "COLLECTIVE" if pipeline else PIPELINE
        verb = "is" if len(foreign) == 1 else "are"
        raise ValueError(f"{', '.join(foreign)} {verb} for 'explain {where}', not 'explain {args.collective}'")
    missing = [_flag(k) for k in (PIPELINE_REQUIRED if pipeline else COLLECTIVE_REQUIRED) if getattr(args, k) is None]
    if missing:
        raise ValueError(f"the following arguments are required: {', '.join(missing)}")
    simulator = [_flag(k) for k in ("links", "nics_per_node", "model") if getattr(args, k) is not None]
    if simulator and not pipeline and not args.predict:
        raise ValueError(f"{', '.join(simulator)}: the simulator's flags need --predict")


def run(args) -> int:
    try:
        check_target_flags(args)
        check_outputs(args)
    except ValueError as e:
        return _error(str(e))
    if args.collective == PIPELINE:
        return run_pipeline(args)
    try:
        names = algorithm_names(args.collective, args.algorithm)
        call = make_call(args)
    except ValueError as e:
        return _error(str(e))
    if args.predict:
        try:
            cluster = make_cluster(args)
        except ValueError as e:
            return _error(str(e))
    if launcher_rank(os.environ) != 0:     # under mpiexec, rank 0 prints; no MPI, no communication
        return 0
    if args.predict:
        return run_predict(args, call, names, cluster)
    try:
        results = [explain(call, name, records=args.algorithm != "all") for name in names]
    except RuntimeError as e:
        sys.stderr.write(f"{PROG}: {call.collective} {', '.join(names)}: {e}\n")
        return 1
    if args.algorithm == "all":
        print(f"every {call.describe()}")
        print("\n".join(format_all([s for _, _, s in results])))
    else:
        print_one(call, args.rank or 0, *results[0])
    return wrote_json(args, lambda: write(args, call, results))


def check_outputs(args) -> None:
    """ValueError naming ``--json`` or ``--plot`` where that file cannot be written (checked before any work)."""
    problem = report.outputs_problem((_flag(flag), getattr(args, flag, None)) for flag in ("json", "plot"))
    if problem:
        raise ValueError(problem)


def explained_header(topology: Topology, **explained) -> dict:
    """The JSON header: the host's facts and the world explained (not this one, and no MPI: nothing ran)."""
    return report.host_header(world_size=topology.size, topology=topology.describe(), node_of=list(topology.node_of),
                              explain=explained)


def wrote_json(args, writer) -> int:
    """With ``--json``: ``writer()`` writes it and the path is printed (0), or one line says why not (2)."""
    if not args.json:
        return 0
    try:
        print(f"wrote {writer()}")
    except OSError as e:
        return _error(f"cannot write --json {args.json}: {e}")
    return 0


def write(args, call: Call, results) -> str:
    """The JSON file: per-rank records and the summary, or one summary record per algorithm for ``all``."""
    header = explained_header(call.topology, collective=call.collective, algorithm=args.algorithm,
                              nbytes=call.nbytes, dtype=str(call.dtype), root=call.root,
                              tree_segment_elements=call.tree_segment, rank=args.rank or 0)
    if args.algorithm == "all":
        return report.write_json(args.json, "explain", header, [s for _, _, s in results])
    schedules, records, summary = results[0]
    rank = args.rank or 0
    rows = round_rows(schedules[rank], rank, call.topology, call.itemsize)
    return report.write_json(args.json, "explain", header, records, summary=summary,
                             rounds={"rank": rank, "rows": rows})


# -- explain COLLECTIVE --predict: the cluster simulator ----------------------------------------------
def make_cluster(args):
    """The simulator's cluster from ``--links`` or ``--model`` and ``--nics-per-node``; ValueError names the flag."""
    from ..plan.config import links_from_file, links_from_presets
    from ..clustersim import Cluster
    if args.model is not None and args.links is not None:
        raise ValueError("--model and --links both give the links: choose one")
    if args.model is not None:
        model = links_from_file(args.model)
    else:
        names = (args.links or DEFAULT_LINKS).split(",")
        if len(names) != 2:
            raise ValueError(f"--links {args.links!r}: expected two presets INTRA,INTER, e.g. {DEFAULT_LINKS}")
        try:
            model = links_from_presets(*names)
        except ValueError as e:
            raise ValueError(f"--links: {e}") from None
    return Cluster(model, args.nics_per_node)


def cluster_text(args) -> str:
    links = f"fitted model {args.model}" if args.model else f"links {args.links or DEFAULT_LINKS} (a port a rank)"
    nics = "no NIC limit" if args.nics_per_node is None else f"{args.nics_per_node} NIC(s) a node"
    return f"{links}, {nics}"


def run_predict(args, call: Call, names: list[str], cluster) -> int:
    """Rank 0: one row per algorithm, the simulated seconds and bandwidths (and why a row has none)."""
    from ..clustersim import predict
    try:
        rows = [predict(cluster, call.collective, a, call.topology, call.nbytes, call.itemsize,
                        call.tree_segment * call.itemsize, root=call.root).to_dict() for a in names]
    except ValueError as e:       # a fitted model without the tier this topology needs
        sys.stderr.write(f"{PROG}: {call.collective}: {e}\n")
        return 1
    print(f"predicted: {call.collective} of {report.human_size(call.nbytes)} bytes ({call.dtype}) on "
          f"{call.topology.describe()}; "
          f"{cluster_text(args)}")
    shown = [dict(r, time=None if r["seconds"] is None else r["seconds"] * 1e6) for r in rows]
    cols = [("algorithm", "algorithm", "{}"), ("time", "time us", "{:.1f}"), ("algbw_GBps", "algbw GB/s", "{:.3f}"),
            ("busbw_GBps", "busbw GB/s", "{:.3f}"), ("method", "simulated by", "{}"), ("note", "note", "{}")]
    print("\n".join(report.format_table(shown, cols)))
    header = explained_header(call.topology, collective=call.collective, algorithm=args.algorithm,
                              nbytes=call.nbytes, dtype=str(call.dtype), root=call.root, predict=cluster_text(args))
    return wrote_json(args, lambda: report.write_json(args.json, "explain", header, rows))


# -- explain pipeline: a schedule's action lists, simulated -----------------------------------------
@dataclass(frozen=True)
class PipelineCall:
    """One pipeline step to explain: the schedule, its shape and the costs per chunk."""

    schedule: str
    p: int
    m: int
    v: int
    costs: dict

    def describe(self) -> str:
        chunks = f", {self.v} chunks per stage" if self.v > 1 else ""
        split = (f" (input gradient {self.costs['B'] - self.costs['W']:g}, W={self.costs['W']:g})"
                 if self.schedule in pipeline_schedules.ZERO_BUBBLE else "")
        return (f"{self.schedule} pipeline: {self.p} stages, {self.m} micro-batches{chunks}; per chunk "
                f"F={self.costs['F']:g} B={self.costs['B']:g}{split} comm={self.costs['comm']:g}")


MAX_PIPELINE_CHUNKS = 100_000   # stages x micro-batches x chunks that explain pipeline walks (about 15 s here)


def make_pipeline_call(args) -> PipelineCall:
    """The pipeline from checked arguments; ValueError names the flag at fault."""
    chunked = pipeline_schedules.interleaved(args.schedule)
    vshape = pipeline_schedules.vshaped(args.schedule)
    v = args.virtual if args.virtual is not None else (2 if chunked or vshape else 1)
    if vshape and v != 2:
        raise ValueError(f"--virtual {v}: {args.schedule} places exactly two chunks per stage, V-wise")
    p, m = args.stages, args.microbatches
    if not chunked and not vshape and v != 1:
        raise ValueError(f"--virtual {v}: {args.schedule} has one chunk per stage; "
                         "virtual stages need --schedule interleaved")
    if chunked and v > 1 and m < p:
        raise ValueError(f"--microbatches {m} is fewer than --stages {p}, "
                         "which the interleaved schedules refuse (micro-batches go in groups of at least p)")
    if p * m * v > MAX_PIPELINE_CHUNKS:   # the walk keeps every action: 1000 x 1000 ran past 2 minutes and 2 GB
        raise ValueError(f"--stages {p} x --microbatches {m} x --virtual {v} = {p * m * v:,} chunk passes; at most "
                         f"{MAX_PIPELINE_CHUNKS:,} are walked (bubble_formula gives the textbook figure at any size)")
    pipeline_schedules.check_schedule_args(args.schedule, p, m, v)      # the library's own check, as a backstop
    costs = {"F": 1.0 if args.forward_cost is None else args.forward_cost,
             "B": 2.0 if args.backward_cost is None else args.backward_cost,
             "comm": 0.0 if args.comm_cost is None else args.comm_cost}
    costs["W"] = costs["B"] / 2 if args.weight_cost is None else args.weight_cost
    if costs["F"] + costs["B"] == 0:
        raise ValueError("--forward-cost and --backward-cost are both 0: nothing takes time")
    if costs["W"] > costs["B"]:
        raise ValueError(f"--weight-cost {costs['W']:g} exceeds --backward-cost {costs['B']:g}: "
                         "W is the part of the backward a zero-bubble schedule runs apart")
    pairs = p * m * v   # each (stage, micro-batch, chunk) runs at most an F, a B and a W, and four transfers
    if not math.isfinite(3 * pairs * max(costs["F"], costs["B"], costs["W"]) + 4 * pairs * costs["comm"]):
        raise ValueError("--forward-cost, --backward-cost, --weight-cost and --comm-cost are so large that the run's "
                         "time could pass what a float holds; scale them down")
    return PipelineCall(args.schedule, p, m, v, costs)


def formula_text(schedule: str) -> str:
    if schedule == "zbv":
        return "(p-1)/(6m+p-1) at T_F = T_B = T_W per chunk"
    if schedule in pipeline_schedules.ZERO_BUBBLE:
        return "(p-1)/(3m+p-1) at T_F = T_B = T_W"
    return "(p-1)/(m*v+p-1)" if pipeline_schedules.interleaved(schedule) else "(p-1)/(m+p-1)"


def stage_line(actions, comm: bool) -> str:
    """One stage's actions, compactly: ``F0 F1 B0 ...`` (``.c`` for chunk c > 0)."""
    from ..pipeline.actions import COMPUTE
    return " ".join(str(a) for a in actions if comm or a.op in COMPUTE)


def pipeline_records(call: PipelineCall, result) -> list[dict]:
    """One row per stage: busy time, idle fraction, peak activations, when it finishes."""
    return [{"stage": s, "busy": result.busy[s], "bubble": result.per_stage_bubble[s],
             "peak_in_flight": result.peak_in_flight[s], "peak_chunk_activations": result.peak_chunk_activations[s],
             "finish": result.finish[s],
             "warmup": pipeline_schedules.warmup_count(call.schedule, call.p, call.m, call.v, s)}
            for s in range(call.p)]


def print_pipeline(call: PipelineCall, lists, result, formula: float, comm: bool) -> None:
    print(call.describe())
    print()
    for s, actions in enumerate(lists):
        print(f"stage {s}: {stage_line(actions, comm)}")
    if not comm and call.p > 1:
        print("(each F after its RECV_ACT and before its SEND_ACT, each B likewise with gradients; --comm lists them)")
    print()
    cols = [("stage", "stage", "{}"), ("warmup", "warm-up F", "{}"), ("busy", "busy", "{:g}"),
            ("bubble", "idle", "{:.1%}"), ("peak_in_flight", "peak micro-batches", "{}"),
            ("peak_chunk_activations", "peak chunk activations", "{}"), ("finish", "finishes", "{:g}")]
    print("\n".join(report.format_table(pipeline_records(call, result), cols)))
    print()
    ideal = call.m * call.v * (call.costs["F"] + call.costs["B"])
    print(f"makespan {result.makespan:g} (the work of one stage: {ideal:g})")
    note = " (which counts no communication time)" if call.costs["comm"] and call.p > 1 else ""
    print(f"bubble {result.bubble:.2%} simulated, {formula:.2%} by the formula {formula_text(call.schedule)}{note}")
    if call.schedule in pipeline_schedules.ZERO_BUBBLE:
        print(f"span bubble {result.span_bubble:.2%} (idle inside each stage's own span: what is lost when "
              "no synchronising optimizer step separates the steps)")


def pipeline_caption(call: PipelineCall, result, formula: float) -> str:
    return (f"bubble {result.bubble:.1%} simulated ({formula:.1%} by {formula_text(call.schedule)}); "
            f"makespan {result.makespan:g}; peak micro-batches held per stage: "
            f"{' '.join(map(str, result.peak_in_flight))}"
            + (f"; chunk activations: {' '.join(map(str, result.peak_chunk_activations))}" if call.v > 1 else ""))


def run_pipeline(args) -> int:
    from ..pipeline import bubble_formula, simulate
    try:
        call = make_pipeline_call(args)
    except ValueError as e:
        return _error(str(e))
    if launcher_rank(os.environ) != 0:     # under mpiexec, rank 0 prints and draws; no MPI, no communication
        return 0
    lists = pipeline_schedules.all_actions(call.schedule, call.p, call.m, call.v)
    result = simulate(lists, v=call.v, costs=call.costs, vshape=pipeline_schedules.vshaped(call.schedule))
    if result.deadlock:                     # the library's schedules never do; say so loudly if one does
        sys.stderr.write(f"{PROG}: {call.describe()}: {result.describe_deadlock()}\n")
        return 1
    formula = bubble_formula(call.schedule, call.p, call.m, call.v)
    print_pipeline(call, lists, result, formula, args.comm)
    if args.plot and importlib.util.find_spec("matplotlib") is None:   # one line, not a traceback
        sys.stderr.write(f"{PROG}: error: --plot needs matplotlib (pip install matplotlib)\n")
        return 2
    try:
        if args.plot:
            from ..pipeline.plot import plot_timeline
            title = f"{call.schedule}: p={call.p} stages, m={call.m} micro-batches" + (
                f", v={call.v} chunks" if call.v > 1 else "")
            drawn = plot_timeline(result.timeline, call.p, title=title, path=args.plot,
                                  caption=pipeline_caption(call, result, formula))
            print(f"wrote {drawn}")
        if args.json:
            print(f"wrote {write_pipeline(args, call, lists, result, formula)}")
    except OSError as e:
        return _error(f"cannot write {e.filename}: {e.strerror}")
    return 0


def write_pipeline(args, call: PipelineCall, lists, result, formula: float) -> str:
    """The JSON file: one record per stage, the summary, the action lists and the timeline (re-plottable)."""
    header = explained_header(Topology.single_node(call.p), target=PIPELINE, schedule=call.schedule, p=call.p,
                              m=call.m, v=call.v, costs=call.costs)
    summary = dict(result.summary(), schedule=call.schedule, m=call.m, v=call.v, bubble_formula=formula,
                   formula=formula_text(call.schedule))
    records = [dict(r, actions=[str(a) for a in lists[r["stage"]]]) for r in pipeline_records(call, result)]
    timeline = [[[start, end, list(a)] for start, end, a in row] for row in result.timeline]
    return report.write_json(args.json, "explain", header, records, summary=summary, timeline=timeline)

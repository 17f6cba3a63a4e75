"""``PYCOLLECT_TRACE=DIR``: every rank records its collectives as Chrome trace events (Perfetto, chrome://tracing).

One complete event (``"ph": "X"``, category ``collective``) per call, args ``{collective,
algorithm, bytes, dtype, accumulate, op, seq, rounds, blocking, comm}``; inside it one span per round of
its schedule (category ``round``: index, peers, bytes sent and received) and, inside the round,
a ``wait`` span from posting its requests to their completion. The ``"mpi"`` algorithm is one
span per call, without rounds (MPI's own); a barrier is such a span of 0 bytes, dtype null.

``pid`` is the world rank. ``tid`` is a lane of a communicator: its blocking calls share one,
and each non-blocking call takes a lane of its own while in flight, because spans on one track
must nest. Times are microseconds on rank 0's clock, counted from a common origin: when a
process's first traced Communicator is created, each rank measures its offset from rank 0 by
ping-pong (or takes none when ``MPI.WTIME_IS_GLOBAL``), so ``PYCOLLECT_TRACE`` must be set on every
rank or on none: a Communicator's settings agree on it (pycollect/settings.py). The directory may
differ between ranks (a node's local disk); a rank that cannot write to its own makes every rank
raise, naming it, before any clock is measured.

The collective span says what the caller handed in (``bytes`` and ``dtype`` of ``x``, as
``comm.record()`` does), and ``accumulate``: the dtype a float16 or bfloat16 reduction is reduced in
(None: its own). Its rounds count the bytes that travel (in the accumulation dtype).

A process writes ``DIR/pycollect-trace-rank{R}.json`` (everything recorded so far) at exit and
from ``Communicator.free()``; ``pycollect trace merge DIR`` joins the ranks. Unset, the
runner has no tracer and nothing here runs.
"""
from __future__ import annotations

import atexit
import json
import math
import os
import platform
import threading

import numpy as np
from mpi4py import MPI

from . import environment
from .exchange import allgather_json
from .observe import Observer
from .trace_files import FILE
from .validate import failures

ENV = environment.TRACE
_TRIES = 8   # ping-pongs per rank; the fastest one gives the offset
_TAG = 0     # alignment runs on a fresh private communicator, before any collective is on it

# One trace file per directory and process, shared by every traced Communicator in the process.
_files: dict[str, "RankFile"] = {}


def from_env(runner) -> "Tracer | None":
    """The tracer of a Communicator's runner being created (pycollect/runner.py: ``lib``, ``rank``, ``size``,
    ``topology``), or None when ``PYCOLLECT_TRACE`` is unset.

    Set or unset on every rank alike (the Communicator's settings agreed on it). Set, collective over
    ``runner.lib``: every rank says whether it can write its directory and whether it opens its file there
    now; an OSError on every rank when any cannot, else the clock alignment when any rank opens its file.
    """
    directory = environment.directory(ENV)
    if directory is None:
        return None
    out = _files.get(directory)
    problem = None if out is not None else _unwritable(directory)
    mine = np.array([problem is not None, out is None], np.int64)
    table = np.empty((runner.size, 2), np.int64)   # (size, 2): every rank's (cannot write, opens its file)
    runner.lib.Allgather(mine, table)
    if table[:, 0].any():
        failed = {r: m for r, m in enumerate(allgather_json(runner.lib, problem)) if m is not None}
        raise OSError(f"{ENV}: {failures(failed, 'trace directory check')}; no rank traces this Communicator")
    if table[:, 1].any():   # measured by every rank, kept by those opening their file
        clock = align(runner.lib)
        if out is None:
            out = _files[directory] = RankFile(directory, runner, clock)
    assert out is not None, "a rank without its file opened it above"
    return Tracer(out, runner)


def _unwritable(directory: str) -> str | None:
    """Why this rank cannot write its trace file in ``directory`` (made if missing), or None when it can."""
    probe = os.path.join(directory, FILE.format(rank=MPI.COMM_WORLD.Get_rank()) + ".tmp")
    try:
        os.makedirs(directory, exist_ok=True)
        with open(probe, "w"):
            pass
        os.remove(probe)
    except OSError as e:
        return f"cannot write the trace directory {directory!r} ({type(e).__name__}: {e})"
    return None


# -- the clock ------------------------------------------------------------------------------------
def align(mpi_comm: MPI.Intracomm) -> dict:
    """This rank's clock against rank 0's: add ``offset_s`` to ``MPI.Wtime()``; ``origin_s`` is the common zero."""
    is_global = bool(MPI.COMM_WORLD.Get_attr(MPI.WTIME_IS_GLOBAL))  # the same value on every process
    offset, rtt = 0.0, 0.0
    if not is_global and mpi_comm.Get_size() > 1:
        offset, rtt = _pingpong(mpi_comm)
    mpi_comm.Barrier()
    origin = np.array([MPI.Wtime()])
    mpi_comm.Bcast(origin, root=0)   # buffer-based: the library sends no pickles
    return {"method": "global" if is_global else "pingpong", "offset_s": offset, "rtt_s": rtt,
            "origin_s": float(origin[0]), "ranks": mpi_comm.Get_size()}


def _pingpong(mpi_comm: MPI.Intracomm) -> tuple[float, float]:
    """(offset from rank 0's clock, round trip) of the fastest of ``_TRIES`` exchanges (Cristian's method)."""
    t = np.zeros(1)
    if mpi_comm.Get_rank() == 0:
        for peer in range(1, mpi_comm.Get_size()):
            for _ in range(_TRIES):
                mpi_comm.Recv(t, peer, _TAG)
                t[0] = MPI.Wtime()
                mpi_comm.Send(t, peer, _TAG)
        return 0.0, 0.0
    best = (math.inf, 0.0)
    for _ in range(_TRIES):
        t1 = MPI.Wtime()
        mpi_comm.Send(t, 0, _TAG)
        mpi_comm.Recv(t, 0, _TAG)
        t2 = MPI.Wtime()
        best = min(best, (t2 - t1, float(t[0]) - (t1 + t2) / 2))
    return best[1], best[0]


# -- the per-rank file ------------------------------------------------------------------------------
class RankFile:
    """This process's events (raw ``MPI.Wtime`` seconds until written), its lanes and its clock."""

    def __init__(self, directory: str, runner, clock: dict):
        self.rank, self.world_size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
        self.path = os.path.join(directory, FILE.format(rank=self.rank))
        self.clock = clock                # align()'s
        self.shift = self.clock["offset_s"] - self.clock["origin_s"]
        self.node = runner.topology.node_of[runner.rank]
        self.events: list[tuple] = []     # (kind, tid, t0, t1, payload); dicts are built when written
        self.tids: dict = {}              # (communicator index, lane) -> tid
        self.comms: list[dict] = []
        atexit.register(self.flush)

    def add_comm(self, runner) -> int:
        self.comms.append({"index": len(self.comms), "rank": runner.rank, "size": runner.size})
        return len(self.comms) - 1

    def tid(self, comm_index: int, lane: int) -> int:
        key = (comm_index, lane)
        if key not in self.tids:
            self.tids[key] = len(self.tids)
        return self.tids[key]

    def flush(self) -> str:
        """Write every event so far (the whole file, replaced at once); returns its path.

        Calls no MPI: it also runs at exit, possibly after MPI_Finalize.
        """
        from importlib.metadata import PackageNotFoundError, version
        try:   # the installed distribution's (setuptools-scm: the git tag and commit); engine/ never imports the root
            __version__ = version("pycollect-mpi")
        except PackageNotFoundError:
            __version__ = "0.0.0+unknown"
        events = self._metadata() + [self._event(*e) for e in self.events]
        info = {"pycollect": __version__, "rank": self.rank, "world_size": self.world_size,
                "node": self.node, "host": platform.node(), "pid": os.getpid(), "clock": self.clock,
                "communicators": self.comms}
        tmp = self.path + ".tmp"
        try:
            with open(tmp, "w") as f:
                json.dump({"traceEvents": events, "displayTimeUnit": "ms", "otherData": info}, f,
                          separators=(",", ":"))
            os.replace(tmp, self.path)
        except OSError as e:   # this rank's alone (no MPI here): its directory went away or filled up
            raise OSError(f"{ENV}: rank {self.rank} cannot write its trace file {self.path!r} "
                          f"({type(e).__name__}: {e})") from e
        return self.path

    def _metadata(self) -> list[dict]:
        pid = self.rank
        meta = [{"ph": "M", "pid": pid, "tid": 0, "name": "process_name",
                 "args": {"name": f"rank {self.rank} (node {self.node})"}},
                {"ph": "M", "pid": pid, "tid": 0, "name": "process_sort_index", "args": {"sort_index": self.rank}}]
        for (comm, lane), tid in self.tids.items():
            name = f"comm {comm}" if lane == 0 else f"comm {comm} non-blocking {lane}"
            meta.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_name", "args": {"name": name}})
            meta.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_sort_index", "args": {"sort_index": tid}})
        return meta

    def _event(self, kind: str, tid: int, t0: float, t1: float, payload) -> dict:
        ev = {"ph": "X", "pid": self.rank, "tid": tid, "ts": round((t0 + self.shift) * 1e6, 3),
              "dur": round((t1 - t0) * 1e6, 3)}
        if kind == "collective":
            ev.update(name=f"{payload['collective']} {payload['algorithm']}", cat="collective",
                      args=dict(payload, dtype=None if payload["dtype"] is None else str(payload["dtype"])))
            return ev
        index, rnd, itemsize, seq = payload
        send_to, recv_from = [s.peer for s in rnd.sends], [r.peer for r in rnd.recvs]
        if kind == "wait":
            ev.update(name="wait", cat="wait", args={"seq": seq, "round": index, "recv_from": recv_from,
                                                     "send_to": send_to})
            return ev
        ev.update(name=f"round {index}", cat="round", args={
            "seq": seq, "round": index, "peers": sorted(set(send_to + recv_from)), "send_to": send_to,
            "recv_from": recv_from, "bytes_sent": sum(s.src.n for s in rnd.sends) * itemsize,
            "bytes_recv": sum(r.dst.n for r in rnd.recvs) * itemsize, "copies": len(rnd.pre) + len(rnd.post)})
        return ev


# -- one communicator --------------------------------------------------------------------------------
class Tracer(Observer):
    """What one Communicator records, on its lanes of the process's file: an observer of its runner."""

    def __init__(self, out: RankFile, runner):
        self.out = out
        self.index = out.add_comm(runner)
        out.tid(self.index, 0)            # blocking calls: tid 0 for the process's first communicator
        self._busy: set[int] = set()      # non-blocking lanes in flight
        self._lanes = threading.Lock()    # take_lane: one thread at a time
        self._spans: dict[int, _Call] = {}   # calls started and not yet ended, by call number
        # calls handed in and not yet started, by call number: (dtype, bytes, accumulate) of the caller's x
        self._given: dict[int, tuple] = {}

    def take_lane(self) -> int:
        with self._lanes:   # two threads may start calls at once (a deferred one in a Request's wait): one lane each
            lane = 1
            while lane in self._busy:
                lane += 1
            self._busy.add(lane)
            return lane

    def give_lane(self, lane: int) -> None:
        self._busy.discard(lane)

    # -- the observer's hooks (engine/observe.py) ----------------------------------------------------
    def before(self, call) -> None:
        if call.seq >= 0:   # a collective (messages take no number and have no span)
            self._given[call.seq] = (call.x.dtype, call.x.nbytes, call.accumulate)

    def start(self, call, rounds: int | None) -> None:
        # what runs may be a copy of x (accumulate's, alltoall's packed blocks): the span says what was handed in
        given = self._given.pop(call.seq, None)
        self._spans[call.seq] = _Call(self, call, rounds, given or (call.x.dtype, call.x.nbytes, call.accumulate))

    def round(self, call, index: int, rnd, times) -> None:
        self._spans[call.seq].round(index, rnd, call.x.dtype.itemsize, *times)

    def after(self, call) -> None:
        span = self._spans.pop(call.seq, None)
        if span is not None:
            span.end()

    def flush(self) -> str:
        return self.out.flush()


def _op_text(op):
    """The op as JSON holds it: its name (a user's ``Op`` by its name), or None."""
    return None if op is None else str(op)


class _Call:
    """One collective call: its span's start, lane and arguments."""

    def __init__(self, tracer: Tracer, call, rounds, given: tuple):
        self.tracer = tracer
        self.lane = 0 if call.blocking else tracer.take_lane()
        self.tid = tracer.out.tid(tracer.index, self.lane)
        dtype, nbytes, accumulate = given   # the caller's x (Tracer.before)
        self.args = {"collective": call.collective, "algorithm": call.name, "bytes": int(nbytes), "dtype": dtype,
                     "accumulate": accumulate, "op": _op_text(call.op), "seq": call.seq, "rounds": rounds,
                     "blocking": bool(call.blocking), "comm": tracer.index}
        self.start = MPI.Wtime()

    def end(self) -> None:
        self.tracer.out.events.append(("collective", self.tid, self.start, MPI.Wtime(), self.args))
        if self.lane:
            self.tracer.give_lane(self.lane)

    def round(self, index: int, rnd, itemsize: int, start: float, posted: float, done: float, end: float) -> None:
        events, payload = self.tracer.out.events, (index, rnd, itemsize, self.args["seq"])
        events.append(("round", self.tid, start, end, payload))
        if rnd.communicates:
            events.append(("wait", self.tid, posted, done, payload))

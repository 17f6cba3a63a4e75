"""The watchdog (``PYCOLLECT_TIMEOUT=seconds``): blocking waits that end instead of hanging.

With a timeout, every blocking wait of a Communicator (a round of a schedule, MPI's own
collective started non-blocking, a point-to-point message, a barrier, the small exchanges
of counts and fingerprints) polls its requests with ``Testall`` until a deadline of
``timeout`` seconds from the start of the wait. A round that completes starts the clock
again, so a long collective of many rounds never times out while it progresses.

On expiry the rank writes its flight recorder, ``pycollect-flight-rank{R}.json`` (``R``
the world rank) in ``PYCOLLECT_FLIGHT_DIR`` (default: ``pycollect-flight`` in the temporary directory,
``tempfile.gettempdir()``, never the current one; the timeout's message names the file): the last
:data:`KEEP` collectives of the Communicator with their state. Then, by default
(``PYCOLLECT_TIMEOUT_ABORT=1``), it prints the :class:`CollectiveTimeout` message to stderr,
waits a moment (so that other ranks that timed out can write theirs) and ends the job
(``abort.end_job``: ``MPI.COMM_WORLD.Abort(1)``, then this process ends; nothing returns to the
caller) so that no rank is left hanging; with
``PYCOLLECT_TIMEOUT_ABORT=0`` it raises the exception instead (interactive use). An MPI
error while polling (MPI noticed a peer's process fail) takes the same way, as a
``CollectiveError`` naming the call and the pending peers.

Polling yields the core between tests (as MPI's own waits do) and, after a few
milliseconds, sleeps between them, which matters when ranks outnumber cores.

Without a timeout the Communicator holds no Watchdog and none of this runs.
"""
from __future__ import annotations

import json
import os
import platform
import threading
import time
from collections import deque
from typing import Callable

from mpi4py import MPI

from . import environment
from .abort import end_job
from .errors import CollectiveError, CollectiveTimeout, describe_pending
from .observe import Observer
from .pairing import LiveTags
from .progress import poll, reported

ENV_ABORT = environment.TIMEOUT_ABORT
ENV_DIR = environment.FLIGHT_DIR
FILE = "pycollect-flight-rank{rank}.json"
SCHEMA = "pycollect.flight/1"
KEEP = 32             # collectives kept in the flight recorder
_GRACE_S = 1.0        # before Abort: lets the other ranks that timed out write their files too


# -- waiting ------------------------------------------------------------------------------------------
def incomplete(requests) -> list[bool]:
    """Which of ``requests`` have not completed (without freeing the ones that have; failed ones count)."""
    flags = []
    for req in requests:
        try:
            flags.append(req != MPI.REQUEST_NULL and not req.Get_status())
        except MPI.Exception:
            flags.append(True)
    return flags


def failed(statuses) -> list[bool]:
    """After MPI raised from ``Testall``: which requests failed or are still pending (not ``MPI.SUCCESS``)."""
    return [st.Get_error() != MPI.SUCCESS for st in statuses]


def allgather(lib: MPI.Intracomm, dog: "Watchdog | None", send, recv, collective: str, seq: int, what: str) -> None:
    """``lib.Allgather(send, recv)`` (``Allgatherv`` for a ``[buffer, counts]`` recv), watched when ``dog`` is set."""
    vector = isinstance(recv, list)
    if dog is None:
        (lib.Allgatherv if vector else lib.Allgather)(send, recv)
        return
    wait_for((lib.Iallgatherv if vector else lib.Iallgather)(send, recv), dog, collective, seq, what)


def wait_for(request, dog: "Watchdog | None", collective: str, seq: int, what: str) -> None:
    """Wait for one request of a step of call ``seq`` (``what``: an exchange); to the deadline when ``dog`` is set."""
    if dog is None:
        request.Wait()
        return
    # a step of a call, not a call: not entered in the flight recorder
    Watch(dog, collective, seq, what, 0, None).finish([request])


# -- the flight recorder ---------------------------------------------------------------------------------
class Watch:
    """One call under the watchdog: its flight-recorder entry and its waits."""

    __slots__ = ("dog", "seq", "collective", "algorithm", "nbytes", "dtype", "rounds", "started",
                 "finished", "state", "rounds_done", "peers")

    def __init__(self, dog: "Watchdog", collective: str, seq, algorithm: str, nbytes: int, dtype, rounds: int = 1,
                 peers=None):
        self.dog, self.collective, self.seq, self.algorithm = dog, collective, seq, algorithm
        self.nbytes, self.dtype, self.rounds, self.peers = int(nbytes), dtype, rounds, peers
        self.started, self.state, self.rounds_done = time.time(), "running", 0
        self.finished: float | None = None

    def wait(self, requests, index: int = 0, pending=None, statuses=None, look=None) -> None:
        """Wait for ``requests`` (round ``index``) to the deadline; on expiry, the timeout.

        ``pending(flags)`` gives the ``(kind, peer)`` of the requests flagged incomplete;
        without it the call's fixed ``peers`` (point-to-point) or none (MPI's own collective).
        ``statuses`` (one per request) are filled when they complete; ``look`` as ``progress.poll``'s.
        """
        start = time.monotonic()
        error: str | None = None
        statuses = [MPI.Status() for _ in requests] if statuses is None else statuses
        try:
            try:
                waited = poll(requests, self.dog.timeout, statuses, look)
            except MPI.Exception as e:  # e.g. a peer's process failed and MPI noticed
                waited, error = time.monotonic() - start, reported(statuses, e)
            if waited is None:
                return
            flags = incomplete(requests) if error is None else failed(statuses)
            who = pending(flags) if pending is not None else (self.peers or [])
            self.rounds_done, self.state = index, "timed out" if error is None else "failed"
            self.dog.expire(self, index, who, waited, error)
        except BaseException:   # the timeout raised (abort off), or an interrupt: MPI may still use these buffers
            self.dog.kept.append(requests)
            raise

    def finish(self, requests) -> None:
        """A call of one round: wait for ``requests`` and mark it done."""
        self.wait(requests)
        self.end()

    def end(self) -> None:
        self.finished, self.state, self.rounds_done = time.time(), "done", self.rounds

    def record(self) -> dict:
        return {"seq": self.seq, "collective": self.collective, "algorithm": self.algorithm, "bytes": self.nbytes,
                "dtype": None if self.dtype is None else str(self.dtype), "started": self.started,
                "finished": self.finished, "rounds": self.rounds, "rounds_done": self.rounds_done,
                "state": self.state}


def default_dir() -> str:
    """Where flight recorders go unless ``PYCOLLECT_FLIGHT_DIR`` says: a temporary directory, not the checkout."""
    import tempfile
    return os.path.join(tempfile.gettempdir(), "pycollect-flight")


class Watchdog(Observer):
    """A Communicator's deadline, abort setting and flight recorder (the last KEEP collectives).

    As an observer of the runner (engine/observe.py) it enters each call in the flight recorder when it
    starts, counts its rounds as they end and marks it done after; ``of(call)`` is the call's Watch, which
    the call's waits poll to the deadline."""

    def __init__(self, timeout: float, abort: bool, rank: int, size: int, live: LiveTags | None = None,
                 kept: list | None = None, broke: Callable[[str], None] | None = None):
        self.timeout, self.abort, self.rank, self.size = timeout, abort, rank, size
        # Abort off, a call that timed out is over for the runner: its tag leaves ``live`` (the runner's set, so
        # free() goes ahead), and the requests of a wait that raised go to ``kept`` (the runner's ``failed``),
        # never freed: MPI may still write into their buffers when a late peer comes.
        self.live = LiveTags() if live is None else live
        self.kept = [] if kept is None else kept
        # ... and the Communicator takes no more calls (Runner.break_off): a late peer's would pair with that one
        self.broke = broke
        self.flight: deque[Watch] = deque(maxlen=KEEP)
        self.watching: dict[int, Watch] = {}   # calls started and not yet done, by call number

    def start(self, call, rounds: int | None) -> None:
        self.watching[call.seq] = self.call(call.collective, call.seq, call.name, call.x.nbytes, call.x.dtype,
                                            1 if rounds is None else rounds)

    def round(self, call, index: int, rnd, times) -> None:
        watch = self.watching[call.seq]
        watch.rounds_done = min(index + 1, watch.rounds)   # a window schedule's closing fence is no round of its own

    def after(self, call) -> None:
        watch = self.watching.pop(call.seq, None)
        if watch is not None:
            watch.end()

    def of(self, call) -> Watch:
        """The Watch of a started ``call``: its waits poll to the deadline and name it on expiry."""
        return self.watching[call.seq]

    def call(self, collective: str, seq: int, algorithm: str, nbytes: int, dtype, rounds: int = 1) -> Watch:
        """Start watching one collective call (entered in the flight recorder)."""
        watch = Watch(self, collective, seq, algorithm, nbytes, dtype, rounds)
        self.flight.append(watch)
        return watch

    def message(self, kind: str, peer: int, tag: int, nbytes: int) -> Watch:
        """Watch one point-to-point message (not entered in the flight recorder)."""
        return Watch(self, kind, None, f"point-to-point, tag {tag}", nbytes, None, peers=[(kind, peer)])

    def expire(self, watch: Watch, index: int, pending: list, waited: float, error=None):
        """The deadline passed (or MPI raised ``error`` while polling): flight recorder, then Abort or the exception
        (the call's tag out of ``live``)."""
        err = self._error(watch, index, pending, waited, error)
        where = self.write(err)
        if not self.abort:
            if watch.seq is not None:
                self.live.discard(self.live.of(watch.seq))
            if self.broke is not None:
                self.broke(f"{_named(watch)} {'timed out' if error is None else 'failed'} (abort off)")
            raise err
        end_job(f"{err}\npycollect: flight recorder: {where}; aborting the job ({ENV_ABORT}=0 raises the "
                f"exception instead)", grace=min(_GRACE_S, self.timeout))

    def _error(self, watch: Watch, index: int, pending: list, waited: float, error) -> CollectiveError:
        if error is None:
            return CollectiveTimeout(collective=watch.collective, seq=watch.seq, algorithm=watch.algorithm,
                                     round=index, rounds=watch.rounds, pending=pending, waited=waited,
                                     timeout=self.timeout, rank=self.rank)
        call = watch.collective if watch.seq is None else f"{watch.collective} #{watch.seq}"
        return CollectiveError(f"rank {self.rank}: {call} ({watch.algorithm}) failed after {waited:.2f} s in round "
                               f"{index} of {watch.rounds} (0-based): MPI reported: {error}; still pending: "
                               f"{describe_pending(pending)}")

    def write(self, err: CollectiveError) -> str:
        """Write this rank's flight recorder; returns its path (or why it could not be written)."""
        rank = MPI.COMM_WORLD.Get_rank()
        path = os.path.join(environment.directory(ENV_DIR) or default_dir(), FILE.format(rank=rank))
        data = {"schema": SCHEMA, "rank": rank, "comm_rank": self.rank, "comm_size": self.size,
                "host": platform.node(), "pid": os.getpid(), "timeout_s": self.timeout, "written": time.time(),
                "error": str(err), "timed_out": _timed_out(err) if isinstance(err, CollectiveTimeout) else None,
                "collectives": [w.record() for w in self.flight]}
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            # a temporary file of this thread's own: Communicators timing out together in several threads wrote one
            # temporary file at once (a recorder of invalid JSON, or "not written"); the last replace wins whole
            partial = f"{path}.{threading.get_ident()}.tmp"
            with open(partial, "w") as f:
                json.dump(data, f, indent=1)
            os.replace(partial, path)
        except OSError as e:
            return f"not written ({path}: {e})"
        return path


def _named(watch: Watch) -> str:
    """``allreduce #2 (ring)``; a message: ``recv (point-to-point, tag 7)``."""
    return watch.collective + ("" if watch.seq is None else f" #{watch.seq}") + f" ({watch.algorithm})"


def _timed_out(err: CollectiveTimeout) -> dict:
    return {"collective": err.collective, "seq": err.seq, "algorithm": err.algorithm, "round": err.round,
            "rounds": err.rounds, "pending": [list(p) for p in err.pending], "waited_s": err.waited}

"""The Communicator: methods that check their arguments into one CollectiveCall and hand it to the runner."""
from __future__ import annotations

import contextlib
import math
import operator
import os
import warnings
import weakref
import zlib
from collections import Counter
from functools import lru_cache
from typing import Callable, cast

import numpy as np
from mpi4py import MPI

from .algorithms import registry
from .algorithms.rank_order import in_rank_order, keeps_rank_order
from . import recording, settings
from .cartesian import Cartesian, grid_shape
from .engine import abort, args, backend, counts, environment, executor, lean_exchange, locations, mpi_native, ops
from .engine.abort import collective_failed
from .engine.backend import flat
from .engine.call import CollectiveCall
from .engine.layout import extent
from .engine.mpi_native import even_counts as _even, lean_out as _lean_out
from .engine.pairing import MPI_LEAST_TAG_UB
from .engine.request import Request
from .engine.shapes import REDUCING
from .engine.topology import Topology
from .engine.validate import ROWS, Call, Validator, check_out_rows
from .engine.window import shm_free
from .rooted import Rooted
from .runner import Runner, TakesPartThenRaises, broken_error, exchanged, freed_error, kept_or_free
from .select import Selector

# The names each collective accepts (the registry is fixed once imported).
abort.end_job_on_uncaught_errors_from_now()
_algorithm_names = lru_cache(maxsize=None)(registry.algorithms)


def detect_topology(comm: MPI.Intracomm) -> Topology:
    """Nodes from ``MPI_Comm_split_type(SHARED)``, labelled by their lowest rank (never by host name)."""
    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    leader = np.array([comm.Get_rank()], np.int64)
    try:
        local.Allreduce(MPI.IN_PLACE, leader, op=MPI.MIN)
    finally:
        local.Free()
    labels = np.empty(comm.Get_size(), np.int64)
    comm.Allgather(leader, labels)
    return Topology.from_labels([int(v) for v in labels])


class Communicator(Rooted):
    """Collectives over an MPI intracommunicator, on NumPy or CuPy arrays.

    Library traffic runs on a private duplicate of ``comm``, one tag per collective call,
    so it never matches the caller's messages or another collective in flight.
    ``topology`` replaces the detected one (every rank must pass the same), for example
    ``Topology.single_node(size)`` to measure topology-blind schedules.

    ``validate`` (default ``PYCOLLECT_DEBUG``, 0 or 1) compares every collective's arguments
    across ranks before it starts and raises ``CollectiveMismatchError`` on every rank when they
    differ (engine/validate.py). ``timeout`` (default ``PYCOLLECT_TIMEOUT``, seconds) bounds
    every blocking wait; past it a rank writes its flight recorder and, as
    ``abort_on_timeout`` (default ``PYCOLLECT_TIMEOUT_ABORT``, 1) says, aborts the job or raises
    ``CollectiveTimeout`` (engine/watchdog.py). Every rank must use the same settings: they are
    compared in one Allgather when the Communicator is built, and differing or bad ones raise on
    every rank (settings.py).
    """

    def __init__(self, comm: MPI.Comm | None = None, *, tuning: str | None = None,
                 segment_bytes: int | None = None, tree_segment_bytes: int | None = None,
                 topology: Topology | None = None, validate: bool | None = None,
                 timeout: float | None = None, abort_on_timeout: bool | None = None,
                 pipeline_bytes: int | None = None):
        if pipeline_bytes is not None:   # the old name of tree_segment_bytes
            tree_segment_bytes = environment.renamed("Communicator: pipeline_bytes", "tree_segment_bytes", pipeline_bytes)
        comm = MPI.COMM_WORLD if comm is None else comm
        if isinstance(comm, MPI.Comm) and comm == MPI.COMM_NULL:
            raise TypeError("Communicator: comm is MPI.COMM_NULL (this rank is in no group of the split that made "
                            "it); build the Communicator only on the ranks that are in it")
        if not isinstance(comm, MPI.Comm):
            raise TypeError(f"Communicator: comm must be an MPI intracommunicator, got {comm!r}")
        if comm.Is_inter():
            raise TypeError("Communicator: comm is an intercommunicator; pass an intracommunicator")
        comm = cast(MPI.Intracomm, comm)
        self.mpi = comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self._tuning_path = tuning      # what split() and sub() hand their groups
        self._groups: list[Communicator] = []   # made by split() and sub(): freed with this one
        self._owned: MPI.Comm | None = None     # the split communicator a group wraps (freed with it)
        self.parent_ranks: list[int] | None = None   # a group's ranks in the Communicator it was made from
        self._freed = False
        # the Communicator whose split() or sub() made this one (_group), weakly
        self._parent: Callable[[], Communicator | None] = _dead
        # Settings are read, then agreed in one Allgather, before anything else: a bad setting on
        # one rank, or settings that differ, raise on every rank (settings.py).
        error = given = None
        try:
            ends_job = abort.abort_on_error()
            given = settings.read(tuning=tuning, segment_bytes=segment_bytes, tree_segment_bytes=tree_segment_bytes,
                                  topology=topology, validate=validate, timeout=timeout,
                                  abort_on_timeout=abort_on_timeout)
            if given.topology is not None and given.topology.size != self.size:
                raise ValueError(f"Communicator: topology has {given.topology.size} ranks, the communicator {self.size}")
        except Exception as e:  # noqa: BLE001 (whatever it is, every rank must hear of it)
            error, given = e, None
        settings.agree(comm, given, error)
        assert given is not None, "settings.agree raises on every rank when any rank's settings failed"
        if ends_job:    # a rank whose program dies of an uncaught error must not leave the others waiting
            abort.end_job_on_uncaught_errors()
        self.validate, self.timeout, self.abort_on_timeout = given.validate, given.timeout, given.abort_on_timeout
        self.segment_bytes, self.tree_segment_bytes = given.segment_bytes, given.tree_segment_bytes
        # ``topology`` overrides detection, e.g. Topology.single_node(size) for a flat baseline
        self.topology = detect_topology(comm) if given.topology is None else given.topology
        self._selector = Selector(given.tuning, size=self.size, multi_node=self.topology.num_nodes > 1,
                                  forced=given.forced)
        # Waiting on one segment at a time overlaps reduction with arrival, but only pays when
        # no two ranks share a core (bench/README.md). The node's cores, not this rank's affinity: a
        # launcher that binds each rank to one core leaves every rank a core of its own.
        on_node = self.topology.node_sizes[self.topology.node_of[self.rank]]
        self._runner = Runner(comm.Dup(), self.topology, segment_bytes=self.segment_bytes,
                              tree_segment_bytes=self.tree_segment_bytes, overlap=on_node <= (os.cpu_count() or 1),
                              timeout=self.timeout, abort_on_timeout=self.abort_on_timeout)
        self._runner.on_break = self._lean_off   # a call ended in flight: every later one reaches the refusing begin()
        self._lib = self._runner.lib    # collectives (the lean paths call it directly)
        self._ag_exchange = (np.empty(3, np.int64), np.empty((self.size, 3), np.int64))   # allgather's rows, lean
        self._exchanged = MPI.Status()   # the exchanges' at two ranks (engine/lean_exchange.py)
        self._p2p = comm.Dup()          # send/recv of this API
        self._refused_messages: dict = {}   # ("send to" or "receive from", peer, tag) -> why (_in_order)
        self._runner.recheck = self._p2p   # a refused call's recheck (Runner.refused): no other collective runs there
        self._runner.on_refusal, self._runner.on_rechecked = self._lean_off, self._lean_tables
        self.tag_ub = int(self._p2p.Get_attr(MPI.TAG_UB) or MPI_LEAST_TAG_UB)   # the largest tag send/recv take
        self._lean_tables()

    def _lean_tables(self) -> None:
        """The lean paths' tables: calls that go straight to MPI's regular call, skipping the runner. Validation,
        the watchdog and tracing each turn them off (every call then takes the one path they observe)."""
        self._lean = lean_exchange.allreduce_table(mpi_native.lean_table(self._selector), self._selector, self.size,
                                                   self.segment_bytes)
        self._lean_rs = mpi_native.lean_table(self._selector, "reduce_scatter")
        self._exchange_rs = lean_exchange.exchange_table(self._lean_rs, self._selector, self.size, self.segment_bytes,
                                                         "reduce_scatter", "ring")
        self._lean_a2a = mpi_native.lean_table(self._selector, "alltoall")
        self._lean_ag = mpi_native.lean_table(self._selector, "allgather")
        self._exchange_ag = lean_exchange.exchange_table(self._lean_ag, self._selector, self.size, self.segment_bytes,
                                                         "allgather", "ring")
        self._lean_of = {c: mpi_native.lean_table(self._selector, c) for c in _LEAN_MORE}
        self._forget_lean_calls()
        runner = self._runner
        self._check = Validator(self._lib, self.rank, self.size, runner.watch) if self.validate else None
        if runner.observed or self._check is not None or self._freed or runner.broken is not None \
                or runner.refusal is not None:   # the lean paths skip begin(), which refuses or rechecks then
            self._lean_off()

    def _lean_off(self) -> None:
        """Every call takes the general path (observed, validated, or freed: where it is refused)."""
        self._lean = self._lean_rs = self._lean_a2a = self._lean_ag = {}
        self._exchange_rs = self._exchange_ag = {}
        self._lean_of = {c: {} for c in _LEAN_MORE}
        self._forget_lean_calls()

    def _forget_lean_calls(self) -> None:
        """What the lean paths remember of their last calls, cleared (their tables have just changed)."""
        # allreduce's lean path: the last lookup (dtype, op, algorithm, entry) and the last (x, out) pair that
        # passed _lean_out, as weak references (nothing is kept alive; a freed array's id cannot match)
        self._lean_last = (None, None, None, None)
        self._lean_x_ref = self._lean_out_ref = _dead
        # reduce_scatter's, alltoall's and allgather's (with counts) lean paths: the last call of each that went to
        # MPI, (x, out, op, algorithm, x's shape, the result's shape, entry, x's dtype), arrays as weak references
        self._lean_repeat: dict = {}

    def __repr__(self) -> str:
        return f"Communicator(rank={self.rank}, size={self.size}, {self.topology.describe()})"

    def free(self) -> None:
        """Release the private communicators and the groups made by ``split``/``sub`` (collective; the wrapped
        communicator stays the caller's; a second call does nothing)."""
        if self._freed:
            return
        self._complete_dropped()
        self._refuse_in_flight()
        self._freed = True
        self._lean_off()   # the lean paths skip the runner, whose begin() now refuses every call
        while self._groups:
            self._groups.pop().free()
        self._drop_unreceived()
        # A message refused here, a call refused or ended in flight: a peer's message for it may still be on its way,
        # which a communicator MPI makes later with the same context would take (Runner.kept_or_free). Kept then.
        keep = bool(self._refused_messages) or self._runner.ever_refused or self._runner.broken is not None
        self._runner.free(keep)
        for c in (self._lib, self._p2p):
            kept_or_free(c, keep)
        if self._owned is not None and self._owned != MPI.COMM_NULL:
            self._owned.Free()
        self._owned = None
        parent = self._parent()
        if parent is not None:
            parent._groups = [g for g in parent._groups if g is not self]

    def _drop_unreceived(self) -> None:
        """Receive and drop the messages sent to this rank that it never received, warning: MPI reuses a freed
        communicator's context, and a later communicator's receive of the same peer and tag took such a message as
        its own (seen in this suite: a test's two messages left on tag 5 were another test's data). The library's
        own communicators too, where a call refused or skipped here leaves its peers' messages (a schedule's tags
        are call numbers, which a later Communicator counts again from 1). Only those that arrived: one still on
        its way cannot be seen without waiting for its sender."""
        runner = self._runner
        for comm, whose in ((self._p2p, "send/recv"), (runner.lib, "the library's calls"),
                            (runner.later, "the library's calls"), (runner.exchanges, "the exchanges of counts")):
            status, dropped = MPI.Status(), Counter[tuple[int, int]]()   # (source, tag) -> messages
            while (message := comm.Improbe(MPI.ANY_SOURCE, MPI.ANY_TAG, status)) is not None:
                message.Recv(bytearray(status.Get_count(MPI.BYTE)))
                dropped[(status.Get_source(), status.Get_tag())] += 1
            if dropped:
                pairs = ", ".join(f"{n} from rank {r}, tag {t}" for (r, t), n in sorted(dropped.items()))
                warnings.warn(f"pycollect: free() on rank {self.rank}: messages of {whose} never received, dropped "
                              f"({pairs})", ResourceWarning, stacklevel=3)

    def _complete_dropped(self) -> None:
        """Wait for the calls of this Communicator and of its groups whose Requests were dropped in flight (no
        reference left): every rank made them, and freeing before they complete would leave the peers waiting."""
        self._runner.settle_dropped(block=True)
        for g in self._groups:
            g._complete_dropped()

    def _refuse_in_flight(self) -> None:
        """Raise, before anything is freed, where a call of this Communicator or of its groups is in flight on this
        rank: the caller can wait and free again."""
        busy = self.in_flight()
        if busy:
            raise RuntimeError(f"free: {busy} call{'s' if busy > 1 else ''} of this Communicator (or of a group made "
                               f"from it) {'are' if busy > 1 else 'is'} still in flight on rank {self.rank}: wait() "
                               f"for {'their Requests' if busy > 1 else 'its Request'} first. pycollect moves a call "
                               f"only inside its Request's test() and wait(), so freeing now would leave the other "
                               f"ranks waiting for its messages; nothing was freed")

    def in_flight(self) -> int:
        """Calls of this Communicator and of its groups not yet complete on this rank (their Requests not waited, or
        tested until done): schedules and deferred calls, which ``free()`` refuses to leave behind (but for those
        whose Requests were dropped, which it completes first). MPI's own non-blocking calls are not counted:
        ``free()`` completes them first (every rank started them), and their Requests' ``wait()`` then returns."""
        return len(self._runner.live) + sum(g.in_flight() for g in self._groups)

    def __enter__(self) -> "Communicator":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None and self.in_flight():
            return   # the block's own error says what went wrong; free() would raise a second one over it
        self.free()

    # -- groups -------------------------------------------------------------------------------------
    def split(self, color, key=None) -> "Communicator | None":
        """The ranks of equal ``color`` as one Communicator, ordered by ``key`` (default: their rank here); color
        None joins none and gets None (collective, like ``MPI_Comm_split``).

        The group inherits this Communicator's settings (validation, timeout, segment and tree segment sizes,
        tuning) and its topology restricted to the group's ranks (no second detection), and is freed with it,
        or earlier by its own ``free()`` or a ``with`` block. ``group.parent_ranks`` are its ranks here.
        """
        seq = self._begin()   # a collective of its own: every rank's arguments are checked before any splits
        err = None
        try:
            color = MPI.UNDEFINED if color is None else args.integer("split", "color", color)
            key = self.rank if key is None else args.integer("split", "key", key)
            if color != MPI.UNDEFINED and color < 0:
                raise ValueError(f"split: color must be None or >= 0, got {color}")
        except (TypeError, ValueError) as e:
            err = e
        self._arguments_agreed("split", err)
        self._runner.meet_after_refusal(seq)   # MPI's own collective next (Runner.refused)
        return self._group(self._lib.Split(color, key))

    def sub(self, ranks) -> "Communicator | None":
        """The Communicator of ``ranks`` (ranks here, in the order given; every rank passes the same list), or
        None on the ranks left out. Collective over this Communicator; a ``split`` underneath."""
        seq = self._begin()
        err, members = None, []
        try:
            if isinstance(ranks, (str, bytes)) or not hasattr(ranks, "__iter__"):
                raise TypeError(f"sub: ranks must be a sequence of ranks, got {type(ranks).__name__}")
            members = [args.integer("sub", "ranks", r) for r in ranks]
            bad = [r for r in members if not 0 <= r < self.size]
            if bad or len(set(members)) != len(members) or not members:
                raise ValueError(f"sub: ranks must be distinct ranks in 0..{self.size - 1}, at least one, got "
                                 f"{members}")
        except (TypeError, ValueError) as e:
            err = e
        self._arguments_agreed("sub", err, f"ranks {members}")
        mine = self.rank in members
        self._runner.meet_after_refusal(seq)
        return self._group(self._lib.Split(0 if mine else MPI.UNDEFINED, members.index(self.rank) if mine else 0))

    def cartesian(self, dims, periods=False) -> "CartesianGrid":
        """This Communicator's ranks as a Cartesian grid of ``dims`` (a 0 lets MPI choose; the product must be the
        size), periodic along the dimensions ``periods`` says (one bool, or one per dimension), in rank order
        (collective, like ``MPI_Cart_create`` without reordering; a bad argument raises on every rank).

        The grid is a Communicator (cartesian.py: coordinates, neighbours, neighbourhood collectives, halo
        exchange) with this one's settings, freed with it or by its own ``free()`` or a ``with`` block.
        """
        seq = self._begin()
        err, shape = None, None
        try:
            shape = grid_shape(self.size, dims, periods)
        except (TypeError, ValueError) as e:
            err = e
        self._arguments_agreed("cartesian", err, None if shape is None else f"dims {shape[0]}, periods {shape[1]}")
        assert shape is not None, "_arguments_agreed raises on every rank when any rank's dims or periods failed"
        self._runner.meet_after_refusal(seq)
        grid = self._group(self._lib.Create_cart(list(shape[0]), list(shape[1]), reorder=False), CartesianGrid)
        return cast(CartesianGrid, grid)

    def _group(self, split: MPI.Comm, kind: "type[Communicator] | None" = None) -> "Communicator | None":
        """A Communicator (or ``kind`` of one) over ``split`` (which it owns), with this one's settings and
        topology, kept for free()."""
        if split == MPI.COMM_NULL:
            return None
        mine = np.array([self.rank], np.int64)
        ranks = np.empty(split.Get_size(), np.int64)
        split.Allgather(mine, ranks)                  # a buffer: the library never pickles
        parent_ranks = ranks.tolist()
        topology = Topology.from_labels([self.topology.node_of[r] for r in parent_ranks])
        group = (kind or Communicator)(split, tuning=self._tuning_path, topology=topology, validate=self.validate,
                             timeout=self.timeout, abort_on_timeout=self.abort_on_timeout,
                             segment_bytes=self.segment_bytes, tree_segment_bytes=self.tree_segment_bytes)
        group._owned, group.parent_ranks = split, parent_ranks
        group._parent = weakref.ref(self)   # a group freed on its own leaves the list (it grew with every split)
        self._groups.append(group)
        return group

    def _arguments_agreed(self, where: str, err: Exception | None, same: str | None = None) -> None:
        """Every rank's argument check exchanged before anything collective: ``err`` raised here, and on every
        other rank an error naming the ranks whose arguments failed (no rank goes on alone). ``same``: what every
        rank must pass alike (as text), compared by its CRC-32 in the same exchange; ValueError on every rank
        where it differs."""
        digest = 0 if same is None or err is not None else zlib.crc32(same.encode())
        (ok, digests), _ = self._exchange((err is None, digest), where, None)
        if err is not None:
            raise err
        if not all(ok):
            bad = [r for r, good in enumerate(ok) if not good]
            raise ValueError(f"{where}: rank(s) {', '.join(map(str, bad))} passed bad arguments; no rank went on")
        odd = [r for r, d in enumerate(digests) if d != digests[0]]
        if odd:
            raise ValueError(f"{where}: every rank must pass the same arguments; rank(s) {', '.join(map(str, odd))} "
                             f"passed other than rank 0's (rank {self.rank} passed {same}); no rank went on")

    def agree_arguments(self, where: str, err: Exception | None) -> None:
        """Arguments checked outside the Communicator (the mpi4py face's buffer specifications) agreed as
        ``split``'s are, in a collective of its own: ``err`` raised here, and on every other rank an error naming
        the ranks whose arguments failed."""
        self._begin()
        self._arguments_agreed(where, err)

    def shared_empty(self, shape, dtype=np.float64) -> np.ndarray:
        """A NumPy array like ``np.empty(shape, dtype)`` in memory the ranks of the node share (collective; each
        rank may ask its own shape).

        Handed as the input of an ``algorithm="shm"`` call, it is read by the peers where it lies, without the
        copy into a window each such call otherwise makes. Where windows cannot be had (ranks on several
        nodes) it is a plain ``np.empty`` array, and every call works as with any array. The memory lives
        while any array made from it does; ``free()`` releases what no rank still uses.
        """
        self._begin()   # a collective of its own: every rank's arguments are checked before any allocates
        err = None
        try:
            dtype = np.dtype(dtype)
            shape = tuple(operator.index(s) for s in shape) if np.ndim(shape) else (operator.index(shape),)
            if any(s < 0 for s in shape):
                raise ValueError(f"shared_empty: shape must not be negative, got {shape}")
            nbytes, free = math.prod(shape) * dtype.itemsize, shm_free()
            if self.topology.num_nodes == 1 and free is not None and nbytes > free:   # windows: MPI's raw error
                raise ValueError(f"shared_empty: shape {shape} of {dtype} takes {nbytes} bytes, more than the {free} "
                                 f"bytes of the node's shared memory free")
        except (TypeError, ValueError) as e:
            err = e if "shared_empty" in str(e) else type(e)(f"shared_empty: bad shape {shape!r} or dtype "
                                                              f"{dtype!r}: {e}")
        self._arguments_agreed("shared_empty", err)
        windows = self._runner.node_windows("shared_empty")
        if windows is None:
            return np.empty(shape, dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        return windows.allocate(nbytes).view(dtype).reshape(shape)

    def record(self):
        """``with comm.record() as log:`` -- every call on this communicator in the block, as
        ``CallRecord``s (collective, elements, dtype, bytes handed in); see ``pycollect.recording``."""
        return recording.record(self._observe)

    @contextlib.contextmanager
    def _observe(self, observer):
        """A block in which ``observer`` (engine/observe.py) sees every call: attached to the runner, the lean paths
        off (they bypass it) until it is detached."""
        self._runner.attach(observer)
        self._lean_tables()
        try:
            yield
        finally:
            self._runner.detach(observer)
            self._lean_tables()

    # -- helpers ------------------------------------------------------------------------------------
    def _begin(self) -> int:
        """A collective call starts: it takes the next number, even if its arguments then fail, so that its tag
        never serves another call (engine/pairing.py)."""
        return self._runner.begin()

    def refused_arguments(self) -> None:
        """For a wrapper that checks a call's arguments before it reaches this Communicator (the mpi4py face reading
        its buffers), on a rank where they failed: the call takes a number, as a collective refusing its arguments
        does, and this rank's next call to MPI's own collective first meets every rank (Runner.refused). On a freed
        or broken Communicator nothing: its next call is refused anyway."""
        try:
            seq = self._begin()
        except RuntimeError:
            return
        self._runner.refused(seq)

    def _checked(self, collective: str, x, describe, blocking: bool, complete=None, **asked):
        """The path every collective shares: a call number, then ``describe()`` checks the arguments into a
        ``CollectiveCall``, which runs (its result, or a Request when not ``blocking``).

        A call whose rows are known only once the ranks exchange them (``name`` None) is completed by
        ``complete(call, table, comm)``, steps of Runner.prepared: a non-blocking call returns before they wait.
        In validation mode an error is held until every rank's call is compared with this one (``asked``: the
        arguments as passed; the checked op and algorithm replace them where the checks passed), then raised here
        and a mismatch error on the other ranks (from ``wait()`` for a non-blocking call); ``complete`` then
        reads the rows from the fingerprints' table.
        """
        seq = self._begin()
        if self._check is None:
            try:
                call = describe(seq)
            except BaseException:
                self._runner.refused(seq)   # on this rank alone, maybe: its next call meets the others first
                raise
            if call.name is not None:   # resolved: nothing to exchange
                return self._runner.run(call)
            return self._runner.prepared(collective, seq, call, complete(call, None, self._runner.exchanges), blocking)
        call = err = None
        try:
            call = describe(seq)
        except Exception as e:  # noqa: BLE001 (held: every rank must hear of it)
            err = e
        if call is not None:
            asked["resolved"] = call.name
            for name in ("op", "accumulate"):
                if name in asked:
                    asked[name] = getattr(call, name)
        # a non-blocking call's steps after the agreement run late, on the runner's own communicator for them
        comm = self._lib if blocking else self._runner.later
        steps = self._validated(Call(collective, seq, x, error=err, blocking=blocking, **asked), call, complete, comm)
        return self._runner.prepared(collective, seq, call, steps, blocking)

    def _validated(self, fingerprint: Call, call: CollectiveCall | None, complete, comm):
        """Steps (Runner.prepared): the fingerprints agreed on (Validator.agreeing raises this rank's own error, or a
        mismatch), then ``complete`` where the call's rows are still unknown."""
        assert self._check is not None, "validation mode only"
        table = yield from self._check.agreeing(fingerprint, comm)
        assert call is not None, "agreeing raised the error of this rank's checks"
        if call.name is None:
            call = yield from complete(call, table, comm)
        return call

    def _lean_entry(self, table: dict, key: tuple, collective: str, nbytes: int):
        """The lean table's ``(MPI op, limit)`` for ``key`` when a call of ``nbytes`` goes to MPI's own, else None.

        Beyond the first rows of the table, ``auto`` asks the selector (a tuning table may give MPI
        windows further on). Allreduce, the hottest path, keeps this inline.
        """
        try:
            lean = table.get(key)
        except TypeError:  # an unhashable op or algorithm: the general path says what is wrong
            return None
        if lean is None or (nbytes > lean[1] and (counts.too_many(nbytes // max(key[0].itemsize, 1))
                                                  or self._selector.choose(collective, nbytes) != "mpi")):
            return None   # past the table's rows: the selector's answer, but never past MPI's count limit
        return lean

    def _repeats(self, collective: str, x, out, op, algorithm):
        """The lean entry of ``collective``'s last call that went to MPI (or, allgather's, ran the two ranks'
        exchange: its entry) when this one repeats it on the same arrays (``_remember``), else None. Checked again
        is what a caller may change in place on the same two arrays: their shapes and dtypes (by assignment),
        ``out``'s flags (writeable; C-contiguous and aligned: ``carray``); a dtype not identical, or anything else,
        takes the checked way. Whether x and out overlap cannot change (data pointers are fixed, as allreduce's lean
        path says)."""
        last = self._lean_repeat.get(collective)
        if last is None or last[0]() is not x or last[2] is not op or last[3] is not algorithm \
                or (dtype := x.dtype) is not last[7] or x.shape != last[4]:
            return None
        if out is None:
            return last[6]
        if last[1]() is not out or not out.flags.carray or out.dtype is not dtype or out.shape != last[5]:
            return None
        return last[6]

    def _remember(self, collective: str, x, out, op, algorithm, shape, lean) -> None:
        """``collective``'s call on ``x`` into ``out`` (of ``shape``; None: a new result) went to MPI by ``lean`` (or
        ran the exchange of ``lean``, an entry of its table)."""
        if type(op) is str or op is None:
            if type(algorithm) is str:   # compared by identity in _repeats: plain str only
                self._lean_repeat[collective] = (weakref.ref(x), _dead if out is None else weakref.ref(out), op,
                                                 algorithm, x.shape, shape, lean, x.dtype)

    def _direct(self, collective: str, run, *args, seq: int | None = None) -> None:
        """A lean path's call straight to MPI, ``run(*args)``, as the call's number (the next, or ``seq`` when the
        call has begun already); MPI raising inside it ends the job naming the call."""
        if seq is None:
            seq = self._runner.begin()
        try:
            run(*args)
        except MPI.Exception as e:
            collective_failed(f"{collective} #{seq} (mpi)", self.rank, e)

    def stages_through_host(self, xp) -> bool:
        """Whether arrays of ``xp`` (NumPy or CuPy) go through host memory: device arrays when MPI is not
        CUDA-aware."""
        return self._runner.staging(xp)

    def auto_algorithm(self, collective: str, nbytes: int, dtype="float32", blocking: bool = True) -> str:
        """The algorithm ``algorithm="auto"`` runs for a message of ``nbytes`` of ``dtype`` (a non-blocking call's
        where ``blocking`` is False: select.nonblocking_rows)."""
        if not isinstance(blocking, bool):
            raise TypeError(f"auto_algorithm: blocking must be True or False, got {blocking!r}")
        return self._resolve(collective, "auto", nbytes, np.dtype(dtype), blocking=blocking)

    def _resolve(self, collective: str, algorithm: str, nbytes: int, dtype, op=None, root: int = 0,
                 where: str | None = None, elements: int | None = None, blocking: bool = True) -> str:
        """The algorithm a call runs (``blocking``: whether the call is; Selector.choose); ``where`` names the method
        in errors when it is not ``collective`` itself
        (reduce_scatter_block runs reduce_scatter's). ``elements``: the most any count or displacement of MPI's own
        call would take (default ``nbytes`` in elements: the whole message); past what one MPI call takes here (an
        MPI-3 library, engine/counts.py) ``auto`` runs a schedule and ``"mpi"`` is refused. Every rank resolves
        from the same figures."""
        where = where or collective
        args.algorithm(where, algorithm, _algorithm_names(collective))
        too_many = counts.too_many(nbytes // max(dtype.itemsize, 1) if elements is None else elements)
        if algorithm == "auto":
            if not ops.commutes(op):   # MPI reduces a non-commutative op in rank order, with any dtype
                if not too_many:
                    return "mpi"
                keeping = in_rank_order(collective, registry.schedule_algorithms(collective), self.topology, root)
                if not keeping:
                    raise ValueError(f"{where}: no algorithm here takes a non-commutative op on more than "
                                     f"{counts.LIMIT} elements: MPI's own call takes at most that many {_UNDER_MPI_3}, "
                                     f"and no schedule keeps rank order for this call (its root, the ranks' nodes); "
                                     f"call it on pieces of at most {counts.LIMIT} elements")
                return keeping[0]
            name = self._selector.choose(collective, nbytes, blocking)
            if name == "mpi" and (too_many or not mpi_native.supports(dtype, op)):
                name = mpi_native.STAND_IN[collective]
            return name
        if algorithm == "mpi":
            if not mpi_native.supports(dtype, op):
                raise ValueError(f"{where}: algorithm 'mpi' cannot {'reduce' if collective in REDUCING else 'move'} "
                                 f"dtype {_dtype_text(dtype, op)} (MPI has no such type); choose one of "
                                 f"{', '.join(registry.schedule_algorithms(collective))}")
            if too_many:
                raise ValueError(_past_the_count(where, collective))
            return algorithm
        if not ops.commutes(op) and not keeps_rank_order(collective, algorithm, self.topology, root):
            raise ValueError(_reorders(where, algorithm, op, in_rank_order(
                collective, registry.schedule_algorithms(collective), self.topology, root)))
        return algorithm

    def _exchange(self, values, collective: str, out) -> tuple[list[list[int]], list[int]]:
        """Every rank's ``values`` and ``out`` rows in one small Allgather (Runner.exchange)."""
        return self._runner.exchange(values, collective, out)

    # -- allreduce ----------------------------------------------------------------------------------
    def allreduce(self, x, op: str = "sum", algorithm: str = "auto", out=None, accumulate: str | None = None):
        """Reduce ``x`` over all ranks; every rank gets the result (a new array unless ``out`` is given)."""
        # Lean path for small host messages that go to MPI's own allreduce: a few checks, so pycollect
        # costs next to nothing over a bare MPI_Allreduce; and at two ranks, for the mid sizes where the
        # recursive doubling runs, its one round straight on MPI (engine/lean_exchange.py). The lean table's
        # entry of the last call's (dtype, op, algorithm), and the last (x, out) pair that passed _lean_out, are
        # remembered: a call that repeats them re-checks only what a caller can change on the same two arrays.
        if type(x) is _ndarray and accumulate is None:
            last = self._lean_last
            if (dtype := x.dtype) is last[0] and op is last[1] and algorithm is last[2]:
                lean = last[3]
            else:
                lean = self._lean_lookup(dtype, op, algorithm)
            # lean: (MPI op, largest nbytes to MPI's own call, nbytes above which and up to which the two ranks'
            # exchange runs, its combine)
            if lean is not None and x.flags.c_contiguous and ((nbytes := x.nbytes) <= lean[1] or (
                    lean[2] < nbytes <= lean[3] and self._alone())):   # nothing in flight: no tag to share
                if out is None:
                    out = _empty(x.shape, dtype)
                # The remembered pair: checked again is only what a caller may change in place on the same two
                # arrays (flags.writeable; shape, dtype, strides by assignment). Whether they overlap cannot
                # change: data pointers are fixed, a C-contiguous array of unchanged shape and dtype spans the
                # same bytes (x's are checked above), and resize() moves an array to memory of its own.
                elif not (self._lean_out_ref() is out and self._lean_x_ref() is x and (flags := out.flags).writeable
                          and flags.c_contiguous and out.dtype == dtype and out.shape == x.shape):
                    if not _lean_out(out, x.shape, x):
                        return self._allreduce(x, op, algorithm, out, accumulate, True)
                    self._lean_x_ref, self._lean_out_ref = weakref.ref(x), weakref.ref(out)
                if nbytes > lean[1]:
                    return lean_exchange.allreduce(self._runner, x, out, lean[4], self._exchanged)
                (runner := self._runner).seq += 1
                try:
                    self._lib.Allreduce(_IN_PLACE if out is x else x, out, lean[0])
                except MPI.Exception as e:
                    collective_failed(f"allreduce #{runner.seq} (mpi)", self.rank, e)
                return out
        return self._allreduce(x, op, algorithm, out, accumulate, True)

    def _alone(self) -> bool:
        """Whether the two ranks' exchanges (engine/lean_exchange.py: one blocking MPI_Sendrecv) may run: no call of
        this Communicator in flight on the rank (no tag to share), and no call in flight in the process that other
        waits move on (executor.move_others), which a rank sitting in the Sendrecv would not: its peer may be waiting
        for it."""
        return not self._runner.live and not executor.movable_in_flight()

    def _lean_lookup(self, dtype, op, algorithm):
        """The lean table's ``(MPI op, limit)`` for a dtype, op and algorithm, or None; remembered for the next
        call when op and algorithm are plain str (compared by identity there, a miss only costs this lookup)."""
        try:
            lean = self._lean.get((dtype, op, algorithm))
        except TypeError:  # an unhashable op or algorithm: the general path says what is wrong
            return None
        if type(op) is str and type(algorithm) is str:
            self._lean_last = (dtype, op, algorithm, lean)
        return lean

    def iallreduce(self, x, op: str = "sum", algorithm: str = "auto", out=None, accumulate: str | None = None) -> Request:
        """Start an allreduce; ``Request.wait()`` returns the result."""
        return self._allreduce(x, op, algorithm, out, accumulate, False)

    def _allreduce(self, x, op, algorithm, out, accumulate, blocking):
        loc = args.locating(op)   # minloc, maxloc: x and out as (values, locations) pairs (engine/locations.py)

        def describe(seq):
            v = locations.pairs("allreduce", x, op, self.rank) if loc else x
            xp = args.array("allreduce", "x", v)
            checked_op = args.op("allreduce", op, v.dtype)
            _check_out("allreduce", out, v.shape, v.dtype, xp, loc)
            wide = args.accumulate("allreduce", accumulate, v.dtype)
            dtype = np.dtype(accumulate) if wide else v.dtype
            name = self._resolve("allreduce", algorithm, v.size * dtype.itemsize, dtype, checked_op,
                                 blocking=blocking)
            return CollectiveCall("allreduce", seq, v, xp, v.shape, None if loc else out, algorithm, name, checked_op,
                                  accumulate=accumulate if wide else None, blocking=blocking)
        result = self._checked("allreduce", locations.values_of(x) if loc else x, describe, blocking,
                               algorithm=algorithm, op=op, accumulate=accumulate)
        return locations.finished(result, out, blocking) if loc else result

    # -- reduce_scatter -----------------------------------------------------------------------------
    def reduce_scatter(self, x, op: str = "sum", counts=None, algorithm: str = "auto", out=None,
                       accumulate: str | None = None):
        """Reduce ``x`` and keep block ``rank`` of it (blocks along axis 0, ``counts`` rows each; without
        ``counts`` as even as the rows allow, the first ``rows % size`` blocks one row longer)."""
        if accumulate is None and type(x) is np.ndarray and x.flags.c_contiguous:
            got = self._lean_reduce_scatter(x, op, counts, algorithm, out)
            if got is not None:
                return got
        return self._reduce_scatter(x, op, counts, algorithm, out, accumulate, True)

    def _lean_reduce_scatter(self, x, op, counts, algorithm, out):
        """The lean paths, as allreduce's, of a C-contiguous host ``x`` without ``accumulate``: even blocks that go to
        MPI_Reduce_scatter_block, and at two ranks the ring's one round straight on MPI; None where the general path
        must run (it also says what is wrong)."""
        if counts is None:
            lean = self._repeats("reduce_scatter", x, out, op, algorithm)
            if lean is not None:   # this call repeats the last one that went to MPI
                if out is None:
                    out = np.empty(self._lean_repeat["reduce_scatter"][5], x.dtype)
                self._direct("reduce_scatter", self._lib.Reduce_scatter_block, x, out, lean[0])
                return out
        if self._exchange_rs:   # its sizes and MPI's own call's are apart
            got = self._exchange_reduce_scatter(x, op, counts, algorithm, out)
            if got is not None:
                return got
        if counts is None:
            if x.ndim and x.shape[0] % self.size == 0:
                lean = self._lean_entry(self._lean_rs, (x.dtype, op, algorithm), "reduce_scatter", x.nbytes)
                if lean is not None:
                    shape = (x.shape[0] // self.size,) + x.shape[1:]
                    if out is None:
                        self._remember("reduce_scatter", x, None, op, algorithm, shape, lean)
                        out = np.empty(shape, x.dtype)
                    elif out is x or not _lean_out(out, shape, x):   # MPI forbids x as out here (one rank)
                        return None
                    else:
                        self._remember("reduce_scatter", x, out, op, algorithm, shape, lean)
                    self._direct("reduce_scatter", self._lib.Reduce_scatter_block, x, out, lean[0])
                    return out
        return None

    def _exchange_reduce_scatter(self, x, op, counts, algorithm, out):
        """At two ranks, the ring's one round straight on MPI (engine/lean_exchange.py), where it is named or auto
        picks it, with nothing in flight: blocks as ``counts`` (a list of two ints) or the default split gives them,
        neither empty, ``out`` new, apart from ``x`` or ``x``'s own block (in place); else None."""
        exchange = _exchange_of(self._exchange_rs, (x.dtype, op, algorithm))
        if exchange is None or not x.ndim or not exchange[1] < x.nbytes <= exchange[2] or not self._alone():
            return None
        rows = x.shape[0]
        if counts is None:
            first = (rows + 1) // 2
        elif type(counts) is list and len(counts) == 2 and type(counts[0]) is int and type(counts[1]) is int \
                and counts[1] >= 0 and counts[0] + counts[1] == rows:   # anything else: the general path checks it
            first = counts[0]
        else:
            return None
        if not 0 < first < rows or max(first, rows - first) * (x.nbytes // rows) > exchange[3]:
            return None   # an empty block (the schedule's messages are other ones), or a block of several messages
        start, stop = (0, first) if self.rank == 0 else (first, rows)
        shape = (stop - start,) + x.shape[1:]
        if out is None:
            out = np.empty(shape, x.dtype)
        elif not _lean_out(out, shape, x) and not _own_block(out, x, start, stop):
            return None
        return lean_exchange.reduce_scatter(self._runner, x, out, first, exchange[0], self._exchanged)

    def ireduce_scatter(self, x, op: str = "sum", counts=None, algorithm: str = "auto", out=None,
                        accumulate: str | None = None) -> Request:
        """Start a reduce_scatter; ``Request.wait()`` returns the result."""
        return self._reduce_scatter(x, op, counts, algorithm, out, accumulate, False)

    def reduce_scatter_block(self, x, op: str = "sum", algorithm: str = "auto", out=None,
                             accumulate: str | None = None):
        """Reduce ``x`` and keep block ``rank`` of it, every block the same: ``x``'s rows (axis 0) a multiple of the
        size (MPI_Reduce_scatter_block); reduce_scatter's algorithms."""
        if accumulate is None and type(x) is np.ndarray and x.flags.c_contiguous and x.ndim \
                and x.shape[0] % self.size == 0:
            got = self._lean_reduce_scatter(x, op, None, algorithm, out)
            if got is not None:
                return got
        return self._reduce_scatter(x, op, None, algorithm, out, accumulate, True, "reduce_scatter_block")

    def ireduce_scatter_block(self, x, op: str = "sum", algorithm: str = "auto", out=None,
                              accumulate: str | None = None) -> Request:
        """Start a reduce_scatter_block; ``Request.wait()`` returns the result."""
        return self._reduce_scatter(x, op, None, algorithm, out, accumulate, False, "reduce_scatter_block")

    def _reduce_scatter(self, x, op, counts, algorithm, out, accumulate, blocking, where="reduce_scatter"):
        loc = args.locating(op)   # minloc, maxloc: x and out as (values, locations) pairs (engine/locations.py)

        def describe(seq):
            v = locations.pairs(where, x, op, self.rank) if loc else x
            xp = args.array(where, "x", v)
            args.rows(where, v)
            if where == "reduce_scatter_block" and v.shape[0] % self.size:
                raise ValueError(f"reduce_scatter_block: x has {v.shape[0]} rows along axis 0, not a multiple of the "
                                 f"{self.size} ranks (equal blocks); reduce_scatter takes uneven ones")
            checked_op = args.op(where, op, v.dtype)
            rows = args.counts(where, counts, v.shape[0], self.size)
            shape = (rows[self.rank],) + v.shape[1:]
            _check_out(where, out, shape, v.dtype, xp, loc)
            wide = args.accumulate(where, accumulate, v.dtype)
            dtype = np.dtype(accumulate) if wide else v.dtype
            name = self._resolve("reduce_scatter", algorithm, v.size * dtype.itemsize, dtype, checked_op, where=where,
                                 blocking=blocking)
            row = _row_elems(v)
            return CollectiveCall("reduce_scatter", seq, v, xp, shape, None if loc else out, algorithm, name,
                                  checked_op, counts=tuple(c * row for c in rows),
                                  accumulate=accumulate if wide else None, blocking=blocking)
        result = self._checked(where, locations.values_of(x) if loc else x, describe, blocking,
                               algorithm=algorithm, op=op, counts=counts, accumulate=accumulate)
        return locations.finished(result, out, blocking) if loc else result

    # -- scan and exscan ----------------------------------------------------------------------------
    def scan(self, x, op: str = "sum", algorithm: str = "auto", out=None):
        """Rank r gets ``x`` of ranks 0..r reduced elementwise, in rank order (an inclusive prefix, MPI_Scan)."""
        return self._lean_prefix("scan", x, op, algorithm, out)

    def iscan(self, x, op: str = "sum", algorithm: str = "auto", out=None) -> Request:
        """Start a scan; ``Request.wait()`` returns the result."""
        return self._scan("scan", x, op, algorithm, out, False)

    def exscan(self, x, op: str = "sum", algorithm: str = "auto", out=None):
        """Rank r gets ``x`` of ranks 0..r-1 reduced elementwise, in rank order (an exclusive prefix, MPI_Exscan);
        rank 0 gets None and its ``out`` is left as it was (MPI leaves its result undefined)."""
        return self._lean_prefix("exscan", x, op, algorithm, out)

    def _lean_prefix(self, collective: str, x, op, algorithm, out):
        """Scan or exscan; lean path: a host array whose call goes to MPI's own, MPI_Scan or MPI_Exscan straight
        (``out`` judged as allreduce's lean path judges it; anything else takes the general path, which says what is
        wrong). Exscan's rank 0 receives into a scratch array: MPI may write there, ``out`` stays as it was."""
        if type(x) is _ndarray and x.flags.c_contiguous:
            lean = self._lean_entry(self._lean_of[collective], (x.dtype, op, algorithm), collective, x.nbytes)
            if lean is not None and (out is None or _lean_out(out, x.shape, x)):
                run = self._lib.Scan if collective == "scan" else self._lib.Exscan
                if collective == "exscan" and self.rank == 0:
                    self._direct(collective, run, x, _empty(x.shape, x.dtype), lean[0])
                    return None
                if out is None:
                    out = _empty(x.shape, x.dtype)
                self._direct(collective, run, _IN_PLACE if out is x else x, out, lean[0])
                return out
        return self._scan(collective, x, op, algorithm, out, True)

    def iexscan(self, x, op: str = "sum", algorithm: str = "auto", out=None) -> Request:
        """Start an exscan; ``Request.wait()`` returns the result (None on rank 0)."""
        return self._scan("exscan", x, op, algorithm, out, False)

    def _scan(self, collective, x, op, algorithm, out, blocking):
        loc = args.locating(op)   # minloc, maxloc: x and out as (values, locations) pairs (engine/locations.py)
        mine = collective == "scan" or self.rank > 0   # whether this rank has a result

        def describe(seq):
            v = locations.pairs(collective, x, op, self.rank) if loc else x
            xp = args.array(collective, "x", v)
            checked_op = args.op(collective, op, v.dtype)
            if checked_op == "avg":   # a prefix of r + 1 ranks has no one divisor the op could apply
                raise ValueError(f"{collective}: op 'avg' has no prefix form (MPI has no average op); use 'sum' and "
                                 f"divide rank r's result by its number of ranks")
            _check_out(collective, out, v.shape, v.dtype, xp, loc)   # exscan's rank 0 too: the error on every rank
            name = self._resolve(collective, algorithm, v.nbytes, v.dtype, checked_op)
            return CollectiveCall(collective, seq, v, xp, v.shape if mine else None, None if loc or not mine else out,
                                  algorithm, name, checked_op, blocking=blocking)
        result = self._checked(collective, locations.values_of(x) if loc else x, describe, blocking,
                               algorithm=algorithm, op=op)
        return locations.finished(result, out if mine else None, blocking) if loc else result

    # -- allgather ----------------------------------------------------------------------------------
    def allgather(self, x, algorithm: str = "auto", out=None, counts=None, displs=None):
        """Concatenate every rank's ``x`` along axis 0; lengths may differ (``counts`` skips their exchange).

        ``displs`` (with ``counts``; MPI_Allgatherv's displacements): the row where each rank's block starts in the
        result, blocks apart and in any order; the rows between them are zeros in a new result and left as they
        were in ``out`` (which may have more rows than the last block needs). They are this rank's own, as MPI's
        are: ranks may pass different ones, or none."""
        # Lean path: every rank's rows given and all equal, a host array that goes to MPI_Allgather.
        if counts is not None and displs is None and type(x) is np.ndarray and x.ndim and x.flags.c_contiguous \
                and _even(counts, x.shape[0], self.size):
            lean = self._repeats("allgather", x, out, None, algorithm)   # the last lean call's, on these arrays
            if lean is not None and (len(lean) == 2 or self._alone()):
                if out is None:
                    out = np.empty(self._lean_repeat["allgather"][5], x.dtype)
                if len(lean) == 2:   # (MPI op, limit): MPI's own
                    self._direct("allgather", self._lib.Allgather, x, out)
                    return out
                return lean_exchange.allgather(self._runner, x, out, self._exchanged)   # the exchange's entry
            if self._exchange_ag:   # two ranks: the ring's one round straight on MPI where it runs
                got = self._exchange_allgather(x, algorithm, out)
                if got is not None:
                    return got
            lean = self._lean_entry(self._lean_ag, (x.dtype, None, algorithm), "allgather", x.nbytes * self.size)
            if lean is not None:
                shape = (x.shape[0] * self.size,) + x.shape[1:]
                if out is not None and (out is x or not _lean_out(out, shape, x)):
                    return self._allgather(x, algorithm, out, counts, True)
                self._remember("allgather", x, out, None, algorithm, shape, lean)
                if out is None:
                    out = np.empty(shape, x.dtype)
                self._direct("allgather", self._lib.Allgather, x, out)
                return out
        # Lean path without counts: a host array of a dtype MPI's own takes (the lean table's), and an out the
        # general path would accept as far as it can tell before the exchange of rows; off under validation and
        # observers (their lean tables are empty). The path only: every rank decides the call from the exchange.
        elif counts is None and displs is None and type(x) is np.ndarray and x.ndim and x.flags.c_contiguous \
                and (out is None or (type(out) is np.ndarray and out.dtype == x.dtype and out.ndim
                                     and out.shape[1:] == x.shape[1:] and out.flags.writeable)) \
                and (self._lean_entry(self._lean_ag, (x.dtype, None, algorithm), "allgather",
                                      x.nbytes * self.size) is not None
                     or self._exchanges_allgather(x, algorithm) is not None):
            return self._allgather_exchanged(x, algorithm, out)
        return self._allgather(x, algorithm, out, counts, True, displs)

    def _exchange_allgather(self, x, algorithm, out):
        """At two ranks, the ring's one round straight on MPI (engine/lean_exchange.py) where it runs
        (``_exchanges_allgather``), ``out`` new or apart from ``x``; else None."""
        exchange = self._exchanges_allgather(x, algorithm)
        if exchange is None:
            return None
        shape = (2 * x.shape[0],) + x.shape[1:]
        if out is not None and (out is x or not _lean_out(out, shape, x)):
            return None
        self._remember("allgather", x, out, None, algorithm, shape, exchange)   # its repeats skip these checks
        if out is None:
            out = np.empty(shape, x.dtype)
        return lean_exchange.allgather(self._runner, x, out, self._exchanged)

    def _exchanges_allgather(self, x, algorithm):
        """The exchange's entry where an allgather of ``x`` from both ranks runs as the exchange (at two ranks,
        where the ring is named or auto picks it, with nothing in flight, ``x`` of one message, not empty), else
        None."""
        exchange = _exchange_of(self._exchange_ag, (x.dtype, None, algorithm))
        if exchange is not None and exchange[1] < 2 * x.nbytes <= exchange[2] and x.nbytes <= exchange[3] \
                and self._alone():
            return exchange
        return None

    def _allgather_exchanged(self, x, algorithm, out):
        """A blocking allgather without counts, its rows exchanged first. Where every rank sent the same row (the
        call's number, x's rows, out's rows: none, or the total), the rows are even and the lean gate's table has
        already resolved the call to MPI's own: MPI_Allgather straight. Anything else takes the general path's
        decisions from the same table on every rank."""
        seq = self._runner.begin()
        row, table = self._ag_exchange   # (3,) and (size, 3) int64: the call's number, out's rows (-1: none), x's rows
        row[0], row[1], row[2] = seq, -1 if out is None else out.shape[0], x.shape[0]
        self._runner.exchanges.Allgather(row, table)   # where the general path's exchanges go (Runner.exchanges)
        mine, shape = row.tolist(), (x.shape[0] * self.size,) + x.shape[1:]
        if table.tolist().count(mine) == self.size and (out is None or (
                mine[1] == shape[0] and out is not x and _lean_out(out, shape, x))):
            if self._exchanges_allgather(x, algorithm) is not None:   # where auto runs the ring: every rank alike
                return lean_exchange.allgather(self._runner, x, np.empty(shape, x.dtype) if out is None else out,
                                               self._exchanged, seq)
            return self._allgather_mpi(seq, x, out, shape)
        (got,), out_rows = exchanged(table, seq, "allgather", self.rank)
        rows = self._exchanged_rows(seq, x, got, out_rows)
        call = self._allgather_call(seq, x, np, rows, algorithm, out, True)   # out's rows checked, algorithm resolved
        if call.name != "mpi" or rows.count(rows[0]) != self.size or \
                (out is not None and (out is x or not _lean_out(out, call.shape, x))):
            return self._runner.run(call)
        return self._allgather_mpi(seq, x, out, call.shape)

    def _allgather_mpi(self, seq: int, x, out, shape):
        """Call ``seq``'s MPI_Allgather straight into ``out`` (a new array of ``shape`` when None)."""
        if out is None:
            out = np.empty(shape, x.dtype)
        self._direct("allgather", self._lib.Allgather, x, out, seq=seq)
        return out

    def iallgather(self, x, algorithm: str = "auto", out=None, counts=None, displs=None) -> Request:
        """Start an allgather; ``Request.wait()`` returns the result. Without ``counts`` the ranks' rows are
        exchanged first, without waiting here: the call moves its data from ``test()`` or ``wait()``."""
        return self._allgather(x, algorithm, out, counts, False, displs)

    def _allgather(self, x, algorithm, out, counts, blocking, displs=None):
        def describe(seq):
            xp = args.array("allgather", "x", x)
            args.rows("allgather", x)
            if displs is not None:   # MPI_Allgatherv's displacements: every rank's rows given with them
                return self._allgather_displaced(seq, x, xp, counts, displs, algorithm, out, blocking)
            if out is not None:   # its rows: once every rank's are known
                args.out("allgather", out, (None,) + x.shape[1:], x.dtype, xp)
            if counts is not None:
                rows = self._allgather_rows(x, counts)
            elif blocking and self._check is None:   # a blocking call waits for the exchange anyway: now, directly
                (got,), out_rows = self._exchange((x.shape[0],), "allgather", out)
                rows = self._exchanged_rows(seq, x, got, out_rows)
            else:   # known once exchanged from the Request (Runner.prepared), or from validation's fingerprints
                rows = None
            return self._allgather_call(seq, x, xp, rows, algorithm, out, blocking)
        # displs place the blocks in this rank's own result (MPI's are local too): validation compares the counts,
        # and an out for displaced blocks is judged here, in _allgather_displaced
        return self._checked("allgather", x, describe, blocking, self._allgather_complete, algorithm=algorithm,
                             counts=counts, out=out if displs is None else None, rows_free=True)

    def _allgather_displaced(self, seq, x, xp, counts, displs, algorithm, out, blocking) -> CollectiveCall:
        """The checked allgather whose blocks start at rows ``displs`` of the result: as many rows as the last block
        needs, or ``out``'s when it has more."""
        if counts is None:
            raise ValueError("allgather: displs needs counts (every rank's rows, as MPI_Allgatherv's recvcounts)")
        rows = self._allgather_rows(x, counts)
        starts = args.displs("allgather", "displs", displs, rows, self.size)
        end = extent(rows, starts)
        given: tuple = tuple(getattr(out, "shape", ()))
        shape = (max(end, given[0]) if len(given) == x.ndim else end,) + x.shape[1:]   # out's rows when enough
        args.out("allgather", out, shape, x.dtype, xp)
        if out is None:
            args.displaced_result("allgather", "displs", end, shape, x.dtype)
        row = _row_elems(x)
        name = self._resolve("allgather", algorithm, sum(rows) * row * x.itemsize, x.dtype, blocking=blocking)
        return CollectiveCall("allgather", seq, x, xp, shape, out, algorithm, name, counts=tuple(c * row for c in rows),
                              blocking=blocking, displs=tuple(d * row for d in starts))

    def _allgather_complete(self, call: CollectiveCall, table, comm):
        """Steps (Runner.prepared): the allgather once every rank's rows are known -- from validation's fingerprints
        (``table``), else exchanged on ``comm``. Every rank's ``out`` rows travel along and are checked on every
        rank, so a wrong ``out`` raises everywhere rather than on one rank after the others have moved on."""
        x, out = call.x, call.out
        if table is not None:
            rows = tuple(int(r) for r in table[:, ROWS])
            assert self._check is not None, "a table comes from validation"
            self._check.out_rows("allgather", call.seq, table, [sum(rows)] * self.size, x.shape[1:])
        else:
            exchange = self._runner.start_exchange((x.shape[0],), "allgather", out, comm, call.seq, call.blocking)
            if exchange.step is not None:
                yield exchange.step
            (got,), out_rows = exchange.read()
            rows = self._exchanged_rows(call.seq, x, got, out_rows)
        return self._allgather_call(call.seq, x, call.xp, rows, call.algorithm, out, call.blocking)

    def _exchanged_rows(self, seq: int, x, got: list[int], out_rows: list[int]) -> tuple[int, ...]:
        """Every rank's rows as exchanged; every rank's ``out`` rows (-1: none) checked on every rank, so a wrong
        ``out`` raises everywhere rather than on one rank after the others have moved on."""
        total = sum(got)
        if out_rows.count(-1) + out_rows.count(total) != self.size:   # some rank's out is wrong: say which
            check_out_rows("allgather", seq, out_rows, [total] * self.size, x.shape[1:], self.rank)
        return tuple(got)

    def _allgather_call(self, seq, x, xp, rows, algorithm, out, blocking) -> CollectiveCall:
        """The checked allgather once every rank's ``rows`` are known (None: not yet, no algorithm resolved)."""
        if rows is None:   # the name is checked now, the algorithm resolved once the rows are known
            args.algorithm("allgather", algorithm, _algorithm_names("allgather"))
            return CollectiveCall("allgather", seq, x, xp, None, out, algorithm, None, blocking=blocking)
        shape, elems, total = _gathered(rows, x.shape[1:])
        if out is not None:
            args.out("allgather", out, shape, x.dtype, xp)
        name = self._resolve("allgather", algorithm, total * x.itemsize, x.dtype, blocking=blocking)
        return CollectiveCall("allgather", seq, x, xp, shape, out, algorithm, name, counts=elems, blocking=blocking)

    def _allgather_rows(self, x, counts) -> tuple[int, ...]:
        """Rows of every rank, as ``counts`` gives them (checked)."""
        given = args.counts("allgather", counts, None, self.size)
        if given[self.rank] != x.shape[0]:
            raise ValueError(f"allgather: counts[{self.rank}] is {given[self.rank]} but x has {x.shape[0]} rows")
        return tuple(given)

    # -- alltoall -----------------------------------------------------------------------------------
    def alltoall(self, x, counts=None, algorithm: str = "auto", out=None, send_displs=None, recv_displs=None):
        """Block i of ``x`` (axis 0) goes to rank i; the result holds the blocks from each rank in rank order.

        Without ``counts`` every rank splits the same number of rows evenly (as MPI_Alltoall; rows that do not
        divide by the size split as evenly as they can, the first ``rows % size`` blocks one row longer, as
        reduce_scatter's);
        with ``counts`` (rows per destination) blocks may be uneven (MPI_Alltoallv), and the ranks
        exchange their counts first. ``counts`` may instead be the whole (size, size) matrix, row i the
        rows rank i sends to each rank, the same on every rank: then nothing is exchanged.
        With ``counts``, MPI_Alltoallv's displacements (rows): ``send_displs`` where the block for each rank starts
        in ``x`` (blocks may overlap, and rows be left out), ``recv_displs`` where the block from each rank starts in
        the result (apart; the rows between are zeros in a new result and left as they were in ``out``; the result
        has as many rows as the last block needs, or ``out``'s when it has more, the rows past the blocks left as
        they were); both are this rank's own layout, as MPI's: ranks may pass different ones, or none.
        """
        # Lean path: even blocks of a host array that go to MPI_Alltoall.
        if counts is None and send_displs is None and recv_displs is None and type(x) is np.ndarray \
                and x.flags.c_contiguous:
            lean = self._repeats("alltoall", x, out, None, algorithm)
            if lean is None and x.ndim and x.shape[0] % self.size == 0:
                lean = self._lean_entry(self._lean_a2a, (x.dtype, None, algorithm), "alltoall", x.nbytes)
                if lean is not None:
                    if out is not None and not _lean_out(out, x.shape, x):
                        return self._alltoall(x, counts, algorithm, out, True)
                    self._remember("alltoall", x, out, None, algorithm, x.shape, lean)
            if lean is not None:
                if out is None:
                    out = np.empty_like(x)
                self._direct("alltoall", self._lib.Alltoall, MPI.IN_PLACE if out is x else x, out)
                return out
        return self._alltoall(x, counts, algorithm, out, True, send_displs, recv_displs)

    def ialltoall(self, x, counts=None, algorithm: str = "auto", out=None, send_displs=None,
                  recv_displs=None) -> Request:
        """Start an alltoall; ``Request.wait()`` returns the result. With a row of ``counts`` (not the whole
        matrix) the ranks' counts are exchanged first, without waiting here: the call moves its data from
        ``test()`` or ``wait()``."""
        return self._alltoall(x, counts, algorithm, out, False, send_displs, recv_displs)

    def _alltoall(self, x, counts, algorithm, out, blocking, send_displs=None, recv_displs=None):
        def describe(seq):
            xp = args.array("alltoall", "x", x)
            args.rows("alltoall", x)
            if counts is None and (send_displs is not None or recv_displs is not None):
                raise ValueError("alltoall: send_displs and recv_displs need counts (rows to each rank, or the whole "
                                 "matrix), as MPI_Alltoallv's")
            given = None if send_displs is not None else x.shape[0]   # blocks where send_displs put them, not all rows
            known = args.count_matrix("alltoall", counts, given, self.size, self.rank)
            rows = known[self.rank] if known else args.counts("alltoall", counts, given, self.size)
            sent = None if send_displs is None else _send_displs(x, rows, send_displs, self.size)
            own = (self.size * rows[self.rank] if counts is None   # with a row of counts: known after the exchange
                   else sum(r[self.rank] for r in known) if known and recv_displs is None else None)
            args.out("alltoall", out, (own,) + x.shape[1:], x.dtype, xp)
            if counts is None:   # even blocks: everything is known here
                return self._alltoall_call(seq, x, xp, (rows,) * self.size, algorithm, out, blocking,
                                           self._resolve("alltoall", algorithm, x.nbytes, x.dtype))
            args.algorithm("alltoall", algorithm, _algorithm_names("alltoall"))
            # not resolved yet: every rank's rows first (the whole matrix when given, else this rank's row); the
            # displacements in rows, as given (recv_displs are checked once every rank's rows to this one are known)
            return CollectiveCall("alltoall", seq, x, xp, None, out, algorithm, None, counts=None if known else rows,
                                  matrix=known, blocking=blocking, displs=recv_displs, send_displs=sent)
        whole = args.is_matrix(counts)   # every rank must pass the same matrix, but a row of its own
        return self._checked("alltoall", x, describe, blocking, self._alltoall_complete, algorithm=algorithm,
                             out=out if recv_displs is None else None,
                             counts=np.ravel(counts).tolist() if whole else counts, rows_free=counts is not None,
                             counts_each=not whole)

    def _alltoall_complete(self, call: CollectiveCall, table, comm):
        """Steps (Runner.prepared): the alltoall once every rank's rows to every rank are known (the whole matrix
        given, else every rank's row exchanged on ``comm``); every rank's ``out`` rows checked on every rank."""
        x, out, matrix = call.x, call.out, call.matrix
        rows_out = out if call.displs is None else None   # an out for displaced blocks: checked here, in _alltoall_call
        if matrix is None:
            exchange = self._runner.start_exchange(call.counts, "alltoall", rows_out, comm, call.seq, call.blocking)
            if exchange.step is not None:
                yield exchange.step
            columns, out_rows = exchange.read()
            matrix = tuple(zip(*columns))
            received = [sum(r[j] for r in matrix) for j in range(self.size)]
            check_out_rows("alltoall", call.seq, out_rows, received, x.shape[1:], self.rank)
        if table is not None:
            assert self._check is not None, "a table comes from validation"
            each = [sum(r[j] for r in matrix) for j in range(self.size)]
            self._check.out_rows("alltoall", call.seq, table, each, x.shape[1:])
        # every rank resolves from the same figure: the bytes an average rank sends
        average = sum(map(sum, matrix)) * x.itemsize * _row_elems(x) // self.size
        largest = max(max(map(sum, matrix)), max(map(sum, zip(*matrix)))) * _row_elems(x)   # a rank's sent or received
        name = self._resolve("alltoall", call.algorithm, average, x.dtype, elements=largest)
        try:
            return self._alltoall_call(call.seq, x, call.xp, matrix, call.algorithm, out, call.blocking, name,
                                       call.send_displs, call.displs)
        except (ValueError, TypeError) as e:   # recv_displs or out, this rank's own, judged by the rows now known:
            # it takes part, its result into scratch, so that no peer waits for its rows (it raised alone before)
            raise TakesPartThenRaises(self._alltoall_call(call.seq, x, call.xp, matrix, call.algorithm, None,
                                                          call.blocking, name, call.send_displs), e) from None

    def _alltoall_call(self, seq, x, xp, rows_matrix, algorithm, out, blocking, name, send_displs=None,
                       recv_displs=None) -> CollectiveCall:
        """The checked alltoall once every rank's rows to every rank are known (displacements in rows, the sending
        ones checked)."""
        received = [r[self.rank] for r in rows_matrix]
        shape, starts = (sum(received),) + x.shape[1:], None
        if recv_displs is not None:   # as many rows as the last block needs, or out's when it has more
            starts = args.displs("alltoall", "recv_displs", recv_displs, received, self.size)
            end = extent(received, starts)
            given: tuple = tuple(getattr(out, "shape", ()))
            shape = (max(end, given[0]) if len(given) == x.ndim else end,) + x.shape[1:]
            if out is None:
                args.displaced_result("alltoall", "recv_displs", end, shape, x.dtype)
        args.out("alltoall", out, shape, x.dtype, xp)
        row = _row_elems(x)
        matrix = tuple(tuple(c * row for c in r) for r in rows_matrix)
        return CollectiveCall("alltoall", seq, x, xp, shape, out, algorithm, name, matrix=matrix, blocking=blocking,
                              displs=None if starts is None else tuple(d * row for d in starts),
                              send_displs=None if send_displs is None else tuple(d * row for d in send_displs))

    # -- broadcast and reduce -----------------------------------------------------------------------
    def broadcast(self, x, root: int = 0, algorithm: str = "auto", out=None):
        """Root's ``x`` on every rank (elsewhere ``x`` gives shape and dtype); ``out=x`` fills ``x`` in place."""
        # Lean path: a host array whose call goes to MPI's own, MPI_Bcast straight into the result (the root's x
        # copied there first unless in place); an ``out`` lean_out refuses, and any other root, the general path.
        if type(x) is _ndarray and type(root) is int and 0 <= root < self.size and x.flags.c_contiguous \
                and self._lean_entry(self._lean_of["broadcast"], (x.dtype, None, algorithm), "broadcast",
                                     x.nbytes) is not None and (out is None or _lean_out(out, x.shape, x)):
            if out is None:
                out = _empty(x.shape, x.dtype)
            if x.nbytes >= mpi_native.BCAST_OVERLAP_BYTES:   # the general path's rule: MPI_Ibcast, root copies meanwhile
                self._direct("broadcast", mpi_native.overlapped_bcast, self._lib, out, root,
                             x if out is not x and root == self.rank else None)
                return out
            if out is not x and root == self.rank:
                out[...] = x
            self._direct("broadcast", self._lib.Bcast, out, root)
            return out
        return self._broadcast(x, root, algorithm, out, True)

    def ibroadcast(self, x, root: int = 0, algorithm: str = "auto", out=None) -> Request:
        """Start a broadcast; ``Request.wait()`` returns the result."""
        return self._broadcast(x, root, algorithm, out, False)

    def _broadcast(self, x, root, algorithm, out, blocking):
        def describe(seq):
            xp = args.array("broadcast", "x", x)
            args.rank("broadcast", "root", root, self.size)
            args.out("broadcast", out, x.shape, x.dtype, xp)
            name = self._resolve("broadcast", algorithm, x.nbytes, x.dtype)
            return CollectiveCall("broadcast", seq, x, xp, x.shape, out, algorithm, name, root=root,
                                  blocking=blocking)
        return self._checked("broadcast", x, describe, blocking, algorithm=algorithm, root=root)

    def reduce(self, x, root: int = 0, op: str = "sum", algorithm: str = "auto", out=None,
               accumulate: str | None = None):
        """Reduce ``x`` onto ``root``; returns the result there and None elsewhere."""
        # Lean path: a host array whose call goes to MPI's own, MPI_Reduce straight (the root's ``out`` judged as
        # allreduce's lean path judges it; off the root ``out`` is not read, as on the general path).
        if type(x) is _ndarray and accumulate is None and type(root) is int and 0 <= root < self.size \
                and x.flags.c_contiguous:
            lean = self._lean_entry(self._lean_of["reduce"], (x.dtype, op, algorithm), "reduce", x.nbytes)
            if lean is not None and root != self.rank:
                self._direct("reduce", self._lib.Reduce, x, None, lean[0], root)
                return None
            if lean is not None and (out is None or _lean_out(out, x.shape, x)):
                if out is None:
                    out = _empty(x.shape, x.dtype)
                self._direct("reduce", self._lib.Reduce, _IN_PLACE if out is x else x, out, lean[0], root)
                return out
        return self._reduce(x, root, op, algorithm, out, accumulate, True)

    def ireduce(self, x, root: int = 0, op: str = "sum", algorithm: str = "auto", out=None,
                accumulate: str | None = None) -> Request:
        """Start a reduce; ``Request.wait()`` returns the result on ``root`` and None elsewhere."""
        return self._reduce(x, root, op, algorithm, out, accumulate, False)

    def _reduce(self, x, root, op, algorithm, out, accumulate, blocking):
        loc = args.locating(op)   # minloc, maxloc: x and out as (values, locations) pairs (engine/locations.py)

        def describe(seq):
            v = locations.pairs("reduce", x, op, self.rank) if loc else x
            xp = args.array("reduce", "x", v)
            args.rank("reduce", "root", root, self.size)
            checked_op = args.op("reduce", op, v.dtype)
            if self.rank == root:
                _check_out("reduce", out, v.shape, v.dtype, xp, loc)
            wide = args.accumulate("reduce", accumulate, v.dtype)
            dtype = np.dtype(accumulate) if wide else v.dtype
            name = self._resolve("reduce", algorithm, v.size * dtype.itemsize, dtype, checked_op, root)
            return CollectiveCall("reduce", seq, v, xp, v.shape if self.rank == root else None,
                                  None if loc else out, algorithm, name, checked_op, root=root,
                                  accumulate=accumulate if wide else None, blocking=blocking)
        result = self._checked("reduce", locations.values_of(x) if loc else x, describe, blocking, algorithm=algorithm,
                               op=op, root=root, accumulate=accumulate)
        return locations.finished(result, out, blocking) if loc else result

    def barrier(self) -> None:
        """Wait until every rank has called ``barrier`` (a collective of its own: it takes a number; observers --
        a recording, the tracer, the watchdog -- see it as a call of no elements)."""
        seq = self._begin()
        if self._check is not None:
            self._check.agree(Call("barrier", seq, None))
        try:
            if self._runner.observers is None:   # the lean path: MPI's own, nothing to tell
                if self._runner.refusal is not None:
                    self._runner.meet_after_refusal(seq)
                self._lib.Barrier()
            else:
                self._runner.barrier(seq)
        except MPI.Exception as e:
            collective_failed(f"barrier #{seq} (mpi)", self.rank, e)

    # -- point to point -----------------------------------------------------------------------------
    def send(self, x, dest: int, tag: int = 0) -> None:
        """Send ``x`` to ``dest``; the receiver passes an array of the same shape and dtype to ``recv``."""
        self._isend(x, dest, tag, True).wait()

    def recv(self, out, source: int, tag: int = 0):
        """Receive into ``out`` from ``source`` and return it. The message must fill ``out``: a shorter one raises
        ValueError (its bytes are in ``out``'s first ones), a longer one ends the job (MPI's truncation). Messages
        carry bytes, not types: one sent as another dtype of the same size lands as ``out``'s, unchecked."""
        return self._irecv(out, source, tag, True).wait()

    def isend(self, x, dest: int, tag: int = 0) -> Request:
        """Start sending ``x`` to ``dest``; ``Request.wait()`` returns None once it is sent."""
        return self._isend(x, dest, tag, False)

    def irecv(self, out, source: int, tag: int = 0) -> Request:
        """Start receiving into ``out`` from ``source``; ``Request.wait()`` returns ``out``."""
        return self._irecv(out, source, tag, False)

    def _isend(self, x, dest, tag, blocking) -> Request:
        self._live()
        dest = args.rank("isend", "dest", dest, self.size)
        tag = args.tag("isend", tag, self.tag_ub)
        with self._in_order("send to", dest, tag):
            xp = args.array("isend", "x", x)
        self._message_told("send", x, xp, blocking)
        xf = flat(x)
        backend.sync(xp)
        staging = self._runner.staging(xp)
        if self._runner.private and not staging:   # abort off: a timed-out send's late peer reads a copy (runner.py)
            xf = xf.copy()
        buf = backend.byte_view(xp.asnumpy(xf) if staging else xf, np if staging else xp)
        watch = None if (dog := self._runner.watch) is None else dog.message("send", dest, tag, xf.nbytes)
        return Request.of_mpi(_posted(self._p2p.Isend, buf, dest, tag), lambda: None, watch,
                              f"send to rank {dest}, tag {tag}", self.rank, self._runner.dropped, inside="MPI",
                              keep=buf)

    def _irecv(self, out, source, tag, blocking) -> Request:
        self._live()
        if type(source) is int and source == MPI.ANY_SOURCE:
            raise ValueError(f"irecv: source must be a rank in [0, {self.size}), got {source} (MPI.ANY_SOURCE, which "
                             f"is not taken: name the sender)")
        if type(tag) is int and tag == MPI.ANY_TAG:
            raise ValueError(f"irecv: tag must be in [0, {self.tag_ub}] (MPI's TAG_UB); MPI.ANY_TAG is not taken "
                             f"(name the tag)")
        source = args.rank("irecv", "source", source, self.size)
        tag = args.tag("irecv", tag, self.tag_ub)
        with self._in_order("receive from", source, tag):
            xp = args.receive_buffer("irecv", out)
        self._message_told("recv", out, xp, blocking)
        of = out.reshape(-1)
        staging = self._runner.staging(xp)
        apart = staging or self._runner.private   # abort off: a timed-out receive's late message lands in a copy
        backend.sync(xp)  # a queued kernel writing `out` must not land on top of the message
        buf = np.empty(of.nbytes, np.uint8) if staging else backend.byte_view(of.copy() if apart else of, xp)

        def finish(status):
            got = counts.received(status, of.nbytes)
            if got != of.nbytes:   # MPI takes a shorter message without a word: out would look whole
                raise ValueError(f"recv: the message from rank {source}, tag {tag} has {got} bytes, but out "
                                 f"({out.dtype}{tuple(out.shape)}) has {of.nbytes}; its first {got} bytes "
                                 f"{'were' if not apart else 'were not'} written (pass out of the sent shape "
                                 f"and dtype)")
            if apart:
                of[...] = xp.asarray(buf.view(of.dtype)) if staging else buf.view(of.dtype)
            return out
        watch = None if (dog := self._runner.watch) is None else dog.message("recv", source, tag, of.nbytes)
        return Request.of_mpi(_posted(self._p2p.Irecv, buf, source, tag), finish, watch,
                              f"receive from rank {source}, tag {tag}", self.rank, self._runner.dropped,
                              with_status=True, inside="MPI", keep=buf)

    @contextlib.contextmanager
    def _in_order(self, kind: str, peer: int, tag: int):
        """The checks of a message's other arguments, once its peer and tag are known. MPI pairs the messages of one
        peer and tag in order, and a refused one is never posted: the rank's next one on that peer and tag would
        take its place (a receive the refused one's message, a send the refused one's receiver), with the data
        of another (found by a helper: a recv refused for a read-only out, caught, then another recv returned the
        first message as the second's). So a refusal ends that peer and tag's messages on this rank: each later
        one raises, naming it."""
        key = (kind, peer, tag)
        refused = self._refused_messages.get(key)
        if refused is not None:
            raise RuntimeError(f"{kind} rank {peer}, tag {tag}: refused, as every message of this peer and tag "
                               f"after one refused on this rank ({refused}): messages pair in order, and this one "
                               f"would take the refused one's place; use another tag")
        try:
            yield
        except Exception as e:
            self._refused_messages[key] = f"{type(e).__name__}: {e}"
            raise

    def _live(self) -> None:
        """Messages take no call number (no ``begin``, which refuses collectives): refused here once freed, or once a
        call ended in flight (Runner.break_off: a message left to MPI would take a later one's place)."""
        if self._freed:
            raise freed_error()
        if self._runner.broken is not None:
            raise broken_error(self._runner.broken)

    def _message_told(self, kind: str, x, xp, blocking: bool) -> None:
        """A point-to-point message handed in, told to the runner's observers (a recording logs it); it takes no
        call number (-1): messages pair by their tags, not by the collectives' count."""
        observers = self._runner.observers
        if observers is not None:
            observers.before(CollectiveCall(kind, -1, x, xp, None, blocking=blocking))


class CartesianGrid(Cartesian, Communicator):
    """A Communicator over a Cartesian grid of ranks (``comm.cartesian(dims, periods)``, or an ``MPI.Cartcomm`` of
    the caller's): ``dims``, ``periods``, ``coords``, ``neighbors``, the neighbourhood collectives and halo
    exchange (cartesian.py) beside every collective of a Communicator."""


# -- argument checks and result plumbing shared by the methods ------------------------------------------
_ndarray, _empty, _IN_PLACE = np.ndarray, np.empty, MPI.IN_PLACE   # the lean path's names, one global lookup each


def _own_block(out, x, start: int, stop: int) -> bool:
    """Whether ``out`` is exactly rows ``start:stop`` of a C-contiguous ``x`` (a reduce-scatter in place), writable."""
    return (type(out) is np.ndarray and out.dtype == x.dtype and out.shape == (stop - start,) + x.shape[1:]
            and out.flags.c_contiguous and out.flags.writeable
            and out.__array_interface__["data"][0] == x[start:stop].__array_interface__["data"][0])


def _exchange_of(table: dict, key: tuple):
    """A lean exchange's entry (engine/lean_exchange.py) for ``key``, or None (an unhashable op or algorithm too:
    the general path says what is wrong)."""
    try:
        return table.get(key)
    except TypeError:
        return None


_LEAN_MORE = ("broadcast", "reduce", "scan", "exscan", "gather", "scatter")   # the lean paths of Communicator._lean_of


def _check_out(where: str, out, shape, dtype, xp, loc: bool) -> None:
    """``out`` of a reducing call: a pair of arrays under minloc and maxloc (engine/locations.py), else one array."""
    if loc:
        locations.check_out(where, out, shape, dtype)
    else:
        args.out(where, out, shape, dtype, xp)


def _posted(start, buf, peer: int, tag: int) -> MPI.Request:
    """``start`` (Isend, Irecv) of the bytes ``buf``: past MPI's count limit as one element of a type of its own
    (engine/counts.py), freed once posted."""
    spec, big = counts.message(buf)
    try:
        return start(spec, peer, tag)
    finally:
        if big is not None:
            big.Free()


_UNDER_MPI_3 = f"under this MPI (MPI {'.'.join(map(str, MPI.Get_version()))}: counts are C ints)"


def _past_the_count(where: str, collective: str) -> str:
    return (f"{where}: algorithm 'mpi' cannot take more than {counts.LIMIT} elements in one call {_UNDER_MPI_3}; "
            f"choose one of {', '.join(registry.schedule_algorithms(collective))}, which cut their messages")


def _dtype_text(dtype, op) -> str:
    """A dtype as an error names it: minloc's pairs by their values' dtype."""
    dtype = np.dtype(dtype)
    return f"{dtype['value']} with op {op!r}" if op in ops.LOCATING else str(dtype)


def _reorders(collective: str, algorithm: str, op, keeping: list[str]) -> str:
    """The error for a non-commutative op on a schedule that combines the ranks out of rank order."""
    others = "'mpi'" + "".join(f" or {n!r}" for n in keeping)
    return (f"{collective}: op {op.name} is not commutative (Op(commute=False)) and algorithm {algorithm!r} "
            f"combines the ranks out of rank order here; use algorithm {others} (or 'auto'), which reduce in "
            f"rank order")


def _dead():
    """A weak reference that has died: matches no array."""
    return None


def _gathered(rows: tuple[int, ...], trailing: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    """Allgather of every rank's ``rows`` of shape ``trailing``: the result's shape, every rank's elements, their sum."""
    total = sum(rows)
    if not trailing:   # rows are elements
        return (total,), rows, total
    row = math.prod(trailing)
    return (total,) + trailing, tuple(c * row for c in rows), total * row


def _send_displs(x, rows, send_displs, size: int) -> tuple[int, ...]:
    """alltoall's ``send_displs`` checked: the block for each rank inside ``x`` (blocks may overlap, as MPI allows)."""
    starts = args.displs("alltoall", "send_displs", send_displs, rows, size, apart=False)
    for r, (d, c) in enumerate(zip(starts, rows)):
        if c and d + c > x.shape[0]:
            raise ValueError(f"alltoall: send_displs put the {c} rows for rank {r} at row {d}, past x's {x.shape[0]} rows")
    return starts


def _row_elems(x) -> int:
    return math.prod(x.shape[1:])










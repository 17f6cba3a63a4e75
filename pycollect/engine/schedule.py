"""The vocabulary of schedules: rounds of sends, receives and local copies on named buffers.

A schedule never touches data or MPI. It names element ranges of three flat buffers:
``"in"`` (the caller's input, read only), ``"out"`` (the result) and ``"tmp"`` (scratch
the executor allocates, ``Schedule.tmp`` elements). ``"in"`` and ``"out"`` may be the
same memory (in-place calls), so a schedule reads each ``"in"`` range before it writes
the same ``"out"`` range.

A message may instead go through a shared-memory window, when every rank of the call is on
one node (``Problem.windows``): its ``Send`` publishes the data at element ``at`` of the
sender's window and its ``Recv`` reads (or reduces) it from there, one copy fewer than MPI's
shared-memory cells. A round is either all window messages or none (``Round.window``):
the executor publishes its sends, waits until every rank has published (a fence), then
reads. A rank's window is read by its peers until the next fence, so two window rounds in a
row publish into disjoint ranges of it (the simulator checks this). A ``from_input`` window round
(the same round of every rank) publishes ranges of ``"in"`` at their own offsets (``at`` is the
slice's start). A rank whose schedule ``lends`` its input, and whose input already lies in shared
memory (``Communicator.shared_empty``), then publishes nothing: its peers read its input itself,
so it must not write over those ranges before the next fence (the simulator checks this too).

A pair of window rounds may ``puts`` a result instead (an allreduce on one node): the first reduces this rank's
block into ``"out"`` and, where a peer's ``out`` lies in shared memory too, writes it straight there as well; the
second, which spreads the blocks, then skips what such a peer would read and, where every peer's lies there,
what this rank would publish. Each block is then read once and written once into every rank's ``out``, what a
copy of the input costs. The rounds, and so the traffic they count, are the same either way.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .topology import Topology

BUFFERS = ("in", "out", "tmp")


@dataclass(frozen=True, slots=True)
class Slice:
    """Elements ``[start, stop)`` of the flat buffer ``buf``."""

    buf: str
    start: int
    stop: int

    @property
    def n(self) -> int:
        return self.stop - self.start

    def sub(self, start: int, stop: int) -> "Slice":
        """The part ``[start, stop)`` of this slice, counted from its own start."""
        return Slice(self.buf, self.start + start, self.start + stop)


@dataclass(frozen=True, slots=True)
class Send:
    """Send ``src`` to ``peer``; with ``at``, publish it at element ``at`` of this rank's window instead."""

    peer: int
    src: Slice
    at: int | None = None


@dataclass(frozen=True, slots=True)
class Recv:
    """Receive ``dst.n`` elements from ``peer``; with ``acc``, store ``op(acc, incoming)`` in ``dst``, or
    ``op(incoming, acc)`` with ``incoming_first`` (the message holds the lower ranks).

    With ``at``, read them at element ``at`` of ``peer``'s window (the reads of a round run in the
    order listed, so one may accumulate onto what an earlier one wrote).
    """

    peer: int
    dst: Slice
    acc: Slice | None = None
    at: int | None = None
    incoming_first: bool = False


@dataclass(frozen=True, slots=True)
class Copy:
    """Copy ``src`` to ``dst``; with ``acc``, store ``op(acc, src)`` in ``dst`` instead (a local reduction, ``acc``
    holding the lower ranks: what a prefix needs when the raw message and its reduction are both kept)."""

    src: Slice
    dst: Slice
    acc: Slice | None = None


@dataclass(frozen=True, slots=True)
class Round:
    """One step of a schedule: ``pre`` copies, then all sends and receives at once, then ``post`` copies.

    Messages between the same pair in one round are matched in the order listed. A ``window``
    round (every message with ``at``) publishes, meets every rank at a fence, then reads: every
    rank of the call has the same number of window rounds, even one with nothing to move in it.
    ``from_input``: its sends are ranges of ``"in"`` published at their own offsets (module docstring).
    ``puts``: a window round whose result also goes straight into the ``out`` of peers whose ``out`` lies in shared
    memory, or (the round after) whose reads and publishing such peers no longer need (module docstring).
    """

    sends: tuple[Send, ...] = ()
    recvs: tuple[Recv, ...] = ()
    pre: tuple[Copy, ...] = ()
    post: tuple[Copy, ...] = ()
    window: bool = False
    from_input: bool = False
    puts: bool = False

    @property
    def communicates(self) -> bool:
        return bool(self.sends or self.recvs)


@dataclass(frozen=True, slots=True)
class Schedule:
    """What one rank does: its rounds in order, the scratch it needs and the window elements it publishes into.

    ``win`` is the same on every rank of a call (the executor sizes one shared window by it); ``lends``:
    its ``from_input`` rounds may be read from its input where it lies (module docstring).
    """

    rounds: tuple[Round, ...]
    tmp: int = 0
    win: int = 0
    lends: bool = False

    def __add__(self, other: "Schedule") -> "Schedule":
        return Schedule(self.rounds + other.rounds, max(self.tmp, other.tmp), max(self.win, other.win),
                        self.lends and other.lends)


EMPTY = Schedule(())


@dataclass(frozen=True, slots=True)
class Problem:
    """Everything a schedule function may depend on.

    ``counts``: elements of each rank's block (reduce_scatter output, allgather input, gather input,
    scatter output);
    ``displs``: element offsets of each rank's block in the root's buffer (gather output, scatter input; empty:
    the blocks packed in rank order);
    ``n``: elements of the whole vector (allreduce, broadcast, reduce, reduce_scatter input; the root's blocks'
    extent for gather and scatter);
    ``matrix[i][j]``: elements rank i sends to rank j (alltoall);
    ``tree_segment``: elements per segment of the segmented (pipelined) trees (0: one segment);
    ``aliased``: whether ``in`` and ``out`` may share memory (a schedule that must stage data
    to survive aliasing can skip that when it is false);
    ``windows``: whether the ranks of each node can share a memory window (host buffers); the
    window schedules fall back to messages without it (most also on more than one node).
    """

    rank: int
    size: int
    topology: Topology
    n: int = 0
    counts: tuple[int, ...] = ()
    displs: tuple[int, ...] = ()
    matrix: tuple[tuple[int, ...], ...] = ()
    root: int = 0
    tree_segment: int = 0
    aliased: bool = True
    windows: bool = False

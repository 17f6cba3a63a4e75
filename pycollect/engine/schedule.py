"""The vocabulary of schedules: rounds of sends, receives and local copies on named buffers.

A schedule never touches data or MPI. It names element ranges of three flat buffers:
``"in"`` (the caller's input, read only), ``"out"`` (the result) and ``"tmp"`` (scratch
the executor allocates, ``Schedule.tmp`` elements). ``"in"`` and ``"out"`` may be the
same memory (in-place calls), so a schedule reads each ``"in"`` range before it writes
the same ``"out"`` range.
"""
from __future__ import annotations

from dataclasses import dataclass, field
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
    peer: int
    src: Slice


@dataclass(frozen=True, slots=True)
class Recv:
    """Receive ``dst.n`` elements from ``peer``; with ``acc``, store ``op(acc, incoming)`` in ``dst``."""

    peer: int
    dst: Slice
    acc: Slice | None = None


@dataclass(frozen=True, slots=True)
class Copy:
    src: Slice
    dst: Slice


@dataclass(frozen=True, slots=True)
class Round:
    """One step of a schedule: ``pre`` copies, then all sends and receives at once, then ``post`` copies.

    Messages between the same pair in one round are matched in the order listed.
    """

    sends: tuple[Send, ...] = ()
    recvs: tuple[Recv, ...] = ()
    pre: tuple[Copy, ...] = ()
    post: tuple[Copy, ...] = ()

    @property
    def communicates(self) -> bool:
        return bool(self.sends or self.recvs)


@dataclass(frozen=True, slots=True)
class Schedule:
    """What one rank does: its rounds in order and the scratch it needs."""

    rounds: tuple[Round, ...]
    tmp: int = 0

    def __add__(self, other: "Schedule") -> "Schedule":
        return Schedule(self.rounds + other.rounds, max(self.tmp, other.tmp))


EMPTY = Schedule(())


@dataclass(frozen=True, slots=True)
class Problem:
    """Everything a schedule function may depend on.

    ``counts``: elements of each rank's block (reduce_scatter output, allgather input);
    ``n``: elements of the whole vector (allreduce, broadcast, reduce, reduce_scatter input);
    ``matrix[i][j]``: elements rank i sends to rank j (alltoall);
    ``pipeline``: elements per pipelined segment for schedules that pipeline (0: one segment);
    ``aliased``: whether ``in`` and ``out`` may share memory (a schedule that must stage data
    to survive aliasing can skip that when it is false).
    """

    rank: int
    size: int
    topology: Topology
    n: int = 0
    counts: tuple[int, ...] = ()
    matrix: tuple[tuple[int, ...], ...] = ()
    root: int = 0
    pipeline: int = 0
    aliased: bool = True
    extra: dict = field(default_factory=dict, compare=False, hash=False)

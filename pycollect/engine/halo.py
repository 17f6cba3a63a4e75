"""Halo exchange: the ghost layers of an N-d block filled from its Cartesian neighbours, without packing copies.

A rank's block ``u`` holds its own cells with ``width[d]`` ghost layers on both sides of dimension
``d``: ``u.shape[d] = n[d] + 2 * width[d]``. Each face (the ``width[d]`` own layers next to a side)
goes to the neighbour on that side, which lands it in its ghosts on the other side. Faces are
described to MPI as subarray datatypes over the whole array (``MPI_Type_create_subarray``), so MPI
reads and writes them in place; the datatypes are committed once per (shape, dtype, width,
corners) and kept (``plan``).

Corners (cells that are ghosts in two or more dimensions) come the standard way: dimensions are
exchanged one after another, and the faces of dimension ``d`` span the full extent, ghosts
included, of the dimensions before it, which carries the ghosts received there on to the
diagonal neighbours. Without corners every face spans only the own cells of the other dimensions,
and all dimensions go in one phase.

Messages of one call carry one tag (its call number). Two messages between the same pair of
ranks in one phase (a dimension of two ranks, or of one, periodic) are told apart by MPI's
non-overtaking order: each rank sends its low face, then its high face, and posts the receive
of its high ghosts before that of its low ghosts.
"""
from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

from .abort import collective_failed
from .backend import sync
from .pairing import LiveTags

KEEP = 64   # plans kept; the oldest one's datatypes are freed once no exchange in flight still posts with them


@dataclass(frozen=True)
class Face:
    """One side of one dimension: the own cells sent (``send_starts``) and the ghost cells received
    (``recv_starts``), both of shape ``subsizes``. ``side`` is -1 (the neighbour below) or +1 (above)."""

    dim: int
    side: int
    subsizes: tuple[int, ...]
    send_starts: tuple[int, ...]
    recv_starts: tuple[int, ...]

    def region(self, starts: tuple[int, ...]) -> tuple[slice, ...]:
        return tuple(slice(s, s + n) for s, n in zip(starts, self.subsizes))

    @property
    def cells(self) -> int:
        return math.prod(self.subsizes)


def phases(shape: tuple[int, ...], width: tuple[int, ...], corners: bool) -> tuple[tuple[Face, ...], ...]:
    """The faces exchanged, phase by phase: one phase per dimension with corners (a phase's faces read the
    ghosts the phases before it received), else one phase of every face. Dimensions of width 0 have none."""
    per_dim = []
    for d, w in enumerate(width):
        if w == 0:
            continue
        subsizes, base = [], []
        for e, (n, we) in enumerate(zip(shape, width)):
            if e == d:
                subsizes.append(w)
                base.append(0)
            elif corners and e < d:      # ghosts of the dimensions already exchanged ride along: the corners
                subsizes.append(n)
                base.append(0)
            else:                        # own cells only (ghosts not yet filled, or not asked for)
                subsizes.append(n - 2 * we)
                base.append(we)

        def at(start: int, d: int = d, base: list = base) -> tuple[int, ...]:
            return tuple(start if e == d else b for e, b in enumerate(base))
        low = Face(d, -1, tuple(subsizes), send_starts=at(w), recv_starts=at(0))
        high = Face(d, +1, tuple(subsizes), send_starts=at(shape[d] - 2 * w), recv_starts=at(shape[d] - w))
        per_dim.append((low, high))
    if corners:
        return tuple(per_dim)
    return (tuple(f for pair in per_dim for f in pair),) if per_dim else ()


def check(where: str, shape: tuple[int, ...], width, ndim: int) -> tuple[int, ...]:
    """``width`` (one int for every dimension, or one per dimension) checked against an array of ``shape`` on a
    grid of ``ndim`` dimensions: each face must lie in the block's own cells."""
    if len(shape) != ndim:
        raise ValueError(f"{where}: u has {len(shape)} dimension(s) {shape}, the grid {ndim}")
    widths = [int(width)] * ndim if _is_int(width) else \
        [int(w) for w in width] if isinstance(width, (tuple, list)) and all(map(_is_int, width)) else None
    if widths is None or len(widths) != ndim or any(w < 0 for w in widths):
        raise ValueError(f"{where}: width must be an int >= 0 or one per dimension ({ndim}), got {width!r}")
    for d, (n, w) in enumerate(zip(shape, widths)):
        if n - 2 * w < w:
            raise ValueError(f"{where}: width {w} in dimension {d} is wider than the local block: u has {n} cells "
                             f"there, {max(n - 2 * w, 0)} of its own after 2 x {w} ghost layers (at least {w} "
                             f"needed)")
    return tuple(widths)


def _is_int(w) -> bool:
    return isinstance(w, (int, np.integer)) and not isinstance(w, bool)


class Plan:
    """The faces of one (shape, dtype, width, corners) and their committed subarray datatypes, over the array's
    bytes (any dtype; the last dimension counted in bytes)."""

    def __init__(self, shape: tuple[int, ...], itemsize: int, width: tuple[int, ...], corners: bool):
        self.phases = phases(shape, width, corners)
        self.nbytes = math.prod(shape) * itemsize
        self.freed = self.evicted = False
        self.running = 0         # exchanges in flight whose later phases will post with these datatypes
        self._posts: dict = {}   # neighbours -> what each phase posts (``posts``)
        sizes = [*shape[:-1], shape[-1] * itemsize]
        self.types: dict[tuple[int, int, str], MPI.Datatype] = {}
        for phase in self.phases:
            for f in phase:
                for which, starts in (("send", f.send_starts), ("recv", f.recv_starts)):
                    t = MPI.BYTE.Create_subarray(sizes, [*f.subsizes[:-1], f.subsizes[-1] * itemsize],
                                                 [*starts[:-1], starts[-1] * itemsize])
                    self.types[(f.dim, f.side, which)] = t.Commit()

    def posts(self, neighbors) -> tuple:
        """Per phase ``(receives, sends, faces)`` for a rank with ``neighbors``: ``(datatype, peer)`` of each message
        in the order posted (receives of the high ghosts before the low: the non-overtaking order), and the faces
        that move (a neighbour on that side, cells to send); worked out once per neighbours, as the plan is kept."""
        key = neighbors if type(neighbors) is tuple else tuple(tuple(pair) for pair in neighbors)   # (ndim, 2)
        hit = self._posts.get(key)
        if hit is None:
            hit = self._posts[key] = tuple(self._phase_posts(phase, key) for phase in self.phases)
        return hit

    def _phase_posts(self, phase, neighbors) -> tuple:
        peer = lambda f: neighbors[f.dim][0 if f.side < 0 else 1]  # noqa: E731
        faces = [f for f in phase if f.cells and peer(f) is not None]
        landing = sorted(faces, key=lambda f: (f.dim, -f.side))
        recvs = tuple((self.types[(f.dim, f.side, "recv")], peer(f)) for f in landing)
        sends = tuple((self.types[(f.dim, f.side, "send")], peer(f)) for f in faces)
        return recvs, sends, tuple(faces)

    def release(self) -> None:
        """An exchange with this plan has ended: free the datatypes if the plan was evicted meanwhile."""
        self.running -= 1
        if self.evicted and not self.running:
            self.free()

    def free(self) -> None:
        for t in self.types.values():
            t.Free()
        self.types, self._posts, self.freed = {}, {}, True


_PLANS: OrderedDict = OrderedDict()


def plan(shape: tuple[int, ...], dtype, width: tuple[int, ...], corners: bool) -> Plan:
    """The Plan of this shape, dtype, width and corners: built once, then kept (the ``KEEP`` most recent)."""
    key = (shape, np.dtype(dtype).itemsize, width, corners)
    found = _PLANS.get(key)
    if found is not None:
        _PLANS.move_to_end(key)
        return found
    made = _PLANS[key] = Plan(shape, np.dtype(dtype).itemsize, width, corners)
    if len(_PLANS) > KEEP:
        oldest = _PLANS.popitem(last=False)[1]
        oldest.evicted = True
        if not oldest.running:   # else freed when its last exchange in flight ends (Plan.release)
            oldest.free()
    return made


class HaloRun:
    """One halo exchange in flight (the run of a Request): ``test()`` posts the next phase once one has landed,
    ``wait()`` runs them all. ``neighbors[d]`` is ``(low, high)``, None where a non-periodic edge has none.

    ``buf`` is what MPI reads and writes: the array itself, or its host copy when device arrays are staged
    (``land`` then copies each received ghost region back to the device array)."""

    def __init__(self, lib: MPI.Comm, the_plan: Plan, buf, neighbors, tag: int, watch, label: str, rank: int,
                 live: LiveTags, land=None):
        self.lib, self.plan, self.buf, self.neighbors, self.tag = lib, the_plan, buf, neighbors, tag
        self.watch, self.label, self.rank, self.live, self.land = watch, label, rank, live, land
        self.index = 0                   # the phase in flight
        self.posts = the_plan.posts(neighbors)
        self.live.add(tag)               # a peer's early message of this call is not a stray (engine/pairing.py)
        the_plan.running += 1            # its datatypes stay until the last phase is posted and landed
        self.requests = self._post()
        if not the_plan.phases:          # nothing to exchange (every width 0)
            the_plan.release()

    def _post(self) -> list:
        """This phase's receives (high ghosts before low: the non-overtaking order), then its sends."""
        if self.index >= len(self.posts):
            return []
        recvs, sends, _ = self.posts[self.index]
        buf, lib, tag = self.buf, self.lib, self.tag
        try:
            requests = [lib.Irecv([buf, 1, t], peer, tag) for t, peer in recvs]
            requests += [lib.Isend([buf, 1, t], peer, tag) for t, peer in sends]
        except MPI.Exception as e:
            collective_failed(self.label, self.rank, e)
        return requests

    def _pending(self, flags: list[bool]) -> list[tuple[str, int]]:
        """The ``(kind, peer)`` of the phase's requests flagged incomplete (the watchdog's report)."""
        recvs, sends, _ = self.posts[self.index]
        sides = [("recv", peer) for _, peer in recvs] + [("send", peer) for _, peer in sends]
        return [side for side, waiting in zip(sides, flags) if waiting]

    def _faces(self) -> tuple[Face, ...]:
        """The faces of the phase in flight that move: a neighbour on that side, and cells to send."""
        return self.posts[self.index][2]

    def test(self) -> bool:
        while self.index < len(self.plan.phases):
            try:
                if not MPI.Request.Testall(self.requests):
                    return False
            except MPI.Exception as e:
                collective_failed(self.label, self.rank, e)
            self._next()
        return True

    def wait(self) -> None:
        while self.index < len(self.plan.phases):
            if self.watch is not None:
                self.watch.wait(self.requests, self.index, self._pending)
            else:
                try:
                    MPI.Request.Waitall(self.requests)
                except MPI.Exception as e:
                    collective_failed(self.label, self.rank, e)
            self._next()

    def _next(self) -> None:
        """The phase in flight has landed: copy its ghosts back (staged), post the next, or end the call."""
        if self.land is not None:
            self.land(self._faces())
        self.index += 1
        self.requests = self._post()
        if self.index >= len(self.plan.phases):
            self.plan.release()
            self.live.discard(self.tag)
            if self.watch is not None:
                self.watch.end()


def start(lib: MPI.Comm, u, xp, staging: bool, the_plan: Plan, neighbors, tag: int, watch, label: str, rank: int,
          live: LiveTags) -> HaloRun:
    """Post the first phase of the exchange of ``u``'s ghosts (C-contiguous; checked by the caller)."""
    if not staging:
        sync(xp)    # queued kernels writing u's faces finish before MPI reads them
        return HaloRun(lib, the_plan, u, neighbors, tag, watch, label, rank, live)
    host = xp.asnumpy(u)    # (same shape) what MPI reads and writes; only received ghosts are copied back

    def land(faces) -> None:
        for f in faces:
            region = f.region(f.recv_starts)
            u[region] = xp.asarray(host[region])
    return HaloRun(lib, the_plan, host, neighbors, tag, watch, label, rank, live, land)

"""ProcessMesh: tensor, data and pipeline parallel groups over one communicator (Megatron's order).

A rank's coordinates are (tp_rank, dp_rank, pp_rank) with

    global rank = tp_rank + dp_rank * tp + pp_rank * tp * dp

so a tensor-parallel group is ``tp`` consecutive ranks (on one node when ``tp`` divides the ranks
per node), a data-parallel group strides by ``tp`` and a pipeline group by ``tp * dp``.
The groups are pycollect Communicators made by ``comm.split``; inside each group ranks are
ordered by their coordinate of that kind, so ``mesh.tp.rank == mesh.coords[0]``.
"""
from __future__ import annotations

import numbers
import warnings

from mpi4py import MPI

from ..comm import Communicator
from .agree import OwnChecks, agree_layout

__all__ = ["ProcessMesh", "KINDS", "mesh_coords", "mesh_rank", "mesh_groups"]

KINDS = ("tp", "dp", "pp")


# -- pure layout: coordinates and groups from (tp, dp, pp), no MPI -----------------------------------
def mesh_coords(rank: int, tp: int, dp: int, pp: int) -> tuple[int, int, int]:
    """(tp_rank, dp_rank, pp_rank) of global ``rank``."""
    return rank % tp, (rank // tp) % dp, rank // (tp * dp)


def mesh_rank(tp_rank: int, dp_rank: int, pp_rank: int, tp: int, dp: int, pp: int) -> int:
    """Global rank of coordinates (tp_rank, dp_rank, pp_rank)."""
    return tp_rank + dp_rank * tp + pp_rank * tp * dp


def mesh_groups(rank: int, tp: int, dp: int, pp: int) -> dict[str, list[int]]:
    """Global ranks of ``rank``'s tp, dp and pp groups, each ordered by the coordinate of its kind."""
    t, d, p = mesh_coords(rank, tp, dp, pp)
    return {"tp": [mesh_rank(i, d, p, tp, dp, pp) for i in range(tp)],
            "dp": [mesh_rank(t, i, p, tp, dp, pp) for i in range(dp)],
            "pp": [mesh_rank(t, d, i, tp, dp, pp) for i in range(pp)]}


def check_mesh(where: str, mesh) -> "ProcessMesh":
    """``mesh`` when it is a ProcessMesh, else TypeError naming ``where``: raised at once, on the ranks that passed
    it (there is no group to agree over)."""
    if not isinstance(mesh, ProcessMesh):
        raise TypeError(f"{where}: mesh must be a pycollect.parallel.ProcessMesh, got {type(mesh).__name__}")
    return mesh


def _check_size(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"ProcessMesh: {name} must be a positive integer, got {value!r}")
    return int(value)


class ProcessMesh:
    """Tensor (``tp``), data (``dp``) and pipeline (``pp``) parallel groups of ``comm``.

    ``comm`` is a pycollect Communicator whose size must be ``dp * pp * tp``. Building the mesh is
    collective over ``comm``. ``mesh.tp``, ``mesh.dp`` and ``mesh.pp`` are this rank's groups as
    pycollect Communicators (pass them explicitly as ``group=``); ``free()`` releases them.
    """

    def __init__(self, comm: Communicator, tp: int = 1, pp: int = 1, dp: int = 1):
        if not isinstance(comm, Communicator):
            raise TypeError(f"ProcessMesh: comm must be a pycollect Communicator, got {type(comm).__name__}")
        with OwnChecks((ValueError,)) as own:
            tp, pp, dp = _check_size("tp", tp), _check_size("pp", pp), _check_size("dp", dp)
            if tp * pp * dp != comm.size:
                raise ValueError(f"ProcessMesh: tp={tp} x dp={dp} x pp={pp} = {tp * dp * pp} ranks, "
                                 f"but the world size is {comm.size}")
        # ranks with other sizes would split into groups that match nobody's mesh: agreed (one allgather), a
        # rank's own refused sizes raised there after it, so that no rank waits for another
        agree_layout("ProcessMesh", "mesh sizes", f"tp {tp!r}, dp {dp!r}, pp {pp!r}", comm, own.failed)
        self.comm = comm
        self.rank, self.size = comm.rank, comm.size
        self.tp_size, self.dp_size, self.pp_size = tp, dp, pp
        self.coords: tuple[int, int, int] = mesh_coords(comm.rank, tp, dp, pp)   # (tp_rank, dp_rank, pp_rank)
        self.groups: dict[str, list[int]] = mesh_groups(comm.rank, tp, dp, pp)
        self.tp_rank, self.dp_rank, self.pp_rank = self.coords
        self._comms: dict[str, Communicator] = {}
        t, d, p = self.coords
        # color: the coordinates the group shares; key: the coordinate that orders it. comm.split hands each
        # group comm's settings and its topology restricted to the group (no second detection).
        split = {"tp": (d + p * dp, t), "dp": (t + p * tp, d), "pp": (t + d * tp, p)}
        for kind in KINDS:
            group = comm.split(*split[kind])
            assert group is not None  # split gives None only for color None; every rank passes a color here
            self._comms[kind] = group
        self.tp, self.dp, self.pp = self._comms["tp"], self._comms["dp"], self._comms["pp"]
        self._warn_tp_across_nodes()

    # -- layout -------------------------------------------------------------------------------------
    def rank_of(self, *, tp: int | None = None, dp: int | None = None, pp: int | None = None) -> int:
        """Global rank at the given coordinates; a coordinate left out is this rank's own."""
        t, d, p = self.coords
        t, d, p = (t if tp is None else tp), (d if dp is None else dp), (p if pp is None else pp)
        for name, value, size in (("tp", t, self.tp_size), ("dp", d, self.dp_size), ("pp", p, self.pp_size)):
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < size:
                raise ValueError(f"ProcessMesh.rank_of: {name}={value!r} is outside 0..{size - 1}")
        return mesh_rank(t, d, p, self.tp_size, self.dp_size, self.pp_size)

    def tp_groups_across_nodes(self) -> list[list[int]]:
        """Every tp group (global ranks) whose ranks are not all on one node of ``comm.topology``."""
        node_of = self.comm.topology.node_of
        out = []
        for p in range(self.pp_size):
            for d in range(self.dp_size):
                members = [mesh_rank(t, d, p, self.tp_size, self.dp_size, self.pp_size) for t in range(self.tp_size)]
                if len({node_of[r] for r in members}) > 1:
                    out.append(members)
        return out

    def _warn_tp_across_nodes(self) -> None:
        # Pure (the topology is known on every rank): no communication, one warning on rank 0.
        spanning = self.tp_groups_across_nodes()
        if spanning and self.rank == 0:
            topo = self.comm.topology
            warnings.warn(f"ProcessMesh: {len(spanning)} tensor-parallel group(s) of tp={self.tp_size} span more "
                          f"than one node (first: ranks {spanning[0]}; {topo.describe()}); tensor-parallel "
                          f"collectives will cross the inter-node network. Choose tp dividing the ranks per "
                          f"node and place ranks by block.", RuntimeWarning, stacklevel=3)

    def check_group(self, group, kind: str) -> None:
        """ValueError unless ``group`` is this mesh's group of ``kind`` ("tp", "dp" or "pp") on this rank."""
        if kind not in KINDS:
            raise ValueError(f"ProcessMesh.check_group: kind must be one of {KINDS}, got {kind!r}")
        mine = self._comms[kind]
        if group is mine:
            return
        if not isinstance(group, Communicator):
            raise ValueError(f"ProcessMesh.check_group: expected this mesh's {kind} group (a pycollect "
                             f"Communicator), got {type(group).__name__}")
        same = (group.size == mine.size and group.rank == mine.rank
                and MPI.Comm.Compare(group.mpi, mine.mpi) in (MPI.IDENT, MPI.CONGRUENT))
        if not same:
            raise ValueError(f"ProcessMesh.check_group: rank {self.rank}: group of size {group.size} (rank "
                             f"{group.rank} in it) is not this mesh's {kind} group of size {mine.size} "
                             f"(global ranks {self.groups[kind]})")

    def describe(self) -> str:
        t, d, p = self.coords
        return (f"ProcessMesh(tp={self.tp_size}, dp={self.dp_size}, pp={self.pp_size}) rank {self.rank}: "
                f"tp_rank={t} dp_rank={d} pp_rank={p}; tp group {self.groups['tp']}, "
                f"dp group {self.groups['dp']}, pp group {self.groups['pp']}")

    def __repr__(self) -> str:
        return f"ProcessMesh(tp={self.tp_size}, dp={self.dp_size}, pp={self.pp_size}, rank={self.rank})"

    def free(self) -> None:
        """Release the group Communicators (``comm`` stays the caller's; it would free them with itself too)."""
        for kind in KINDS:
            c = self._comms.pop(kind, None)
            if c is not None:
                c.free()

"""The registry of algorithms: ``{collective: {name: module}}``; each module has ``schedule(Problem)``.

``"mpi"`` (MPI's own collective) and ``"auto"`` are not schedules; the communicator
handles them. Modules are imported on first use. ``all_schedules`` and ``all_summaries`` build every
rank's schedule for one call (the simulator's input) or every rank's summary (what the traffic walker
and the cost model read).
"""
from __future__ import annotations

import importlib
from dataclasses import replace
from types import ModuleType
from typing import Callable

from ..engine.schedule import Problem, Schedule
from ..engine.summary import Summary, of_schedule

_MODULES: dict[str, dict[str, str]] = {
    "allreduce": {
        "ring": "allreduce_ring",
        "recursive_doubling": "allreduce_recursive_doubling",
        "rabenseifner": "allreduce_rabenseifner",
        "tree": "allreduce_tree",
        "hierarchical": "allreduce_hierarchical",
        "shm": "allreduce_shm",
    },
    "reduce_scatter": {
        "ring": "reduce_scatter_ring",
        "recursive_halving": "reduce_scatter_recursive_halving",
        "pairwise": "reduce_scatter_pairwise",
        "shm": "reduce_scatter_shm",
    },
    "allgather": {
        "ring": "allgather_ring",
        "recursive_doubling": "allgather_recursive_doubling",
        "bruck": "allgather_bruck",
        "shm": "allgather_shm",
    },
    "alltoall": {
        "pairwise": "alltoall_pairwise",
        "bruck": "alltoall_bruck",
        "shm": "alltoall_shm",
    },
    "broadcast": {
        "binomial": "broadcast_binomial",
        "scatter_allgather": "broadcast_scatter_allgather",
        "shm": "broadcast_shm",
    },
    "reduce": {
        "binomial": "reduce_binomial",
    },
    "gather": {
        "binomial": "gather_binomial",
        "linear": "gather_linear",
    },
    "scatter": {
        "binomial": "scatter_binomial",
        "linear": "scatter_linear",
    },
    "scan": {
        "recursive_doubling": "scan_recursive_doubling",
        "linear": "scan_linear",
    },
    "exscan": {
        "recursive_doubling": "exscan_recursive_doubling",
        "linear": "exscan_linear",
    },
}

COLLECTIVES = tuple(_MODULES)
# Names that run another collective's schedules: MPI_Reduce_scatter_block is a reduce-scatter of equal blocks.
ALIASES = {"reduce_scatter_block": "reduce_scatter"}
NAMES = COLLECTIVES + tuple(ALIASES)   # what pc.traffic and explain accept
SPECIAL = ("auto", "mpi")


def canonical(collective: str) -> str:
    """The collective whose schedules ``collective`` runs (itself, or what an alias stands for)."""
    return ALIASES.get(collective, collective)


def algorithms(collective: str) -> tuple[str, ...]:
    """Names accepted for ``collective``: ``"auto"``, ``"mpi"`` and every schedule."""
    mods = _MODULES.get(canonical(collective))
    if mods is None:
        raise ValueError(f"unknown collective {collective!r}; expected one of {', '.join(NAMES)}")
    return SPECIAL + tuple(mods)


def schedule_algorithms(collective: str) -> tuple[str, ...]:
    """Names of the schedules of ``collective`` (everything but ``auto`` and ``mpi``)."""
    return algorithms(collective)[len(SPECIAL):]


def get_schedule(collective: str, name: str) -> Callable[[Problem], Schedule]:
    """The schedule function of algorithm ``name``; a ValueError names the choices."""
    return get_module(collective, name).schedule


def get_module(collective: str, name: str) -> ModuleType:
    """The module of algorithm ``name`` (its ``schedule``, and its ``summaries`` where it counts without one)."""
    mods = _MODULES.get(canonical(collective))
    if mods is None:
        raise ValueError(f"unknown collective {collective!r}; expected one of {', '.join(NAMES)}")
    mod = mods.get(name)
    if mod is None:
        raise ValueError(f"{collective}: unknown algorithm {name!r}; expected one of {', '.join(algorithms(collective))}")
    return importlib.import_module(f"{__package__}.{mod}")



def all_schedules(collective: str, algorithm: str, problem: Problem) -> list[Schedule]:
    """``problem`` with its rank replaced by each rank in turn, scheduled by ``algorithm``."""
    fn = get_schedule(collective, algorithm)
    return [fn(replace(problem, rank=r)) for r in range(problem.size)]


def all_summaries(collective: str, algorithm: str, problem: Problem) -> list[Summary]:
    """Every rank's summary (engine/summary.py): the algorithm's own ``summaries`` form where it has one (and
    it answers for this problem), else every rank's schedule walked."""
    counted = counted_summaries(collective, algorithm, problem, in_step=False, counts_only=True)
    if counted is not None:
        return counted
    return [of_schedule(s) for s in all_schedules(collective, algorithm, problem)]


def counted_summaries(collective: str, algorithm: str, problem: Problem, in_step: bool = True,
                      counts_only: bool = False) -> list[Summary] | None:
    """Every rank's summary from the algorithm's ``summaries`` form, or None where it has none for this problem.

    ``in_step`` (what the cluster simulator's lockstep takes): only where the module's ``in_step(problem)`` says
    every rank's round t meets round t of its peers. The butterflies' fold and a tree's missing children put
    ranks out of that step (their counts and each rank's finishing round are still exact: ``in_step=False``).
    ``counts_only`` (with ``in_step=False``; what the traffic and the cost model read): also a module's ``counts``
    form, whose rounds are exact but whose finishing rounds need not be (``explain``'s critical path walks)."""
    module = get_module(collective, algorithm)
    form = getattr(module, "summaries", None)
    if counts_only and not in_step:
        form = getattr(module, "counts", form)
    if form is None or (in_step and not getattr(module, "in_step", lambda p: True)(problem)):
        return None
    return form(problem)

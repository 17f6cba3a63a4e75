"""Build the schedules of every rank for one call: the input of the simulator and the traffic walker."""
from __future__ import annotations

from dataclasses import replace

from ..algorithms import registry
from .schedule import Problem, Schedule


def all_schedules(collective: str, algorithm: str, problem: Problem) -> list[Schedule]:
    """``problem`` with its rank replaced by each rank in turn, scheduled by ``algorithm``."""
    fn = registry.get_schedule(collective, algorithm)
    return [fn(replace(problem, rank=r)) for r in range(problem.size)]

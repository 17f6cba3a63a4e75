"""Build the schedules of every rank for one call (the input of the simulator), or their summaries (what the
traffic walker and the cost model read)."""
from __future__ import annotations

from dataclasses import replace

from ..algorithms import registry
from .schedule import Problem, Schedule
from .summary import Summary, of_schedule


def all_schedules(collective: str, algorithm: str, problem: Problem) -> list[Schedule]:
    """``problem`` with its rank replaced by each rank in turn, scheduled by ``algorithm``."""
    fn = registry.get_schedule(collective, algorithm)
    return [fn(replace(problem, rank=r)) for r in range(problem.size)]


def all_summaries(collective: str, algorithm: str, problem: Problem) -> list[Summary]:
    """Every rank's summary (engine/summary.py): the algorithm's own ``summaries`` form where it has one (and
    it answers for this problem), else every rank's schedule walked."""
    counted = counted_summaries(collective, algorithm, problem)
    if counted is not None:
        return counted
    return [of_schedule(s) for s in all_schedules(collective, algorithm, problem)]


def counted_summaries(collective: str, algorithm: str, problem: Problem) -> list[Summary] | None:
    """Every rank's summary from the algorithm's ``summaries`` form, or None where it has none for this problem."""
    form = getattr(registry.get_module(collective, algorithm), "summaries", None)
    return form(problem) if form is not None else None

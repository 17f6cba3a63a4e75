"""Linear (pipelined) exclusive scan: scan_linear's pipeline, each rank keeping the prefix of the ranks below it as
received (rank 0 has none) and sending on that prefix reduced with its own block."""
from __future__ import annotations

from ..engine.schedule import Problem, Schedule
from .scan_linear import build, counted


def schedule(p: Problem) -> Schedule:
    return build(p, exclusive=True)


def summaries(p: Problem):
    return counted(p, exclusive=True)

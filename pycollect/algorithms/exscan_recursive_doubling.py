"""Recursive-doubling exclusive scan: scan_recursive_doubling's rounds after a first that hands each rank its lower
neighbour's input (rank 0 has no result)."""
from __future__ import annotations

from ..engine.schedule import Problem, Schedule
from .scan_recursive_doubling import build, counted


def schedule(p: Problem) -> Schedule:
    return build(p, exclusive=True)


def summaries(p: Problem):
    return counted(p, exclusive=True)

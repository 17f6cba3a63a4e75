"""The makespan of a pipeline schedule, walked as ``pipeline.simulate`` walks it but for the makespan alone (pure).

The planner walks a schedule for every candidate's chunk and message times, at up to hundreds of
stages and micro-batches; ``simulate`` keeps a timeline, mailboxes and action objects for every
step, which is what a reader of one walk wants and what a search of thousands cannot pay for.
Here each stage's computations become a list of (what it produces, what it waits for, cost) once
per (schedule, p, m, v), and a walk is a longest path over them: a computation starts when the
stage's previous one ends and its input is there, a message ``c`` after the neighbour produced it
(none where the neighbouring model chunk is on the same stage: p = 1, the bottom of zbv's V). That
is the simulator's rule for non-blocking sends and blocking receives; tests/test_plan.py holds the
two equal for every schedule on a grid of p, m, v and costs.
"""
from __future__ import annotations

from functools import lru_cache

from ..pipeline.actions import B, F, model_chunk, stage_of
from ..pipeline.schedules import compute_order, vshaped
from ..pipeline.simulate import split_pairs

__all__ = ["makespan"]

_F, _B, _W, _BSPLIT = 0, 1, 2, 3              # cost kinds: forward, whole backward, W, a B whose W runs apart


@lru_cache(maxsize=4)
def _program(schedule: str, p: int, m: int, v: int) -> tuple:
    """Per stage: ((key, needs, remote, kind), ...) in the stage's order. ``key`` names the result
    (op, micro, model chunk); ``needs`` the input from another computation or None; ``remote``
    whether that input is a message (a neighbour's) rather than this stage's own."""
    vshape, last = vshaped(schedule), p * v - 1
    stages = []
    for s in range(p):
        order = compute_order(schedule, p, m, v, s)
        split = split_pairs(order)
        rows = []
        for a in order:
            k = model_chunk(s, a.chunk, p, vshape)
            needs = None
            if a.op == F:
                kind, needs = _F, ((F, a.micro, k - 1) if k > 0 else None)
            elif a.op == B:
                kind = _BSPLIT if (a.micro, a.chunk) in split else _B
                needs = (B, a.micro, k + 1) if k < last else None
            else:
                kind = _W                              # its own B ran before it on this stage
            remote = needs is not None and stage_of(needs[2], p, vshape)[0] != s
            rows.append(((a.op, a.micro, k), needs, remote, kind))
        stages.append(tuple(rows))
    return tuple(stages)


def makespan(schedule: str, p: int, m: int, v: int, forward: float, backward: float, w: float,
             message: float) -> float:
    """When the last stage's last computation ends: F = ``forward``, B the whole ``backward`` (``backward
    - w`` where the list runs the pair's W apart, and W ``w``), each message ``message`` long."""
    cost = (forward, backward, w, backward - w)
    program = _program(schedule, p, m, v)
    done: dict = {}
    at, clock = [0] * p, [0.0] * p
    left = sum(len(rows) for rows in program)
    while left:
        before = left
        for s in range(p):                      # each stage runs until it waits on a neighbour
            rows, i, now = program[s], at[s], clock[s]
            while i < len(rows):
                key, needs, remote, kind = rows[i]
                if needs is not None:
                    ready = done.get(needs)
                    if ready is None:
                        break
                    ready += message if remote else 0.0
                    if ready > now:
                        now = ready
                now += cost[kind]
                done[key] = now
                i += 1
            left -= i - at[s]
            at[s], clock[s] = i, now
        if left == before:
            raise ValueError(f"{schedule}: p={p}, m={m}, v={v} does not finish (a stage waits forever)")
    return max(clock)

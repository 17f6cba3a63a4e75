"""Pipeline schedules as data (pure), their simulator and timeline plots; the executor is ``pycollect.parallel.Pipeline``.

    actions     the vocabulary: Action(op, micro, chunk, peer) and the model-chunk mapping
    schedules   gpipe, 1f1b, interleaved (and interleaved-mcore), zb-h1, zb-h2, zbv:
                (schedule, p, m, v, stage) -> the stage's actions
    simulate    every stage's list walked together: makespan, bubble, peak memory, deadlock
    plot        a simulated or measured timeline as a picture (matplotlib imported when drawing)
"""
from .actions import (B, COMM, COMPUTE, F, RECV_ACT, RECV_GRAD, SEND_ACT, SEND_GRAD, W, Action, model_chunk,
                      next_of, prev_of, stage_of)
from .schedules import (ALL_SCHEDULES, SCHEDULES, SIMULATOR_ONLY, ZERO_BUBBLE, all_actions, check_schedule_args,
                        compute_order, stage_actions, warmup_count)
from .simulate import SimResult, bubble_formula, simulate
from .plot import plot_timeline


__all__ = ["Action", "F", "B", "W", "SEND_ACT", "RECV_ACT", "SEND_GRAD", "RECV_GRAD", "COMPUTE", "COMM",
           "model_chunk", "stage_of", "next_of", "prev_of",
           "SCHEDULES", "ALL_SCHEDULES", "SIMULATOR_ONLY", "ZERO_BUBBLE", "stage_actions", "all_actions",
           "check_schedule_args", "compute_order", "warmup_count",
           "SimResult", "simulate", "bubble_formula", "plot_timeline"]

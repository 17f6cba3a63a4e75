"""Pipeline schedules as pure functions: (schedule, p, m, v, stage) -> the stage's actions in order.

    gpipe        all m forwards, then all m backwards (backwards in order 0 .. m-1)
    1f1b         p - stage - 1 warm-up forwards (at most m), then one forward one backward, then
                 the remaining backwards (PipeDream-Flush, Megatron-LM's non-interleaved schedule)
    interleaved  1F1B over v chunks per stage, in the order of Megatron's
                 forward_backward_pipelining_with_interleaving; v = 1 is plain 1f1b. Micro-batches go
                 in groups (Megatron-Core's get_schedule_table): groups of p when m is a multiple of p,
                 else the smallest group size g >= p whose last group is whole or at least p long, so
                 any m >= p runs. At m == p every forward runs first, as Megatron-LM did
    interleaved-mcore
                 the same, with Megatron-Core's warm-up at m == p too: (p - stage - 1) * 2 + (v - 1) * g
                 forwards, so later stages hold fewer activations (p = 4, m = 4, v = 2: peak chunk
                 activations [8, 8, 7, 5] against [8, 8, 8, 8]) at the same bubble when messages are
                 free; when a message takes longer than a computation it is slower (the simulator:
                 p = 4, v = 2, F = B = 1, comm = 3: makespan 68 against 64), never faster. That is why
                 ``interleaved`` keeps all forwards first at m == p and is the default; the planner
                 searches gpipe, 1f1b and interleaved.
    zb-h1        1f1b's order of F and B with each backward split (Qi et al., "Zero Bubble Pipeline
                 Parallelism", ICLR 2024): stage s runs W of micro-batch k right after B of k + s, so every
                 stage holds p micro-batches from F to W, as 1f1b's first stage does; the rest of the W
                 fill the cool-down. Idle per stage (p - 1)(T_F + T_B - T_W), 1f1b's (p - 1)(T_F + T_B + T_W)
    zb-h2        the same with 2(p - s - 1) warm-up forwards on stage s (at most m), filling the wait for
                 the first gradient, and W of k after B of k + 2s (for m < 2p - 1, which cuts the warm-up
                 short, k + s + max(0, s - (2p - 1 - m))): from m = 2p - 1 on each stage is busy without a
                 gap from its first F to its last W at T_F = T_B = T_W, holding 2p - 1 micro-batches
    zbv          two chunks per stage placed V-wise (stage s: model chunks s and 2p - 1 - s), the paper's
                 ZB-V: 2(p - s) - 1 forwards of chunk 0, s pairs (F chunk 1, F chunk 0), p - s rounds
                 of chunk 1's F, B, W; then rounds of (F, B, W of chunk 0; F, B, W of chunk 1) while
                 forwards remain; then s pairs of B (chunk 0, chunk 1), p - s of chunk 0's (B, W), and
                 the W still owed, chunk 1's first. At T_F = T_B = T_W per chunk each stage runs without
                 a gap for m >= 2p - 1, holding 2p chunks' activations: 1F1B's p micro-batches

Every F of (micro, chunk) is preceded by its RECV_ACT (unless it is model chunk 0) and followed by
its SEND_ACT (unless it is the last model chunk); every B by RECV_GRAD before (unless last model
chunk) and SEND_GRAD after (unless model chunk 0); a W has neither. Peers are the neighbours of
``actions.next_of`` / ``actions.prev_of``. With p = 1 there is no communication: with v > 1 the
chunks of the one stage pass activations and gradients to each other locally, as zbv's last stage
does between its two chunks, the bottom of the V.
"""
from __future__ import annotations

from .actions import B, F, RECV_ACT, RECV_GRAD, SEND_ACT, SEND_GRAD, W, Action, model_chunk, next_of, prev_of

__all__ = ["SCHEDULES", "ALL_SCHEDULES", "SIMULATOR_ONLY", "ZERO_BUBBLE", "interleaved", "vshaped", "default_chunks",
           "group_size",
           "check_schedule_args", "stage_actions", "all_actions", "compute_order", "warmup_count", "w_delay"]

SCHEDULES = ("gpipe", "1f1b", "interleaved")        # the planner's search
ZERO_BUBBLE = ("zb-h1", "zb-h2", "zbv")             # backward split in B and W
ALL_SCHEDULES = SCHEDULES + ("interleaved-mcore",) + ZERO_BUBBLE   # what the simulator takes
SIMULATOR_ONLY: tuple[str, ...] = ()               # schedules the executor refuses: none (B and W split)


def interleaved(schedule: str) -> bool:
    """Whether ``schedule`` takes virtual stages (v chunks per stage)."""
    return schedule.startswith("interleaved")


def vshaped(schedule: str) -> bool:
    """Whether ``schedule`` places its two chunks per stage V-wise (``actions.model_chunk``)."""
    return schedule == "zbv"


def group_size(p: int, m: int) -> int:
    """Micro-batches per group of the interleaved order: p when m is a multiple of p, else the smallest g >= p
    whose last group (m mod g) is empty or at least p long, as Megatron-Core requires of its
    ``microbatch_group_size_per_vp_stage`` (a shorter last group would leave a stage waiting on its own chunk)."""
    return next(g for g in range(p, m + 1) if m % g == 0 or m % g >= p)


def check_schedule_args(schedule: str, p: int, m: int, v: int = 1,
                        names: tuple[str, str, str] = ("p", "m", "v")) -> None:
    """ValueError naming the argument unless (schedule, p, m, v) is a schedule that exists.

    gpipe and 1f1b need v = 1. The interleaved schedules take v >= 1 (v = 1 is 1f1b) and, as
    Megatron-Core requires, at least p micro-batches when v >= 2 (they go in groups of at least p).
    zb-h1 and zb-h2 need v = 1, zbv v = 2, and, as the paper's, m >= p: with fewer micro-batches
    the W cannot fill the cool-down (the lists still run; the walk is slower than the paper's figures).
    ``names``: what the caller calls p, m and v, for the message (the executor's ``microbatches`` and
    ``virtual_stages``).
    """
    np_, nm, nv = names
    if schedule not in ALL_SCHEDULES:
        raise ValueError(f"schedule {schedule!r} is unknown; expected one of {', '.join(ALL_SCHEDULES)}")
    for name, value in zip(names, (p, m, v)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{schedule}: {name} must be a positive int, got {value!r}")
    if vshaped(schedule) and v != 2:
        raise ValueError(f"{schedule}: {nv} must be 2 (two chunks per stage placed V-wise), got {nv}={v}")
    if not interleaved(schedule) and not vshaped(schedule) and v != 1:
        raise ValueError(f"{schedule}: {nv} must be 1 (one chunk per stage), got {nv}={v}; "
                         "use the interleaved schedule for virtual stages")
    if schedule in ZERO_BUBBLE and m < p:
        raise ValueError(f"{schedule}: {nm}={m} micro-batches must be at least {np_}={p} stages "
                         "(the deferred W fill the cool-down of p - 1 steps)")
    if interleaved(schedule) and v > 1 and m < p:
        raise ValueError(f"{schedule}: {nm}={m} micro-batches must be at least {np_}={p} stages when {nv}={v} "
                         "(the interleaved order runs micro-batches in groups of at least p)")


def _check_stage(p: int, stage: int) -> None:
    if isinstance(stage, bool) or not isinstance(stage, int) or not 0 <= stage < p:
        raise ValueError(f"stage must be an int in 0..{p - 1} for p={p}, got {stage!r}")


# -- the order of the computations ----------------------------------------------------------------
def warmup_count(schedule: str, p: int, m: int, v: int, stage: int) -> int:
    """Forwards (of a chunk) a stage runs before its first backward, the one that starts the steady state.

    gpipe: all m. 1f1b and zb-h1: p - stage - 1, at most m. zb-h2: 2(p - stage - 1), at most m.
    interleaved (Megatron):
    (p - stage - 1) * 2 + (v - 1) * g (g: ``group_size``), at most m*v, and all m*v when m == p
    (interleaved-mcore: the formula there too).
    """
    if schedule == "gpipe":
        return m
    if schedule == "zb-h2":
        return min(2 * (p - stage - 1), m)
    if schedule == "zbv":
        return next(i for i, a in enumerate(_zbv_order(p, m, stage)) if a.op == B)
    if schedule in ("1f1b", "zb-h1") or v == 1:
        return min(p - stage - 1, m)
    if m == p and schedule == "interleaved":
        return m * v
    return min((p - stage - 1) * 2 + (v - 1) * group_size(p, m), m * v)


def _interleaved_table(p: int, m: int, v: int) -> list[tuple[int, int]]:
    """(micro, chunk) of a stage's forwards in order (Megatron-Core's schedule table): micro-batches in groups of
    g, each group through chunk 0, then the same micro-batches through chunk 1, ...; the last group runs to m.
    Backwards take the same table with the chunks reversed."""
    g, table = group_size(p, m), []
    for first in range(0, m, g):
        end = m if first + g >= m else first + g
        table += [(micro, chunk) for chunk in range(v) for micro in range(first, end)]
    return table


def compute_order(schedule: str, p: int, m: int, v: int, stage: int) -> list[Action]:
    """The F and B actions of ``stage`` in the order it runs them, without communication."""
    check_schedule_args(schedule, p, m, v)
    _check_stage(p, stage)
    if schedule == "gpipe":
        return [Action(F, i) for i in range(m)] + [Action(B, i) for i in range(m)]
    if schedule == "zbv":
        return _zbv_order(p, m, stage)
    if schedule in ZERO_BUBBLE:
        return _zero_bubble_order(m, warmup_count(schedule, p, m, v, stage), w_delay(schedule, p, m, stage))
    total = m * v
    if interleaved(schedule) and v > 1:
        table = _interleaved_table(p, m, v)
        fwd = [Action(F, micro, chunk) for micro, chunk in table]
        bwd = [Action(B, micro, v - 1 - chunk) for micro, chunk in table]
    else:
        fwd, bwd = [Action(F, i) for i in range(m)], [Action(B, i) for i in range(m)]
    warm = warmup_count(schedule, p, m, v, stage)
    order = fwd[:warm]
    for k in range(total - warm):                  # steady state: one forward, one backward
        order += [fwd[warm + k], bwd[k]]
    return order + bwd[total - warm:]              # cool-down


def w_delay(schedule: str, p: int, m: int, stage: int) -> int:
    """zb-h1 and zb-h2: how many backwards a stage runs before the W of its first; W of k follows B of k + delay.

    zb-h1: stage, so every stage holds p micro-batches from F to W (p - stage - 1 warm-up forwards,
    one more forward, then ``stage`` B whose W wait). zb-h2: 2 * stage, holding 2p - 1, and when
    m < 2p - 1 cuts the warm-up short, stage + max(0, stage - (2p - 1 - m)): the shorter warm-up
    leaves the last stages less slack, so they run their W sooner (the simulator: makespan
    3m + p - 1 at T_F = T_B = T_W for every m >= p, where 2 * stage would take longer)."""
    if schedule == "zb-h1":
        return stage
    return stage + max(0, stage - max(0, 2 * p - 1 - m))


def _zero_bubble_order(m: int, warm: int, delay: int) -> list[Action]:
    """1F1B's order after ``warm`` forwards (F of warm + k, then B of k), each B of k + delay followed by
    W of k; the W still owed run after the last B, in order."""
    order = [Action(F, i) for i in range(warm)]
    for k in range(m):
        if warm + k < m:
            order.append(Action(F, warm + k))
        order.append(Action(B, k))
        if k >= delay:
            order.append(Action(W, k - delay))
    return order + [Action(W, k) for k in range(max(0, m - delay), m)]


def _zbv_order(p: int, m: int, stage: int) -> list[Action]:
    """ZB-V's order on ``stage`` (the module docstring): chunk 0 is model chunk ``stage``, chunk 1 model
    chunk 2p - 1 - stage; ``stage`` 0 holds the first and the last, so its chunk 1 starts the backward."""
    order: list[Action] = []
    done = {(op, c): 0 for op in (F, B, W) for c in (0, 1)}

    def run(op: str, chunk: int, *more: str) -> None:
        for o in (op,) + more:
            order.append(Action(o, done[(o, chunk)], chunk))
            done[(o, chunk)] += 1

    def forward(chunk: int) -> None:
        # chunk 1 only behind chunk 0 (its input is chunk 0's output, a trip down the stages and back)
        if done[(F, chunk)] < (m if chunk == 0 else done[(F, 0)]):
            run(F, chunk)

    for _ in range(2 * (p - stage) - 1):     # down the V: deeper stages wait less for their first input
        forward(0)
    for _ in range(stage):                   # chunk 1's inputs come back up: one each, between chunk 0's
        forward(1)
        forward(0)
    for _ in range(p - stage):               # the first gradients are chunk 1's: B and W at once
        forward(1)
        run(B, 1, W)
    while done[(F, 1)] < m:                  # steady: both chunks one round each
        forward(0)
        run(B, 0, W)
        forward(1)
        run(B, 1, W)
    for _ in range(stage):                   # cool-down: input gradients first, their W later
        run(B, 0)
        run(B, 1)
    while done[(B, 0)] < m:
        run(B, 0, W)
    for chunk in (1, 0):
        while done[(W, chunk)] < m:
            run(W, chunk)
    return order


# -- with the communication around each computation -----------------------------------------------
def _with_comm(a: Action, p: int, v: int, stage: int, vshape: bool = False) -> list[Action]:
    """``a`` between the receive it waits for and the send it posts; none where the neighbouring model chunk
    is on this stage (p = 1, or the bottom of a V): the stage hands over to itself, no message."""
    k, last = model_chunk(stage, a.chunk, p, vshape), p * v - 1
    before, after = [], []
    prev = prev_of(stage, a.chunk, p, vshape)[0] if k > 0 else stage
    nxt = next_of(stage, a.chunk, p, vshape)[0] if k < last else stage
    if a.op == F:
        if prev != stage:
            before.append(Action(RECV_ACT, a.micro, a.chunk, prev))
        if nxt != stage:
            after.append(Action(SEND_ACT, a.micro, a.chunk, nxt))
    elif a.op == B:                                # a W sends nothing: no one waits for it
        if nxt != stage:
            before.append(Action(RECV_GRAD, a.micro, a.chunk, nxt))
        if prev != stage:
            after.append(Action(SEND_GRAD, a.micro, a.chunk, prev))
    return before + [a] + after


def stage_actions(schedule: str, p: int, m: int, v: int, stage: int) -> list[Action]:
    """Everything ``stage`` does, in order: each F and B with its receive before and its send after."""
    vshape = vshaped(schedule)
    return [x for a in compute_order(schedule, p, m, v, stage) for x in _with_comm(a, p, v, stage, vshape)]


def default_chunks(schedule: str) -> int:
    """The chunks per stage a schedule takes when none is given: zbv's two (placed V-wise), one for the others
    (the interleaved schedules take ``v`` explicitly)."""
    return 2 if vshaped(schedule) else 1


def all_actions(schedule: str, p: int, m: int, v: int | None = None) -> list[list[Action]]:
    """``all_actions(...)[s]``: the actions of stage s (``v`` None: ``default_chunks(schedule)``)."""
    v = default_chunks(schedule) if v is None else v
    check_schedule_args(schedule, p, m, v)
    return [stage_actions(schedule, p, m, v, s) for s in range(p)]

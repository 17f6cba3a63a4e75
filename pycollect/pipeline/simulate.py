"""Walk every stage's action list together, as the executor runs them, with unit or given costs.

The model is the executor's: F and B take their cost per chunk (default F = 1, B = 2, as given;
nothing is divided by v). ``costs["B"]`` is the whole backward; where a list splits a pair's
backward (it holds a W of that (micro, chunk), ``actions``), its B costs ``B - W`` and its W costs
``W`` (W defaults to half of B: the defaults F = 1, B = 2 give the paper's T_F = T_B = T_W = 1). A
W waits for its B on the same stage and sends nothing. A send is posted and the stage goes on at
once, its message there ``comm`` later; a receive blocks until the matching message, matched by
(kind, micro, chunk), has arrived. Where the neighbouring model chunk is on the same stage (p = 1,
the bottom of zbv's V) activations and gradients are handed over locally, at once.

From the walk: the makespan, the bubble (idle fraction of p * makespan), the span bubble (idle
fraction of each stage's own span, first computation to last), each stage's peak activation memory,
the timeline of the computations, and, when the lists cannot finish, the deadlock: the action each
stuck stage waits on.
"""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

from .actions import (B, COMM, RECV_ACT, RECV_GRAD, SEND_ACT, SEND_GRAD, F, W, Action, model_chunk, next_of,
                      prev_of)
from .schedules import ZERO_BUBBLE, all_actions, check_schedule_args, default_chunks, vshaped

__all__ = ["DEFAULT_COSTS", "SimResult", "simulate", "bubble_formula", "peak_memory", "split_pairs"]

DEFAULT_COSTS = {"F": 1.0, "B": 2.0, "W": 1.0, "comm": 0.0}
Timeline = list[list[tuple[float, float, Action]]]


@dataclass
class SimResult:
    """What the walk found; times in the units of the costs.

    ``peak_in_flight[s]``: the most micro-batches stage s holds activations of at once, a
    micro-batch counting while some chunk has run its forward and not yet its backward (for v = 1
    the usual in-flight count; for v > 1 a micro-batch held on two chunks counts once). A pair whose
    backward is split holds its activations until its W, which needs the layers' inputs (the paper
    counts them so: ZB-H1's peak is 1F1B's p, ZB-H2's 2p - 1).
    ``peak_chunk_activations[s]``: the same counting (micro, chunk) pairs, the stashed activations
    in units of one chunk's. Both are counted in the stage's program order, after each F.
    ``deadlock``: None, or stage -> the action it waits on forever (a receive whose message is
    never sent, or a computation whose input the stage never gets).
    ``unreceived``: (stage, send) for every message no receive takes.
    """

    p: int
    makespan: float
    busy: list[float]
    timeline: Timeline
    peak_in_flight: list[int]
    peak_chunk_activations: list[int]
    deadlock: dict[int, Action] | None = None
    unreceived: list[tuple[int, Action]] = field(default_factory=list)
    finish: list[float] = field(default_factory=list)

    @property
    def bubble(self) -> float:
        """1 - total busy time / (p * makespan)."""
        return 1.0 - sum(self.busy) / (self.p * self.makespan) if self.makespan > 0 else 0.0

    @property
    def span_bubble(self) -> float:
        """1 - total busy time / the sum of the stages' spans (each from its first computation to its last).

        The bubble when steps follow each other with no synchronising optimizer step in between (the
        paper's optimizer post-validation): a stage then starts the next step once its own last
        computation is done, and only the idle time inside its span is lost. Zero for ZB-H2 and ZB-V.
        """
        spans = [row[-1][1] - row[0][0] for row in self.timeline if row]
        return 1.0 - sum(self.busy) / sum(spans) if sum(spans) > 0 else 0.0

    @property
    def per_stage_bubble(self) -> list[float]:
        return [1.0 - b / self.makespan if self.makespan > 0 else 0.0 for b in self.busy]

    def summary(self) -> dict:
        """The figures as plain data (no timeline), for JSON."""
        return {"p": self.p, "makespan": self.makespan, "bubble": self.bubble, "span_bubble": self.span_bubble,
                "per_stage_bubble": self.per_stage_bubble, "busy": self.busy,
                "peak_in_flight": self.peak_in_flight, "peak_chunk_activations": self.peak_chunk_activations,
                "deadlock": None if self.deadlock is None else {s: str(a) for s, a in self.deadlock.items()},
                "unreceived": [[s, str(a)] for s, a in self.unreceived]}

    def describe_deadlock(self) -> str:
        if not self.deadlock:
            return "no deadlock"
        return "deadlock: " + "; ".join(f"stage {s} waits on {a}" for s, a in sorted(self.deadlock.items()))


def bubble_formula(schedule: str, p: int, m: int, v: int | None = None) -> float:
    """The literature's bubble fraction: (p-1)/(m+p-1) for gpipe and 1f1b, (p-1)/(m*v+p-1) interleaved.

    Bubble time (p-1)(F+B) per stage, over v for interleaving (Narayanan et al., SC'21, section
    2.2), as a fraction of the whole step, bubble included. ``simulate`` gives exactly this when
    messages are free (comm = 0), whatever F and B cost per chunk: for every p and m with gpipe
    and 1f1b, for every m >= p (which it must be when v >= 2) with the interleaved schedules; the
    makespan is then (m*v + p - 1)(F + B). With latency c > 0 (p > 1) the bubble is larger: gpipe's
    makespan grows by one micro-batch's 2(p-1) hops, 2(p-1)c, for any c; interleaved's by
    2(p*v-1)c when m == p or c <= min(F, B), by more otherwise (interleaved-mcore: by more at m == p
    too; when m is not a multiple of p the longer last group hides part of it: the growth may be
    less); 1f1b's by 2(p-1)c for m <= 2 and
    by more from m = 3 on (its steady state waits a round trip for each gradient).

    zb-h1 and zb-h2 at the paper's T_F = T_B = T_W (the default costs: F = 1, B = 2 split in halves):
    (p-1)/(3m+p-1), ZB-H1's idle (p-1)(T_F + T_B - T_W) per stage over a step of
    m(T_F + T_B + T_W) plus it, a third of 1f1b's (p-1)(T_F + T_B + T_W). The simulator gives ZB-H1's
    idle exactly whenever T_W <= min(T_F, T_B) and messages are free. ZB-H2 has the same makespan,
    3m + p - 1, which no schedule of one chunk per stage beats (the last stage starts after p - 1
    forwards and has 3m to do): its zero bubble is in each stage's own span (``span_bubble``, 0 for
    m >= 2p - 1), what a step without a synchronising optimizer step between steps gains.
    zbv, costs per chunk (a chunk half a stage's layers): (p-1)/(6m+p-1), a stage's 6m of work behind
    the first forward's p - 1 chunk-long hops, the walk's for m >= 2p - 2 (longer below: the warm-up
    is cut short); its span bubble is 0 for m >= 2p - 1.
    """
    v = default_chunks(schedule) if v is None else v    # as simulate: zbv's two chunks, one elsewhere
    check_schedule_args(schedule, p, m, v)
    if schedule == "zbv":
        return (p - 1) / (6 * m + p - 1)
    if schedule in ZERO_BUBBLE:
        return (p - 1) / (3 * m + p - 1)
    return (p - 1) / (m * v + p - 1)


def split_pairs(actions: list[Action]) -> set[tuple[int, int]]:
    """The (micro, chunk) pairs whose backward this stage's list splits: those it holds a W of."""
    return {(a.micro, a.chunk) for a in actions if a.op == W}


def peak_memory(actions: list[Action]) -> tuple[int, int]:
    """(peak micro-batches, peak (micro, chunk) pairs) holding activations, walking one stage's list.

    A pair holds them from its F to its B, or to its W when the list splits its backward."""
    split = split_pairs(actions)
    held: dict[int, int] = defaultdict(int)          # micro -> chunks it holds activations on
    pairs = peak_micro = peak_pairs = 0
    for a in actions:
        if a.op == F:
            held[a.micro] += 1
            pairs += 1
            peak_micro, peak_pairs = max(peak_micro, len(held)), max(peak_pairs, pairs)
        elif a.op == (W if (a.micro, a.chunk) in split else B) and held.get(a.micro):
            held[a.micro] -= 1
            pairs -= 1
            if not held[a.micro]:
                del held[a.micro]
    return peak_micro, peak_pairs


def _costs(costs: dict | None) -> dict:
    out = dict(DEFAULT_COSTS)
    out["W"] = (costs or {}).get("B", out["B"]) / 2   # unless given: B splits in halves, T_B = T_W
    for key, value in (costs or {}).items():
        if key not in DEFAULT_COSTS:
            raise ValueError(f"costs: unknown key {key!r}; expected F, B, W or comm")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
            raise ValueError(f"costs: {key} must be a finite non-negative number, got {value!r}")
        out[key] = float(value)
    if out["W"] > out["B"]:
        raise ValueError(f"costs: W={out['W']:g} must be at most B={out['B']:g} "
                         "(B is the whole backward, W the weight-gradient part a split schedule runs apart)")
    return out


def _destination(a: Action, stage: int, p: int, vshape: bool = False) -> tuple[int, int]:
    """(stage, chunk) a send of ``stage`` goes to: the next model chunk for activations, the previous for gradients."""
    return (next_of if a.op == SEND_ACT else prev_of)(stage, a.chunk, p, vshape)


def _source(a: Action, stage: int, p: int, vshape: bool = False) -> tuple[int, int]:
    """(stage, chunk) a receive of ``stage`` comes from."""
    return (prev_of if a.op == RECV_ACT else next_of)(stage, a.chunk, p, vshape)


def _check_lists(lists: list[list[Action]], p: int, v: int, vshape: bool) -> None:
    """ValueError for an action that cannot be: a chunk out of range, a peer that is not the neighbour."""
    for s, actions in enumerate(lists):
        for i, a in enumerate(actions):
            if a.op not in (F, B, W) + COMM:
                raise ValueError(f"stage {s} action {i}: unknown op {a.op!r}")
            if not 0 <= a.chunk < v:
                raise ValueError(f"stage {s} action {i} ({a}): chunk {a.chunk} out of range 0..{v - 1}")
            k = model_chunk(s, a.chunk, p, vshape)
            if a.op in COMM:
                if (k == 0 and a.op in (RECV_ACT, SEND_GRAD)) or (k == p * v - 1 and a.op in (SEND_ACT, RECV_GRAD)):
                    raise ValueError(f"stage {s} action {i} ({a}): model chunk {k} has no such neighbour")
                want = (_destination(a, s, p, vshape) if a.op.startswith("SEND") else _source(a, s, p, vshape))[0]
                if a.peer != want:
                    raise ValueError(f"stage {s} action {i} ({a}): peer {a.peer}, expected stage {want}")


def simulate(schedule_or_lists, p: int | None = None, m: int | None = None, v: int | None = None,
             costs: dict | None = None, vshape: bool = False) -> SimResult:
    """Walk a named schedule (with p, m, v) or explicit per-stage lists (p = len(lists); v from the chunks seen).

    ``vshape``: the lists' two chunks per stage are placed V-wise (``actions.model_chunk``); a named
    schedule brings its own placement (zbv's is V-wise).

    ``costs``: ``{"F": f, "B": b, "W": w, "comm": c}`` per chunk, defaults 1, 2, b / 2, 0 (B the whole
    backward, W <= B the part a W runs: a split B costs b - w).
    """
    c = _costs(costs)
    if isinstance(schedule_or_lists, str):
        if p is None or m is None:
            raise ValueError(f"simulate({schedule_or_lists!r}): p and m are needed with a schedule name")
        v = default_chunks(schedule_or_lists) if v is None else v
        lists = all_actions(schedule_or_lists, p, m, v)
        vshape = vshaped(schedule_or_lists)
    else:
        lists = [[Action(*a) for a in stage] for stage in schedule_or_lists]
        if p is not None and p != len(lists):
            raise ValueError(f"simulate: p={p} but {len(lists)} lists of actions were given")
        p = len(lists)
        if p < 1:
            raise ValueError("simulate: no stages")
        v = v if v is not None else 1 + max((a.chunk for stage in lists for a in stage), default=0)
    if vshape and v != 2:
        raise ValueError(f"simulate: vshape places two chunks per stage, got v={v}")
    _check_lists(lists, p, v, vshape)
    _check_total(lists, c)
    return _Walk(lists, p, v, c, vshape).run()


def _check_total(lists: list[list[Action]], c: dict) -> None:
    """ValueError where the run's time could overflow a float: the walk would answer inf and nan. Bounded by all
    the work done one action after another (some stage always runs), each action at the largest cost of its kind."""
    computes = sum(a.op in (F, B, W) for stage in lists for a in stage)
    comms = sum(len(stage) for stage in lists) - computes
    if not math.isfinite(computes * max(c["F"], c["B"], c["W"]) + comms * c["comm"]):
        raise ValueError(f"costs: {computes} computations at up to {max(c['F'], c['B'], c['W']):g} and {comms} "
                         f"transfers at {c['comm']:g} could take longer than a float holds; scale the costs down")


class _Walk:
    """Every stage's list walked together: a stage runs its next action until it must wait."""

    def __init__(self, lists: list[list[Action]], p: int, v: int, c: dict, vshape: bool):
        self.lists, self.p, self.v, self.c, self.last, self.vshape = lists, p, v, c, p * v - 1, vshape
        self.at, self.clock, self.busy = [0] * p, [0.0] * p, [0.0] * p
        self.timeline: Timeline = [[] for _ in range(p)]
        self.mailbox: dict = defaultdict(list)   # (kind, dst stage, micro, dst chunk) -> [(arrival, src, send)]
        self.have: list[dict] = [dict() for _ in range(p)]  # ("act"|"grad"|"fwd"|"bwd", micro, chunk) -> time
        self.split = [split_pairs(stage) for stage in lists]

    def step(self, s: int) -> bool:
        """Run stage s's next action if it can; False when it must wait."""
        a = self.lists[s][self.at[s]]
        if a.op in (SEND_ACT, SEND_GRAD):
            dst, dchunk = _destination(a, s, self.p, self.vshape)
            self.mailbox[(a.op[5:], dst, a.micro, dchunk)].append((self.clock[s] + self.c["comm"], s, a))
        elif a.op in (RECV_ACT, RECV_GRAD):
            box = self.mailbox.get((a.op[5:], s, a.micro, a.chunk))
            if not box:
                return False
            self.clock[s] = max(self.clock[s], box.pop(0)[0])
            self.have[s][(a.op[5:].lower(), a.micro, a.chunk)] = self.clock[s]
        elif not self.compute(s, a):
            return False
        self.at[s] += 1
        return True

    def _needs(self, s: int, a: Action) -> list[tuple[str, int, int]]:
        """What a computation consumes: its input activation (F), its forward and gradient (B), its B (W)."""
        k = model_chunk(s, a.chunk, self.p, self.vshape)
        if a.op == F:
            return [("act", a.micro, a.chunk)] if k > 0 else []
        if a.op == W:
            return [("bwd", a.micro, a.chunk)]
        return [("fwd", a.micro, a.chunk)] + ([("grad", a.micro, a.chunk)] if k < self.last else [])

    def compute(self, s: int, a: Action) -> bool:
        needs = self._needs(s, a)
        have = self.have[s]
        if any(n not in have for n in needs):
            return False                         # only its own later actions could give it: never
        for n in needs:
            del have[n]                          # consumed: a second F, B or W of the pair waits forever
        cost = self.c[a.op]
        if a.op == B and (a.micro, a.chunk) in self.split[s]:
            cost -= self.c["W"]                  # the input gradient alone; its W runs the rest
        start = self.clock[s]
        self.clock[s] = end = start + cost
        self.busy[s] += cost
        self.timeline[s].append((start, end, a))
        k = model_chunk(s, a.chunk, self.p, self.vshape)
        if a.op == F:
            have[("fwd", a.micro, a.chunk)] = end
            to = next_of(s, a.chunk, self.p, self.vshape) if k < self.last else None
            if to and to[0] == s:                # the next model chunk is on this stage: no message
                have[("act", a.micro, to[1])] = end
        elif a.op == B:
            have[("bwd", a.micro, a.chunk)] = end
            to = prev_of(s, a.chunk, self.p, self.vshape) if k > 0 else None
            if to and to[0] == s:
                have[("grad", a.micro, to[1])] = end
        return True

    def run(self) -> SimResult:
        moved = True
        while moved:
            moved = False
            for s in range(self.p):
                while self.at[s] < len(self.lists[s]) and self.step(s):
                    moved = True
        lists, p = self.lists, self.p
        stuck = {s: lists[s][self.at[s]] for s in range(p) if self.at[s] < len(lists[s])}
        unreceived = sorted((src, send) for box in self.mailbox.values() for _, src, send in box)
        peaks = [peak_memory(stage) for stage in lists]
        return SimResult(p=p, makespan=max(self.clock), busy=self.busy, timeline=self.timeline,
                         peak_in_flight=[a for a, _ in peaks], peak_chunk_activations=[b for _, b in peaks],
                         deadlock=stuck or None, unreceived=unreceived, finish=list(self.clock))

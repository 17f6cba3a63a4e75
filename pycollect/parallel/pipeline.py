"""Pipeline parallelism: run a schedule's action lists (``pycollect.pipeline``) with real chunks.

Each rank of ``group`` (``mesh.pp``) is one stage and holds ``v`` chunks (``chunks[c]`` is local
chunk c, model chunk ``c * p + stage``). A chunk is any object with

    forward(x, micro) -> y       x None on model chunk 0 (it takes micro-batch ``micro`` of its own
                                 data); y the loss (a 0-d array) on the last model chunk
    backward(dy, micro) -> dx    dy None on the last model chunk (it seeds with its own loss scale);
                                 dx None on model chunk 0
    input_spec() / output_spec() (shape, dtype name) of the activation it receives / sends, or None
                                 for model chunk 0 / the last model chunk

Activations and gradients travel with pycollect's point-to-point calls on ``group``: a 10-integer
header (ndim, shape, dtype) then the payload, tagged by (kind, micro-batch, receiving model chunk),
so messages match whatever order they arrive in. Sends are non-blocking, receives block; the
schedules are deadlock-free under exactly that rule (``pipeline.simulate`` checks them).

Shapes are agreed before any point-to-point message: the constructor allgathers every chunk's
input and output spec over the group and raises on every rank, naming both stages, when what a
chunk sends is not what the next one expects. At run time each header is checked again against the
receiver's spec (a mismatch raises on the receiver, naming both stages; the message is drained
first so the sender is not left waiting).

Each layer keeps one ``cache`` (what its backward needs); with several micro-batches in flight
the executor stashes a chunk's caches after each forward and restores them before the matching
backward (``nn._base.stash_caches``); ``peak_in_flight`` and ``peak_activation_bytes`` say how many
(micro-batch, chunk) pairs were held at most, and their bytes. ``run()`` returns the losses of the micro-batches (on the
stage holding the last model chunk) and records when each F and B ran (``timeline``), so a run
reports its measured bubble beside the simulator's.
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np

from ..engine.backend import array_module
from ..nn._base import layers_in, restore_caches, stash_caches
from ..pipeline.actions import B, F, RECV_ACT, RECV_GRAD, SEND_ACT, SEND_GRAD, model_chunk, next_of, prev_of
from ..pipeline.schedules import ALL_SCHEDULES, SIMULATOR_ONLY, check_schedule_args, stage_actions

__all__ = ["Pipeline", "DTYPES"]

DTYPES = ("float64", "float32", "float16", "bfloat16")  # header codes
HEADER = 10  # ndim, up to 8 dims, dtype code
_KINDS = {"act": 0, "grad": 1}
RUNNABLE = tuple(s for s in ALL_SCHEDULES if s not in SIMULATOR_ONLY)


def _dtype_name(dtype) -> str:
    return np.dtype(dtype).name


def _header(x) -> np.ndarray:
    if x.ndim > 8 or _dtype_name(x.dtype) not in DTYPES:
        raise ValueError(f"Pipeline: cannot send an array of {x.ndim} dims and dtype {x.dtype} "
                         f"(at most 8 dims, dtype one of {DTYPES})")
    h = np.zeros(HEADER, np.int64)
    h[0] = x.ndim
    h[1:1 + x.ndim] = x.shape
    h[9] = DTYPES.index(_dtype_name(x.dtype))
    return h


def _spec_of(header: np.ndarray) -> tuple[tuple, str]:
    n = int(header[0])
    code = int(header[9])
    return tuple(int(d) for d in header[1:1 + n]), DTYPES[code] if 0 <= code < len(DTYPES) else f"code {code}"


def _encode(spec) -> np.ndarray:
    """(HEADER + 1,) int64: a presence flag then the header of ``spec``."""
    out = np.zeros(HEADER + 1, np.int64)
    if spec is not None:
        shape, dtype = spec
        out[0], out[1] = 1, len(shape)
        out[2:2 + len(shape)] = shape
        out[HEADER] = DTYPES.index(dtype) if dtype in DTYPES else -1
    return out


def _decode(row):
    return None if row[0] == 0 else _spec_of(row[1:])


def _spec(value):
    """(shape tuple, dtype name) or None, from what a chunk reports."""
    if value is None:
        return None
    shape, dtype = value
    return tuple(int(d) for d in shape), _dtype_name(dtype)


class Pipeline:
    """Runs ``schedule`` over ``group`` with this stage's ``chunks``; see the module docstring."""

    def __init__(self, chunks, group, schedule: str = "1f1b", microbatches: int = 1, virtual_stages: int = 1,
                 xp=None):
        """``xp``: the array module messages are received into; None takes the chunks' parameters'
        (``chunk.params``, NumPy when a chunk has none)."""
        check_schedule_args(schedule, group.size, microbatches, virtual_stages)
        if schedule in SIMULATOR_ONLY:   # no layer splits its backward in B and W yet: refuse, not half-run
            raise ValueError(f"Pipeline: schedule {schedule!r} runs in the simulator only for now "
                             f"(pycollect.pipeline.simulate); the executor runs {', '.join(RUNNABLE)}")
        if not isinstance(chunks, (list, tuple)) or len(chunks) != virtual_stages:
            raise ValueError(f"Pipeline: chunks must be a list of virtual_stages = {virtual_stages} chunks "
                             f"(this stage's, in order), got {type(chunks).__name__} of "
                             f"{len(chunks) if isinstance(chunks, (list, tuple)) else '?'}")
        self.chunks, self.group = list(chunks), group
        self.xp = xp if xp is not None else _module_of(self.chunks)
        self.p, self.stage = group.size, group.rank
        self.m, self.v, self.schedule = microbatches, virtual_stages, schedule
        self.actions = stage_actions(schedule, self.p, self.m, self.v, self.stage)
        self._layers = [layers_in(c) for c in self.chunks]
        self.timeline: list = []
        self._agree_specs()

    # -- shapes, agreed once before any message ------------------------------------------------------
    def _agree_specs(self) -> None:
        mine = np.stack([np.concatenate([_encode(_spec(c.input_spec())), _encode(_spec(c.output_spec()))])
                         for c in self.chunks])  # (v, 2 * (HEADER + 1))
        table = self.group.allgather(mine, counts=[self.v] * self.p) if self.p > 1 else mine  # (p*v, ...)
        every = [[[_decode(table[s * self.v + c][:HEADER + 1]), _decode(table[s * self.v + c][HEADER + 1:])]
                  for c in range(self.v)] for s in range(self.p)]  # every stage's [in, out] per chunk
        problems = []
        for s in range(self.p):
            for c in range(self.v):
                k = model_chunk(s, c, self.p)
                if k == self.p * self.v - 1:
                    continue
                ns, nc = next_of(s, c, self.p)
                sent, expected = every[s][c][1], every[ns][nc][0]
                if sent is None or expected is None or list(sent[0]) != list(expected[0]) or sent[1] != expected[1]:
                    problems.append(f"stage {s} chunk {c} sends {self._fmt(sent)} but stage {ns} chunk {nc} "
                                    f"expects {self._fmt(expected)}")
        if problems:
            raise ValueError("Pipeline: activations do not fit between stages: " + "; ".join(problems))

    @staticmethod
    def _fmt(spec) -> str:
        return "nothing" if spec is None else f"{spec[1]}{tuple(spec[0])}"

    # -- messages --------------------------------------------------------------------------------------
    def _tag(self, kind: str, micro: int, receiver_chunk: int) -> int:
        return (micro * self.p * self.v + receiver_chunk) * 2 + _KINDS[kind]

    def _send(self, kind: str, x, micro: int, to_stage: int, to_chunk: int) -> list:
        tag = self._tag(kind, micro, model_chunk(to_stage, to_chunk, self.p))
        header = _header(x)
        return [self.group.isend(header, to_stage, tag), self.group.isend(x, to_stage, tag), header, x]

    def _recv(self, kind: str, micro: int, chunk: int, from_stage: int):
        tag = self._tag(kind, micro, model_chunk(self.stage, chunk, self.p))
        header = self.group.recv(np.empty(HEADER, np.int64), from_stage, tag)
        shape, dtype = _spec_of(header)
        expected = _spec(self.chunks[chunk].input_spec() if kind == "act" else self.chunks[chunk].output_spec())
        xp = self.xp
        if dtype not in DTYPES:
            raise ValueError(f"Pipeline: stage {self.stage} received a header with unknown dtype {dtype} "
                             f"from stage {from_stage}")
        out = xp.empty(shape, dtype=_np_dtype(dtype))
        self.group.recv(out, from_stage, tag)  # drained even when it does not fit: the sender is not left waiting
        if expected is not None and (shape, dtype) != expected:
            what = "activation" if kind == "act" else "gradient"
            raise ValueError(f"Pipeline: stage {self.stage} chunk {chunk} expected the {what} of micro-batch "
                             f"{micro} as {self._fmt(expected)} but stage {from_stage} sent {dtype}{shape}")
        return out

    # -- one step ----------------------------------------------------------------------------------------
    def run(self) -> list:
        """Every action of this stage, in order; returns the m losses on the last model chunk's stage
        (floats; [] elsewhere). ``timeline``: (start, end, action) of each F and B, seconds from the start."""
        p, last = self.p, self.p * self.v - 1    # last: the last model chunk
        # by (micro, chunk): outputs to send, gradients to send, stashed caches, arrived inputs and gradients
        acts: dict[tuple[int, int], Any] = {}
        grads: dict[tuple[int, int], Any] = {}
        stash: dict[tuple[int, int], list] = {}
        inbox_act: dict[tuple[int, int], Any] = {}
        inbox_grad: dict[tuple[int, int], Any] = {}
        pending: list[list] = []   # sends in flight (``_send``'s requests)
        losses: dict[int, float] = {}
        self.timeline = []
        self.peak_in_flight = self.peak_activation_bytes = held = 0  # (micro, chunk) pairs stashed; their bytes
        t_start = time.perf_counter()
        for a in self.actions:
            chunk = self.chunks[a.chunk]
            k = model_chunk(self.stage, a.chunk, p)
            if a.op == F:
                t0 = time.perf_counter()
                x = None if k == 0 else inbox_act.pop((a.micro, a.chunk))
                y = chunk.forward(x, a.micro)
                stash[(a.micro, a.chunk)] = saved = stash_caches(self._layers[a.chunk])
                held += _nbytes(saved)
                self.peak_in_flight = max(self.peak_in_flight, len(stash))
                self.peak_activation_bytes = max(self.peak_activation_bytes, held)
                if k == last:
                    losses[a.micro] = float(y)
                elif p == 1:  # the next chunk is on this stage: no message (the schedule lists none)
                    inbox_act[(a.micro, a.chunk + 1)] = y
                else:
                    acts[(a.micro, a.chunk)] = y
                self.timeline.append((t0 - t_start, time.perf_counter() - t_start, a))
            elif a.op == B:
                t0 = time.perf_counter()
                saved = stash.pop((a.micro, a.chunk))
                held -= _nbytes(saved)
                restore_caches(self._layers[a.chunk], saved)
                dy = None if k == last else inbox_grad.pop((a.micro, a.chunk))
                dx = chunk.backward(dy, a.micro)
                if k != 0 and p == 1:
                    inbox_grad[(a.micro, a.chunk - 1)] = dx
                elif k != 0:
                    grads[(a.micro, a.chunk)] = dx
                self.timeline.append((t0 - t_start, time.perf_counter() - t_start, a))
            elif a.op == SEND_ACT:
                ns, nc = next_of(self.stage, a.chunk, p)
                pending.append(self._send("act", acts.pop((a.micro, a.chunk)), a.micro, ns, nc))
            elif a.op == SEND_GRAD:
                ps, pc = prev_of(self.stage, a.chunk, p)
                pending.append(self._send("grad", grads.pop((a.micro, a.chunk)), a.micro, ps, pc))
            elif a.op == RECV_ACT:
                inbox_act[(a.micro, a.chunk)] = self._recv("act", a.micro, a.chunk, a.peer)
            elif a.op == RECV_GRAD:
                inbox_grad[(a.micro, a.chunk)] = self._recv("grad", a.micro, a.chunk, a.peer)
            else:
                raise ValueError(f"Pipeline: unknown action {a!r}")
            pending = [s for s in pending if not (s[0].test() and s[1].test())]  # advance the sends
        _wait_sends(pending)
        return [losses[i] for i in sorted(losses)]

    def measured_bubble(self, makespan: float | None = None) -> float:
        """1 - (time in F and B) / ``makespan`` on this stage; ``makespan`` defaults to this stage's own
        span (its start to its last compute). Pass the largest span over the stages (started together)
        for the simulator's per-stage definition."""
        if not self.timeline:
            return 0.0
        busy = sum(end - start for start, end, _ in self.timeline)
        span = self.timeline[-1][1] if makespan is None else makespan
        return 1.0 - busy / span if span > 0 else 0.0


def _module_of(chunks):
    """The array module of the first parameter any chunk holds; NumPy when none holds one."""
    for chunk in chunks:
        for value in (getattr(chunk, "params", None) or {}).values():
            return array_module(value)
    return np


def _nbytes(obj) -> int:
    """Bytes of the arrays in a (nested) cache; a float or None counts nothing."""
    if isinstance(obj, (list, tuple)):
        return sum(_nbytes(o) for o in obj)
    if isinstance(obj, dict):
        return sum(_nbytes(o) for o in obj.values())
    return int(getattr(obj, "nbytes", 0)) if hasattr(obj, "shape") else 0


def _np_dtype(name: str):
    if name == "bfloat16":
        import ml_dtypes
        return ml_dtypes.bfloat16
    return np.dtype(name)


def _wait_sends(pending: list[list]) -> None:
    """Finish the sends still in flight at the end of a step (each ``_send``'s two requests)."""
    for s in pending:
        s[0].wait()
        s[1].wait()

"""Pipeline parallelism: run a schedule's action lists (``pycollect.pipeline``) with real chunks.

Each rank of ``group`` (``mesh.pp``) is one stage and holds ``v`` chunks (``chunks[c]`` is local
chunk c, model chunk ``c * p + stage``; under ``zbv``, placed V-wise, model chunks ``stage`` and
``2p - 1 - stage``). A chunk is any object with

    forward(x, micro) -> y       x None on model chunk 0 (it takes micro-batch ``micro`` of its own
                                 data); y the loss (a 0-d array) on the last model chunk
    backward(dy, micro) -> dx    dy None on the last model chunk (it seeds with its own loss scale);
                                 dx None on model chunk 0
    input_spec() / output_spec() (shape, dtype name) of the activation it receives / sends, or None
                                 for model chunk 0 / the last model chunk

and, for the zero-bubble schedules (``zb-h1``, ``zb-h2``, ``zbv``: lists with W), the backward in two:

    backward_input(dy, micro) -> dx   B: what the previous chunk waits for (sent at once); the layers
                                      keep what W reads
    backward_weight(micro)            W: the weight gradients, no communication, later in the list

Where the neighbouring model chunk sits on the same stage (p = 1, or the bottom of zbv's V) the
activation or gradient is handed over in memory, no message.

Activations and gradients travel with pycollect's point-to-point calls on ``group``: a 12-integer
header (ndim, shape, dtype, the pipeline's id and the run's number) then the payload, tagged by (kind,
micro-batch, receiving model chunk), so messages match whatever order they arrive in. A run that raised
can leave messages unreceived; the next run (of this pipeline or another built on the group) drops those
of earlier runs by the header's id and number, and a stage that finds its neighbour already in the next
run (whose message of this run never came) keeps that message for the next run and raises. Sends are
non-blocking, receives block; the schedules are deadlock-free under exactly that rule
(``pipeline.simulate`` checks them).

Shapes are agreed before any point-to-point message: the constructor allgathers every chunk's
input and output spec over the group and raises on every rank, naming both stages, when what a
chunk sends is not what the next one expects. At run time the sender checks what its chunk made
against the chunk's own spec (a mismatch raises there, naming the chunk, after a header that tells the
receiver the send is refused, so that it raises too instead of waiting), and each header is checked
again against the receiver's spec (a mismatch raises on the receiver, naming both stages; the message is
drained first so the sender is not left waiting).

Each layer keeps one ``cache`` (what its backward needs); with several micro-batches in flight
the executor stashes a chunk's caches after each forward and restores them before the matching
backward (``nn._base.stash_caches``), and for a split backward stashes again what B kept for W until
the W (only that: B drops the rest of the forward's cache); ``peak_in_flight`` and
``peak_activation_bytes`` say how many (micro-batch, chunk) pairs were held at most, from F to their
last backward step, and their bytes. ``run()`` returns the losses of the micro-batches (on the stage
holding the last model chunk) and records when each F, B and W ran (``timeline``), so a run reports
its measured bubble beside the simulator's.

The data-parallel gradient reduction is not this executor's: a model starts it as each layer
group's last W (or whole backward) of the step is done, and finishes it after ``run()``; the
optimizer step after it keeps its synchronisation (the global-norm clipping, the overflow check),
which the paper's post-validation bypasses.
"""
from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

from ..comm import Communicator
from ..engine.backend import array_module
from ..nn._base import layers_in, restore_caches, stash_caches
from ..pipeline.actions import B, F, RECV_ACT, RECV_GRAD, SEND_ACT, SEND_GRAD, W, model_chunk, next_of, prev_of
from ..pipeline.schedules import ALL_SCHEDULES, SIMULATOR_ONLY, check_schedule_args, stage_actions, vshaped
from .agree import OwnChecks, agree_layout, check_group

__all__ = ["Pipeline", "DTYPES"]

DTYPES = ("float64", "float32", "float16", "bfloat16")  # header codes
HEADER = 10  # ndim, up to 8 dims, dtype code
MESSAGE = HEADER + 2  # a message's header: HEADER, then the pipeline's id and the run's number
_KINDS = {"act": 0, "grad": 1}
RUNNABLE = tuple(s for s in ALL_SCHEDULES if s not in SIMULATOR_ONLY)
ARG_NAMES = ("group.size", "microbatches", "virtual_stages")  # p, m, v in check_schedule_args' errors


def _dtype_name(dtype) -> str:
    return np.dtype(dtype).name


def _header(x, run: tuple[int, int]) -> np.ndarray:
    """(MESSAGE,) int64: ndim, shape, dtype code, then ``run`` (the pipeline's id, the run's number)."""
    if x.ndim > 8 or _dtype_name(x.dtype) not in DTYPES:
        raise ValueError(f"Pipeline: cannot send an array of {x.ndim} dims and dtype {x.dtype} "
                         f"(at most 8 dims, dtype one of {DTYPES})")
    h = np.zeros(MESSAGE, np.int64)
    h[HEADER:] = run
    h[0] = x.ndim
    h[1:1 + x.ndim] = x.shape
    h[9] = DTYPES.index(_dtype_name(x.dtype))
    return h


_REFUSED = -2   # a header's dtype code where the sender's chunk made what its spec does not describe


def _spec_of_array(x):
    """(shape, dtype name) of what a chunk returned, or None where it is no array."""
    shape, dtype = getattr(x, "shape", None), getattr(x, "dtype", None)
    return None if shape is None or dtype is None else (tuple(int(d) for d in shape), _dtype_name(dtype))


def _fmt_made(x, made) -> str:
    return f"{type(x).__name__} {x!r:.40}" if made is None else f"{made[1]}{made[0]}"


def _spec_of(header: np.ndarray) -> tuple[tuple, str]:
    n = int(header[0])
    code = int(header[9])
    return tuple(int(d) for d in header[1:1 + n]), DTYPES[code] if 0 <= code < len(DTYPES) else f"code {code}"


_ABSENT, _SENDABLE, _UNSENDABLE = 0, 1, 2   # the presence flag of an encoded spec
_REFUSED = 3                                 # a stage whose chunks' specs could not be read


def _encode(spec) -> np.ndarray:
    """(HEADER + 1,) int64: a presence flag then the header of ``spec``; a spec no header can carry (more than
    8 dims, a dtype not in DTYPES: model chunk 0's integer ids, or a chunk's mistake) is flagged, its ndim kept."""
    out = np.zeros(HEADER + 1, np.int64)
    if spec is not None:
        shape, dtype = spec
        sendable = len(shape) <= 8 and dtype in DTYPES
        out[0], out[1] = (_SENDABLE if sendable else _UNSENDABLE), len(shape)
        if sendable:
            out[2:2 + len(shape)] = shape
        out[HEADER] = DTYPES.index(dtype) if dtype in DTYPES else -1
    return out


def _decode(row):
    """None, (shape, dtype name), or for a flagged spec (None, "N dims of dtype ...")."""
    if row[0] == _ABSENT:
        return None
    if row[0] == _UNSENDABLE:
        code = int(row[HEADER])
        dtype = DTYPES[code] if 0 <= code < len(DTYPES) else "a dtype not in DTYPES"
        return None, f"{int(row[1])} dims of {dtype}"
    return _spec_of(row[1:])


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
        # this stage's own checks; then agreed, so that a stage refusing alone stops every stage
        with OwnChecks((ValueError, TypeError, AttributeError)) as own:
            self._check_and_plan(chunks, group, schedule, microbatches, virtual_stages, xp)
        if not isinstance(group, Communicator) and own.failed is not None \
                and not isinstance(own.failed, AttributeError):
            raise own.failed   # no group to agree over: its own error first
        check_group("Pipeline", group)
        # every stage must run the same lists: schedule, micro-batches and chunks per stage agreed (one allgather)
        agree_layout("Pipeline", "schedule, microbatches or virtual_stages",
                     f"schedule {schedule!r}, microbatches {microbatches!r}, virtual_stages {virtual_stages!r}", group,
                     own.failed)
        self._layers = [layers_in(c) for c in self.chunks]
        self.timeline: list = []
        self._id = self._agree_specs()
        self._runs = 0   # run() calls begun; with _id, in every header this pipeline sends
        self._early: dict[tuple[int, int], tuple] = {}   # (run, tag) -> (header, payload) of a neighbour ahead

    def _check_and_plan(self, chunks, group, schedule, microbatches, virtual_stages, xp) -> None:
        """The arguments checked on this stage (no communication) and its action list."""
        check_schedule_args(schedule, group.size, microbatches, virtual_stages, ARG_NAMES)
        if schedule in SIMULATOR_ONLY:   # refuse, not half-run
            raise ValueError(f"Pipeline: schedule {schedule!r} runs in the simulator only for now "
                             f"(pycollect.pipeline.simulate); the executor runs {', '.join(RUNNABLE)}")
        if not isinstance(chunks, (list, tuple)) or len(chunks) != virtual_stages:
            raise ValueError(f"Pipeline: chunks must be a list of virtual_stages = {virtual_stages} chunks "
                             f"(this stage's, in order), got {type(chunks).__name__} of "
                             f"{len(chunks) if isinstance(chunks, (list, tuple)) else '?'}")
        self.chunks, self.group = list(chunks), group
        if xp is not None and getattr(xp, "__name__", None) not in ("numpy", "cupy"):
            raise TypeError(f"Pipeline: xp must be the numpy or cupy module (or None: the chunks' own), got {xp!r}")
        self.xp = xp if xp is not None else _module_of(self.chunks)
        self.p, self.stage = group.size, group.rank
        self.m, self.v, self.schedule = microbatches, virtual_stages, schedule
        self.vshape = vshaped(schedule)
        self.actions = stage_actions(schedule, self.p, self.m, self.v, self.stage)
        self._split = {(a.micro, a.chunk) for a in self.actions if a.op == W}  # pairs whose backward splits
        if self._split:
            _check_split(self.chunks, schedule)
        top = self._tag("grad", self.m - 1, self.p * self.v - 1)   # the largest tag a run sends
        if top > getattr(group, "tag_ub", top):   # a group without one: check_group refuses it next
            raise ValueError(f"Pipeline: microbatches = {self.m} on {self.p} stage(s) of {self.v} chunk(s) each need "
                             f"message tags up to {top} (two per micro-batch and chunk), past this MPI's TAG_UB "
                             f"{group.tag_ub}: run at most {(group.tag_ub + 1) // (2 * self.p * self.v)} micro-batches "
                             f"a run")

    # -- shapes, agreed once before any message ------------------------------------------------------
    def _agree_specs(self) -> int:
        """Raise on every stage unless what each chunk sends is what the next expects; return the pipeline's id
        (stage 0's random number, in the same allgather)."""
        ident = int.from_bytes(os.urandom(7), "little")
        failed = None
        try:
            mine = np.stack([np.concatenate([_encode(_spec(c.input_spec())), _encode(_spec(c.output_spec())), [ident]])
                             for c in self.chunks])  # (v, 2 * (HEADER + 1) + 1)
        except Exception as e:  # noqa: BLE001 (a chunk's own: raised after the allgather, the other stages told)
            failed = e
            mine = np.full((self.v, 2 * (HEADER + 1) + 1), _REFUSED, np.int64)
        table = self.group.allgather(mine, counts=[self.v] * self.p) if self.p > 1 else mine  # (p*v, ...)
        if failed is not None:
            raise TypeError(f"Pipeline: a chunk's input_spec() or output_spec() could not be read on stage "
                            f"{self.group.rank}: {type(failed).__name__}: {failed}") from failed
        refused = sorted({i // self.v for i in range(len(table)) if table[i][0] == _REFUSED})
        if refused:
            raise ValueError(f"Pipeline: stage(s) {refused} could not read their chunks' specs (their errors say why); "
                             f"refused here too (stage {self.group.rank})")
        every = [[[_decode(table[s * self.v + c][:HEADER + 1]), _decode(table[s * self.v + c][HEADER + 1:-1])]
                  for c in range(self.v)] for s in range(self.p)]  # every stage's [in, out] per chunk
        problems = []
        for s in range(self.p):
            for c in range(self.v):
                k = model_chunk(s, c, self.p, self.vshape)
                if k == self.p * self.v - 1:
                    continue
                ns, nc = next_of(s, c, self.p, self.vshape)
                sent, expected = every[s][c][1], every[ns][nc][0]
                unsendable = [sp for sp in (sent, expected) if sp is not None and sp[0] is None]
                if unsendable and ns == s:      # handed over in memory, no header: anything the chunks agree on
                    continue
                if unsendable:
                    problems.append(f"stage {s} chunk {c} to stage {ns} chunk {nc}: an activation of "
                                    f"{unsendable[0][1]} (at most 8 dims, dtype one of {DTYPES})")
                elif sent is None or expected is None or list(sent[0]) != list(expected[0]) or sent[1] != expected[1]:
                    problems.append(f"stage {s} chunk {c} sends {self._fmt(sent)} but stage {ns} chunk {nc} "
                                    f"expects {self._fmt(expected)}")
        if problems:
            raise ValueError("Pipeline: activations do not fit between stages: " + "; ".join(problems))
        return int(table[0][-1])

    @staticmethod
    def _fmt(spec) -> str:
        return "nothing" if spec is None else f"{spec[1]}{tuple(spec[0])}"

    # -- messages --------------------------------------------------------------------------------------
    def _tag(self, kind: str, micro: int, receiver_chunk: int) -> int:
        return (micro * self.p * self.v + receiver_chunk) * 2 + _KINDS[kind]

    def _send(self, kind: str, x, micro: int, chunk: int, to_stage: int, to_chunk: int) -> list:
        """Local ``chunk``'s activation (its forward's output) or gradient (its backward's, of its input) to the
        neighbour. What a chunk returns must be what its spec, agreed at construction, says: otherwise the header
        says the send is refused (the receiver raises on it instead of waiting) and this stage raises."""
        tag = self._tag(kind, micro, model_chunk(to_stage, to_chunk, self.p, self.vshape))
        spec = self.chunks[chunk].output_spec() if kind == "act" else self.chunks[chunk].input_spec()
        expected, made = _spec(spec), _spec_of_array(x)
        if made != expected:
            refused = np.zeros(MESSAGE, np.int64)
            refused[9], refused[HEADER:] = _REFUSED, (self._id, self._runs)
            self.group.send(refused, to_stage, tag)   # 80 bytes: MPI's eager path, it returns at once
            what, said = ("activation", "output_spec") if kind == "act" else ("gradient", "input_spec")
            raise ValueError(f"Pipeline: stage {self.stage} chunk {chunk} made the {what} of micro-batch {micro} "
                             f"as {_fmt_made(x, made)}, but its {said}() says {self._fmt(expected)}")
        header = _header(x, (self._id, self._runs))
        return [self.group.isend(header, to_stage, tag), self.group.isend(x, to_stage, tag), header, x]

    def _this_run(self, kind: str, micro: int, from_stage: int, tag: int):
        """(header, payload or None) of this run's message ``tag`` from ``from_stage``: one kept from the run
        before, or received, dropping those of earlier runs (left by a run that raised)."""
        if (self._runs, tag) in self._early:
            return self._early.pop((self._runs, tag))
        while True:
            header = self.group.recv(np.empty(MESSAGE, np.int64), from_stage, tag)
            payload = None
            if header[9] != _REFUSED:
                shape, dtype = _spec_of(header)
                if dtype not in DTYPES:
                    raise ValueError(f"Pipeline: stage {self.stage} received a header with unknown dtype {dtype} "
                                     f"from stage {from_stage}")
                payload = self.xp.empty(shape, dtype=_np_dtype(dtype))
                self.group.recv(payload, from_stage, tag)  # received whatever follows: no sender left waiting
            ident, run = int(header[HEADER]), int(header[HEADER + 1])
            if ident == self._id and run == self._runs:
                return header, payload
            if ident == self._id and run > self._runs:
                self._early[(run, tag)] = (header, payload)
                what = "activation" if kind == "act" else "gradient"
                raise ValueError(f"Pipeline: stage {self.stage}: stage {from_stage} sent the {what} of micro-batch "
                                 f"{micro} of its next run before this run's (an error ended its run); this run "
                                 f"ends here too, the message is kept for the next")
            # a message of an earlier run, or of a pipeline built on this group before: dropped

    def _recv(self, kind: str, micro: int, chunk: int, from_stage: int):
        tag = self._tag(kind, micro, model_chunk(self.stage, chunk, self.p, self.vshape))
        header, out = self._this_run(kind, micro, from_stage, tag)
        shape, dtype = _spec_of(header)
        what = "activation" if kind == "act" else "gradient"
        if header[9] == _REFUSED:
            raise ValueError(f"Pipeline: stage {self.stage} chunk {chunk}: stage {from_stage} refused to send the "
                             f"{what} of micro-batch {micro}: its chunk made one its spec does not describe (that "
                             f"stage's error says how)")
        expected = _spec(self.chunks[chunk].input_spec() if kind == "act" else self.chunks[chunk].output_spec())
        if expected is not None and (shape, dtype) != expected:
            raise ValueError(f"Pipeline: stage {self.stage} chunk {chunk} expected the {what} of micro-batch "
                             f"{micro} as {self._fmt(expected)} but stage {from_stage} sent {dtype}{shape}")
        return out

    # -- one step ----------------------------------------------------------------------------------------
    def run(self) -> list:
        """Every action of this stage, in order; returns the m losses on the last model chunk's stage
        (floats; [] elsewhere). ``timeline``: (start, end, action) of each F, B and W, seconds from the start."""
        self._runs += 1
        self._acts: dict[tuple[int, int], Any] = {}    # outputs to send, by (micro, chunk)
        self._grads: dict[tuple[int, int], Any] = {}   # input gradients to send
        self._stash: dict[tuple[int, int], list] = {}  # caches from F to B, and from a split B to its W
        self._inbox_act: dict[tuple[int, int], Any] = {}
        self._inbox_grad: dict[tuple[int, int], Any] = {}
        self._losses: dict[int, float] = {}
        self._held = 0
        pending: list[list] = []   # sends in flight (``_send``'s requests)
        self.timeline = []
        self.peak_in_flight = self.peak_activation_bytes = 0  # (micro, chunk) pairs stashed; their bytes
        t_start = time.perf_counter()
        for a in self.actions:
            if a.op in (F, B, W):
                t0 = time.perf_counter()
                (self._forward if a.op == F else self._backward if a.op == B else self._weight)(a)
                self.timeline.append((t0 - t_start, time.perf_counter() - t_start, a))
            elif a.op == SEND_ACT:
                ns, nc = next_of(self.stage, a.chunk, self.p, self.vshape)
                pending.append(self._send("act", self._acts.pop((a.micro, a.chunk)), a.micro, a.chunk, ns, nc))
            elif a.op == SEND_GRAD:
                ps, pc = prev_of(self.stage, a.chunk, self.p, self.vshape)
                pending.append(self._send("grad", self._grads.pop((a.micro, a.chunk)), a.micro, a.chunk, ps, pc))
            elif a.op == RECV_ACT:
                self._inbox_act[(a.micro, a.chunk)] = self._recv("act", a.micro, a.chunk, a.peer)
            elif a.op == RECV_GRAD:
                self._inbox_grad[(a.micro, a.chunk)] = self._recv("grad", a.micro, a.chunk, a.peer)
            else:
                raise ValueError(f"Pipeline: unknown action {a!r}")
            pending = [s for s in pending if not (s[0].test() and s[1].test())]  # advance the sends
        _wait_sends(pending)
        return [self._losses[i] for i in sorted(self._losses)]

    def _keep(self, key: tuple[int, int], chunk: int) -> None:
        """Stash the caches of local ``chunk``'s layers under ``key`` (micro, chunk); count the peaks."""
        self._stash[key] = saved = stash_caches(self._layers[chunk])
        self._held += _nbytes(saved)
        self.peak_in_flight = max(self.peak_in_flight, len(self._stash))
        self.peak_activation_bytes = max(self.peak_activation_bytes, self._held)

    def _unkeep(self, key: tuple[int, int], chunk: int) -> None:
        saved = self._stash.pop(key)
        self._held -= _nbytes(saved)
        restore_caches(self._layers[chunk], saved)

    def _forward(self, a) -> None:
        k, key = model_chunk(self.stage, a.chunk, self.p, self.vshape), (a.micro, a.chunk)
        x = None if k == 0 else self._inbox_act.pop(key)
        y = self.chunks[a.chunk].forward(x, a.micro)
        self._keep(key, a.chunk)
        if k == self.p * self.v - 1:
            self._losses[a.micro] = float(y)
        else:
            ns, nc = next_of(self.stage, a.chunk, self.p, self.vshape)
            if ns == self.stage:  # the next chunk is on this stage: no message (the schedule lists none)
                self._inbox_act[(a.micro, nc)] = y
            else:
                self._acts[key] = y

    def _backward(self, a) -> None:
        """B: the whole backward, or with a W of the pair in the list its input gradient alone, the
        layers' caches (what W reads) stashed again until the W."""
        k, key = model_chunk(self.stage, a.chunk, self.p, self.vshape), (a.micro, a.chunk)
        self._unkeep(key, a.chunk)
        dy = None if k == self.p * self.v - 1 else self._inbox_grad.pop(key)
        chunk = self.chunks[a.chunk]
        if key in self._split:
            dx = chunk.backward_input(dy, a.micro)
            self._keep(key, a.chunk)
        else:
            dx = chunk.backward(dy, a.micro)
        if k == 0:
            return
        ps, pc = prev_of(self.stage, a.chunk, self.p, self.vshape)
        if ps == self.stage:  # the previous chunk is on this stage: handed over in memory
            self._inbox_grad[(a.micro, pc)] = dx
        else:
            self._grads[key] = dx

    def _weight(self, a) -> None:
        """W: the weight gradients of (micro, chunk) from what its B kept, then nothing is held for it."""
        self._unkeep((a.micro, a.chunk), a.chunk)
        self.chunks[a.chunk].backward_weight(a.micro)
        stash_caches(self._layers[a.chunk])  # every cache cleared: W took what B kept

    def measured_bubble(self, makespan: float | None = None) -> float:
        """1 - (time in F, B and W) / ``makespan`` on this stage; ``makespan`` defaults to this stage's own
        span (its start to its last compute). Pass the largest span over the stages (started together)
        for the simulator's per-stage definition."""
        if not self.timeline:
            return 0.0
        busy = sum(end - start for start, end, _ in self.timeline)
        span = self.timeline[-1][1] if makespan is None else makespan
        return 1.0 - busy / span if span > 0 else 0.0


def _check_split(chunks, schedule: str) -> None:
    """TypeError unless every chunk splits its backward (``backward_input`` and ``backward_weight``)."""
    for c, chunk in enumerate(chunks):
        missing = [m for m in ("backward_input", "backward_weight") if not callable(getattr(chunk, m, None))]
        if missing:
            raise TypeError(f"Pipeline: schedule {schedule!r} splits each backward in B and W, but chunks[{c}] "
                            f"({type(chunk).__name__}) has no {' and no '.join(missing)}")


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

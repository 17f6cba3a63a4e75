"""ZeRO: AdamW with its state sharded over a data-parallel group (Rajbhandari et al., 2020).

The parameters are flattened into one buffer (``FlatLayout``), padded so that every one of the N
ranks owns an equal shard. Per rank, persistently (c bytes per compute element, 4 per float32)::

    stage 0   full parameters, full gradient buffer, full master weights and moments (plain data
              parallelism with a replicated optimizer: the baseline, (2 + 2 + 12) P in mixed precision)
    stage 1   full parameters and gradient buffer; master weights and moments of its shard (4P + 12P/N)
    stage 2   full parameters; gradient, master weights and moments of its shard (2P + 14P/N)
    stage 3   parameters too: only its shard of everything (16P/N); ``gathered(names)`` allgathers
              parameters just in time (``prefetch`` starts the next one while the current one computes)

A step: local gradients are reduced in buckets of contiguous ranges of the flat buffer, walked
from its end (the order backward produces them); stages 1 to 3 reduce-scatter each bucket with
counts that send every element to the rank owning it (uneven counts at shard borders), stage 0
allreduces. ``grad_ready(name, grad)`` starts a bucket (non-blocking) as soon as its gradients are all
in, so the reduction overlaps the rest of backward; ``step(grads)`` does the same for any not yet
handed in, waits, and updates. The update is ``torch.optim.AdamW``'s, in its order, on the master
shard (so float64 runs equal ``pycollect.optim.AdamW`` bit for bit when the reductions agree).
Stages 0 to 2 then allgather the updated parameters into the caller's arrays; stage 3 keeps its shard.

Traffic per rank per step, in elements (a ring's counts): stages 1 and 2 a reduce-scatter and an
allgather of P, about 2P, like an allreduce; stage 3 the reduce-scatter and an allgather of P for
forward and another for backward, about 3P. (The issue's text says stage 1 allreduces the
gradients; an allreduce costs 2P, plus the allgather 3P, so stage 1 here reduce-scatters, as ZeRO's
P_os does, and differs from stage 2 in keeping the full gradient buffer and reducing it at step time.)

Mixed precision: float16 or bfloat16 parameters and gradients, float32 master weights and moments.
Gradients are reduced in the compute dtype, or with ``accumulate="float32"`` in float32 (twice the
bytes on the wire; each sum rounded once to the compute dtype, not at every partial sum: Megatron's
``grad_reduce_in_fp32``). With ``loss_scale="dynamic"`` (float16) the caller
multiplies its loss by ``opt.loss_scale``; a step whose gradient shard holds an inf or nan on any
rank is skipped and the scale halved; after ``growth_interval`` good steps it doubles. Every step
ends the reductions with a vote (one 2-element int64 allreduce over the group, whatever the stage):
a rank some gradient never reached refuses the step and every rank raises, nothing updated; the
overflow flag rides in the same call. ``max_grad_norm`` clips by the global 2-norm computed from the shards (one allreduce).

Under model parallelism (tensor, pipeline) each rank's ``params`` are its part of a bigger model:
pass the group of ranks holding the other parts as ``model_parallel`` (the tensor-parallel group, or
tensor x pipeline), and as ``norm_skip`` the names this rank leaves out of the norm because another
rank of that group holds the same values and counts them (a LayerNorm on tensor-parallel ranks other
than 0, a tied embedding's second copy). The step's vote and the norm then span that group too
(one more small allreduce each), so every part of the model steps, refuses, skips, clips and scales alike.

``owned_params`` / ``owned_grads``: parameters this rank alone holds (a mixture of experts' own
experts), kept whole beside the shards and stepped with them (``zero/owned.py``); the memory
formulas add (c + c + 4 + 8) bytes per owned element.
"""
from __future__ import annotations

import math
from contextlib import contextmanager

import numpy as np

from ..comm import Communicator
from ..engine import args
from ..engine.request import Request
from ..nn._base import check_array, check_bool
from ..optim import parameter_names
from ..parallel.agree import OwnChecks, agree_layout, check_group
from .layout import FlatLayout
from .owned import Owned, flat_adamw_update

__all__ = ["ZeroAdamW", "STAGES", "expected_memory", "check_stage", "check_hyperparameters"]

STAGES = (0, 1, 2, 3)
_LOW = ("float16", "bfloat16")


def _number(where, name, value, low=0.0, allow_low=True):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value < low or (value == low and not allow_low):
        raise ValueError(f"{where}: {name} must be a finite number {'>=' if allow_low else '>'} {low}, got {value!r}")
    return float(value)


def check_stage(where: str, stage) -> int:
    """``stage`` as an int: one of STAGES (an integer, not a bool or a float); ValueError naming it otherwise."""
    if isinstance(stage, (bool, np.bool_)) or not isinstance(stage, (int, np.integer)) or stage not in STAGES:
        raise ValueError(f"{where}: stage must be one of {STAGES}, got {stage!r}")
    return int(stage)


def check_hyperparameters(where: str, lr, betas, eps, weight_decay, max_grad_norm, growth_interval) -> dict:
    """AdamW's settings as ZeroAdamW keeps them (floats, a pair of floats, an int), each checked:
    ValueError naming the first out of range (``where: lr must be ..., got ...``)."""
    if not (isinstance(betas, (tuple, list)) and len(betas) == 2
            and all(isinstance(b, (int, float)) and not isinstance(b, bool) and 0 <= b < 1 for b in betas)):
        raise ValueError(f"{where}: betas must be two numbers in [0, 1), got {betas!r}")
    if isinstance(growth_interval, bool) or not isinstance(growth_interval, (int, np.integer)) \
            or growth_interval < 1:
        raise ValueError(f"{where}: growth_interval must be a positive integer, got {growth_interval!r}")
    return {"lr": _number(where, "lr", lr), "betas": (float(betas[0]), float(betas[1])),
            "eps": _number(where, "eps", eps, allow_low=False),
            "weight_decay": _number(where, "weight_decay", weight_decay),
            "max_grad_norm": None if max_grad_norm is None else _number(where, "max_grad_norm", max_grad_norm,
                                                                         allow_low=False),
            "growth_interval": int(growth_interval)}


def expected_memory(layout: FlatLayout, stage: int, dtype, owned: int = 0) -> dict:
    """Bytes per rank of a ZeroAdamW over ``layout`` (its world and shards) at ``stage`` with parameters of
    ``dtype``: c bytes per compute element, 4 per state element in mixed precision (else c), ``owned`` elements
    whole on this rank. ``ZeroAdamW.expected_memory`` is this for its own layout (no group needed here)."""
    dtype = np.dtype(dtype)
    c = dtype.itemsize
    f = np.dtype(np.float32).itemsize if dtype.name in _LOW else c
    P, S, Pp = layout.numel, layout.shard, layout.padded
    n_state = Pp if stage == 0 else S
    return {"parameters": c * ((S if stage == 3 else P) + owned),
            "gradients": c * ((Pp if stage <= 1 else S) + owned),
            "master_weights": f * (n_state + owned), "moments": 2 * f * (n_state + owned)}


class ZeroAdamW:
    """See the module docstring. ``params``: dict name -> array, full values, the same on every rank."""

    def __init__(self, params: dict, group, stage: int = 1, lr: float = 1e-3, betas=(0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2, no_decay=(), loss_scale=None,
                 max_grad_norm: float | None = None, bucket_bytes: int = 4 << 20, growth_interval: int = 2000,
                 model_parallel=None, norm_skip=(), owned_params: dict | None = None, owned_grads: dict | None = None,
                 accumulate: str | None = None):
        where = "ZeroAdamW"
        check_group(where, group)
        layout = ""
        with OwnChecks() as own:   # this rank's own arguments, checked before the agreement: all raise together
            stage = check_stage(where, stage)
            self._set_hyperparameters(where, lr, betas, eps, weight_decay, max_grad_norm, growth_interval)
            if not isinstance(bucket_bytes, int) or isinstance(bucket_bytes, bool) or bucket_bytes < 1:
                raise ValueError(f"{where}: bucket_bytes must be a positive integer, got {bucket_bytes!r}")
            dtype, xp = self._check_params(where, params, stage)
            owned_params, owned_grads = owned_params or {}, owned_grads or {}
            no_decay = parameter_names(where, "no_decay", no_decay)   # once: an iterator is read once
            names = self._check_names(where, params, owned_params, no_decay)
            self.loss_scale, self.dynamic_loss_scale = self._scale_setting(where, loss_scale, dtype)
            args.accumulate(where, accumulate, dtype)
            self.master_dtype = np.dtype(np.float32) if dtype.name in _LOW else dtype
            self.no_decay = no_decay
            self.model_parallel, self.norm_skip = self._model_parallel(where, model_parallel, norm_skip, names)
            self.owned = (Owned(where, owned_params, owned_grads, dtype, self.master_dtype, xp, self.no_decay,
                                self.norm_skip) if owned_params or owned_grads else None)
            layout = (f"stage {stage}, bucket_bytes {bucket_bytes}, dtype {np.dtype(dtype)}, params "
                      + ", ".join(f"{n} {tuple(p.shape)}" for n, p in params.items())
                      + f"; lr {self.lr}, betas {self.betas}, eps {self.eps}, weight_decay {self.weight_decay}, "
                        f"no_decay {sorted(self.no_decay)}, max_grad_norm {self.max_grad_norm}, loss_scale "
                        f"{loss_scale!r}, growth_interval {self.growth_interval}, accumulate {accumulate!r}, "
                        f"model_parallel {'none' if self.model_parallel is None else 'given'}")
        # the flat layout follows params' order: ranks whose orders or shapes differ would sum one name's
        # gradient into another's; other settings would step the shards apart (one allgather of a digest)
        agree_layout(where, "params (names in order, shapes), dtype, stage, bucket_bytes or settings (lr, betas, "
                     "eps, weight_decay, no_decay, max_grad_norm, loss_scale, growth_interval, accumulate, whether "
                     "model_parallel is given)", layout, group,
                     own.failed)
        self.group, self.stage, self.xp = group, stage, xp
        self.accumulate = accumulate
        self.dtype = dtype
        self.world = 1 if stage == 0 else group.size
        self.rank = 0 if stage == 0 else group.rank
        self.layout = FlatLayout({n: p.shape for n, p in params.items()}, self.world)
        self._decay = self._decay_slices()
        self._counted = None  # (S,) bool: the shard's elements this rank counts in the norm (None: all)
        sharded_skip = [n for n in self.norm_skip if n in params]  # the owned ones: Owned's mask
        if sharded_skip:
            self._counted = ~self.layout.mask(sharded_skip, self.rank, xp)
        self.good_steps, self.t, self.skipped = 0, 0, 0
        self.last_grad_norm: float | None = None   # the global norm of the last step's gradient, where it clipped
        self._make_state(params, stage, dtype, xp)
        self._make_buffers(stage, dtype, xp, bucket_bytes)
        self._prefetched: dict = {}   # tuple of names -> the gather in flight of their parameters
        self._reset_step()

    # -- setup ----------------------------------------------------------------------------------------
    def _set_hyperparameters(self, where, lr, betas, eps, weight_decay, max_grad_norm, growth_interval) -> None:
        hp = check_hyperparameters(where, lr, betas, eps, weight_decay, max_grad_norm, growth_interval)
        self.lr, self.betas, self.eps = hp["lr"], hp["betas"], hp["eps"]
        self.weight_decay, self.max_grad_norm, self.growth_interval = (hp["weight_decay"], hp["max_grad_norm"],
                                                                       hp["growth_interval"])

    @staticmethod
    def _check_names(where, params, owned_params, no_decay) -> set:
        """Every name, sharded or owned; ValueError for a name in both or a no_decay name in neither."""
        both = sorted(set(params) & set(owned_params))
        if both:
            raise ValueError(f"{where}: {both} are both sharded params and owned_params")
        names = set(params) | set(owned_params)
        unknown = sorted(set(no_decay) - names)
        if unknown:
            raise ValueError(f"{where}: no_decay names {unknown} that are not parameters")
        return names

    def _make_state(self, params, stage, dtype, xp) -> None:
        """Master weights and moments of this rank's shard; at stage 3 the compute-dtype shard too."""
        lo, hi = self.layout.shard_span(self.rank)
        full = self.layout.flatten(params, self.master_dtype, xp)  # (padded,), transient
        self.master = full[lo:hi].copy()  # (S,) or (padded,) at stage 0
        self.m, self.v = xp.zeros_like(self.master), xp.zeros_like(self.master)
        del full
        if stage == 3:
            self.params = None  # the caller's arrays are not kept: only the shard
            self.param_shard = self.master.astype(dtype)  # (S,)
        else:
            self.params = params  # updated in place after each step
            self.param_shard = None

    @property
    def _kept_params(self) -> dict:
        """The caller's parameters, which stages 0 to 2 keep and update in place (stage 3 keeps only the shard)."""
        assert self.params is not None, "stage 3 keeps no full parameters"
        return self.params

    def _make_buffers(self, stage, dtype, xp, bucket_bytes) -> None:
        """The gradient buffers (full at stages 0-1, the shard's at 2-3) and the buckets' staging."""
        self.grad_flat = xp.zeros(self.layout.padded, dtype) if stage <= 1 else None  # the full gradient buffer
        self.grad_shard = xp.zeros(self.layout.shard if stage else self.layout.padded, dtype)
        self._buckets = self._plan_buckets(max(1, bucket_bytes // dtype.itemsize))
        self._bucket_bufs = ([xp.empty(max(hi - lo for lo, hi in self._buckets), dtype) for _ in range(2)]
                             if stage >= 2 else [])

    @staticmethod
    def _check_params(where, params, stage):
        """(dtype, array module) of ``params``: arrays of one floating dtype and backend, writeable at stages 0
        to 2 (the step writes the updated values into them: a read-only one raised only there, after the
        optimizer's state had moved)."""
        if not isinstance(params, dict) or not params:
            raise ValueError(f"{where}: params must be a non-empty dict name -> array")
        dtype = xp = None
        for name, p in params.items():
            m = check_array(where, f"parameter {name!r}", p)
            if stage != 3 and not getattr(p.flags, "writeable", True):   # CuPy's arrays are always writeable
                raise ValueError(f"{where}: parameter {name!r} is read-only; at stage {stage} each step writes the "
                                 f"updated values into the parameters (pass a writeable array)")
            if p.dtype.kind != "f" and p.dtype.name != "bfloat16":
                raise TypeError(f"{where}: parameter {name!r} has dtype {p.dtype}, expected a floating dtype")
            if dtype is not None and (p.dtype != dtype or m is not xp):
                raise TypeError(f"{where}: parameter {name!r} is {m.__name__} {p.dtype}, the first was "
                                f"{xp.__name__} {dtype}: one dtype and one backend for all")
            dtype, xp = p.dtype, m
        return np.dtype(dtype), xp

    @staticmethod
    def _scale_setting(where, loss_scale, dtype):
        if loss_scale is None:
            return 1.0, False
        if loss_scale == "dynamic":
            return 2.0 ** 16, True
        return _number(where, "loss_scale", loss_scale, allow_low=False), False

    @staticmethod
    def _model_parallel(where, group, norm_skip, params):
        if group is not None and not isinstance(group, Communicator):  # mpi4py's would pickle: refused
            raise TypeError(f"{where}: model_parallel must be a pycollect Communicator (the ranks holding the "
                            f"model's other parts) or None, got {type(group).__name__}")
        norm_skip = parameter_names(where, "norm_skip", norm_skip)
        unknown = sorted(norm_skip - set(params))
        if unknown:
            raise ValueError(f"{where}: norm_skip names {unknown} that are not parameters")
        if norm_skip and group is None:
            raise ValueError(f"{where}: norm_skip needs model_parallel, the group whose other ranks count those names")
        return (group if group is not None and group.size > 1 else None), norm_skip

    def _decay_slices(self) -> list[tuple[int, int]]:
        """[a, b) ranges of this rank's shard (local indices) whose elements get weight decay."""
        lo, hi = self.layout.shard_span(self.rank)
        out = []
        for n in self.layout.names:
            if n in self.no_decay:
                continue
            a, b = self.layout.span(n)
            a, b = max(a, lo), min(b, hi)
            if a < b:
                out.append((a - lo, b - lo))
        return out

    def _plan_buckets(self, elems: int) -> list[tuple[int, int]]:
        """Contiguous [lo, hi) ranges of the flat buffer, from its end (padding included) backwards."""
        buckets, hi, lo = [], self.layout.padded, self.layout.padded
        for n in reversed(self.layout.names):
            lo = self.layout.offsets[n]
            if hi - lo >= elems:
                buckets.append((lo, hi))
                hi = lo
        if hi > 0 or not buckets:
            buckets.append((0, hi))
        return [b for b in buckets if b[1] > b[0]]

    # -- gradients in, buckets out --------------------------------------------------------------------
    def _reset_step(self) -> None:
        self._pending = {n for n in self.layout.names}
        self._missing = [sum(1 for n in self.layout.names
                             if self.layout.sizes[n] and lo <= self.layout.offsets[n] < hi)
                         for lo, hi in self._buckets]
        self._next = 0
        self._inflight: list[tuple] = []  # (request, staging or None)
        self._packed: dict = {}

    def handed_in(self) -> int:
        """How many gradients were handed in since the last step (0 between steps)."""
        return len(self.layout.names) - len(self._pending)

    def grad_ready(self, name: str, grad, copy: bool = True) -> None:
        """Hand in ``name``'s local gradient for this step (backward order); starts full buckets.

        ``grad`` is read at once (stages 0 and 1 copy it into their full gradient buffer; at stages 2 and 3 a
        bucket that starts now packs it), or else copied: the caller may write it again as soon as this returns.
        ``copy=False`` keeps ``grad`` itself until its bucket starts (at the latest in ``step``), saving that
        copy at stages 2 and 3: the caller must then leave it unwritten until ``step``."""
        copy = check_bool("ZeroAdamW.grad_ready", "copy", copy)
        if name not in self.layout.offsets:
            raise ValueError(f"ZeroAdamW.grad_ready: {name!r} is not a parameter")
        if name not in self._pending:
            raise RuntimeError(f"ZeroAdamW.grad_ready: {name!r} was already handed in this step")
        wrong = self._misfit(name, grad)
        if wrong:
            raise ValueError(f"ZeroAdamW.grad_ready: {wrong}")
        self._pending.discard(name)
        a, b = self.layout.span(name)
        if a == b:
            return  # no element: no bucket waits for it
        if self.grad_flat is not None:
            self.grad_flat[a:b] = grad.reshape(-1)
        else:
            self._packed[name] = grad  # packed into the bucket buffer when the bucket starts
        self._missing[self._bucket_of(a)] -= 1
        self._start_ready()
        if copy and name in self._packed:   # its bucket waits for others: keep a copy, not the caller's array
            self._packed[name] = grad.copy()
        for req, _ in self._inflight:
            req.test()  # no progress thread: advance the buckets in flight

    def _misfit(self, name: str, grad) -> str | None:
        """How ``grad`` differs from ``name``'s shape and the compute dtype, or None."""
        shape, dtype = tuple(getattr(grad, "shape", ())), getattr(grad, "dtype", None)
        if shape == self.layout.shapes[name] and dtype == self.dtype:
            return None
        return (f"grad of {name!r} is {dtype if dtype is not None else type(grad).__name__}{shape}, "
                f"expected {self.dtype}{self.layout.shapes[name]}")

    def _bucket_of(self, offset: int) -> int:
        """The bucket holding flat ``offset``."""
        return next(i for i, (lo, hi) in enumerate(self._buckets) if lo <= offset < hi)

    def _start_ready(self) -> None:
        while self._next < len(self._buckets) and self._missing[self._next] == 0:
            self._start(self._next)
            self._next += 1

    def _start(self, k: int) -> None:
        lo, hi = self._buckets[k]
        if self.grad_flat is not None:
            send = self.grad_flat[lo:hi]
        else:
            if len(self._inflight) >= len(self._bucket_bufs):  # both staging buffers busy: wait the oldest
                self._inflight.pop(0)[0].wait()
            buf = self._bucket_bufs[k % 2][:hi - lo]
            buf[...] = 0  # the padding
            for n in [n for n in self._packed if lo <= self.layout.offsets[n] < hi]:
                a, b = self.layout.span(n)
                buf[a - lo:b - lo] = self._packed.pop(n).reshape(-1)
            send = buf
        if self.stage == 0:
            out = self.grad_shard[lo:hi]
            req = self.group.iallreduce(send, op="sum", out=out, accumulate=self.accumulate) \
                if self.group.size > 1 else None
            if req is None:
                out[...] = send
        else:
            counts = self.layout.counts(lo, hi)
            s_lo, _ = self.layout.shard_span(self.rank)
            a = max(lo, s_lo) - s_lo
            out = self.grad_shard[a:a + counts[self.rank]]
            req = self.group.ireduce_scatter(send, op="sum", counts=counts, out=out, accumulate=self.accumulate) \
                if self.world > 1 else None
            if req is None:
                out[...] = send
        if req is not None:
            self._inflight.append((req, send))

    def _finish_reduction(self) -> None:
        self._start_ready()
        if self._next < len(self._buckets):  # cannot happen once every gradient is in
            raise RuntimeError("ZeroAdamW: buckets left unstarted")
        for req, _ in self._inflight:
            req.wait()
        self._inflight = []

    # -- the step -------------------------------------------------------------------------------------
    def step(self, grads: dict | None = None) -> bool:
        """Reduce the gradients (those not yet handed to ``grad_ready``, from ``grads``) and update.

        Returns False when the step was skipped (non-finite gradients under dynamic loss scaling).
        A rank with gradients missing (or of the wrong shape or dtype in ``grads``) still joins the
        reductions, with zeros, and then says so in the step's vote: every rank of the group (and of
        ``model_parallel``) raises, and no parameter, state or loss scale changes anywhere."""
        refusal = self._refusal(grads)
        if refusal is None and grads is not None:
            for name in reversed(self.layout.names):
                if name in self._pending:
                    self.grad_ready(name, grads[name], copy=False)   # every bucket starts in this call
        elif refusal is not None:
            self._start_unready()
        self._finish_reduction()
        self._reset_step()
        for pending in self._prefetched.values():  # gathers of the old parameters: finish and drop
            pending.wait()
        self._prefetched = {}
        xp = self.xp
        divisor = self.group.size * self.loss_scale if self.loss_scale != 1.0 else self.group.size
        g = self.grad_shard.astype(self.master_dtype)  # (S,)
        g /= divisor
        go = None if self.owned is None else self.owned.gradient(divisor)  # (Po,)
        self.last_grad_norm = None
        refused, overflow = self._vote(refusal is not None, self.dynamic_loss_scale and not self._finite(g, go))
        if refused:
            raise ValueError(refusal or "ZeroAdamW.step: another rank of the group"
                             f"{' or of model_parallel' if self.model_parallel is not None else ''} had gradients "
                             "missing or refused (it raised too, naming them): the step is refused, nothing updated")
        if overflow:
            self.loss_scale /= 2
            self.good_steps = 0
            self.skipped += 1
            return False
        if self.max_grad_norm is not None:
            norm = self.last_grad_norm = self.grad_norm(g, go)
            if norm > self.max_grad_norm:
                g *= self.max_grad_norm / (norm + 1e-6)
                if go is not None:
                    go *= self.max_grad_norm / (norm + 1e-6)
        self._update(g, go, xp)
        self._publish()
        if self.dynamic_loss_scale:
            self.good_steps += 1
            if self.good_steps % self.growth_interval == 0:
                self.loss_scale *= 2
        return True

    def _refusal(self, grads) -> str | None:
        """Why this rank cannot step (gradients never handed in, or wrong in ``grads``), or None."""
        if grads is None:
            if not self._pending:
                return None
            return (f"ZeroAdamW.step: no grads given and {len(self._pending)} never handed in "
                    f"(first {sorted(self._pending)[:3]}); the step is refused on every rank, nothing updated")
        missing = sorted(self._pending - set(grads))
        if missing:
            return (f"ZeroAdamW.step: grads lack {missing[:4]}{'...' if len(missing) > 4 else ''}; "
                    "the step is refused on every rank, nothing updated")
        for name in self._pending:
            wrong = self._misfit(name, grads[name])
            if wrong:
                return f"ZeroAdamW.step: {wrong}; the step is refused on every rank, nothing updated"
        return None

    def _start_unready(self) -> None:
        """Start every bucket not started yet, the gradients never handed in as zeros (a refused step:
        the others wait in these reductions; what they reduce is never used)."""
        for name in list(self._pending):
            a, b = self.layout.span(name)
            if a == b:
                continue
            if self.grad_flat is not None:
                self.grad_flat[a:b] = 0
            self._missing[self._bucket_of(a)] -= 1
        self._pending.clear()
        self._start_ready()

    def _spans_group(self) -> bool:
        """Whether a per-rank figure must be combined over the group: its shards differ (stages 1-3), or
        its owned parameters do (at stage 0 every rank holds the whole reduced gradient already)."""
        return self.world > 1 or (self.owned is not None and self.group.size > 1)

    def _finite(self, g, go=None) -> bool:
        return bool(self.xp.isfinite(g).all()) and (go is None or bool(self.xp.isfinite(go).all()))

    def _vote(self, refused: bool, overflow: bool) -> tuple[bool, bool]:
        """(some rank refused the step, some rank's shard overflowed): one 2-element allreduce over the
        group (at every stage: a refusal is known on one rank alone), one more over ``model_parallel``
        (the model's other parts step or refuse alike)."""
        votes = np.array([int(refused), int(overflow)], np.int64)
        if self.group.size > 1:
            votes = self.group.allreduce(votes, op="max")
        if self.model_parallel is not None:
            votes = self.model_parallel.allreduce(votes, op="max")
        return bool(votes[0]), bool(votes[1])

    def grad_norm(self, g, go=None) -> float:
        """The global 2-norm of the averaged gradient from the shards (padding holds zeros), over the
        model-parallel group too, without this rank's ``norm_skip`` names (another rank counts them)."""
        g = g.astype(np.float64)
        if self._counted is not None:
            g = g[self._counted]
        dense, owned = float((g ** 2).sum()), 0.0
        if go is not None:
            assert self.owned is not None  # go, the owned parameters' gradient, comes with owned parameters
            owned = self.owned.sum_of_squares(go)
        if self.world > 1:
            sq = self.group.allreduce(np.array([dense + owned]), op="sum")
        elif self._spans_group():  # stage 0: the reduced part is whole everywhere, the owned one is not
            sq = self.group.allreduce(np.array([owned]), op="sum") + dense
        else:
            sq = np.array([dense + owned])
        if self.model_parallel is not None:
            sq = self.model_parallel.allreduce(sq, op="sum")
        return math.sqrt(float(sq[0]))

    def _update(self, g, go, xp) -> None:
        """torch.optim.AdamW on the master shard (and the owned parameters), in its order."""
        self.t += 1
        hyper = (self.t, self.lr, self.betas, self.eps, self.weight_decay, xp)
        flat_adamw_update(self.master, self.m, self.v, g, self._decay, *hyper)
        if go is not None:
            o = self.owned
            assert o is not None  # go, the owned parameters' gradient, comes with owned parameters
            flat_adamw_update(o.master, o.m, o.v, go, o.decay, *hyper)

    def _publish(self) -> None:
        """The updated parameters where the caller computes with them."""
        if self.owned is not None:
            self.owned.publish()
        shard = self.master.astype(self.dtype)
        if self.stage == 3:
            self.param_shard[...] = shard
            return
        full = shard if self.stage == 0 else self._allgather_range(shard, 0, self.layout.padded)
        params = self._kept_params
        for n, view in self.layout.views(full).items():
            params[n][...] = view

    # -- parameters --------------------------------------------------------------------------------------
    def _allgather_range(self, shard_part_source, lo: int, hi: int, blocking: bool = True):
        """Every rank's piece of [lo, hi) gathered: (hi - lo,) in the compute dtype."""
        counts = self.layout.counts(lo, hi)
        s_lo, _ = self.layout.shard_span(self.rank)
        a = max(lo, s_lo) - s_lo
        mine = self.xp.ascontiguousarray(shard_part_source[a:a + counts[self.rank]])
        if self.world == 1:
            return mine.copy() if blocking else Request.completed(mine.copy())
        call = self.group.allgather if blocking else self.group.iallgather
        return call(mine, counts=counts)

    def _range_of(self, names, where: str = "ZeroAdamW.gathered") -> tuple[int, int]:
        names = list(names)
        if not names:
            raise ValueError(f"{where}: names must name at least one parameter")
        unknown = [n for n in names if n not in self.layout.offsets]
        if unknown:
            raise ValueError(f"{where}: {unknown} are not parameters")
        spans = [self.layout.span(n) for n in names]
        lo, hi = min(a for a, _ in spans), max(b for _, b in spans)
        if sum(b - a for a, b in spans) != hi - lo:
            raise ValueError(f"{where}: {list(names)} are not contiguous in the parameter order")
        return lo, hi

    def _range_to_gather(self, names, where: str) -> tuple[int, int]:
        """``_range_of``; where the names are wrong on this rank while the others, in step, start their allgather
        (stage 3, more than one rank, nothing prefetched here, so nothing there either), the error counts as a
        refused collective (Communicator.refused_arguments): a rank that catches it and gathers again meets the others
        first, where its allgather paired with theirs by order and they returned its layer's rows in theirs
        (Allgatherv of other counts, no error). With a prefetch pending the others may start nothing: left alone."""
        try:
            return self._range_of(names, where)
        except ValueError:
            if self.stage == 3 and self.world > 1 and not self._prefetched:
                self.group.refused_arguments()
            raise

    def prefetch(self, names) -> None:
        """Stage 3: start gathering ``names`` (non-blocking); ``gathered`` picks it up."""
        key = tuple(names)
        lo, hi = self._range_to_gather(names, "ZeroAdamW.prefetch")
        if self.stage == 3 and key not in self._prefetched:
            self._prefetched[key] = self._allgather_range(self.param_shard, lo, hi, blocking=False)

    def gather(self, names) -> dict:
        """Stage 3: name -> full parameter (views of one new buffer), from a ``prefetch`` when there was one.
        Other stages: the parameters themselves. Contiguous names only (a layer's, in order)."""
        # at every stage: a model that runs here runs at stage 3
        lo, hi = self._range_to_gather(names, "ZeroAdamW.gathered")
        if self.stage != 3:
            return {n: self._kept_params[n] for n in names}
        key = tuple(names)
        pending = self._prefetched.pop(key, None)
        flat = pending.wait() if pending is not None else self._allgather_range(self.param_shard, lo, hi)
        return {n: flat[self.layout.offsets[n] - lo:self.layout.offsets[n] - lo + self.layout.sizes[n]]
                .reshape(self.layout.shapes[n]) for n in names}

    @contextmanager
    def gathered(self, names):
        """``gather(names)`` for the block; at stage 3 the buffer is dropped on exit."""
        views = self.gather(names)
        try:
            yield views
        finally:
            del views

    def full_params(self) -> dict:
        """Every full parameter (compute dtype), new arrays; collective at stage 3."""
        if self.stage == 3:
            flat = self._allgather_range(self.param_shard, 0, self.layout.padded)
            return {n: v.copy() for n, v in self.layout.views(flat).items()}
        return {n: p.copy() for n, p in self._kept_params.items()}

    def full_state(self) -> dict:
        """{"master", "m", "v"}: each name -> full float array gathered from the shards (collective)."""
        out = {}
        for key, shard in (("master", self.master), ("m", self.m), ("v", self.v)):
            flat = shard if self.stage == 0 else self._gather_master(shard)
            out[key] = {n: v.copy() for n, v in self.layout.views(flat).items()}
        return out

    def _gather_master(self, shard):
        if self.world == 1:
            return shard
        return self.group.allgather(shard, counts=[self.layout.shard] * self.world)

    # -- accounting ----------------------------------------------------------------------------------------
    def memory_report(self) -> dict:
        """Bytes this rank holds per category, from its arrays (the parameters the caller passed count
        at stages 0 to 2, where the optimizer writes them)."""
        params = (self.param_shard.nbytes if self.stage == 3 else sum(p.nbytes for p in self._kept_params.values()))
        grads = self.grad_flat.nbytes if self.grad_flat is not None else self.grad_shard.nbytes
        comm = sum(b.nbytes for b in self._bucket_bufs) + (self.grad_shard.nbytes if self.stage <= 1 else 0)
        report = {"parameters": int(params), "gradients": int(grads), "master_weights": int(self.master.nbytes),
                  "moments": int(self.m.nbytes + self.v.nbytes), "communication_buffers": int(comm)}
        for k, v in (self.owned.nbytes() if self.owned is not None else {}).items():
            report[k] += int(v)
        report["total"] = sum(report.values())
        return report

    def expected_memory(self) -> dict:
        """The formulas, for this layout: c bytes per compute element, 4 (or the master's) per state element."""
        owned = 0 if self.owned is None else self.owned.layout.numel  # owned: whole, on this rank alone
        return expected_memory(self.layout, self.stage, self.dtype, owned)


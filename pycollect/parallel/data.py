"""Data parallelism: gradients allreduced in buckets that start while backward is still running.

Gradients are grouped, in the order backward produces them (the reverse of the forward order of
use), into buckets of about ``bucket_bytes``, one dtype per bucket and one contiguous flat buffer
per bucket. When the training code has marked every gradient of a bucket ready, the bucket's
gradients are copied into its buffer and its allreduce starts non-blocking, so communication
overlaps the rest of backward; ``finish()`` waits and copies the reduced gradients back.

Non-blocking collectives advance only inside MPI calls (there is no progress thread): a started
allreduce would sit still while backward computes. So every ``grad_ready`` call also advances each
bucket in flight with ``Request.test()`` (non-blocking), which moves it on by whatever rounds have
arrived since the last call (``progress=False`` turns that off).

Buckets always start in the same order (``buckets``) on every rank, whatever the order of the
``grad_ready`` calls: a bucket completed early waits for the ones before it. That keeps every rank's
sequence of collectives identical, which the communicator requires.
"""
from __future__ import annotations

from collections.abc import Mapping
from contextlib import contextmanager
from typing import Any

from ..engine import args
from ..engine.backend import array_module
from ..nn._base import check_bool
from .agree import OwnChecks, agree_layout, check_group

__all__ = ["DataParallel", "plan_buckets"]


def plan_buckets(entries, bucket_bytes: int) -> list[list[int]]:
    """Indices of ``entries`` (name, dtype, nbytes) in forward order, grouped into buckets.

    Walks the reverse order, adding each gradient to the open bucket of its dtype and closing a
    bucket once it holds ``bucket_bytes`` or more; buckets are returned in the order they complete
    when gradients arrive in reverse order (by the position of their last member).
    """
    open_: dict[object, list] = {}   # dtype -> [indices, bytes so far] of its open bucket
    closed: list[list[int]] = []
    for i in reversed(range(len(entries))):
        _, dtype, nbytes = entries[i]
        bucket = open_.setdefault(dtype, [[], 0])
        bucket[0].append(i)
        bucket[1] += nbytes
        if bucket[1] >= bucket_bytes:
            closed.append(open_.pop(dtype)[0])
    closed.extend(b[0] for b in open_.values())
    return sorted(closed, key=lambda b: -b[-1])  # b[-1]: the member backward produces last


class _Bucket:
    """One bucket: its names, the grads they stand for, their offsets in one flat buffer; with ``flag`` one
    element more at the end, the number of ranks that started it without every gradient ready (the sum)."""

    def __init__(self, names, grads, xp, flag: bool = False):
        self.names = names
        self.grads = grads
        self.offsets = [0]
        for g in grads:
            self.offsets.append(self.offsets[-1] + g.size)
        self.flag = flag
        self.buf = xp.empty(self.offsets[-1] + flag, grads[0].dtype)  # (sum of sizes [+ 1],)
        self.request: Any = None   # the allreduce's Request while started

    def pack(self, missed: bool = False) -> None:
        for g, lo, hi in zip(self.grads, self.offsets, self.offsets[1:]):
            self.buf[lo:hi] = g.reshape(-1)
        if self.flag:
            self.buf[-1] = 1 if missed else 0

    def missed(self) -> bool:
        """After the allreduce: whether any rank started this bucket with a gradient never marked ready."""
        return bool(self.flag and self.buf[-1] != 0)

    def unpack(self, divisor: int) -> None:
        if divisor != 1:
            self.buf /= divisor
        for g, lo, hi in zip(self.grads, self.offsets, self.offsets[1:]):
            g[...] = self.buf[lo:hi].reshape(g.shape)


class DataParallel:
    """Bucketed, overlapped gradient allreduce over ``group`` (a pycollect Communicator).

    ``params_in_order``: a list of (name, param, grad) in the forward order of use, or a dict
    name -> grad in that order. Gradients must be floating arrays of one array module; they are
    reduced in place. With ``average`` (default) the result is the mean over the group, which is the
    gradient of a loss averaged over the global batch when every rank's loss is the mean over its
    own, equally sized, batch; otherwise the sum.

    Per step: call ``grad_ready(name)`` once per gradient after it is final (backward order), then
    ``finish()``. Inside ``with dp.no_sync():`` nothing is communicated (gradients accumulate
    locally); the first step after it reduces the accumulated gradients. With ``progress`` (default)
    each ``grad_ready`` advances the buckets in flight (``Request.test()``), so their allreduces run
    during backward rather than all inside ``finish()``. ``accumulate="float32"`` reduces float16 and
    bfloat16 gradients in float32 (twice the bytes on the wire; each sum rounded once to the gradients' dtype,
    not at every partial sum: Megatron's ``grad_reduce_in_fp32``).
    """

    _ready: set[str]              # this step's names marked ready
    _inflight: list[_Bucket]      # started buckets whose allreduce was not yet seen complete

    def __init__(self, params_in_order, group, bucket_bytes: int = 25 * 2**20, average: bool = True,
                 progress: bool = True, accumulate: str | None = None):
        check_group("DataParallel", group)
        names: list = []
        grads: list = []
        with OwnChecks() as own:   # this rank's own arguments: raised after the agreement, on every rank
            if not isinstance(bucket_bytes, int) or isinstance(bucket_bytes, bool) or bucket_bytes <= 0:
                raise ValueError(f"DataParallel: bucket_bytes must be a positive integer, got {bucket_bytes!r}")
            average = check_bool("DataParallel", "average", average)
            progress = check_bool("DataParallel", "progress", progress)
            names, grads = _entries(params_in_order)
            for g in grads:
                args.accumulate("DataParallel", accumulate, g.dtype)
        # the buckets follow the names' order: ranks whose orders, shapes or dtypes differ would sum one
        # gradient into another's (one allgather of a digest, here only)
        agree_layout("DataParallel", "gradients (names in order, dtypes, shapes), bucket_bytes or accumulate",
                     f"bucket_bytes {bucket_bytes}, average {bool(average)}, accumulate {accumulate!r}, grads "
                     + ", ".join(f"{n} {g.dtype}{tuple(g.shape)}" for n, g in zip(names, grads)), group, own.failed)
        self.group, self.average, self.progress = group, bool(average), bool(progress)
        self.accumulate = accumulate
        self.bucket_bytes = bucket_bytes
        self._index = {n: i for i, n in enumerate(names)}
        plan = plan_buckets([(n, g.dtype, g.nbytes) for n, g in zip(names, grads)], bucket_bytes)
        xp = array_module(grads[0]) if grads else None
        # the last bucket carries the flag that voids a step some rank did not complete (see finish)
        self._buckets = [_Bucket([names[i] for i in b], [grads[i] for i in b], xp,
                                 flag=group.size > 1 and k == len(plan) - 1) for k, b in enumerate(plan)]
        self._bucket_of = {n: k for k, b in enumerate(self._buckets) for n in b.names}
        self._sync = True
        self._reset()

    @property
    def buckets(self) -> list[list[str]]:
        """Names in each bucket, buckets in the order they start."""
        return [list(b.names) for b in self._buckets]

    def traffic(self) -> int:
        """Bytes handed to allreduce per synchronised step (0 on a group of one): the gradients and one element
        of the last bucket's dtype, the flag of a step some rank did not complete."""
        return 0 if self.group.size == 1 else sum(b.buf.nbytes for b in self._buckets)

    # -- one step -----------------------------------------------------------------------------------
    def grad_ready(self, name: str) -> None:
        """Mark ``name``'s gradient final for this step; starts its bucket's allreduce once the bucket is full.

        Then (with ``progress``) advances, without blocking, every bucket already in flight.
        """
        if name not in self._index:
            raise ValueError(f"DataParallel.grad_ready: {name!r} is not a parameter; expected one of "
                             f"{', '.join(map(repr, self._index))}")
        if not self._sync:
            return
        if name in self._ready:
            raise RuntimeError(f"DataParallel.grad_ready: {name!r} was already marked ready in this step "
                               f"(rank {self.group.rank})")
        self._ready.add(name)
        k = self._bucket_of[name]
        self._missing[k] -= 1
        if self._missing[k] == 0:
            self._start_complete()
        if self.progress and self._inflight:
            self._inflight = [b for b in self._inflight if not b.request.test()]

    def all_ready(self) -> None:
        """Mark every gradient not yet marked ready (backward order): for callers whose gradients are
        all final at once, such as a pipeline after its flush."""
        for name in reversed(list(self._index)):
            if name not in self._ready:
                self.grad_ready(name)

    def finish(self) -> None:
        """Wait for every bucket (starting any not started), write the reduced gradients back.

        Inside ``no_sync`` nothing is communicated and this returns at once.
        """
        if not self._sync:
            return
        never = [n for n in self._index if n not in self._ready]
        if never:   # the buckets still waiting start anyway, flagged: the other ranks' allreduces pair up with
            self._missing = [0] * len(self._buckets)    # them and every rank learns the step is void
            self._start_complete(missed=True)
            self._drain()
            self._reset()
            raise RuntimeError(f"DataParallel.finish: {len(never)} gradient(s) never marked ready in this step "
                               f"(rank {self.group.rank}): {', '.join(map(repr, never))}; no gradient written back")
        self._start_complete()
        self._drain()
        locked = self._locked() if self.group.size > 1 else []   # a group of one writes nothing back
        if locked:   # checked before any is written: all gradients written back, or none
            self._reset()
            raise ValueError(f"DataParallel.finish: grads {locked} are read-only (rank {self.group.rank}); "
                             "no gradient written back")
        if self._buckets and self._buckets[-1].missed():
            self._reset()
            raise RuntimeError(f"DataParallel.finish: another rank of the group did not complete this step (a "
                               f"gradient never marked ready, or read-only: its error names them); no gradient "
                               f"written back (rank {self.group.rank})")
        divisor = self.group.size if self.average else 1
        try:
            for b in self._buckets:
                if b.request is not None:
                    b.unpack(divisor)
        finally:
            self._reset()   # an error here must not leave this step's buckets to the next finish

    @contextmanager
    def no_sync(self):
        """Micro-batches inside skip all communication; gradients accumulate in the grad arrays."""
        if self._ready:
            raise RuntimeError(f"DataParallel.no_sync: entered in the middle of a step ({len(self._ready)} "
                               "gradient(s) already marked ready); call finish() first")
        previous, self._sync = self._sync, False
        try:
            yield self
        finally:
            self._sync = previous

    # -- internals ----------------------------------------------------------------------------------
    def _reset(self) -> None:
        self._ready = set()
        self._missing = [len(b.names) for b in self._buckets]
        self._next = 0  # the first bucket not started
        self._inflight = []  # started buckets whose allreduce was not yet seen complete
        for b in self._buckets:
            b.request = None

    def _start_complete(self, missed: bool = False) -> None:
        """Start, in bucket order, every complete bucket whose predecessors have all started (``missed``: flagged
        as started without every gradient ready)."""
        while self._next < len(self._buckets) and self._missing[self._next] == 0:
            b = self._buckets[self._next]
            self._next += 1
            if self.group.size == 1:
                continue  # a group of one: the local gradient is the result
            # the last bucket's flag voids the step on every rank where this one cannot complete it: a gradient
            # never marked ready, or one made read-only since (the others wrote theirs back, the replicas parted)
            b.pack(missed or (b.flag and bool(self._locked())))
            b.request = self.group.iallreduce(b.buf, op="sum", out=b.buf, accumulate=self.accumulate)
            self._inflight.append(b)

    def _locked(self) -> list[str]:
        """The names of this rank's gradients that are read-only now (the reduced ones cannot be written back)."""
        return [n for b in self._buckets for n, g in zip(b.names, b.grads) if not getattr(g.flags, "writeable", True)]

    def _drain(self) -> None:
        for b in self._buckets:
            if b.request is not None:
                b.request.wait()


def _entries(params_in_order) -> tuple[list[str], list]:
    """(names, grads) from a list of (name, param, grad) or a dict name -> grad, checked."""
    items: list[tuple]
    if isinstance(params_in_order, Mapping):
        items = [(n, None, g) for n, g in params_in_order.items()]
    else:
        items = []
        for i, item in enumerate(params_in_order):
            if not isinstance(item, (tuple, list)) or len(item) != 3:
                raise TypeError(f"DataParallel: params_in_order[{i}] must be (name, param, grad), got {item!r}")
            items.append(tuple(item))
    names: list[str] = []
    grads: list = []
    module = None
    for name, param, grad in items:
        if name in names:
            raise ValueError(f"DataParallel: parameter name {name!r} appears twice")
        try:
            xp = array_module(grad)
            if param is not None:
                array_module(param)
        except TypeError as e:
            raise TypeError(f"DataParallel: {name!r}: {e}") from None
        if grad.dtype.kind not in "fc" and grad.dtype.name != "bfloat16":   # ml_dtypes' bfloat16 is of kind V
            raise TypeError(f"DataParallel: grad of {name!r} has dtype {grad.dtype}, expected a floating dtype")
        if not getattr(grad.flags, "writeable", True):
            raise ValueError(f"DataParallel: grad of {name!r} is read-only; the reduced gradient is written into it")
        if param is not None and tuple(param.shape) != tuple(grad.shape):
            raise ValueError(f"DataParallel: grad of {name!r} has shape {tuple(grad.shape)}, "
                             f"expected {tuple(param.shape)} (the param's)")
        if module is not None and xp is not module:
            raise TypeError(f"DataParallel: grad of {name!r} is a {xp.__name__} array, the others {module.__name__}")
        module = xp
        names.append(name)
        grads.append(grad)
    return names, grads

"""Communication for tensor and sequence parallelism, in conjugate (adjoint) pairs.

Each class takes its group (a pycollect Communicator) explicitly and has ``forward(x)`` and
``backward(dy)``; backward is the adjoint of forward over the group. An input or output is either
*replicated* (the same array on every rank of the group: one value, its inner product counted
once) or *partial* (each rank's own array: inner products summed over the group). With that,
<forward(x), y> == <x, backward(y)> for every pair:

    pair                        forward                  backward                  x -> y
    copy_to_group               identity                 allreduce                 replicated -> partial
    reduce_from_group           allreduce                identity                  partial -> replicated
    scatter_to_group            split last axis          allgather last axis       replicated -> partial
    gather_from_group           allgather last axis      split last axis           partial -> replicated
    scatter_to_sequence         split seq_axis           allgather seq_axis        replicated -> partial
    gather_from_sequence        allgather seq_axis       reduce-scatter seq_axis   partial -> partial
    reduce_scatter_to_sequence  reduce-scatter seq_axis  allgather seq_axis        partial -> partial

pycollect gathers and scatters along axis 0: the axis is moved to the front in a contiguous copy
and back. A split axis must divide by the group size (ValueError otherwise, on every rank of the
group alike when all pass the same shape). Group size 1 short-circuits: every op is the identity
and returns its input. Usage: ``f = copy_to_group(mesh.tp); y = f.forward(x); dx = f.backward(dy)``.

Sequence parallelism leaves some gradients of replicated parameters *partial*: a LayerNorm, a bias
added after reduce_scatter_to_sequence, or the position table sees only this rank's T/p tokens, so
its gradient is this rank's share of the true one. ``allreduce_partial_grads`` sums such a list over
the group in place with one allreduce of the arrays packed into a flat buffer (Megatron does the
same in finalize_model_grads).
"""
from __future__ import annotations

import numpy as np

from ..comm import Communicator
from ..engine.backend import array_module
from ..nn._base import check_array

__all__ = ["copy_to_group", "reduce_from_group", "scatter_to_group", "gather_from_group",
           "scatter_to_sequence", "gather_from_sequence", "reduce_scatter_to_sequence",
           "split_along", "allgather_along", "reduce_scatter_along", "allreduce_sum", "allreduce_partial_grads"]


# -- the primitives, along any axis --------------------------------------------------------------------
def _axis(where: str, x, axis: int) -> int:
    check_array(where, "x", x)  # TypeError for non-arrays, naming the call
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"{where}: axis {axis} is out of range for an array of shape {tuple(x.shape)}")
    return axis % x.ndim


def _divisible(where: str, x, axis: int, group: Communicator) -> int:
    n = x.shape[axis]
    if n % group.size:
        raise ValueError(f"{where}: axis {axis} has length {n}, which does not divide by the group size "
                         f"{group.size} (shape {tuple(x.shape)}, rank {group.rank})")
    return n // group.size


def _to_front(x, axis: int):
    xp = array_module(x)
    return xp.ascontiguousarray(xp.moveaxis(x, axis, 0))


def _from_front(x, axis: int):
    xp = array_module(x)
    return xp.ascontiguousarray(xp.moveaxis(x, 0, axis))


def split_along(x, axis: int, group: Communicator, where: str = "split_along"):
    """This rank's part of ``x`` split into ``group.size`` equal parts along ``axis`` (a contiguous copy)."""
    axis = _axis(where, x, axis)
    k = _divisible(where, x, axis, group)
    if group.size == 1:
        return x
    index = [slice(None)] * x.ndim
    index[axis] = slice(group.rank * k, (group.rank + 1) * k)
    return array_module(x).ascontiguousarray(x[tuple(index)])


def allgather_along(x, axis: int, group: Communicator, where: str = "allgather_along", exchange: bool = False):
    """Every rank's ``x`` concatenated along ``axis`` in group-rank order: equal lengths, or with ``exchange``
    lengths that may differ (one allgather of an int each first)."""
    axis = _axis(where, x, axis)
    if group.size == 1:
        return x
    front = _to_front(x, axis)
    out = group.allgather(front) if exchange else group.allgather(front, counts=[front.shape[0]] * group.size)
    return _from_front(out, axis)


def reduce_scatter_along(x, axis: int, group: Communicator, where: str = "reduce_scatter_along"):
    """This rank's part (along ``axis``) of the sum of ``x`` over the group."""
    axis = _axis(where, x, axis)
    k = _divisible(where, x, axis, group)
    if group.size == 1:
        return x
    out = group.reduce_scatter(_to_front(x, axis), op="sum", counts=[k] * group.size)
    return _from_front(out, axis)


def allreduce_sum(x, group: Communicator, where: str = "allreduce_sum", name: str = "x"):
    check_array(where, name, x)
    if group.size == 1:
        return x
    return group.allreduce(x, op="sum")


def _check_group(where: str, group) -> Communicator:
    if not isinstance(group, Communicator):
        raise TypeError(f"{where}: group must be a pycollect Communicator, got {type(group).__name__}")
    return group


def allreduce_partial_grads(grads: list, group: Communicator) -> None:
    """Sum every array of ``grads`` over the group in place, with one allreduce of them packed flat.

    Every rank of the group passes arrays of the same shapes in the same order, all of one dtype.
    A group of one and an empty list communicate nothing.
    """
    where = "allreduce_partial_grads"
    _check_group(where, group)
    grads = list(grads)
    for i, g in enumerate(grads):
        array_module(g)  # TypeError for non-arrays
        if g.dtype != grads[0].dtype:
            raise TypeError(f"{where}: grads[{i}] has dtype {g.dtype}, expected {grads[0].dtype} "
                            f"(the dtype of grads[0]; one packed buffer holds one dtype)")
        if not getattr(g.flags, "writeable", True):   # checked before any is written: all or none
            raise ValueError(f"{where}: grads[{i}] is read-only; the summed gradient is written into it")
    if not grads or group.size == 1:
        return
    xp = array_module(grads[0])
    flat = xp.concatenate([g.reshape(-1) for g in grads])  # (sum of the sizes,), a new buffer
    group.allreduce(flat, op="sum", out=flat)
    offset = 0
    for g in grads:
        g[...] = flat[offset:offset + g.size].reshape(g.shape)
        offset += g.size


# -- the pairs ----------------------------------------------------------------------------------------
class _Pair:
    def __init__(self, group: Communicator):
        self.group = _check_group(type(self).__name__, group)

    def __call__(self, x):
        return self.forward(x)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(group of {self.group.size})"


class copy_to_group(_Pair):
    """Forward: identity (each rank holds the full input). Backward: all-reduce of the gradients."""

    def forward(self, x):
        check_array("copy_to_group.forward", "x", x)
        return x

    def backward(self, dy):
        return allreduce_sum(dy, self.group, "copy_to_group.backward", "dy")


class reduce_from_group(_Pair):
    """Forward: all-reduce of the partial sums. Backward: identity."""

    def forward(self, x):
        return allreduce_sum(x, self.group, "reduce_from_group.forward")

    def backward(self, dy):
        check_array("reduce_from_group.backward", "dy", dy)
        return dy


class scatter_to_group(_Pair):
    """Forward: keep this rank's part of the last axis (..., C) -> (..., C/n). Backward: all-gather it back."""

    def forward(self, x):
        return split_along(x, -1, self.group, "scatter_to_group.forward")  # (..., C/n)

    def backward(self, dy):
        return allgather_along(dy, -1, self.group, "scatter_to_group.backward")  # (..., C)


class gather_from_group(_Pair):
    """Forward: all-gather the last axis (..., C/n) -> (..., C). Backward: keep this rank's part."""

    def forward(self, x):
        return allgather_along(x, -1, self.group, "gather_from_group.forward")  # (..., C)

    def backward(self, dy):
        return split_along(dy, -1, self.group, "gather_from_group.backward")  # (..., C/n)


class _SequencePair(_Pair):
    def __init__(self, group: Communicator, seq_axis: int = 1):
        super().__init__(group)
        if isinstance(seq_axis, bool) or not isinstance(seq_axis, (int, np.integer)):
            raise TypeError(f"{type(self).__name__}: seq_axis must be an integer, got {seq_axis!r}")
        self.seq_axis = int(seq_axis)


class scatter_to_sequence(_SequencePair):
    """Forward: keep this rank's part of the sequence (B, T, C) -> (B, T/n, C). Backward: all-gather along T."""

    def forward(self, x):
        return split_along(x, self.seq_axis, self.group, "scatter_to_sequence.forward")  # (B, T/n, C)

    def backward(self, dy):
        return allgather_along(dy, self.seq_axis, self.group, "scatter_to_sequence.backward")  # (B, T, C)


class gather_from_sequence(_SequencePair):
    """Forward: all-gather along T (B, T/n, C) -> (B, T, C). Backward: reduce-scatter along T."""

    def forward(self, x):
        return allgather_along(x, self.seq_axis, self.group, "gather_from_sequence.forward")  # (B, T, C)

    def backward(self, dy):
        return reduce_scatter_along(dy, self.seq_axis, self.group, "gather_from_sequence.backward")  # (B, T/n, C)


class reduce_scatter_to_sequence(_SequencePair):
    """Forward: reduce-scatter along T (B, T, C) -> (B, T/n, C). Backward: all-gather along T."""

    def forward(self, x):
        return reduce_scatter_along(x, self.seq_axis, self.group, "reduce_scatter_to_sequence.forward")  # (B, T/n, C)

    def backward(self, dy):
        return allgather_along(dy, self.seq_axis, self.group, "reduce_scatter_to_sequence.backward")  # (B, T, C)

"""Tensor (intra-layer) parallelism: Linear split by columns or rows, and the MLP built from the two.

``ColumnParallelLinear`` splits the weight by output columns: rank r of a group of p holds
``w[:, r*C_out/p:(r+1)*C_out/p]``. Its input is replicated; backward allreduces the input gradient
(copy_to_group: identity forward / allreduce backward). ``RowParallelLinear`` splits the weight by
input rows; its input is split along the last axis, forward allreduces the partial products
(reduce_from_group: allreduce forward / identity backward) and adds the replicated bias once.
``ParallelMLP`` puts the two around a GeLU: one allreduce forward, one backward (Megatron-LM).

Every class takes its group (a ``pycollect.Communicator``) explicitly and keeps ``params`` and
``grads`` of its own shards as ``pycollect.nn`` layers do; ``full_grads()`` gathers the shards into the
full gradients, named and shaped as ``from_full`` takes the full parameters. Shards of NumPy or CuPy.
"""
from __future__ import annotations

from ..nn._base import Layer, check_float, check_same_dtype, check_shape
from ..nn.activation import _check_approx, gelu_backward, gelu_forward
from ..nn.linear import linear_backward, linear_forward, linear_params
from .mappings import allgather_along, copy_to_group, gather_from_group, reduce_from_group, scatter_to_group

__all__ = ["ColumnParallelLinear", "RowParallelLinear", "ParallelMLP"]




def _shard(where: str, dim: str, size: int, group) -> int:
    """``size // group.size``; ValueError naming the dimension unless it divides evenly."""
    if size % group.size:
        raise ValueError(f"{where}: {dim} = {size} does not divide by the group size {group.size} "
                         f"(rank {group.rank})")
    return size // group.size


def _check_full(where: str, params: dict, shapes: dict) -> None:
    """``params`` holds exactly the names of ``shapes`` (None: optional), float arrays of those shapes."""
    missing = [k for k, s in shapes.items() if s is not None and k not in params]
    extra = [k for k in params if k not in shapes]
    if missing or extra:
        raise ValueError(f"{where}: params has names {sorted(params)}, expected {sorted(shapes)}"
                         f" (missing {missing}, unexpected {extra})")
    for k in params:
        check_float(where, k, params[k])


class ColumnParallelLinear(Layer):
    """y = x @ w + b with w (C_in, C_out) split by output columns: params ``w`` (C_in, C_out/p), ``b`` (C_out/p,).

    ``gather_output`` allgathers y along its last axis to (..., C_out); otherwise y stays (..., C_out/p).
    """

    def __init__(self, w_shard, b_shard, group, gather_output: bool = False):
        super().__init__(linear_params("ColumnParallelLinear", w_shard, b_shard, "w_shard", "b_shard"))
        self.group = group
        self.gather_output = gather_output
        self._copy, self._gather = copy_to_group(group), gather_from_group(group)

    @classmethod
    def from_full(cls, params: dict, group, gather_output: bool = False) -> "ColumnParallelLinear":
        """This rank's shard of full ``{"w": (C_in, C_out), "b": (C_out,)}`` (``b`` optional); copies."""
        _check_full("ColumnParallelLinear.from_full", params, {"w": (None, None), "b": None})
        w, b = params["w"], params.get("b")
        check_shape("ColumnParallelLinear.from_full", "w", w, (None, None))
        if b is not None:
            check_shape("ColumnParallelLinear.from_full", "b", b, (w.shape[1],))
        n = _shard("ColumnParallelLinear", "C_out (w.shape[1])", w.shape[1], group)
        lo = group.rank * n
        w_shard = w[:, lo:lo + n].copy()  # (C_in, C_out/p), C-contiguous
        b_shard = None if b is None else b[lo:lo + n].copy()  # (C_out/p,)
        return cls(w_shard, b_shard, group, gather_output)

    def forward(self, x):
        """x (..., C_in) replicated over the group -> (..., C_out/p), or (..., C_out) with gather_output."""
        w = self.params["w"]  # (C_in, C_out/p)
        check_float("ColumnParallelLinear.forward", "x", x)
        check_shape("ColumnParallelLinear.forward", "x", x, (..., w.shape[0]))
        check_same_dtype("ColumnParallelLinear.forward", "x", x, "w", w)
        self.cache = x = self._copy.forward(x)  # (..., C_in), identity
        y = linear_forward(x, w, self.params.get("b"))  # (..., C_out/p)
        return self._gather.forward(y) if self.gather_output else y

    def backward(self, dy):
        """dy (..., C_out/p), or (..., C_out) replicated with gather_output -> dx (..., C_in), allreduced."""
        x = self._take_cache("ColumnParallelLinear.backward")
        w = self.params["w"]
        c_out = w.shape[1] * (self.group.size if self.gather_output else 1)
        check_shape("ColumnParallelLinear.backward", "dy", dy, x.shape[:-1] + (c_out,))
        if self.gather_output:
            dy = self._gather.backward(dy)  # (..., C_out/p)
        dx, dw, db = linear_backward(dy, x, w)  # dx (..., C_in) partial over the group
        self.grads["w"] += dw
        if "b" in self.grads:
            self.grads["b"] += db
        return self._copy.backward(dx)  # allreduce  # (..., C_in)

    def full_grads(self) -> dict:
        """``{"w": (C_in, C_out), "b": (C_out,)}`` gathered from every rank's shard gradients (collective)."""
        full = {"w": allgather_along(self.grads["w"], -1, self.group)}  # (C_in, C_out)
        if "b" in self.grads:
            full["b"] = allgather_along(self.grads["b"], -1, self.group)  # (C_out,)
        return full


class RowParallelLinear(Layer):
    """y = x @ w + b with w (C_in, C_out) split by input rows: params ``w`` (C_in/p, C_out), ``b`` (C_out,) replicated.

    With ``input_is_parallel`` x comes split along its last axis (..., C_in/p), as a
    ColumnParallelLinear leaves it; otherwise x is replicated (..., C_in) and each rank takes its block.
    """

    def __init__(self, w_shard, b, group, input_is_parallel: bool = True):
        super().__init__(linear_params("RowParallelLinear", w_shard, b, "w_shard", "b"))
        self.group = group
        self.input_is_parallel = input_is_parallel
        self._scatter, self._reduce = scatter_to_group(group), reduce_from_group(group)

    @classmethod
    def from_full(cls, params: dict, group, input_is_parallel: bool = True) -> "RowParallelLinear":
        """This rank's shard of full ``{"w": (C_in, C_out), "b": (C_out,)}`` (``b`` optional); copies."""
        _check_full("RowParallelLinear.from_full", params, {"w": (None, None), "b": None})
        w, b = params["w"], params.get("b")
        check_shape("RowParallelLinear.from_full", "w", w, (None, None))
        if b is not None:
            check_shape("RowParallelLinear.from_full", "b", b, (w.shape[1],))
        n = _shard("RowParallelLinear", "C_in (w.shape[0])", w.shape[0], group)
        lo = group.rank * n
        w_shard = w[lo:lo + n].copy()  # (C_in/p, C_out)
        return cls(w_shard, None if b is None else b.copy(), group, input_is_parallel)

    def forward(self, x):
        """x (..., C_in/p) (or (..., C_in) replicated) -> y (..., C_out) replicated: one allreduce."""
        w = self.params["w"]  # (C_in/p, C_out)
        check_float("RowParallelLinear.forward", "x", x)
        c_in = w.shape[0] * (1 if self.input_is_parallel else self.group.size)
        check_shape("RowParallelLinear.forward", "x", x, (..., c_in))
        check_same_dtype("RowParallelLinear.forward", "x", x, "w", w)
        if not self.input_is_parallel:
            x = self._scatter.forward(x)  # (..., C_in/p)
        self.cache = x  # (..., C_in/p)
        y = self._reduce.forward(linear_forward(x, w))  # allreduce  # (..., C_out)
        if "b" in self.params:
            y += self.params["b"]  # once, after the reduction
        return y

    def backward(self, dy):
        """dy (..., C_out) replicated -> dx (..., C_in/p) (or (..., C_in) gathered when the input was replicated)."""
        x = self._take_cache("RowParallelLinear.backward")
        w = self.params["w"]
        check_shape("RowParallelLinear.backward", "dy", dy, x.shape[:-1] + (w.shape[1],))
        dy = self._reduce.backward(dy)  # identity
        dx, dw, db = linear_backward(dy, x, w)  # dx (..., C_in/p); db (C_out,) full on every rank
        self.grads["w"] += dw
        if "b" in self.grads:
            self.grads["b"] += db
        return dx if self.input_is_parallel else self._scatter.backward(dx)  # allgather

    def full_grads(self) -> dict:
        """``{"w": (C_in, C_out), "b": (C_out,)}``: the row shards gathered (collective), ``b`` copied."""
        w = self.grads["w"]  # (C_in/p, C_out)
        full = {"w": self.group.allgather(w, counts=[w.shape[0]] * self.group.size)}  # (C_in, C_out)
        if "b" in self.grads:
            full["b"] = self.grads["b"].copy()  # (C_out,)
        return full


class ParallelMLP(Layer):
    """y = gelu(x @ w1 + b1) @ w2 + b2: w1 split by columns, w2 by rows; one allreduce each way.

    ``params``/``grads`` name this rank's shards ``w1`` (C, F/p), ``b1`` (F/p,), ``w2`` (F/p, C), ``b2`` (C,);
    they are the arrays of the two sublayers ``fc`` and ``proj``.
    """

    def __init__(self, fc: ColumnParallelLinear, proj: RowParallelLinear, approximate: str = "tanh"):
        _check_approx("ParallelMLP", approximate)
        if fc.gather_output or not proj.input_is_parallel:
            raise ValueError("ParallelMLP: fc must have gather_output=False and proj input_is_parallel=True")
        if "b" not in fc.params or "b" not in proj.params:
            raise ValueError("ParallelMLP: fc and proj must both have a bias")
        if fc.group is not proj.group:
            raise ValueError("ParallelMLP: fc and proj must share one group")
        self.fc, self.proj, self.approximate, self.group = fc, proj, approximate, fc.group
        self.params = {"w1": fc.params["w"], "b1": fc.params["b"], "w2": proj.params["w"], "b2": proj.params["b"]}
        self.grads = {"w1": fc.grads["w"], "b1": fc.grads["b"], "w2": proj.grads["w"], "b2": proj.grads["b"]}
        self.cache = None

    @classmethod
    def from_full(cls, params: dict, group, approximate: str = "tanh") -> "ParallelMLP":
        """From full ``{"w1": (C, F), "b1": (F,), "w2": (F, C), "b2": (C,)}``, the same on every rank."""
        where = "ParallelMLP.from_full"
        _check_full(where, params, {"w1": (None, None), "b1": (None,), "w2": (None, None), "b2": (None,)})
        w1 = params["w1"]
        check_shape(where, "w1", w1, (None, None))
        c, f = w1.shape
        check_shape(where, "b1", params["b1"], (f,))
        check_shape(where, "w2", params["w2"], (f, c))
        check_shape(where, "b2", params["b2"], (c,))
        _shard("ParallelMLP", "F (the hidden width, w1.shape[1])", f, group)
        fc = ColumnParallelLinear.from_full({"w": w1, "b": params["b1"]}, group)
        proj = RowParallelLinear.from_full({"w": params["w2"], "b": params["b2"]}, group)
        return cls(fc, proj, approximate)

    def forward(self, x):
        """x (B, T, C) replicated over the group -> y (B, T, C) replicated."""
        h = self.fc.forward(x)  # (B, T, F/p)
        self.cache = h
        a = gelu_forward(h, self.approximate)  # (B, T, F/p)
        return self.proj.forward(a)  # (B, T, C): the forward allreduce

    def backward(self, dy):
        """dy (B, T, C) replicated -> dx (B, T, C) replicated; shard gradients added into ``grads``."""
        h = self._take_cache("ParallelMLP.backward")  # (B, T, F/p)
        da = self.proj.backward(dy)  # (B, T, F/p)
        dh = gelu_backward(da, h, self.approximate)  # (B, T, F/p)
        return self.fc.backward(dh)  # (B, T, C): the backward allreduce

    def full_grads(self) -> dict:
        """``{"w1": (C, F), "b1": (F,), "w2": (F, C), "b2": (C,)}`` gathered over the group (collective)."""
        g1, g2 = self.fc.full_grads(), self.proj.full_grads()
        return {"w1": g1["w"], "b1": g1["b"], "w2": g2["w"], "b2": g2["b"]}

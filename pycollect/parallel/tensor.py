"""Tensor (intra-layer) parallelism: Linear split by columns or rows, and the MLP built from the two.

``ColumnParallelLinear`` splits the weight by output columns: rank r of a group of p holds
``w[:, r*C_out/p:(r+1)*C_out/p]``. Its input is replicated; backward allreduces the input gradient
(copy_to_group: identity forward / allreduce backward). ``RowParallelLinear`` splits the weight by
input rows; its input is split along the last axis, forward allreduces the partial products
(reduce_from_group: allreduce forward / identity backward) and adds the replicated bias once.
``ParallelMLP`` puts the two around a GeLU: one allreduce forward, one backward (Megatron-LM).

Sequence parallelism (``sequence_parallel=True``, Megatron-LM's, Korthikanti et al. 2022): outside
the tensor-parallel region the activations are split along the sequence, x (B, T/p, C) on each rank,
rank r holding positions r*T/p:(r+1)*T/p, so the LayerNorms and residual adds around the layers
work on a p-th of the tokens. The column layer then allgathers its input along T
(gather_from_sequence: allgather forward / reduce-scatter backward) in place of copy_to_group, and
the row layer reduce-scatters its partial products along T (reduce_scatter_to_sequence:
reduce-scatter forward / allgather backward) in place of the allreduce, adding the bias after it.
An allreduce is a reduce-scatter plus an allgather, so the traffic stays the same: the MLP runs one
allgather and one reduce-scatter each way, and no allreduce. The column layer keeps the gathered
input for its weight gradient (Megatron gathers it again in backward to save memory).

Gradients of a replicated parameter applied to the sequence shard (the row layer's bias; the
LayerNorms and ``wpe`` elsewhere) hold only this rank's tokens' share: every layer names them in
``partial_grads`` (empty without sequence parallelism), and they must be summed over the group to
be the gradient of the loss (``mappings.allreduce_partial_grads``, one packed allreduce; Megatron's
finalize_model_grads).

Every class takes its group (a ``pycollect.Communicator``) explicitly and keeps ``params`` and
``grads`` of its own shards as ``pycollect.nn`` layers do; ``full_grads()`` gathers the shards into the
full gradients, named and shaped as ``from_full`` takes the full parameters, and sums the partial
ones over the group (one allreduce for all of them). Shards of NumPy or CuPy.
"""
from __future__ import annotations

from ..nn._base import ForWeight, Layer, check_bool, check_float, check_same_dtype, check_shape
from ..nn.activation import _check_approx, gelu_backward, gelu_forward
from ..nn.linear import linear_backward_input, linear_backward_weight, linear_forward, linear_params
from .agree import OwnChecks, agree_equal_shards, agree_full, check_group
from .mappings import (allgather_along, allreduce_partial_grads, copy_to_group, gather_from_group,
                       gather_from_sequence, reduce_from_group, reduce_scatter_to_sequence, scatter_to_group)

__all__ = ["ColumnParallelLinear", "RowParallelLinear", "ParallelMLP"]


def _shard(where: str, dim: str, size: int, group) -> int:
    """``size // group.size``; ValueError naming the dimension unless it divides evenly."""
    if size % group.size:
        raise ValueError(f"{where}: {dim} = {size} does not divide by the group size {group.size} "
                         f"(rank {group.rank})")
    return size // group.size


def _seq_shard(where: str, name: str, x, group) -> int:
    """T/p for ``x`` of shape (B, T, ...); ValueError naming T and the group size unless p divides T."""
    return _shard(where, f"T (the sequence length, {name}.shape[1])", x.shape[1], group)


def gathered(x, axis: int, group):
    """Every rank's ``x`` concatenated along ``axis``: always a new array (a copy on a group of one).

    The lengths along ``axis`` are exchanged (an allgather of one int each), so shards built by hand of
    different widths concatenate as they are; this gathers whole parameters and gradients, not a step's
    activations (those go through ``allgather_along``, equal lengths, no exchange)."""
    out = allgather_along(x, axis, group, exchange=True)
    return out.copy() if out is x else out


def _sum_partial(full: dict, names: tuple, group, sum_partial: bool) -> dict:
    """``full`` with its entries ``names`` (copies of partial gradients) summed over the group in place."""
    if sum_partial:
        allreduce_partial_grads([full[k] for k in names], group)  # one allreduce of them all, packed
    return full


def _check_full(where: str, params: dict, shapes: dict) -> None:
    """``params`` holds exactly the names of ``shapes`` (None: optional), float arrays of those shapes."""
    missing = [k for k, s in shapes.items() if s is not None and k not in params]
    extra = [k for k in params if k not in shapes]
    if missing or extra:
        raise ValueError(f"{where}: params has names {sorted(params)}, expected {sorted(shapes)}"
                         f" (missing {missing}, unexpected {extra})")
    for k in params:
        check_float(where, k, params[k])


def _full_linear(name: str, params: dict, group, axis: int, dim: str, flags: dict):
    """(w, b, this rank's width along ``axis``) of full ``{"w": (C_in, C_out), "b": (C_out,)}``, checked here and
    agreed with the settings ``flags`` (name -> True or False) over ``group`` (a rank's own refused arguments
    raised after the agreement)."""
    where = f"{name}.from_full"
    check_group(where, group)
    w = b = None
    n = 0
    with OwnChecks() as own:
        for flag, value in flags.items():
            check_bool(where, flag, value)
        _check_full(where, params, {"w": (None, None), "b": None})
        w, b = params["w"], params.get("b")
        check_shape(where, "w", w, (None, None))
        if b is not None:
            check_shape(where, "b", b, (w.shape[1],))
        n = _shard(name, dim, w.shape[axis], group)
    agree_full(where, params, ", ".join(f"{flag} {bool(value)}" for flag, value in flags.items()), group, own.failed)
    return w, b, n


class ColumnParallelLinear(Layer):
    """y = x @ w + b with w (C_in, C_out) split by output columns: params ``w`` (C_in, C_out/p), ``b`` (C_out/p,).

    ``gather_output`` allgathers y along its last axis to (..., C_out); otherwise y stays (..., C_out/p).
    With ``sequence_parallel`` x is this rank's sequence shard (B, T/p, C_in), allgathered along T to
    (B, T, C_in) before the product, and dx is reduce-scattered back to (B, T/p, C_in).
    """

    partial_grads = ()  # the bias is a column shard over every token: no gradient is partial

    def __init__(self, w_shard, b_shard, group, gather_output: bool = False, sequence_parallel: bool = False,
                 equal_shards: bool = False):
        """``equal_shards``: the caller knows every rank's ``w_shard`` has C_out/p columns (``from_full``); else,
        with ``gather_output``, the first forward agrees the widths (one allgather of an int) and refuses uneven
        ones, whose gathered output and split gradient need equal widths. Without ``gather_output`` shards of any
        width work: each rank's output columns are its own."""
        super().__init__(linear_params("ColumnParallelLinear", w_shard, b_shard, "w_shard", "b_shard"))
        gather_output = check_bool("ColumnParallelLinear", "gather_output", gather_output)
        sequence_parallel = check_bool("ColumnParallelLinear", "sequence_parallel", sequence_parallel)
        equal_shards = check_bool("ColumnParallelLinear", "equal_shards", equal_shards)
        if gather_output and sequence_parallel:
            raise ValueError("ColumnParallelLinear: gather_output=True cannot be combined with "
                             "sequence_parallel=True (the output is split along C_out, the input along T)")
        self.group = group
        self.gather_output, self.sequence_parallel = bool(gather_output), bool(sequence_parallel)
        self._copy = gather_from_sequence(group) if sequence_parallel else copy_to_group(group)
        self._gather = gather_from_group(group)
        self._shards_agreed = bool(equal_shards) or not self.gather_output

    @classmethod
    def from_full(cls, params: dict, group, gather_output: bool = False,
                  sequence_parallel: bool = False) -> "ColumnParallelLinear":
        """This rank's shard of full ``{"w": (C_in, C_out), "b": (C_out,)}`` (``b`` optional); copies."""
        w, b, n = _full_linear("ColumnParallelLinear", params, group, 1, "C_out (w.shape[1])",
                               {"gather_output": gather_output, "sequence_parallel": sequence_parallel})
        lo = group.rank * n
        w_shard = w[:, lo:lo + n].copy()  # (C_in, C_out/p), C-contiguous
        b_shard = None if b is None else b[lo:lo + n].copy()  # (C_out/p,)
        return cls(w_shard, b_shard, group, gather_output, sequence_parallel, equal_shards=True)

    def forward(self, x):
        """x (..., C_in) replicated over the group -> (..., C_out/p), or (..., C_out) with gather_output.

        With sequence_parallel: x (B, T/p, C_in) this rank's part of the sequence -> (B, T, C_out/p).
        """
        w = self.params["w"]  # (C_in, C_out/p)
        check_float("ColumnParallelLinear.forward", "x", x)
        check_shape("ColumnParallelLinear.forward", "x", x,
                    (None, None, w.shape[0]) if self.sequence_parallel else (..., w.shape[0]))
        check_same_dtype("ColumnParallelLinear.forward", "x", x, "w", w)
        if not self._shards_agreed:
            agree_equal_shards("ColumnParallelLinear.forward", "C_out (w_shard.shape[1])", w.shape[1], self.group)
            self._shards_agreed = True
        # identity (..., C_in), or with sequence_parallel the allgather along T (B, T, C_in)
        self.cache = x = self._copy.forward(x)
        y = linear_forward(x, w, self.params.get("b"))  # (..., C_out/p)
        return self._gather.forward(y) if self.gather_output else y

    def backward_input(self, dy):
        """dy (..., C_out/p), or (..., C_out) replicated with gather_output -> dx (..., C_in), allreduced.

        With sequence_parallel: dy (B, T, C_out/p) -> dx (B, T/p, C_in), reduce-scattered along T.
        B holds every communication of the backward; it keeps (x, dy) for W, which sends nothing.
        """
        x = self._take_cache("ColumnParallelLinear.backward")
        w = self.params["w"]
        c_out = w.shape[1] * (self.group.size if self.gather_output else 1)
        check_shape("ColumnParallelLinear.backward", "dy", dy, x.shape[:-1] + (c_out,))
        check_same_dtype("ColumnParallelLinear.backward", "dy", dy, "w", w)
        if self.gather_output:
            dy = self._gather.backward(dy)  # (..., C_out/p)
        self.cache = ForWeight((x, dy))
        dx = linear_backward_input(dy, w)  # (..., C_in) partial over the group
        # allreduce (..., C_in), or with sequence_parallel the reduce-scatter along T (B, T/p, C_in)
        return self._copy.backward(dx)

    def backward_weight(self) -> None:
        """This rank's shard gradients from its own columns: no communication."""
        x, dy = self._take_for_weight("ColumnParallelLinear.backward_weight")
        dw, db = linear_backward_weight(dy, x)  # (C_in, C_out/p), (C_out/p,)
        self.grads["w"] += dw
        if "b" in self.grads:
            self.grads["b"] += db

    def _whole(self, which: str) -> dict:
        """``which`` ("params" or "grads") gathered whole: {"w": (C_in, C_out), "b": (C_out,)} (collective)."""
        d = getattr(self, which)
        full = {"w": gathered(d["w"], -1, self.group)}  # (C_in, C_out)
        if "b" in d:
            full["b"] = gathered(d["b"], -1, self.group)  # (C_out,)
        return full

    def full_grads(self, sum_partial: bool = True) -> dict:
        """``{"w": (C_in, C_out), "b": (C_out,)}`` gathered from every rank's shard gradients (collective).

        No gradient of this layer is partial; ``sum_partial`` is taken for a uniform signature.
        """
        check_bool("ColumnParallelLinear.full_grads", "sum_partial", sum_partial)
        return self._whole("grads")

    def full_params(self) -> dict:
        """The full weights, named and shaped as ``from_full`` takes them (collective; new arrays)."""
        return self._whole("params")


class RowParallelLinear(Layer):
    """y = x @ w + b with w (C_in, C_out) split by input rows: params ``w`` (C_in/p, C_out), ``b`` (C_out,) replicated.

    With ``input_is_parallel`` x comes split along its last axis (..., C_in/p), as a
    ColumnParallelLinear leaves it; otherwise x is replicated (..., C_in) and each rank takes its block.
    With ``sequence_parallel`` (which needs ``input_is_parallel``) x (B, T, C_in/p) and the output is
    reduce-scattered along T to this rank's (B, T/p, C_out), the bias added to it; the gradient of
    ``b`` is then partial (this rank's tokens only) and named in ``partial_grads``.
    """

    def __init__(self, w_shard, b, group, input_is_parallel: bool = True, sequence_parallel: bool = False):
        super().__init__(linear_params("RowParallelLinear", w_shard, b, "w_shard", "b"))
        input_is_parallel = check_bool("RowParallelLinear", "input_is_parallel", input_is_parallel)
        sequence_parallel = check_bool("RowParallelLinear", "sequence_parallel", sequence_parallel)
        if sequence_parallel and not input_is_parallel:
            raise ValueError("RowParallelLinear: sequence_parallel=True needs input_is_parallel=True "
                             "(the input split along C_in, as a ColumnParallelLinear leaves it)")
        self.group = group
        self.input_is_parallel, self.sequence_parallel = bool(input_is_parallel), bool(sequence_parallel)
        self._scatter = scatter_to_group(group)
        self._reduce = reduce_scatter_to_sequence(group) if sequence_parallel else reduce_from_group(group)

    @property
    def partial_grads(self) -> tuple:
        """``("b",)`` with sequence_parallel and a bias: each rank's ``b`` gradient covers its T/p tokens."""
        return ("b",) if self.sequence_parallel and "b" in self.grads else ()

    @classmethod
    def from_full(cls, params: dict, group, input_is_parallel: bool = True,
                  sequence_parallel: bool = False) -> "RowParallelLinear":
        """This rank's shard of full ``{"w": (C_in, C_out), "b": (C_out,)}`` (``b`` optional); copies."""
        w, b, n = _full_linear("RowParallelLinear", params, group, 0, "C_in (w.shape[0])",
                               {"input_is_parallel": input_is_parallel, "sequence_parallel": sequence_parallel})
        lo = group.rank * n
        w_shard = w[lo:lo + n].copy()  # (C_in/p, C_out)
        return cls(w_shard, None if b is None else b.copy(), group, input_is_parallel, sequence_parallel)

    def forward(self, x):
        """x (..., C_in/p) (or (..., C_in) replicated) -> y (..., C_out) replicated: one allreduce.

        With sequence_parallel: x (B, T, C_in/p) -> y (B, T/p, C_out), this rank's part of the
        sequence: one reduce-scatter along T (ValueError unless the group size divides T).
        """
        where, w = "RowParallelLinear.forward", self.params["w"]  # (C_in/p, C_out)
        check_float(where, "x", x)
        c_in = w.shape[0] * (1 if self.input_is_parallel else self.group.size)
        check_shape(where, "x", x, (None, None, c_in) if self.sequence_parallel else (..., c_in))
        check_same_dtype(where, "x", x, "w", w)
        if self.sequence_parallel:
            _seq_shard(where, "x", x, self.group)
        if not self.input_is_parallel:
            x = self._scatter.forward(x)  # (..., C_in/p)
        self.cache = x  # (..., C_in/p)
        # allreduce (..., C_out), or with sequence_parallel the reduce-scatter along T (B, T/p, C_out)
        y = self._reduce.forward(linear_forward(x, w))
        if "b" in self.params:
            y += self.params["b"]  # once, after the reduction
        return y

    def backward_input(self, dy):
        """dy (..., C_out) replicated -> dx (..., C_in/p) (or (..., C_in) gathered when the input was replicated).

        With sequence_parallel: dy (B, T/p, C_out) this rank's part, allgathered along T -> dx (B, T, C_in/p).
        B holds every communication of the backward; it keeps (x, dy gathered, dy) for W.
        """
        x = self._take_cache("RowParallelLinear.backward")
        w = self.params["w"]
        t = x.shape[1] // self.group.size if self.sequence_parallel else None  # T/p
        want = (x.shape[0], t, w.shape[1]) if self.sequence_parallel else x.shape[:-1] + (w.shape[1],)
        check_shape("RowParallelLinear.backward", "dy", dy, want)
        check_same_dtype("RowParallelLinear.backward", "dy", dy, "w", w)
        dy_full = self._reduce.backward(dy)  # identity (..., C_out), or the allgather along T (B, T, C_out)
        self.cache = ForWeight((x, dy_full, dy))
        dx = linear_backward_input(dy_full, w)  # (..., C_in/p)
        return dx if self.input_is_parallel else self._scatter.backward(dx)  # allgather

    def backward_weight(self) -> None:
        """This rank's row shard's gradient, and the bias's: no communication."""
        x, dy_full, dy = self._take_for_weight("RowParallelLinear.backward_weight")
        dw, db = linear_backward_weight(dy_full, x)  # (C_in/p, C_out); db (C_out,) over every token
        self.grads["w"] += dw
        if "b" in self.grads:
            # with sequence_parallel the bias was added to this rank's tokens only: their share (partial)
            self.grads["b"] += dy.reshape(-1, dw.shape[1]).sum(axis=0) if self.sequence_parallel else db

    def _whole(self, which: str) -> dict:
        """``which`` gathered whole: the row shards of ``w`` concatenated, ``b`` copied (collective)."""
        d = getattr(self, which)
        full = {"w": gathered(d["w"], 0, self.group)}  # (C_in, C_out)
        if "b" in d:
            full["b"] = d["b"].copy()  # (C_out,)
        return full

    def full_grads(self, sum_partial: bool = True) -> dict:
        """``{"w": (C_in, C_out), "b": (C_out,)}``: the row shards gathered (collective), ``b`` copied.

        With sequence_parallel ``b`` is summed over the group; ``sum_partial=False`` copies it as it is.
        """
        check_bool("RowParallelLinear.full_grads", "sum_partial", sum_partial)   # before the gathers
        return _sum_partial(self._whole("grads"), self.partial_grads, self.group, sum_partial)

    def full_params(self) -> dict:
        return self._whole("params")


def check_column_row(where: str, col_name: str, col: ColumnParallelLinear, row_name: str,
                     row: RowParallelLinear) -> None:
    """ValueError unless ``col`` then ``row`` make one Megatron pair: the column's output left split,
    the row's input taken split, one group, sequence parallelism in both or neither."""
    if col.gather_output or not row.input_is_parallel:
        raise ValueError(f"{where}: {col_name} must have gather_output=False and {row_name} input_is_parallel=True")
    if col.group is not row.group:
        raise ValueError(f"{where}: {col_name} and {row_name} must share one group")
    if col.sequence_parallel != row.sequence_parallel:
        raise ValueError(f"{where}: {col_name} has sequence_parallel={col.sequence_parallel} but {row_name} "
                         f"{row.sequence_parallel}; both or neither")


class ParallelMLP(Layer):
    """y = gelu(x @ w1 + b1) @ w2 + b2: w1 split by columns, w2 by rows; one allreduce each way.

    ``params``/``grads`` name this rank's shards ``w1`` (C, F/p), ``b1`` (F/p,), ``w2`` (F/p, C), ``b2`` (C,);
    they are the arrays of the two sublayers ``fc`` and ``proj``. With sequence parallelism (both
    sublayers built with it) x and y are (B, T/p, C): one allgather and one reduce-scatter each way,
    and the gradient of ``b2`` is partial.
    """

    def __init__(self, fc: ColumnParallelLinear, proj: RowParallelLinear, approximate: str = "tanh"):
        _check_approx("ParallelMLP", approximate)
        check_column_row("ParallelMLP", "fc", fc, "proj", proj)
        if "b" not in fc.params or "b" not in proj.params:
            raise ValueError("ParallelMLP: fc and proj must both have a bias")
        self.fc, self.proj, self.approximate, self.group = fc, proj, approximate, fc.group
        self.sequence_parallel = fc.sequence_parallel
        self.params = {"w1": fc.params["w"], "b1": fc.params["b"], "w2": proj.params["w"], "b2": proj.params["b"]}
        self.grads = {"w1": fc.grads["w"], "b1": fc.grads["b"], "w2": proj.grads["w"], "b2": proj.grads["b"]}
        self.cache = None

    @property
    def partial_grads(self) -> tuple:
        """``("b2",)`` with sequence parallelism, else ``()``."""
        return ("b2",) if self.proj.partial_grads else ()

    @classmethod
    def from_full(cls, params: dict, group, approximate: str = "tanh",
                  sequence_parallel: bool = False) -> "ParallelMLP":
        """From full ``{"w1": (C, F), "b1": (F,), "w2": (F, C), "b2": (C,)}``, the same on every rank."""
        where = "ParallelMLP.from_full"
        check_group(where, group)
        with OwnChecks() as own:
            _check_full(where, params, {"w1": (None, None), "b1": (None,), "w2": (None, None), "b2": (None,)})
            w1 = params["w1"]
            check_shape(where, "w1", w1, (None, None))
            c, f = w1.shape
            check_shape(where, "b1", params["b1"], (f,))
            check_shape(where, "w2", params["w2"], (f, c))
            check_shape(where, "b2", params["b2"], (c,))
            _shard("ParallelMLP", "F (the hidden width, w1.shape[1])", f, group)
            _check_approx(where, approximate)
            check_bool(where, "sequence_parallel", sequence_parallel)
        agree_full(where, params, f"approximate {approximate!r}, sequence_parallel {bool(sequence_parallel)}",
                   group, own.failed)
        fc = ColumnParallelLinear.from_full({"w": w1, "b": params["b1"]}, group,
                                            sequence_parallel=sequence_parallel)
        proj = RowParallelLinear.from_full({"w": params["w2"], "b": params["b2"]}, group,
                                           sequence_parallel=sequence_parallel)
        return cls(fc, proj, approximate)

    def forward(self, x):
        """x (B, T, C) replicated over the group -> y (B, T, C) replicated.

        With sequence parallelism: x (B, T/p, C) this rank's part of the sequence -> y (B, T/p, C).
        """
        h = self.fc.forward(x)  # (B, T, F/p): copy_to_group, or the allgather along T
        self.cache = h
        a = gelu_forward(h, self.approximate)  # (B, T, F/p)
        return self.proj.forward(a)  # (B, T, C) allreduced, or (B, T/p, C) reduce-scattered

    def backward_input(self, dy):
        """dy (B, T, C) replicated -> dx (B, T, C) replicated; the sublayers keep what their W need.

        With sequence parallelism: dy (B, T/p, C) -> dx (B, T/p, C).
        """
        h = self._take_cache("ParallelMLP.backward")  # (B, T, F/p)
        da = self.proj.backward_input(dy)  # (B, T, F/p): identity, or the allgather along T; checks dy
        self.cache = None   # only now: a dy refused above leaves the forward's cache for a second try
        dh = gelu_backward(da, h, self.approximate)  # (B, T, F/p)
        return self.fc.backward_input(dh)  # (B, T, C) allreduced, or (B, T/p, C) reduce-scattered

    def backward_weight(self) -> None:
        """Shard gradients added into ``grads`` (the sublayers' W): no communication."""
        self.proj.backward_weight()
        self.fc.backward_weight()

    def full_grads(self, sum_partial: bool = True) -> dict:
        """``{"w1": (C, F), "b1": (F,), "w2": (F, C), "b2": (C,)}`` gathered over the group (collective).

        ``b2`` partial (sequence parallelism) is summed over the group, or with ``sum_partial=False`` copied.
        """
        check_bool("ParallelMLP.full_grads", "sum_partial", sum_partial)   # before the gathers
        g1, g2 = self.fc.full_grads(), self.proj.full_grads(sum_partial)
        return {"w1": g1["w"], "b1": g1["b"], "w2": g2["w"], "b2": g2["b"]}

    def full_params(self) -> dict:
        """The full weights under ``from_full``'s names (collective; new arrays)."""
        p1, p2 = self.fc.full_params(), self.proj.full_params()
        return {"w1": p1["w"], "b1": p1["b"], "w2": p2["w"], "b2": p2["b"]}

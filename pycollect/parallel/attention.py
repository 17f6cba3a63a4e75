"""Tensor-parallel causal self-attention, and the pre-LayerNorm transformer block built on it.

``ParallelAttention`` splits the NH heads over the group: rank r of p owns heads
r*NH/p:(r+1)*NH/p. The QKV projection is column-parallel, but the full (C, 3*C) matrix is laid out
[q | k | v], so rank r's shard takes the columns of its heads from each of the three C-wide blocks
(three non-contiguous blocks of C/p columns) and stores them [q_r | k_r | v_r]. Each rank runs the
attention core on its own heads; the output projection is row-parallel over the same C/p rows.
Communication is Megatron-LM's: the input gradient is allreduced once (copy_to_group, inside the
column layer) and the output once (reduce_from_group, inside the row layer), the bias added after it.

``ParallelBlock`` is x + attn(ln1(x)), then + mlp(ln2(.)), with the LayerNorms replicated: their
inputs and the gradients reaching them are replicated, so their gradients agree on every rank.

With sequence parallelism (``sequence_parallel=True``, Megatron-LM's) the input and output are this
rank's part of the sequence, (B, T/p, C), rank r holding positions r*T/p:(r+1)*T/p. The LayerNorms
and residual adds run on that shard; the QKV layer allgathers its input along T (gather_from_sequence)
so each rank attends over the whole sequence with its own heads, and the output projection
reduce-scatters along T (reduce_scatter_to_sequence) instead of allreducing. Per block that is two
allgathers and two reduce-scatters of B*T*C elements forward, two reduce-scatters and two allgathers
backward, and no allreduce. The gradients of the LayerNorms and of ``b_proj`` and ``b2`` then cover
only this rank's tokens: ``partial_grads`` names them, and ``full_grads()`` sums them over the group
in one allreduce (``mappings.allreduce_partial_grads`` does the same in place, for training).
"""
from __future__ import annotations

from typing import Protocol

from ..nn._base import Layer, array_module, check_bool, check_float, check_shape
from ..nn.attention import attention_backward, attention_forward, merge_heads, split_heads
from ..nn.dropout import check_rate, dropout_mask
from ..nn.layernorm import LayerNorm
from .agree import OwnChecks, agree_full, as_text, check_group
from .mappings import allgather_along
from .tensor import (ColumnParallelLinear, ParallelMLP, RowParallelLinear, _check_full, _sum_partial,
                     check_column_row)

__all__ = ["ParallelAttention", "ParallelBlock"]


class MLPBranch(Protocol):
    """What a block needs of its MLP branch: a ``ParallelMLP``, or the experts' ``MoEBranch`` (pycollect.moe,
    which builds on this layer)."""

    params: dict
    grads: dict

    @property
    def partial_grads(self) -> tuple: ...

    def forward(self, x): ...

    def backward(self, dy): ...

    def backward_input(self, dy): ...

    def backward_weight(self) -> None: ...

    def full_grads(self, sum_partial: bool = ...) -> dict: ...

    def full_params(self) -> dict: ...


def _check_heads(where: str, c: int, nh: int, group) -> int:
    """NH/p, the heads of one rank; ValueError unless NH divides C and the group size divides NH."""
    if isinstance(nh, bool) or not isinstance(nh, int) or nh < 1 or c % nh:
        raise ValueError(f"{where}: nh = {nh!r} must be a positive integer dividing C = {c}")
    if nh % group.size:
        raise ValueError(f"{where}: NH = {nh} heads do not divide by the group size {group.size} "
                         f"(rank {group.rank})")
    return nh // group.size


def _qkv_shard(a, rank: int, p: int):
    """Rank ``rank``'s columns of each of q, k, v from full (..., 3*C): (..., 3*C/p) as [q_r | k_r | v_r]."""
    lead, c3 = a.shape[:-1], a.shape[-1]
    n = c3 // (3 * p)
    return a.reshape(*lead, 3, p, n)[..., rank, :].reshape(*lead, 3 * n).copy()


def _qkv_unshard(a, p: int):
    """Inverse of ``_qkv_shard`` over the group: (..., p*3*C/p) rank-major -> (..., 3*C) as [q | k | v]."""
    lead, c3 = a.shape[:-1], a.shape[-1]
    n = c3 // (3 * p)
    k = len(lead)
    perm = tuple(range(k)) + (k + 1, k, k + 2)  # (..., p, 3, n) -> (..., 3, p, n)
    return a.reshape(*lead, p, 3, n).transpose(perm).reshape(*lead, c3)


class ParallelAttention(Layer):
    """Causal self-attention with heads split over the group; one allreduce forward, one backward.

    ``params``/``grads`` name this rank's shards ``w_qkv`` (C, 3*C/p), ``b_qkv`` (3*C/p,),
    ``w_proj`` (C/p, C), ``b_proj`` (C,); they are the arrays of the sublayers ``qkv`` and ``proj``.
    With sequence parallelism (both sublayers built with it) x and y are (B, T/p, C): one allgather
    and one reduce-scatter each way, and the gradient of ``b_proj`` is partial.
    """

    def __init__(self, qkv: ColumnParallelLinear, proj: RowParallelLinear, nh: int):
        check_column_row("ParallelAttention", "qkv", qkv, "proj", proj)
        self.qkv, self.proj, self.group = qkv, proj, qkv.group
        self.sequence_parallel = qkv.sequence_parallel
        c = proj.params["w"].shape[1]
        self.nh_local = _check_heads("ParallelAttention", c, nh, self.group)
        self.nh = nh
        self.params = {"w_qkv": qkv.params["w"], "b_qkv": qkv.params["b"],
                       "w_proj": proj.params["w"], "b_proj": proj.params["b"]}
        self.grads = {"w_qkv": qkv.grads["w"], "b_qkv": qkv.grads["b"],
                      "w_proj": proj.grads["w"], "b_proj": proj.grads["b"]}
        self.cache = None

    @property
    def partial_grads(self) -> tuple:
        """``("b_proj",)`` with sequence parallelism, else ``()``."""
        return ("b_proj",) if self.proj.partial_grads else ()

    @classmethod
    def from_full(cls, params: dict, nh: int, group, sequence_parallel: bool = False) -> "ParallelAttention":
        """From full ``{"w_qkv": (C, 3*C), "b_qkv": (3*C,), "w_proj": (C, C), "b_proj": (C,)}``; copies."""
        where = "ParallelAttention.from_full"
        check_group(where, group)
        with OwnChecks() as own:
            _check_full(where, params, {"w_qkv": (None, None), "b_qkv": (None,), "w_proj": (None, None),
                                        "b_proj": (None,)})
            check_shape(where, "w_proj", params["w_proj"], (None, None))
            c = params["w_proj"].shape[0]
            check_shape(where, "w_qkv", params["w_qkv"], (c, 3 * c))
            check_shape(where, "b_qkv", params["b_qkv"], (3 * c,))
            check_shape(where, "w_proj", params["w_proj"], (c, c))
            check_shape(where, "b_proj", params["b_proj"], (c,))
            _check_heads(where, c, nh, group)
            check_bool(where, "sequence_parallel", sequence_parallel)
        agree_full(where, params, f"nh {as_text(nh)}, sequence_parallel {bool(sequence_parallel)}", group, own.failed)
        p, r = group.size, group.rank
        qkv = ColumnParallelLinear(_qkv_shard(params["w_qkv"], r, p),  # (C, 3*C/p)
                                   _qkv_shard(params["b_qkv"], r, p), group,  # (3*C/p,)
                                   sequence_parallel=sequence_parallel)
        proj = RowParallelLinear.from_full({"w": params["w_proj"], "b": params["b_proj"]}, group,
                                           sequence_parallel=sequence_parallel)
        return cls(qkv, proj, nh)

    def forward(self, x, drop=None):
        """x (B, T, C) replicated over the group -> y (B, T, C) replicated.

        With sequence parallelism: x (B, T/p, C) this rank's part of the sequence -> y (B, T/p, C).
        ``drop`` (B, NH/p, T, T): an optional dropout mask on this rank's heads' probabilities.
        """
        qkv = self.qkv.forward(x)  # (B, T, 3*C/p); copy_to_group, or the allgather along T, inside
        cl = qkv.shape[-1] // 3
        q, k, v = (split_heads(qkv[..., i * cl:(i + 1) * cl], self.nh_local) for i in range(3))  # (B, NH/p, T, HS)
        out, att = attention_forward(q, k, v, drop=drop)  # (B, NH/p, T, HS), (B, NH/p, T, T)
        self.cache = (q, k, v, att, drop)
        return self.proj.forward(merge_heads(out))  # (B, T, C) allreduced, or (B, T/p, C) reduce-scattered

    def backward_input(self, dy):
        """dy (B, T, C) replicated -> dx (B, T, C) replicated; the projections keep what their W need.

        With sequence parallelism: dy (B, T/p, C) -> dx (B, T/p, C).
        """
        q, k, v, att, drop = self._take_cache("ParallelAttention.backward")
        do = self.proj.backward_input(dy)  # (B, T, C/p): identity, or the allgather along T; checks dy
        self.cache = None  # q, k, v and the probabilities: W needs none of them (a dy refused above keeps them)
        dq, dk, dv = attention_backward(split_heads(do, self.nh_local), q, k, v, att, drop)  # (B, NH/p, T, HS)
        parts = [merge_heads(dq), merge_heads(dk), merge_heads(dv)]  # (B, T, C/p) each
        dqkv = array_module(q).concatenate(parts, axis=-1)  # (B, T, 3*C/p), [q_r | k_r | v_r]
        return self.qkv.backward_input(dqkv)  # (B, T, C) allreduced, or (B, T/p, C) reduce-scattered

    def backward_weight(self) -> None:
        """Shard gradients added into ``grads`` (the projections' W): no communication."""
        self.proj.backward_weight()
        self.qkv.backward_weight()

    def _whole(self, which: str, sum_partial: bool = False) -> dict:
        """``which`` ("params" or "grads") whole, named as ``from_full`` takes them, [q | k | v] (collective)."""
        p, d = self.group.size, getattr(self, which)
        w = allgather_along(d["w_qkv"], -1, self.group)  # (C, 3*C), rank-major
        b = allgather_along(d["b_qkv"], -1, self.group)  # (3*C,), rank-major
        g = self.proj.full_grads(sum_partial) if which == "grads" else self.proj.full_params()
        return {"w_qkv": _qkv_unshard(w, p).copy(), "b_qkv": _qkv_unshard(b, p).copy(), "w_proj": g["w"],
                "b_proj": g["b"]}

    def full_grads(self, sum_partial: bool = True) -> dict:
        """Full gradients named and shaped as ``from_full`` takes the parameters, [q | k | v] (collective).

        ``b_proj`` partial (sequence parallelism) is summed over the group, or with ``sum_partial=False`` copied.
        """
        check_bool("ParallelAttention.full_grads", "sum_partial", sum_partial)   # before the gathers
        return self._whole("grads", sum_partial)

    def full_params(self) -> dict:
        return self._whole("params")


class ParallelBlock(Layer):
    """Pre-LayerNorm transformer block: h = x + attn(ln1(x)); y = h + mlp(ln2(h)). Two allreduces each way.

    ``mlp`` is a ``ParallelMLP``, or another branch with the same methods (``pc.moe.MoEBranch``, which
    works on this rank's tokens and communicates over its own expert group).

    ``params``/``grads`` are those of the sublayers ``ln1``, ``attn``, ``ln2``, ``mlp`` under the names
    of ``from_full``; the LayerNorm entries are full (replicated), the rest this rank's shards. With
    sequence parallelism x and y are (B, T/p, C), two allgathers and two reduce-scatters each way
    replace the allreduces, and the LayerNorm, ``b_proj`` and ``b2`` gradients are partial.
    """

    NAMES = ("ln1_w", "ln1_b", "w_qkv", "b_qkv", "w_proj", "b_proj", "ln2_w", "ln2_b", "w1", "b1", "w2", "b2")

    def __init__(self, ln1: LayerNorm, attn: ParallelAttention, ln2: LayerNorm, mlp: MLPBranch,
                 dropout: float = 0.0):
        self.dropout = check_rate("ParallelBlock", dropout)
        if isinstance(mlp, ParallelMLP) and attn.group is not mlp.group:
            raise ValueError("ParallelBlock: attn and mlp must share one group")
        if attn.sequence_parallel != getattr(mlp, "sequence_parallel", False):
            raise ValueError(f"ParallelBlock: attn has sequence_parallel={attn.sequence_parallel} but mlp "
                             f"{getattr(mlp, 'sequence_parallel', False)}; both or neither")
        self.ln1, self.attn, self.ln2, self.mlp, self.group = ln1, attn, ln2, mlp, attn.group
        self.sequence_parallel = attn.sequence_parallel
        self.params = {"ln1_w": ln1.params["w"], "ln1_b": ln1.params["b"], **attn.params,
                       "ln2_w": ln2.params["w"], "ln2_b": ln2.params["b"], **mlp.params}
        self.grads = {"ln1_w": ln1.grads["w"], "ln1_b": ln1.grads["b"], **attn.grads,
                      "ln2_w": ln2.grads["w"], "ln2_b": ln2.grads["b"], **mlp.grads}
        self.cache = None

    @property
    def partial_grads(self) -> tuple:
        """With sequence parallelism ``("ln1_w", "ln1_b", "b_proj", "ln2_w", "ln2_b", "b2")``, else ``()``."""
        if not self.sequence_parallel:
            return ()
        return ("ln1_w", "ln1_b", *self.attn.partial_grads, "ln2_w", "ln2_b", *self.mlp.partial_grads)

    @classmethod
    def from_full(cls, params: dict, nh: int, group, eps: float = 1e-5,
                  approximate: str = "tanh", sequence_parallel: bool = False,
                  dropout: float = 0.0) -> "ParallelBlock":
        """From the full parameters named in ``NAMES``, the same on every rank; copies.

        ``dropout``: the rate on the attention probabilities and on both residual branches (GPT-2's)."""
        where = "ParallelBlock.from_full"
        check_group(where, group)
        with OwnChecks() as own:
            _check_full(where, params, {name: (None,) for name in cls.NAMES})
            ln1 = LayerNorm(params["ln1_w"].copy(), params["ln1_b"].copy(), eps)
            ln2 = LayerNorm(params["ln2_w"].copy(), params["ln2_b"].copy(), eps)
            check_bool(where, "sequence_parallel", sequence_parallel)
        agree_full(where, params, f"nh {as_text(nh)}, eps {as_text(eps)}, approximate {approximate!r}, "
                                  f"sequence_parallel {bool(sequence_parallel)}, dropout {as_text(dropout)}", group, own.failed)
        attn = ParallelAttention.from_full({k: params[k] for k in ("w_qkv", "b_qkv", "w_proj", "b_proj")},
                                           nh=nh, group=group, sequence_parallel=sequence_parallel)
        mlp = ParallelMLP.from_full({k: params[k] for k in ("w1", "b1", "w2", "b2")}, group, approximate,
                                    sequence_parallel=sequence_parallel)
        return cls(ln1, attn, ln2, mlp, dropout)

    def forward(self, x, key=None, first_row: int = 0):
        """x (B, T, C) replicated over the group -> y (B, T, C) replicated.

        With sequence parallelism: x (B, T/p, C) this rank's part of the sequence -> y (B, T/p, C).
        ``key`` (a tuple of integers, e.g. (seed, step, layer)) turns dropout on; ``first_row`` is
        the row of x's first sequence in the global batch, so that masks equal the single process's.
        """
        check_float("ParallelBlock.forward", "x", x)
        masks = self._masks(x, key, first_row)  # (attention, attn branch, mlp branch)
        self.cache = (*masks, x.shape, x.dtype)   # dy must be x's shape and dtype
        a = self.attn.forward(self.ln1.forward(x), drop=masks[0])  # (B, T, C), or (B, T/p, C)
        h = x + (a if masks[1] is None else a * masks[1])
        m = self.mlp.forward(self.ln2.forward(h))
        return h + (m if masks[2] is None else m * masks[2])  # (B, T, C), or (B, T/p, C)

    def _masks(self, x, key, first_row: int):
        """Dropout masks at this rank's positions in the full tensors, or three Nones."""
        if key is None or self.dropout == 0.0:
            return None, None, None
        b, t_local, c = x.shape
        p, r, sp = self.group.size, self.group.rank, self.sequence_parallel
        t, seq0 = (t_local * p, r * t_local) if sp else (t_local, 0)
        nh_local, xp = self.attn.nh_local, array_module(x)
        att = dropout_mask((*key, 1), self.dropout, (b, nh_local, t, t), (first_row, r * nh_local, 0, 0),
                           (first_row + b, self.attn.nh, t, t), x.dtype, xp)  # (B, NH/p, T, T)
        branch = [dropout_mask((*key, site), self.dropout, x.shape, (first_row, seq0, 0), (first_row + b, t, c),
                               x.dtype, xp) for site in (2, 3)]  # (B, T, C) or (B, T/p, C)
        return att, branch[0], branch[1]

    def backward_input(self, dy):
        """dy (B, T, C) replicated -> dx (B, T, C) replicated; the residuals add their gradients.

        With sequence parallelism: dy (B, T/p, C) -> dx (B, T/p, C). Every communication of the
        block's backward runs here; the sublayers keep what their W need.
        """
        _, drop_attn, drop_mlp, shape, dtype = self._take_cache("ParallelBlock.backward")
        check_shape("ParallelBlock.backward", "dy", dy, shape)
        if dy.dtype != dtype:
            raise TypeError(f"ParallelBlock.backward: dy has dtype {dy.dtype}, expected {dtype} (the forward's x)")
        self.cache = None
        dm = dy if drop_mlp is None else dy * drop_mlp
        dh = dy + self.ln2.backward_input(self.mlp.backward_input(dm))  # (B, T, C), or (B, T/p, C)
        da = dh if drop_attn is None else dh * drop_attn
        return dh + self.ln1.backward_input(self.attn.backward_input(da))  # (B, T, C), or (B, T/p, C)

    def backward_weight(self) -> None:
        """Every sublayer's W, in backward's order: no communication."""
        self.mlp.backward_weight()
        self.ln2.backward_weight()
        self.attn.backward_weight()
        self.ln1.backward_weight()

    def full_grads(self, sum_partial: bool = True) -> dict:
        """Full gradients named as ``from_full`` takes them (collective).

        Without sequence parallelism the LayerNorm gradients are copied as they are (replicated). With
        it the partial gradients (``partial_grads``) are summed over the group in one allreduce, or with
        ``sum_partial=False`` copied as they are (for a caller who summed them in place already).
        """
        check_bool("ParallelBlock.full_grads", "sum_partial", sum_partial)   # before the gathers
        g = self.grads
        full = {"ln1_w": g["ln1_w"].copy(), "ln1_b": g["ln1_b"].copy(), **self.attn.full_grads(False),
                "ln2_w": g["ln2_w"].copy(), "ln2_b": g["ln2_b"].copy(), **self.mlp.full_grads(False)}
        return _sum_partial(full, self.partial_grads, self.group, sum_partial)

    def full_params(self) -> dict:
        """The full weights named as ``from_full`` takes them (collective; new arrays)."""
        p = self.params
        return {"ln1_w": p["ln1_w"].copy(), "ln1_b": p["ln1_b"].copy(), **self.attn.full_params(),
                "ln2_w": p["ln2_w"].copy(), "ln2_b": p["ln2_b"].copy(), **self.mlp.full_params()}

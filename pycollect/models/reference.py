"""The GPT in one process, from ``pycollect.nn`` layers only: the twin every parallel run is checked against.

No communication and no code shared with ``pycollect.parallel``: embedding, L pre-LayerNorm blocks
(x + attn(ln1(x)), then + mlp(ln2(.))), final LayerNorm, head tied to ``wte``, cross-entropy.
``params`` and ``grads`` are flat dicts under the names of ``config.param_names``. Its block,
``ReferenceBlock``, is also the reference the tests hold ``ParallelBlock`` to.
"""
from __future__ import annotations

import numpy as np

from ..nn import CausalSelfAttention, CrossEntropy, Embedding, GeLU, LayerNorm, Linear
from ..nn._base import check_shape
from ..nn.dropout import Dropout, dropout_mask
from .config import GPTConfig, block_names, param_shapes
from .data import IGNORE

__all__ = ["ReferenceBlock", "ReferenceGPT"]


class _DenseMLP:
    def __init__(self, p: dict, approximate: str):
        self.fc, self.act, self.proj = Linear(p["w1"], p["b1"]), GeLU(approximate), Linear(p["w2"], p["b2"])
        self.aux_loss = 0.0

    def forward(self, x):
        return self.proj.forward(self.act.forward(self.fc.forward(x)))

    def backward(self, dy, aux_grad: float = 0.0):
        return self.fc.backward(self.act.backward(self.proj.backward(dy)))

    def named(self, which: str) -> dict:
        fc, proj = getattr(self.fc, which), getattr(self.proj, which)
        return {"w1": fc["w"], "b1": fc["b"], "w2": proj["w"], "b2": proj["b"]}


class _GroupedMoE:
    """The experts on the batch split into ``groups`` row groups times ``seq_groups`` slices of the
    sequence, each routed on its own (its own capacity and balancing loss), as the data-parallel ranks
    (times micro-batches) and, under sequence parallelism, the tensor-parallel ranks route theirs: one
    single-process MoELayer per group over the same parameter arrays; the balancing loss is the mean
    over the groups, as the average of the ranks' losses makes it."""

    NAMES = ("router", "w1", "b1", "w2", "b2")

    def __init__(self, p: dict, config: GPTConfig, groups: int, seq_groups: int = 1):
        from ..moe import MoELayer
        self.params = {k: p[k] for k in self.NAMES}  # the caller's arrays
        self.grads = {k: np.zeros_like(v) for k, v in self.params.items()}
        self.layers = []
        self.seq_groups = seq_groups
        for _ in range(groups * seq_groups):
            layer = MoELayer.from_full(self.params, top_k=config.moe_top_k,
                                       capacity_factor=config.moe_capacity_factor, group=None,
                                       drop_tokens=not config.moe_dropless, aux_loss_coef=config.moe_aux_coef,
                                       approximate=config.approximate)
            layer.params.update(self.params)  # compute with the shared arrays, not copies
            self.layers.append(layer)
        self.aux_loss = 0.0

    def _split(self, x) -> list:
        """(B, T, C) -> the groups' (B/g, T/s, C) pieces, row group major."""
        g, s = len(self.layers) // self.seq_groups, self.seq_groups
        if x.shape[0] % g or x.shape[1] % s:
            raise ValueError(f"ReferenceGPT: a batch of {x.shape[0]} rows and {x.shape[1]} positions does not "
                             f"split into {g} x {s} routing groups")
        return [piece for rows in np.split(x, g) for piece in np.split(rows, s, axis=1)]

    def _join(self, pieces: list):
        s = self.seq_groups
        return np.concatenate([np.concatenate(pieces[i:i + s], axis=1) for i in range(0, len(pieces), s)])

    def forward(self, x):  # (B, T, C): B divides into the row groups, T into the sequence slices
        out = self._join([layer.forward(part) for layer, part in zip(self.layers, self._split(x))])
        self.aux_loss = sum(layer.aux_loss for layer in self.layers) / len(self.layers)
        return out

    def backward(self, dy, aux_grad: float = 0.0):
        g = len(self.layers)
        dx = self._join([layer.backward(part, aux_grad=aux_grad / g)
                         for layer, part in zip(self.layers, self._split(dy))])
        for layer in self.layers:
            for k, grad in layer.grads.items():
                self.grads[k] += grad
                grad[...] = 0
        return dx

    def named(self, which: str) -> dict:
        return dict(getattr(self, which))


class ReferenceBlock:
    """The pre-LayerNorm block in one process, from ``pycollect.nn`` layers over the arrays of ``p``
    (not copied): x + attn(ln1(x)), then + mlp(ln2(.)), dropout on the attention probabilities and
    on each residual branch. ``mlp``: another MLP slot (the experts); by default the dense MLP of
    ``p``'s w1, b1, w2, b2. The twin of ``ParallelBlock``: the tests hold each to it."""

    def __init__(self, p: dict, n_head: int, eps: float = 1e-5, approximate: str = "tanh", dropout: float = 0.0,
                 mlp=None):
        self.rate, self.nh = dropout, n_head
        self.ln1 = LayerNorm(p["ln1_w"], p["ln1_b"], eps)
        self.attn = CausalSelfAttention(p["w_qkv"], p["b_qkv"], p["w_proj"], p["b_proj"], n_head)
        self.ln2 = LayerNorm(p["ln2_w"], p["ln2_b"], eps)
        self.mlp = _DenseMLP(p, approximate) if mlp is None else mlp
        self.aux_grad = 0.0  # the gradient of the loss with respect to the experts' balancing loss

    @classmethod
    def from_config(cls, p: dict, config: GPTConfig, moe_groups: int = 1, moe_seq_groups: int = 1):
        """Block of the GPT ``config``: with experts, routed in ``moe_groups`` x ``moe_seq_groups`` groups."""
        mlp = _GroupedMoE(p, config, moe_groups, moe_seq_groups) if config.n_experts else None
        return cls(p, config.n_head, config.eps, config.approximate, config.dropout, mlp)

    def forward(self, x, key=None, first_row: int = 0):  # (B, T, C) -> (B, T, C)
        att = drop_a = drop_m = None
        if key is not None and self.rate > 0:
            b, t, c = x.shape
            att = dropout_mask((*key, 1), self.rate, (b, self.nh, t, t), (first_row, 0, 0, 0),
                               (first_row + b, self.nh, t, t), x.dtype)  # (B, NH, T, T)
            drop_a, drop_m = (dropout_mask((*key, site), self.rate, x.shape, (first_row, 0, 0), (first_row + b, t, c),
                                           x.dtype) for site in (2, 3))  # (B, T, C)
        self.masks = (drop_a, drop_m)
        a = self.attn.forward(self.ln1.forward(x), drop=att)
        h = x + (a if drop_a is None else a * drop_a)
        m = self.mlp.forward(self.ln2.forward(h))
        return h + (m if drop_m is None else m * drop_m)

    def backward(self, dy):
        drop_a, drop_m = self.masks
        dm = dy if drop_m is None else dy * drop_m
        dh = dy + self.ln2.backward(self.mlp.backward(dm, self.aux_grad))
        da = dh if drop_a is None else dh * drop_a
        return dh + self.ln1.backward(self.attn.backward(da))

    def named(self, which: str) -> dict:
        """``which`` ("params" or "grads") of the sublayers under ``block_names`` (ParallelBlock's), in order."""
        d = {k: getattr(layer, which) for k, layer in (("ln1", self.ln1), ("attn", self.attn), ("ln2", self.ln2))}
        return {"ln1_w": d["ln1"]["w"], "ln1_b": d["ln1"]["b"], **d["attn"], "ln2_w": d["ln2"]["w"],
                "ln2_b": d["ln2"]["b"], **self.mlp.named(which)}


class ReferenceGPT:
    """Single-process GPT over the full parameters (used as they are, not copied)."""

    def __init__(self, config: GPTConfig, params: dict, moe_groups: int = 1, moe_seq_groups: int = 1):
        """``moe_groups``: with experts, the batch routes in that many row groups (data-parallel ranks x
        micro-batches of the run it stands for: capacity and the balancing loss are per group), each
        in ``moe_seq_groups`` slices of the sequence (the tensor-parallel size under sequence parallelism)."""
        if not isinstance(params, dict):
            raise TypeError(f"ReferenceGPT: params must be a dict name -> array, got {type(params).__name__}")
        expected = param_shapes(config)
        if set(params) != set(expected):
            raise ValueError(f"ReferenceGPT: params lack {sorted(set(expected) - set(params))} "
                             f"and have extra {sorted(set(params) - set(expected))}")
        for name, shape in expected.items():
            check_shape("ReferenceGPT", name, params[name], shape)
        self.config = config
        self.embedding = Embedding(params["wte"], params["wpe"])
        self.blocks = [ReferenceBlock.from_config({k: params[f"h{i}.{k}"] for k in block_names(config)}, config,
                                                  moe_groups, moe_seq_groups)
                       for i in range(config.n_layer)]
        self.lnf = LayerNorm(params["lnf_w"], params["lnf_b"], config.eps)
        self.head = Linear(params["wte"].T)  # (C, V): a view, tied to wte
        self.loss = CrossEntropy(ignore_index=IGNORE)
        self.drop = Dropout(config.dropout)
        self.params = self._named("params")
        self.grads = self._named("grads")

    def _named(self, which: str) -> dict:
        out = {"wte": getattr(self.embedding, which)["wte"], "wpe": getattr(self.embedding, which)["wpe"]}
        for i, b in enumerate(self.blocks):
            out.update({f"h{i}.{k}": v for k, v in b.named(which).items()})
        out.update({"lnf_w": getattr(self.lnf, which)["w"], "lnf_b": getattr(self.lnf, which)["b"]})
        return out

    def forward(self, idx, targets, dropout_key=None, first_row: int = 0):
        """idx, targets (B, T) token ids -> mean cross-entropy over the scored tokens (target != -1), 0-d.

        ``dropout_key`` (seed, step) turns dropout on (``config.dropout``); ``first_row`` is idx's
        first row in the global batch (masks depend on global positions, ``nn.dropout``)."""
        if getattr(idx, "ndim", 0) == 2 and idx.shape[1] == 0:   # as GPT.forward refuses it
            raise ValueError(f"ReferenceGPT.forward: idx has T = 0 tokens; a sequence needs at least one (up to "
                             f"block_size = {self.config.block_size})")
        x = self.embedding.forward(idx)  # (B, T, C)
        x = self.drop.forward(x, None if dropout_key is None else (*dropout_key, self.config.n_layer, 0),
                              (first_row, 0, 0), (first_row + x.shape[0],) + x.shape[1:])
        for i, b in enumerate(self.blocks):
            x = b.forward(x, None if dropout_key is None else (*dropout_key, i), first_row)
        logits = self.head.forward(self.lnf.forward(x))  # (B, T, V)
        loss = self.loss.forward(logits, targets)
        if self.config.n_experts:  # the balancing losses join the loss
            loss = loss + np.asarray(sum(b.mlp.aux_loss for b in self.blocks), dtype=loss.dtype)
        return loss

    def backward(self, dloss: float = 1.0) -> None:
        """Adds the gradients of ``dloss * loss`` into ``grads``."""
        dx = self.lnf.backward(self.head.backward(self.loss.backward(dloss)))
        for b in reversed(self.blocks):
            b.aux_grad = dloss
            dx = b.backward(dx)
        self.embedding.backward(self.drop.backward(dx))
        self.grads["wte"] += self.head.grads["w"].T  # the head's share of the tied weight
        self.head.grads["w"][...] = 0

    def zero_grad(self) -> None:
        for g in self.grads.values():
            g[...] = 0
        self.head.grads["w"][...] = 0

    def logits(self, idx):
        """(B, T) -> (B, T, V), for sampling."""
        x = self.embedding.forward(idx)
        for b in self.blocks:
            x = b.forward(x)
        return self.head.forward(self.lnf.forward(x))  # evaluation: no dropout

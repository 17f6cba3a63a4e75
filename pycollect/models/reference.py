"""The GPT in one process, from ``pycollect.nn`` layers only: the twin every parallel run is checked against.

No communication and no code shared with ``pycollect.parallel``: embedding, L pre-LayerNorm blocks
(x + attn(ln1(x)), then + mlp(ln2(.))), final LayerNorm, head tied to ``wte``, cross-entropy.
``params`` and ``grads`` are flat dicts under the names of ``config.param_names``.
"""
from __future__ import annotations

from ..nn import CausalSelfAttention, CrossEntropy, Embedding, GeLU, LayerNorm, Linear
from ..nn._base import check_shape
from ..nn.dropout import Dropout, dropout_mask
from .config import BLOCK_NAMES, GPTConfig, param_shapes
from .data import IGNORE

__all__ = ["ReferenceGPT"]


class _Block:
    def __init__(self, p: dict, config: GPTConfig):
        self.rate, self.nh = config.dropout, config.n_head
        self.ln1 = LayerNorm(p["ln1_w"], p["ln1_b"], config.eps)
        self.attn = CausalSelfAttention(p["w_qkv"], p["b_qkv"], p["w_proj"], p["b_proj"], config.n_head)
        self.ln2 = LayerNorm(p["ln2_w"], p["ln2_b"], config.eps)
        self.fc, self.act, self.proj = Linear(p["w1"], p["b1"]), GeLU(config.approximate), Linear(p["w2"], p["b2"])

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
        m = self.proj.forward(self.act.forward(self.fc.forward(self.ln2.forward(h))))
        return h + (m if drop_m is None else m * drop_m)

    def backward(self, dy):
        drop_a, drop_m = self.masks
        dm = dy if drop_m is None else dy * drop_m
        dh = dy + self.ln2.backward(self.fc.backward(self.act.backward(self.proj.backward(dm))))
        da = dh if drop_a is None else dh * drop_a
        return dh + self.ln1.backward(self.attn.backward(da))

    def named(self, which: str) -> dict:
        """``which`` ("params" or "grads") of the sublayers under BLOCK_NAMES."""
        d = {k: getattr(layer, which) for k, layer in (("ln1", self.ln1), ("attn", self.attn), ("ln2", self.ln2),
                                                       ("fc", self.fc), ("proj", self.proj))}
        out = {"ln1_w": d["ln1"]["w"], "ln1_b": d["ln1"]["b"], **d["attn"], "ln2_w": d["ln2"]["w"],
               "ln2_b": d["ln2"]["b"], "w1": d["fc"]["w"], "b1": d["fc"]["b"], "w2": d["proj"]["w"],
               "b2": d["proj"]["b"]}
        return {k: out[k] for k in BLOCK_NAMES}


class ReferenceGPT:
    """Single-process GPT over the full parameters (used as they are, not copied)."""

    def __init__(self, config: GPTConfig, params: dict):
        expected = param_shapes(config)
        if set(params) != set(expected):
            raise ValueError(f"ReferenceGPT: params lack {sorted(set(expected) - set(params))} "
                             f"and have extra {sorted(set(params) - set(expected))}")
        for name, shape in expected.items():
            check_shape("ReferenceGPT", name, params[name], shape)
        self.config = config
        self.embedding = Embedding(params["wte"], params["wpe"])
        self.blocks = [_Block({k: params[f"h{i}.{k}"] for k in BLOCK_NAMES}, config) for i in range(config.n_layer)]
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
        x = self.embedding.forward(idx)  # (B, T, C)
        x = self.drop.forward(x, None if dropout_key is None else (*dropout_key, self.config.n_layer, 0),
                              (first_row, 0, 0), (first_row + x.shape[0],) + x.shape[1:])
        for i, b in enumerate(self.blocks):
            x = b.forward(x, None if dropout_key is None else (*dropout_key, i), first_row)
        logits = self.head.forward(self.lnf.forward(x))  # (B, T, V)
        return self.loss.forward(logits, targets)

    def backward(self, dloss: float = 1.0) -> None:
        """Adds the gradients of ``dloss * loss`` into ``grads``."""
        dx = self.lnf.backward(self.head.backward(self.loss.backward(dloss)))
        for b in reversed(self.blocks):
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

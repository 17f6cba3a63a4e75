"""Softmax, the causal attention core on (B, NH, T, HS), and causal multi-head self-attention.

The QKV projection is one (C, 3*C) matrix whose columns are [q | k | v], each C wide, and head h
owns columns h*HS:(h+1)*HS of each: a head-parallel version takes its heads' columns of all three.
"""
from __future__ import annotations

import math

import numpy as np

from ._base import ForWeight, Layer, array_module, check_float, check_same_dtype, check_shape, normal
from .linear import linear_backward_input, linear_backward_weight, linear_forward


def softmax_forward(x, axis: int = -1):
    """Numerically stable softmax along ``axis``."""
    xp = array_module(x)
    e = xp.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def softmax_backward(dy, y, axis: int = -1):
    """dx = y * (dy - sum(dy * y)) along ``axis``; ``y`` is the forward output."""
    return y * (dy - (dy * y).sum(axis=axis, keepdims=True))


class Softmax(Layer):
    """Softmax along the last axis; caches its output."""

    def __init__(self):
        super().__init__({})

    def forward(self, x):
        check_float("Softmax.forward", "x", x)
        self.cache = softmax_forward(x)
        return self.cache

    def backward_input(self, dy):
        """dy -> dx; no weights, so B is the whole backward and frees the cache."""
        y = self._take_cache("Softmax.backward")
        check_shape("Softmax.backward", "dy", dy, y.shape)
        self.cache = None
        return softmax_backward(dy, y)


def attention_forward(q, k, v, causal: bool = True, drop=None):
    """softmax(q k^T / sqrt(HS), masked causally) v.

    q, k, v (B, NH, T, HS) -> out (B, NH, T, HS), att (B, NH, T, T) the probabilities (the cache).
    ``drop`` (B, NH, T, T): a dropout mask scaled by 1/(1-p) applied to the probabilities (``nn.dropout``).
    """
    xp = array_module(q)
    t, hs = q.shape[-2], q.shape[-1]
    scores = (q @ xp.swapaxes(k, -1, -2)) * (1.0 / math.sqrt(hs))  # (B, NH, T, T)
    if causal:
        future = xp.triu(xp.ones((t, t), dtype=bool), k=1)  # (T, T): key s after query t
        scores = xp.where(future, -xp.inf, scores)
    att = softmax_forward(scores)  # (B, NH, T, T)
    out = (att if drop is None else att * drop) @ v  # (B, NH, T, HS)
    return out, att


def attention_backward(dout, q, k, v, att, drop=None):
    """Gradients of ``attention_forward`` (with the same ``drop``): dq, dk, dv, each (B, NH, T, HS).

    Masked entries of ``att`` are zero, so their score gradients vanish without the mask.
    """
    xp = array_module(q)
    scale = 1.0 / math.sqrt(q.shape[-1])
    datt = dout @ xp.swapaxes(v, -1, -2)  # (B, NH, T, T)
    dv = xp.swapaxes(att if drop is None else att * drop, -1, -2) @ dout  # (B, NH, T, HS)
    if drop is not None:
        datt *= drop
    dscores = softmax_backward(datt, att) * scale  # (B, NH, T, T)
    dq = dscores @ k  # (B, NH, T, HS)
    dk = xp.swapaxes(dscores, -1, -2) @ q  # (B, NH, T, HS)
    return dq, dk, dv


def split_heads(x, nh: int):
    """(B, T, NH*HS) -> (B, NH, T, HS)."""
    b, t, c = x.shape
    return x.reshape(b, t, nh, c // nh).transpose(0, 2, 1, 3)


def merge_heads(x):
    """(B, NH, T, HS) -> (B, T, NH*HS), contiguous."""
    b, nh, t, hs = x.shape
    xp = array_module(x)
    return xp.ascontiguousarray(x.transpose(0, 2, 1, 3)).reshape(b, t, nh * hs)


def self_attention_forward(x, w_qkv, b_qkv, w_proj, b_proj, nh: int, drop=None):
    """Causal multi-head self-attention. x (B, T, C) -> y (B, T, C), cache for the backward.

    ``drop`` (B, NH, T, T): an optional dropout mask on the attention probabilities."""
    c = x.shape[-1]
    qkv = linear_forward(x, w_qkv, b_qkv)  # (B, T, 3*C)
    q, k, v = (split_heads(qkv[..., i * c:(i + 1) * c], nh) for i in range(3))  # (B, NH, T, HS)
    out, att = attention_forward(q, k, v, drop=drop)  # (B, NH, T, HS), (B, NH, T, T)
    o = merge_heads(out)  # (B, T, C)
    y = linear_forward(o, w_proj, b_proj)  # (B, T, C)
    return y, (x, q, k, v, att, o, drop)


def self_attention_backward_input(dy, cache, w_qkv, w_proj):
    """B of ``self_attention_forward``: dx (B, T, C), and (x, dqkv, o, dy) for W (no q, k, v, att)."""
    x, q, k, v, att, o, drop = cache
    xp = array_module(x)
    do = linear_backward_input(dy, w_proj)  # (B, T, C)
    dout = split_heads(do, q.shape[1])  # (B, NH, T, HS)
    dq, dk, dv = attention_backward(dout, q, k, v, att, drop)  # (B, NH, T, HS) each
    dqkv = xp.concatenate([merge_heads(dq), merge_heads(dk), merge_heads(dv)], axis=-1)  # (B, T, 3*C)
    return linear_backward_input(dqkv, w_qkv), (x, dqkv, o, dy)  # dx (B, T, C)


def self_attention_backward_weight(kept) -> dict:
    """W of ``self_attention_forward``: the parameter gradients from what B kept."""
    x, dqkv, o, dy = kept
    dw_proj, db_proj = linear_backward_weight(dy, o)  # (C, C), (C,)
    dw_qkv, db_qkv = linear_backward_weight(dqkv, x)  # (C, 3*C), (3*C,)
    return {"w_qkv": dw_qkv, "b_qkv": db_qkv, "w_proj": dw_proj, "b_proj": db_proj}


def self_attention_backward(dy, cache, w_qkv, w_proj):
    """Gradients of ``self_attention_forward``: dx and a dict of parameter gradients."""
    dx, kept = self_attention_backward_input(dy, cache, w_qkv, w_proj)
    return dx, self_attention_backward_weight(kept)


class CausalSelfAttention(Layer):
    """(B, T, C) -> (B, T, C) with NH heads; params w_qkv (C, 3*C), b_qkv (3*C,), w_proj (C, C), b_proj (C,)."""

    def __init__(self, w_qkv, b_qkv, w_proj, b_proj, nh: int):
        where = "CausalSelfAttention"
        check_float(where, "w_qkv", w_qkv)
        check_shape(where, "w_qkv", w_qkv, (None, None))
        c = w_qkv.shape[0]
        check_shape(where, "w_qkv", w_qkv, (c, 3 * c))
        check_shape(where, "b_qkv", b_qkv, (3 * c,))
        check_shape(where, "w_proj", w_proj, (c, c))
        check_shape(where, "b_proj", b_proj, (c,))
        for name, a in (("b_qkv", b_qkv), ("w_proj", w_proj), ("b_proj", b_proj)):
            check_same_dtype(where, name, a, "w_qkv", w_qkv)
        if nh < 1 or c % nh:
            raise ValueError(f"{where}: nh={nh} must be positive and divide C={c}")
        self.nh = nh
        super().__init__({"w_qkv": w_qkv, "b_qkv": b_qkv, "w_proj": w_proj, "b_proj": b_proj})

    @classmethod
    def create(cls, c: int, nh: int, *, std: float = 0.02, rng=None, dtype=np.float32,
               xp=np) -> "CausalSelfAttention":
        rng = np.random.default_rng(rng)
        return cls(normal((c, 3 * c), std, rng, dtype, xp), xp.zeros(3 * c, dtype),
                   normal((c, c), std, rng, dtype, xp), xp.zeros(c, dtype), nh)

    def forward(self, x, drop=None):
        """x (B, T, C) -> (B, T, C); ``drop`` (B, NH, T, T) an optional dropout mask on the probabilities."""
        p = self.params
        c = p["w_proj"].shape[0]
        check_float("CausalSelfAttention.forward", "x", x)
        check_shape("CausalSelfAttention.forward", "x", x, (None, None, c))
        check_same_dtype("CausalSelfAttention.forward", "x", x, "w_qkv", p["w_qkv"])
        y, self.cache = self_attention_forward(x, p["w_qkv"], p["b_qkv"], p["w_proj"], p["b_proj"], self.nh, drop)
        return y

    def backward_input(self, dy):
        """dy (B, T, C) -> dx (B, T, C); keeps (x, dqkv, o, dy) for W."""
        cache = self._take_cache("CausalSelfAttention.backward")
        check_shape("CausalSelfAttention.backward", "dy", dy, cache[0].shape)
        dx, kept = self_attention_backward_input(dy, cache, self.params["w_qkv"], self.params["w_proj"])
        self.cache = ForWeight(kept)
        return dx

    def backward_weight(self) -> None:
        grads = self_attention_backward_weight(self._take_for_weight("CausalSelfAttention.backward_weight"))
        for name, g in grads.items():
            self.grads[name] += g

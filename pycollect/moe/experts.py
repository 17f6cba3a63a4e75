"""The experts one rank holds: expert l computes gelu(x @ w1[l] + b1[l]) @ w2[l] + b2[l] on its rows.

Rows arrive as the all-to-all leaves them (``dispatch.to_experts``): by source rank, then by local
expert. ``runs`` lists the blocks, ``(l, lo, hi)``: rows lo..hi-1 are local expert l's. Shapes: R
rows in all, C model width, F hidden width, E_l local experts.
"""
from __future__ import annotations

from ..nn._base import array_module
from ..nn.activation import gelu_backward, gelu_forward
from ..nn.linear import linear_backward_input, linear_backward_weight, linear_forward

__all__ = ["experts_forward", "experts_backward", "experts_backward_input", "experts_backward_weight"]


def experts_forward(x, runs, w1, b1, w2, b2, approximate: str = "tanh"):
    """x (R, C), runs ((l, lo, hi), ...) -> y (R, C), h (R, F) (the pre-activation, the cache).

    w1 (E_l, C, F), b1 (E_l, F), w2 (E_l, F, C), b2 (E_l, C).
    """
    xp = array_module(x)
    y = xp.empty((x.shape[0], w2.shape[2]), dtype=x.dtype)  # (R, C)
    h = xp.empty((x.shape[0], w1.shape[2]), dtype=x.dtype)  # (R, F)
    for l, lo, hi in runs:
        h[lo:hi] = linear_forward(x[lo:hi], w1[l], b1[l])  # (n, F)
        y[lo:hi] = linear_forward(gelu_forward(h[lo:hi], approximate), w2[l], b2[l])  # (n, C)
    return y, h


def experts_backward_input(dy, x, h, runs, w1, w2, approximate: str = "tanh"):
    """B: dy (R, C) -> dx (R, C), and dh (R, F) the pre-activation's gradient, which W reads."""
    xp = array_module(x)
    dx = xp.empty_like(x)  # (R, C)
    dh = xp.empty_like(h)  # (R, F)
    for l, lo, hi in runs:
        da = linear_backward_input(dy[lo:hi], w2[l])  # (n, F)
        dh[lo:hi] = gelu_backward(da, h[lo:hi], approximate)  # (n, F)
        dx[lo:hi] = linear_backward_input(dh[lo:hi], w1[l])  # (n, C)
    return dx, dh


def experts_backward_weight(dy, x, h, dh, runs, grads: dict, approximate: str = "tanh") -> None:
    """W: adds dw1, db1, dw2, db2 of each local expert into ``grads`` from dy, x, h and B's dh."""
    for l, lo, hi in runs:
        a = gelu_forward(h[lo:hi], approximate)  # (n, F), recomputed rather than kept between B and W
        dw2, db2 = linear_backward_weight(dy[lo:hi], a)  # (F, C), (C,)
        dw1, db1 = linear_backward_weight(dh[lo:hi], x[lo:hi])  # (C, F), (F,)
        grads["w1"][l] += dw1
        grads["b1"][l] += db1
        grads["w2"][l] += dw2
        grads["b2"][l] += db2


def experts_backward(dy, x, h, runs, w1, w2, grads: dict, approximate: str = "tanh"):
    """dy (R, C) -> dx (R, C); adds dw1, db1, dw2, db2 of each local expert into ``grads``."""
    dx, dh = experts_backward_input(dy, x, h, runs, w1, w2, approximate)
    experts_backward_weight(dy, x, h, dh, runs, grads, approximate)
    return dx

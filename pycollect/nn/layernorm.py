"""LayerNorm over the last axis, with weight, bias and eps."""
from __future__ import annotations

import numpy as np

from ._base import ForWeight, Layer, check_float, check_same_dtype, check_shape


def layernorm_forward(x, w, b, eps: float = 1e-5):
    """x (..., C), w (C,), b (C,) -> y (..., C), mean (..., 1), rstd (..., 1)."""
    mean = x.mean(axis=-1, keepdims=True)  # (..., 1)
    xc = x - mean  # (..., C)
    rstd = 1.0 / (((xc * xc).mean(axis=-1, keepdims=True) + eps) ** 0.5)  # (..., 1)
    y = xc * rstd * w + b  # (..., C)
    return y, mean, rstd


def layernorm_backward_input(dy, x, w, mean, rstd):
    """B of ``layernorm_forward``: dx (..., C), and xhat (..., C) the normalised input W reads."""
    xhat = (x - mean) * rstd  # (..., C)
    dxhat = dy * w  # (..., C)
    dx = rstd * (dxhat - dxhat.mean(axis=-1, keepdims=True)
                 - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True))  # (..., C)
    return dx, xhat


def layernorm_backward_weight(dy, xhat):
    """W of ``layernorm_forward``: dw (C,), db (C,) from dy and xhat (..., C)."""
    c = xhat.shape[-1]
    dw = (dy * xhat).reshape(-1, c).sum(axis=0)  # (C,)
    db = dy.reshape(-1, c).sum(axis=0)  # (C,)
    return dw, db


def layernorm_backward(dy, x, w, mean, rstd):
    """Gradients of ``layernorm_forward``: dx (..., C), dw (C,), db (C,)."""
    dx, xhat = layernorm_backward_input(dy, x, w, mean, rstd)
    return (dx, *layernorm_backward_weight(dy, xhat))


class LayerNorm(Layer):
    """params ``w`` (C,) and ``b`` (C,); caches x, mean and rstd."""

    def __init__(self, w, b, eps: float = 1e-5):
        check_float("LayerNorm", "w", w)
        check_shape("LayerNorm", "w", w, (None,))
        check_shape("LayerNorm", "b", b, w.shape)
        check_same_dtype("LayerNorm", "b", b, "w", w)
        self.eps = eps
        super().__init__({"w": w, "b": b})

    @classmethod
    def create(cls, c: int, *, eps: float = 1e-5, dtype=np.float32, xp=np) -> "LayerNorm":
        return cls(xp.ones(c, dtype), xp.zeros(c, dtype), eps)

    def forward(self, x):
        w = self.params["w"]
        check_float("LayerNorm.forward", "x", x)
        check_shape("LayerNorm.forward", "x", x, (..., w.shape[0]))
        check_same_dtype("LayerNorm.forward", "x", x, "w", w)
        y, mean, rstd = layernorm_forward(x, w, self.params["b"], self.eps)
        self.cache = (x, mean, rstd)
        return y

    def backward_input(self, dy):
        """dy (..., C) -> dx (..., C); keeps (dy, xhat) for W, drops x, mean and rstd."""
        x, mean, rstd = self._take_cache("LayerNorm.backward")
        check_shape("LayerNorm.backward", "dy", dy, x.shape)
        dx, xhat = layernorm_backward_input(dy, x, self.params["w"], mean, rstd)
        self.cache = ForWeight((dy, xhat))
        return dx

    def backward_weight(self) -> None:
        dy, xhat = self._take_for_weight("LayerNorm.backward_weight")
        dw, db = layernorm_backward_weight(dy, xhat)
        self.grads["w"] += dw
        self.grads["b"] += db

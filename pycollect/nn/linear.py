"""Linear: y = x @ w + b, with w stored (C_in, C_out)."""
from __future__ import annotations

import math

import numpy as np

from ._base import ForWeight, Layer, check_bool, check_float, check_same_dtype, check_shape, normal


def linear_forward(x, w, b=None):
    """y = x @ w (+ b).  x (..., C_in), w (C_in, C_out), b (C_out,) or None -> y (..., C_out)."""
    y = x @ w  # (..., C_out)
    if b is not None:
        y = y + b
    return y


def linear_backward_input(dy, w):
    """B of ``linear_forward``: dx (..., C_in) = dy (..., C_out) @ w^T."""
    return dy @ w.T  # (..., C_in)


def linear_backward_weight(dy, x):
    """W of ``linear_forward``: dw (C_in, C_out) and db (C_out,) from dy (..., C_out) and x (..., C_in)."""
    n = math.prod(dy.shape[:-1])  # tokens; not -1: a shard of no columns (C_out = 0) has no size to divide
    dy2 = dy.reshape(n, dy.shape[-1])  # (N, C_out)
    dw = x.reshape(n, x.shape[-1]).T @ dy2  # (C_in, C_out)
    db = dy2.sum(axis=0)  # (C_out,)
    return dw, db


def linear_backward(dy, x, w):
    """Gradients of ``linear_forward``: dx (..., C_in), dw (C_in, C_out), db (C_out,)."""
    dw, db = linear_backward_weight(dy, x)
    return linear_backward_input(dy, w), dw, db


def linear_params(where: str, w, b, w_name: str = "w", b_name: str = "b") -> dict:
    """``{"w": w}`` plus ``"b"`` when given, after checking w is a float matrix and b matches its columns."""
    check_float(where, w_name, w)
    check_shape(where, w_name, w, (None, None))
    params = {"w": w}
    if b is not None:
        check_shape(where, b_name, b, (w.shape[1],))
        check_same_dtype(where, b_name, b, w_name, w)
        params["b"] = b
    return params


class Linear(Layer):
    """Affine map over the last axis; params ``w`` (C_in, C_out) and, with a bias, ``b`` (C_out,)."""

    def __init__(self, w, b=None):
        super().__init__(linear_params("Linear", w, b))

    @classmethod
    def create(cls, c_in: int, c_out: int, *, bias: bool = True, std: float = 0.02,
               rng=None, dtype=np.float32, xp=np) -> "Linear":
        """Weights from N(0, std^2), bias zero."""
        bias = check_bool("Linear.create", "bias", bias)
        w = normal((c_in, c_out), std, rng, dtype, xp)
        return cls(w, xp.zeros(c_out, dtype) if bias else None)

    def forward(self, x):
        w = self.params["w"]
        check_float("Linear.forward", "x", x)
        check_shape("Linear.forward", "x", x, (..., w.shape[0]))
        check_same_dtype("Linear.forward", "x", x, "w", w)
        self.cache = x  # (..., C_in)
        return linear_forward(x, w, self.params.get("b"))

    def backward_input(self, dy):
        """dy (..., C_out) -> dx (..., C_in); keeps (x, dy) for W."""
        x = self._take_cache("Linear.backward")
        w = self.params["w"]
        check_shape("Linear.backward", "dy", dy, x.shape[:-1] + (w.shape[1],))
        self.cache = ForWeight((x, dy))
        return linear_backward_input(dy, w)

    def backward_weight(self) -> None:
        x, dy = self._take_for_weight("Linear.backward_weight")
        dw, db = linear_backward_weight(dy, x)
        self.grads["w"] += dw
        if "b" in self.grads:
            self.grads["b"] += db

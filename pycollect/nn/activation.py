"""GeLU, exact (erf) and tanh-approximated."""
from __future__ import annotations

import math

from ._base import Layer, array_module, check_float, check_shape, erf

_S = math.sqrt(2.0 / math.pi)  # tanh variant: sqrt(2/pi)
_A = 0.044715
_APPROX = ("tanh", "none")


def _check_approx(where: str, approximate: str) -> None:
    if approximate not in _APPROX:
        raise ValueError(f"{where}: approximate must be 'tanh' or 'none', got {approximate!r}")


def gelu_forward(x, approximate: str = "tanh"):
    """GeLU(x) elementwise; ``approximate="none"`` is x * Phi(x) through erf."""
    _check_approx("gelu_forward", approximate)
    xp = array_module(x)
    if approximate == "tanh":
        return 0.5 * x * (1.0 + xp.tanh(_S * (x + _A * x * x * x)))
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def gelu_backward(dy, x, approximate: str = "tanh"):
    """dx = dy * GeLU'(x)."""
    _check_approx("gelu_backward", approximate)
    xp = array_module(x)
    if approximate == "tanh":
        t = xp.tanh(_S * (x + _A * x * x * x))
        local = 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * _S * (1.0 + 3.0 * _A * x * x)
    else:
        pdf = xp.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
        local = 0.5 * (1.0 + erf(x / math.sqrt(2.0))) + x * pdf
    return dy * local


class GeLU(Layer):
    """GeLU with no parameters; caches its input."""

    def __init__(self, approximate: str = "tanh"):
        _check_approx("GeLU", approximate)
        self.approximate = approximate
        super().__init__({})

    def forward(self, x):
        check_float("GeLU.forward", "x", x)
        self.cache = x
        return gelu_forward(x, self.approximate)

    def backward_input(self, dy):
        """dy -> dx; no weights, so B is the whole backward and frees the cache."""
        x = self._take_cache("GeLU.backward")
        check_shape("GeLU.backward", "dy", dy, x.shape)
        self.cache = None
        return gelu_backward(dy, x, self.approximate)

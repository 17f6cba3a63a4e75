"""Parameters one rank holds alone beside ZeroAdamW's sharded ones: a mixture of experts' experts.

Expert parallelism over the data-parallel group leaves every rank its own experts (E / N of them),
whose gradients already hold every token routed to them: there is nothing to shard or to reduce
(DeepSpeed's and Megatron's "expert data-parallel group" has one rank here). ``Owned`` keeps their
float32 master weights and Adam moments and takes part in everything the step decides for the
whole model: their gradient is divided by the group size and the loss scale like the reduced one
(the group's loss is the mean of its ranks'), checked for overflow, counted in the norm and clipped
with the rest, and updated by the same AdamW rule (``flat_adamw_update``).
"""
from __future__ import annotations

import numpy as np

from ..engine.backend import array_module
from ..nn._base import check_array
from ..optim import adamw_update
from .layout import FlatLayout

__all__ = ["Owned", "flat_adamw_update"]

_CHUNK = 1 << 18  # elements per piece of the update


def flat_adamw_update(p, m, v, g, decay: list, t: int, lr: float, betas, eps: float, weight_decay: float,
                      xp) -> None:
    """``pycollect.optim.adamw_update`` on flat arrays: decoupled weight decay on the ``decay`` ranges
    [a, b), then the rest in pieces whose temporaries stay in cache (2x faster at 24M elements)."""
    if weight_decay:
        for a, b in decay:
            p[a:b] *= 1 - lr * weight_decay
    for lo in range(0, p.size, _CHUNK):
        hi = lo + _CHUNK
        adamw_update(p[lo:hi], m[lo:hi], v[lo:hi], g[lo:hi], t, lr, betas, eps, weight_decay, False, xp)


class Owned:
    """``params`` / ``grads``: the caller's dicts name -> array (the model's own arrays, updated in place)."""

    def __init__(self, where: str, params: dict, grads: dict, dtype, master_dtype, xp, no_decay, norm_skip):
        if not isinstance(params, dict) or not isinstance(grads, dict) or set(params) != set(grads):
            raise ValueError(f"{where}: owned_params and owned_grads must be dicts with the same names")
        for name in params:
            for kind, a in (("owned_params", params[name]), ("owned_grads", grads[name])):
                if check_array(where, f"{kind}[{name!r}]", a) is not xp or a.dtype != dtype:
                    raise TypeError(f"{where}: {kind}[{name!r}] is {array_module(a).__name__} {a.dtype}; the "
                                    f"parameters are {xp.__name__} {dtype}")
            if not getattr(params[name].flags, "writeable", True):   # CuPy's arrays are always writeable
                raise ValueError(f"{where}: owned_params[{name!r}] is read-only; each step writes the updated "
                                 f"values into it (pass a writeable array)")
            if grads[name].shape != params[name].shape:
                raise ValueError(f"{where}: owned_grads[{name!r}] has shape {grads[name].shape}, the parameter "
                                 f"{params[name].shape}")
        self.params, self.grads, self.dtype, self.xp = params, grads, dtype, xp
        self.layout = FlatLayout({n: p.shape for n, p in params.items()}, 1)
        self.master = self.layout.flatten(params, master_dtype, xp)  # (Po,) padded to itself
        self.m, self.v = xp.zeros_like(self.master), xp.zeros_like(self.master)
        self.decay = [self.layout.span(n) for n in self.layout.names if n not in no_decay]
        skip = [n for n in self.layout.names if n in norm_skip]
        self.counted = ~self.layout.mask(skip, 0, xp) if skip else None

    def gradient(self, divisor: float):
        """(Po,) master-dtype: the caller's gradients flattened and divided by ``divisor``."""
        g = self.layout.flatten(self.grads, self.master.dtype, self.xp)
        g /= divisor
        return g

    def sum_of_squares(self, g) -> float:
        g = g.astype(np.float64)
        return float(((g if self.counted is None else g[self.counted]) ** 2).sum())

    def publish(self) -> None:
        for n, view in self.layout.views(self.master).items():
            self.params[n][...] = view.astype(self.dtype)

    def nbytes(self) -> dict:
        return {"parameters": sum(p.nbytes for p in self.params.values()),
                "gradients": sum(g.nbytes for g in self.grads.values()),
                "master_weights": self.master.nbytes, "moments": self.m.nbytes + self.v.nbytes}

"""AdamW with ``torch.optim.AdamW``'s update rule, on dicts of NumPy or CuPy arrays, in place.

For step t (from 1), gradient g, parameter p (Loshchilov & Hutter, decoupled weight decay)::

    p <- p - lr * weight_decay * p
    m <- beta1 * m + (1 - beta1) * g
    v <- beta2 * v + (1 - beta2) * g^2
    p <- p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)

The arithmetic order is torch's, so a run can be checked step by step against it. Each parameter
is updated from its own gradient only: a model whose shards live on several ranks runs one
optimizer per rank over its own shards, and replicated parameters (with equal gradients on every
rank) stay equal. ``clip_grad_norm`` clips by the global 2-norm over every rank's shards.
"""
from __future__ import annotations

import math
from collections.abc import Iterable

from .engine.backend import array_module

__all__ = ["AdamW", "adamw_update", "global_grad_norm", "clip_grad_norm", "sum_of_squares", "scale_to_norm"]


def positive(where: str, name: str, value, allow_zero: bool = False) -> float:
    """``value`` as a float when it is a positive (``allow_zero``: non-negative) finite number, else ValueError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value < 0 or (value == 0 and not allow_zero):
        bound = "non-negative" if allow_zero else "positive"
        raise ValueError(f"{where}: {name} must be a {bound} finite number, got {value!r}")
    return float(value)


def adamw_update(p, m, v, g, t: int, lr: float, betas, eps: float, weight_decay: float, decay: bool, xp) -> None:
    """One AdamW step at step ``t`` on arrays of one shape, in place, in torch's order: decoupled weight
    decay (when ``decay``), the moments, the update. ZeRO calls it on pieces of its flat buffers."""
    b1, b2 = betas
    step_size, root2 = lr / (1 - b1 ** t), math.sqrt(1 - b2 ** t)
    if weight_decay and decay:
        p *= 1 - lr * weight_decay
    m *= b1
    m += (1 - b1) * g
    v *= b2
    v += (1 - b2) * g * g
    denom = xp.sqrt(v) / root2 + eps
    p -= step_size * m / denom


class AdamW:
    """``params`` and ``grads``: dicts name -> array of the same shapes (the layers' own dicts).

    ``no_decay``: names exempt from weight decay (GPT-2 and llm.c exempt biases and norms).
    ``step()`` updates every parameter in place from ``grads``; it does not zero them.
    """

    def __init__(self, params: dict, grads: dict, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, no_decay=()):
        where = "AdamW"
        self.lr = positive(where, "lr", lr, allow_zero=True)
        if not isinstance(betas, (tuple, list)) or len(betas) != 2 or \
                not all(isinstance(b, (int, float)) and 0 <= b < 1 for b in betas):
            raise ValueError(f"{where}: betas must be two numbers in [0, 1), got {betas!r}")
        self.betas = (float(betas[0]), float(betas[1]))
        self.eps = positive(where, "eps", eps)
        self.weight_decay = positive(where, "weight_decay", weight_decay, allow_zero=True)
        if set(params) != set(grads):
            raise ValueError(f"{where}: params and grads name different arrays: only in params "
                             f"{sorted(set(params) - set(grads))}, only in grads {sorted(set(grads) - set(params))}")
        no_decay = parameter_names(where, "no_decay", no_decay)   # once: an iterator is read once
        unknown = sorted(no_decay - set(params))
        if unknown:
            raise ValueError(f"{where}: no_decay names {unknown} that are not parameters")
        for name, p in params.items():
            array_module(p)
            if p.dtype.kind != "f":
                raise TypeError(f"{where}: parameter {name!r} has dtype {p.dtype}, expected a floating dtype")
            if not p.flags.writeable:   # step() writes it in place: it would fail there, after t and earlier moments
                raise ValueError(f"{where}: parameter {name!r} is read-only (its flags.writeable is False); step() "
                                 f"updates the parameters in place")
            if tuple(grads[name].shape) != tuple(p.shape) or grads[name].dtype != p.dtype:
                raise ValueError(f"{where}: grad of {name!r} is {grads[name].dtype}{tuple(grads[name].shape)}, "
                                 f"expected {p.dtype}{tuple(p.shape)} (the parameter's)")
        self.params, self.grads = params, grads
        self.no_decay = no_decay
        self.m = {n: array_module(p).zeros_like(p) for n, p in params.items()}
        self.v = {n: array_module(p).zeros_like(p) for n, p in params.items()}
        self.t = 0

    def step(self) -> None:
        self.t += 1
        for name, p in self.params.items():
            adamw_update(p, self.m[name], self.v[name], self.grads[name], self.t, self.lr, self.betas, self.eps,
                         self.weight_decay, name not in self.no_decay, array_module(p))

    def state(self) -> dict:
        """``{"t": step, "m": {...}, "v": {...}}`` (the arrays themselves, not copies)."""
        return {"t": self.t, "m": self.m, "v": self.v}


def parameter_names(where: str, name: str, value) -> frozenset:
    """A collection of parameter names (a list, tuple, set, read once): TypeError for a string, whose characters it
    would otherwise be, or for anything not iterable."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise TypeError(f"{where}: {name} must be a collection of parameter names, got {value!r}")
    return frozenset(value)


def global_grad_norm(local_sq: float, group=None) -> float:
    """sqrt of ``local_sq`` summed over ``group`` (a pycollect Communicator; None: this rank alone)."""
    import numpy as np

    total = np.array([local_sq], dtype=np.float64)
    if group is not None and group.size > 1:
        total = group.allreduce(total, op="sum")
    return float(math.sqrt(total[0]))


def clip_grad_norm(grads: dict, max_norm: float, group=None, replicated=()) -> float:
    """Scale ``grads`` in place so their global 2-norm is at most ``max_norm``; returns the norm before.

    The squares of this rank's arrays are summed over ``group``; names in ``replicated`` hold the
    same array on every rank of the group and count once (taken from the group's rank 0 only).
    """
    max_norm = positive("clip_grad_norm", "max_norm", max_norm)
    rank0 = group is None or group.rank == 0
    norm = global_grad_norm(sum_of_squares(grads, skip=() if rank0 else replicated), group)
    scale_to_norm(grads, max_norm, norm)
    return norm


def sum_of_squares(grads: dict, skip=(), only=None) -> float:
    """Sum of the squared elements (in float64) of the arrays of ``grads`` not named in ``skip`` (and,
    with ``only``, named in it): this rank's share of a global norm."""
    return sum(float((g.astype("float64") ** 2).sum()) for name, g in grads.items()
               if name not in skip and (only is None or name in only))


def scale_to_norm(grads: dict, max_norm: float, norm: float) -> None:
    """Scale every array of ``grads`` by max_norm / (norm + 1e-6) when ``norm`` is above ``max_norm``
    (``torch.nn.utils.clip_grad_norm_``'s rule)."""
    if norm > max_norm:
        scale = max_norm / (norm + 1e-6)
        for g in grads.values():
            g *= scale

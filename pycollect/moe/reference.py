"""The mixture of experts in one process, token by token: the reference MoELayer is held to.

Written plainly and apart from the vectorised code (``router.py``, ``dispatch.py``, ``layer.py``):
a loop over tokens, and over each token's choices, with the routing rules of ``router.py``'s
docstring spelled out again in Python. Only ``pycollect.nn``'s GeLU and softmax are shared, which
``tests/test_nn.py`` checks against finite differences.
"""
from __future__ import annotations

import math

import numpy as np

from ..nn._base import check_bool
from ..nn.activation import gelu_backward, gelu_forward
from ..nn.attention import softmax_backward, softmax_forward

__all__ = ["reference_moe"]


def _route(probs, k: int):
    """Per token: its k experts (most probable first, ties to the lower index) and their gates."""
    experts, gates = [], []
    for p in probs:
        chosen = sorted(range(len(p)), key=lambda e: (-p[e], e))[:k]
        total = sum(p[e] for e in chosen)
        experts.append(chosen)
        gates.append([p[e] if k == 1 else p[e] / total for e in chosen])
    return experts, gates


def _keep(experts, probs, num_experts: int, cap, order: str):
    """keep[t][j]: whether token t's j-th choice fits in its expert's ``cap`` (None: everything fits)."""
    t_count, k = len(experts), len(experts[0]) if experts else 0
    keep = [[True] * k for _ in range(t_count)]
    if cap is None:
        return keep
    for e in range(num_experts):
        wanting = [(t, j) for t in range(t_count) for j in range(k) if experts[t][j] == e]  # in position order
        if order == "probability":
            wanting.sort(key=lambda tj: (-probs[tj[0]][e], tj[0]))
        for t, j in wanting[cap:]:
            keep[t][j] = False
    return keep


def reference_moe(params: dict, x, dy=None, *, top_k: int = 1, capacity_factor: float = 1.25,
                  drop_tokens: bool = True, drop_order: str = "position", aux_loss_coef: float = 1e-2,
                  aux_grad: float = 0.0, approximate: str = "tanh") -> dict:
    """Forward (and with ``dy`` backward) of the whole layer on one rank's tokens x (T, C).

    ``params``: full ``router`` (C, E), ``w1`` (E, C, F), ``b1`` (E, F), ``w2`` (E, F, C), ``b2`` (E, C).
    Returns ``y`` (T, C), ``aux_loss``, ``expert`` and ``keep`` (T, k) lists, ``dropped`` (E,) int64,
    ``capacity``; with ``dy`` (T, C) also ``dx`` (T, C) and ``grads`` (full names and shapes).
    """
    drop_tokens = check_bool("reference_moe", "drop_tokens", drop_tokens)
    t_count, e_count = x.shape[0], params["router"].shape[1]
    probs = _router_probs(x, params["router"])  # (T, E)
    experts, gates = _route(probs, top_k)
    cap = math.ceil(round(top_k * t_count / e_count * capacity_factor, 9)) if drop_tokens else None
    keep = _keep(experts, probs, e_count, cap, drop_order)
    y, chosen, dropped = _experts_forward(params, x, experts, gates, keep, approximate)
    f = chosen / max(t_count * top_k, 1)  # fraction of assignments per expert
    mean_p = probs.sum(axis=0) / max(t_count, 1)
    aux = float(aux_loss_coef * e_count * sum(f[i] * mean_p[i] for i in range(e_count)))
    out = {"y": y, "aux_loss": aux, "expert": experts, "keep": keep, "dropped": dropped, "capacity": cap}
    if dy is None:
        return out
    grads = {n: np.zeros_like(params[n]) for n in ("router", "w1", "b1", "w2", "b2")}
    dx = np.zeros_like(x)
    for t in range(t_count):
        dgate = _token_experts_backward(params, t, x, dy, experts, gates, keep, grads, dx, approximate)
        dprob = _gates_backward(dgate, experts[t], gates[t], probs[t], x.dtype)  # (E,)
        for i in range(e_count):
            dprob[i] += aux_grad * aux_loss_coef * e_count * f[i] / t_count
        dlogit = softmax_backward(dprob, probs[t])  # (E,)
        grads["router"] += np.outer(x[t], dlogit)
        dx[t] += params["router"] @ dlogit
    out.update(dx=dx, grads=grads)
    return out


def _router_probs(x, wr):
    """Each token's softmax over the experts of its router logits x[t] @ wr: (T, E)."""
    t_count, e_count = x.shape[0], wr.shape[1]
    logits = np.stack([x[t] @ wr for t in range(t_count)]) if t_count else np.zeros((0, e_count), x.dtype)
    return np.stack([softmax_forward(row) for row in logits]) if t_count else logits.copy()


def _expert(params: dict, e: int, x_t, approximate: str):
    """Expert ``e``'s MLP on one token x_t (C,): pre-activation h (F,), GeLU a (F,), output o (C,)."""
    h = x_t @ params["w1"][e] + params["b1"][e]  # (F,)
    a = gelu_forward(h, approximate)  # (F,)
    return h, a, a @ params["w2"][e] + params["b2"][e]  # (C,)


def _experts_forward(params: dict, x, experts, gates, keep, approximate: str):
    """y (T, C): each token's kept choices' outputs weighted by their gates; assignments per expert (E,) and
    those dropped (E,) int64."""
    e_count = params["router"].shape[1]
    dropped = np.zeros(e_count, np.int64)
    chosen = np.zeros(e_count)
    y = np.zeros_like(x)
    for t in range(x.shape[0]):
        for j, e in enumerate(experts[t]):
            chosen[e] += 1
            if not keep[t][j]:
                dropped[e] += 1
                continue
            y[t] += gates[t][j] * _expert(params, e, x[t], approximate)[2]
    return y, chosen, dropped


def _token_experts_backward(params: dict, t: int, x, dy, experts, gates, keep, grads: dict, dx,
                            approximate: str) -> list[float]:
    """Token t's kept choices backward: adds to the experts' ``grads`` and to dx[t]; returns dy . o per choice
    (the gradient of each gate; 0 for a dropped choice)."""
    dgate = [0.0] * len(experts[t])
    for j, e in enumerate(experts[t]):
        if not keep[t][j]:
            continue
        h, a, o = _expert(params, e, x[t], approximate)
        dgate[j] = float(dy[t] @ o)
        do = gates[t][j] * dy[t]  # (C,)
        grads["w2"][e] += np.outer(a, do)
        grads["b2"][e] += do
        dh = gelu_backward(do @ params["w2"][e].T, h, approximate)  # (F,)
        grads["w1"][e] += np.outer(x[t], dh)
        grads["b1"][e] += dh
        dx[t] += params["w1"][e] @ dh
    return dgate


def _gates_backward(dgate: list[float], experts_t, gates_t, probs_t, dtype):
    """The gradient of one token's probabilities (E,) from its gates': top-1 gates are the probability itself,
    top-k ones the probability over the sum of the chosen."""
    dprob = np.zeros(len(probs_t), dtype=dtype)  # (E,)
    if len(experts_t) == 1:
        dprob[experts_t[0]] += dgate[0]
        return dprob
    total = sum(probs_t[e] for e in experts_t)
    weighted = sum(dgate[j] * gates_t[j] for j in range(len(experts_t)))
    for j, e in enumerate(experts_t):
        dprob[e] += (dgate[j] - weighted) / total
    return dprob

"""The router of a mixture of experts: top-k choices, gate weights, capacity, dropping, balancing loss.

Pure functions on one rank's tokens, no communication. Letters: T tokens, C model width, E experts,
k choices per token. An *assignment* is one (token t, choice j) pair, numbered ``t * k + j``.

- ``probs = softmax(x @ w_router)`` (T, E); a token's choices are its k most probable experts, in
  decreasing order of probability, ties going to the lower expert index. A tie is one of the computed
  probabilities: two router columns alike may give logits that differ in the last bit (the matrix
  product rounds by where a column sits), and the higher index can win there.
- Gate weights: for k = 1 the probability itself (Switch Transformer); for k > 1 the k
  probabilities renormalised to sum to 1 over the chosen k (Mixtral, Megatron's pre-softmax-free
  top-k). Renormalisation happens before any dropping, and a dropped choice's weight is not
  handed to the token's other choices.
- Capacity: ``ceil(k * T / E * capacity_factor)`` assignments per expert per rank, the product
  rounded to 9 decimals before the ceiling (so 1.1 x 10 gives 11, not 12).
- Dropping: each expert keeps at most ``capacity`` of its assignments. ``"position"`` keeps the
  earliest tokens; ``"probability"`` keeps those with the highest router probability for that
  expert, ties going to the earlier token. A token with every choice dropped leaves the layer as 0:
  with the block's residual it passes through unchanged.
- Load-balancing loss (Switch Transformer, eq. 4): ``coef * E * sum_i f_i * P_i`` with ``f_i`` the
  fraction of assignments that choose expert i (counted before dropping; sum_i f_i = 1) and ``P_i``
  the mean probability of expert i over the T tokens. It is ``coef`` when P is uniform and
  ``coef * E`` when every token puts all its probability on one expert. Only P carries a gradient.
"""
from __future__ import annotations

import math
import numbers

from ..nn._base import array_module

__all__ = ["DROP_ORDERS", "capacity", "top_k", "top_k_backward", "keep_mask", "dropped_per_expert",
           "aux_loss", "aux_loss_backward", "check_config"]

DROP_ORDERS = ("position", "probability")


def check_config(where: str, num_experts, top_k, capacity_factor, drop_order: str = "position",
                 aux_loss_coef=0.0) -> None:
    """ValueError/TypeError naming the argument unless the routing settings make sense."""
    for name, v in (("num_experts", num_experts), ("top_k", top_k)):
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
            raise ValueError(f"{where}: {name} must be a positive integer, got {v!r}")
    if top_k > num_experts:
        raise ValueError(f"{where}: top_k = {top_k} is larger than num_experts = {num_experts} "
                         f"(each token chooses k distinct experts)")
    if (isinstance(capacity_factor, bool) or not isinstance(capacity_factor, numbers.Real)
            or not math.isfinite(capacity_factor) or capacity_factor <= 0):
        raise ValueError(f"{where}: capacity_factor must be a positive finite number, got {capacity_factor!r}")
    if drop_order not in DROP_ORDERS:
        raise ValueError(f"{where}: drop_order must be one of {', '.join(DROP_ORDERS)}, got {drop_order!r}")
    if (isinstance(aux_loss_coef, bool) or not isinstance(aux_loss_coef, numbers.Real)
            or not math.isfinite(aux_loss_coef) or aux_loss_coef < 0):
        raise ValueError(f"{where}: aux_loss_coef must be a finite number >= 0, got {aux_loss_coef!r}")


def capacity(tokens: int, num_experts: int, top_k: int, capacity_factor: float) -> int:
    """Assignments an expert takes: ceil(k * T / E * capacity_factor) (1024, 8, 1, 1.25 -> 160)."""
    return math.ceil(round(top_k * tokens / num_experts * capacity_factor, 9))


def top_k(probs, k: int):
    """The k most probable experts of each token and their gate weights.

    probs (T, E) -> expert (T, k) int64, in decreasing probability (ties: lower index first);
    gate (T, k): the probabilities for k = 1, renormalised over the k chosen for k > 1.
    """
    xp = array_module(probs)
    expert = xp.argsort(-probs, axis=1, kind="stable")[:, :k].astype(xp.int64)  # (T, k)
    chosen = xp.take_along_axis(probs, expert, axis=1)  # (T, k)
    gate = chosen if k == 1 else chosen / chosen.sum(axis=1, keepdims=True)
    return expert, gate


def top_k_backward(dgate, probs, expert, gate):
    """dprobs (T, E) from dgate (T, k), for ``top_k``'s gates.

    k = 1: the gate is the probability. k > 1: g_j = p_j / S with S the sum of the chosen p, so
    dp_i = (dg_i - sum_j dg_j g_j) / S for the chosen i, 0 elsewhere.
    """
    xp = array_module(probs)
    dprobs = xp.zeros_like(probs)  # (T, E)
    if expert.shape[1] == 1:
        dchosen = dgate
    else:
        s = xp.take_along_axis(probs, expert, axis=1).sum(axis=1, keepdims=True)  # (T, 1)
        dchosen = (dgate - (dgate * gate).sum(axis=1, keepdims=True)) / s  # (T, k)
    rows = xp.arange(probs.shape[0])[:, None]  # (T, 1)
    dprobs[rows, expert] = dchosen  # the k experts of a token are distinct
    return dprobs


def keep_mask(expert, probs, num_experts: int, cap: int | None, order: str = "position"):
    """(T, k) bool: which assignments their expert keeps within ``cap`` (None: all of them)."""
    xp = array_module(expert)
    t, k = expert.shape
    if cap is None:
        return xp.ones((t, k), dtype=bool)
    e = expert.reshape(-1)  # (T*k,) by assignment t*k + j
    a = xp.arange(t * k)
    if order == "position":
        ranked = xp.argsort(e, kind="stable")  # by expert, then by position
    else:
        p = xp.take_along_axis(probs, expert, axis=1).reshape(-1)  # (T*k,) probability of the chosen expert
        ranked = xp.lexsort((a, -p, e))  # by expert, then by probability (high first), then position
    counts = xp.bincount(e, minlength=num_experts)  # (E,)
    starts = xp.cumsum(counts) - counts  # (E,) where each expert's run begins in ``ranked``
    place = xp.empty(t * k, dtype=xp.int64)
    place[ranked] = a - starts[e[ranked]]  # rank of each assignment within its expert
    return (place < cap).reshape(t, k)


def dropped_per_expert(expert, keep, num_experts: int):
    """(E,) int64: assignments each expert dropped."""
    xp = array_module(expert)
    return xp.bincount(expert[~keep], minlength=num_experts).astype(xp.int64)


def aux_loss(probs, expert, coef: float):
    """Switch's coef * E * sum_i f_i * P_i over these tokens (a float; 0.0 with no tokens).

    f_i: fraction of the T*k assignments choosing expert i (before dropping); P_i: mean probs[:, i].
    """
    xp = array_module(probs)
    t, e = probs.shape
    if t == 0:
        return 0.0
    f = xp.bincount(expert.reshape(-1), minlength=e) / (t * expert.shape[1])  # (E,)
    p = probs.mean(axis=0)  # (E,)
    return float(coef * e * (f * p).sum())


def aux_loss_backward(grad: float, probs, expert, coef: float):
    """dprobs (T, E) of ``grad * aux_loss``: grad * coef * E * f_i / T in column i."""
    xp = array_module(probs)
    t, e = probs.shape
    if t == 0:
        return xp.zeros_like(probs)
    f = xp.bincount(expert.reshape(-1), minlength=e) / (t * expert.shape[1])  # (E,)
    return xp.broadcast_to((grad * coef * e / t * f).astype(probs.dtype), probs.shape).copy()

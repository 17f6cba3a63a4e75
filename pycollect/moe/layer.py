"""MoELayer: a mixture of experts with expert parallelism (Switch Transformer / GShard routing).

y = sum over a token's kept choices j of gate_j * expert_{e_j}(x), where expert e computes
gelu(x @ w1[e] + b1[e]) @ w2[e] + b2[e]. The layer is the MLP branch of a transformer block: it
returns the branch only, and the block adds the residual, so a token whose every choice was dropped
leaves the layer as 0 and passes through on the residual path. Routing, gates, capacity, dropping
and the balancing loss are defined in ``router.py``; the movement of rows in ``dispatch.py``.

Expert parallelism: over a group of p ranks (``group=``, a pycollect Communicator; None for one
process), rank r holds experts r*E/p ... (r+1)*E/p - 1 and a copy of the router. Every rank routes
its own tokens and applies capacity to its own T (per group, as GShard and Switch do). A forward
runs one allgather of the per-expert counts and two all-to-alls over the group (the rows to the
experts, the results back, each given the whole count matrix so no counts are exchanged again); a
backward the same two with the matrix transposed. A group of one sends nothing.

The balancing loss ``aux_loss`` is this rank's: f_i and P_i over this rank's tokens, no
communication. Averaged over ranks it is the figure Megatron-Core logs; its gradient enters only
through ``backward(dy, aux_grad=...)``, which scales it (pass the same factor as the loss's, e.g.
1/N for a mean over N data-parallel ranks).

Gradients: each rank's expert gradients already hold every token of the group routed to them; the
router's gradient holds this rank's tokens only (``partial_grads``): ``full_grads()`` sums it over
the group. Combined with data parallelism (``p`` consecutive ranks an expert group, the dp groups
across them), the experts' gradients are then summed over the dp group, and the router's over the
dp group as well (so over every rank in all).
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from ..nn._base import (ForWeight, Layer, array_module, check_bool, check_float, check_same_dtype, check_shape,
                        scatter_add)
from ..nn.activation import _check_approx
from ..nn.attention import softmax_backward, softmax_forward
from ..parallel.agree import OwnChecks, agree_full, as_text, check_group
from . import dispatch, router
from .experts import experts_backward_input, experts_backward_weight, experts_forward

__all__ = ["MoELayer", "Routing", "init_full", "check_full", "check_aux_grad"]

EXPERT_NAMES = ("w1", "b1", "w2", "b2")


class Routing:
    """What the router decided in the last forward, on this rank's T tokens.

    ``probs`` (T, E) softmax of the router; ``expert`` (T, k) the choices, most probable first;
    ``gate`` (T, k) their weights; ``keep`` (T, k) False where the choice was dropped; ``capacity``
    (None when dropless); ``dropped`` (E,) assignments each expert dropped; ``load`` (E,) assignments
    each expert was chosen for, before dropping.
    """

    def __init__(self, probs, expert, gate, keep, capacity, num_experts):
        self.probs, self.expert, self.gate, self.keep, self.capacity = probs, expert, gate, keep, capacity
        self.dropped = dispatch.to_host(router.dropped_per_expert(expert, keep, num_experts))
        self.load = dispatch.to_host(array_module(expert).bincount(expert.reshape(-1), minlength=num_experts))

    @property
    def dropped_tokens(self):
        """(T,) bool: tokens with every choice dropped (they pass through on the residual)."""
        return ~self.keep.any(axis=1)


def check_full(where: str, params: dict):
    """(C, F, E) of full ``{"router": (C, E), "w1": (E, C, F), "b1": (E, F), "w2": (E, F, C), "b2": (E, C)}``."""
    names = ("router",) + EXPERT_NAMES
    if sorted(params) != sorted(names):
        raise ValueError(f"{where}: params has names {sorted(params)}, expected {sorted(names)}")
    for k in names:
        check_float(where, k, params[k])
        check_same_dtype(where, k, params[k], "router", params["router"])
    check_shape(where, "router", params["router"], (None, None))
    c, e = params["router"].shape
    check_shape(where, "w1", params["w1"], (e, c, None))
    f = params["w1"].shape[2]
    check_shape(where, "b1", params["b1"], (e, f))
    check_shape(where, "w2", params["w2"], (e, f, c))
    check_shape(where, "b2", params["b2"], (e, c))
    return c, f, e


def check_aux_grad(where: str, aux_grad):
    """``aux_grad`` itself when it is a finite real number (a 0-d real array too, as a loss scale may be);
    TypeError naming it for anything else (a string, a bool), ValueError when NaN or infinite (every
    gradient of the router would be NaN)."""
    real = (isinstance(aux_grad, numbers.Real)
            or (getattr(aux_grad, "ndim", None) == 0 and getattr(aux_grad, "dtype", np.dtype(object)).kind in "fiu"))
    if isinstance(aux_grad, (bool, np.bool_)) or not real:
        raise TypeError(f"{where}: aux_grad must be a finite number, got {aux_grad!r}")
    value = float(aux_grad)
    if not math.isfinite(value):
        raise ValueError(f"{where}: aux_grad must be a finite number, got {value!r}")
    return aux_grad


def init_full(d_model: int, d_ff: int, num_experts: int, *, std: float = 0.02, rng=0,
              dtype=np.float32, xp=np) -> dict:
    """Full parameters: router and weights from N(0, std^2), biases zero (the same on every rank for one ``rng``)."""
    rng = np.random.default_rng(rng)
    c, f, e = d_model, d_ff, num_experts
    draw = lambda *shape: xp.asarray((rng.standard_normal(shape) * std).astype(dtype))  # noqa: E731
    return {"router": draw(c, e), "w1": draw(e, c, f), "b1": xp.zeros((e, f), dtype),
            "w2": draw(e, f, c), "b2": xp.zeros((e, c), dtype)}


class MoELayer(Layer):
    """Mixture of E experts, top-k routing, expert-parallel over ``group``.

    ``params``/``grads``: ``router`` (C, E) (replicated), and this rank's E_l = E/p experts ``w1``
    (E_l, C, F), ``b1`` (E_l, F), ``w2`` (E_l, F, C), ``b2`` (E_l, C). ``forward(x)`` takes x of
    shape (..., C), (B*T, C) or (B, T, C) alike: the leading axes are flattened into this rank's
    tokens in C order (their position for dropping), and y has x's shape. After a forward:
    ``aux_loss`` (float), ``dropped`` (E,) int64 and ``routing`` (a ``Routing``).
    """

    def __init__(self, d_model: int, d_ff: int, num_experts: int, top_k: int = 1, capacity_factor: float = 1.25,
                 group=None, drop_tokens: bool = True, aux_loss_coef: float = 1e-2, *,
                 drop_order: str = "position", approximate: str = "tanh", std: float = 0.02, rng=0,
                 dtype=np.float32, xp=np):
        """Random weights (``init_full`` with ``rng``, which every rank must pass alike); see ``from_full``."""
        full: dict = {}
        with OwnChecks() as own:   # raised in _setup after the agreement: a rank refusing alone left the others there
            for name, v in (("d_model", d_model), ("d_ff", d_ff)):
                if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                    raise ValueError(f"MoELayer: {name} must be a positive integer, got {v!r}")
            router.check_config("MoELayer", num_experts, top_k, capacity_factor, drop_order, aux_loss_coef)
            try:
                np.dtype(dtype)
            except TypeError:
                raise TypeError(f"MoELayer: dtype {dtype!r} is not a NumPy dtype") from None
            if isinstance(std, bool) or not isinstance(std, numbers.Real) or not std >= 0:
                raise ValueError(f"MoELayer: std must be a non-negative number, got {std!r}")
            full = init_full(d_model, d_ff, num_experts, std=std, rng=rng, dtype=dtype, xp=xp)
        self._setup("MoELayer", full, top_k, capacity_factor, group, drop_tokens, aux_loss_coef, drop_order,
                    approximate, own.failed)

    @classmethod
    def from_full(cls, params: dict, top_k: int = 1, capacity_factor: float = 1.25, group=None,
                  drop_tokens: bool = True, aux_loss_coef: float = 1e-2, *, drop_order: str = "position",
                  approximate: str = "tanh") -> "MoELayer":
        """This rank's share of full ``{"router": (C, E), "w1": (E, C, F), "b1": (E, F), "w2": (E, F, C),
        "b2": (E, C)}`` (the same on every rank); copies."""
        layer = cls.__new__(cls)
        layer._setup("MoELayer.from_full", params, top_k, capacity_factor, group, drop_tokens, aux_loss_coef,
                     drop_order, approximate)
        return layer

    def _setup(self, where, full, top_k, capacity_factor, group, drop_tokens, aux_loss_coef, drop_order,
               approximate, failed: BaseException | None = None) -> None:
        """``failed``: the constructor's own refused argument, raised after the agreement as this method's."""
        if group is not None:   # None: one process holds every expert
            check_group(where, group)
        c, f, e = 0, 0, 0
        p, r = dispatch.group_size(group), dispatch.group_rank(group)
        # this rank's own checks, then agreed: ranks built otherwise would exchange rows of other widths
        with OwnChecks() as own:
            if failed is not None:
                raise failed
            c, f, e = check_full(where, full)
            router.check_config(where, e, top_k, capacity_factor, drop_order, aux_loss_coef)
            drop_tokens = check_bool(where, "drop_tokens", drop_tokens)
            _check_approx(where, approximate)
            if e % p:
                raise ValueError(f"{where}: num_experts = {e} does not divide by the expert-parallel group size {p} "
                                 f"(rank {r})")
        if group is not None:
            agree_full(where, full, f"top_k {as_text(top_k)}, capacity_factor {as_text(capacity_factor)}, drop_tokens "
                                    f"{bool(drop_tokens)}, aux_loss_coef {as_text(aux_loss_coef)}, drop_order "
                                    f"{drop_order!r}, approximate {approximate!r}", group, own.failed)
        elif own.failed is not None:
            raise own.failed
        n = e // p
        self.group, self.ep_size, self.ep_rank = group, p, r
        self.d_model, self.d_ff, self.num_experts, self.local_experts = c, f, e, n
        self.first_expert = r * n
        self.top_k, self.capacity_factor = int(top_k), float(capacity_factor)
        self.drop_tokens, self.drop_order = bool(drop_tokens), drop_order
        self.aux_loss_coef, self.approximate = float(aux_loss_coef), approximate
        shards = {"router": full["router"].copy()}
        for k in EXPERT_NAMES:
            shards[k] = full[k][r * n:(r + 1) * n].copy()  # (E_l, ...)
        super().__init__(shards)
        self.aux_loss, self.dropped, self.routing = 0.0, np.zeros(e, np.int64), None

    @property
    def partial_grads(self) -> tuple:
        """``("router",)`` over a group of more than one: each rank's router gradient covers its own tokens."""
        return ("router",) if self.ep_size > 1 else ()

    def capacity(self, tokens: int) -> int | None:
        """Assignments each expert keeps out of ``tokens`` of this rank's (None when dropless)."""
        if not self.drop_tokens:
            return None
        return router.capacity(tokens, self.num_experts, self.top_k, self.capacity_factor)

    def forward(self, x):
        """x (..., C) this rank's tokens -> y (..., C) (collective over the group)."""
        where, wr = "MoELayer.forward", self.params["router"]  # (C, E)
        check_float(where, "x", x)
        check_shape(where, "x", x, (..., self.d_model))
        check_same_dtype(where, "x", x, "router", wr)
        xt = x.reshape(-1, self.d_model)  # (T, C)
        probs = softmax_forward(xt @ wr)  # (T, E)
        expert, gate = router.top_k(probs, self.top_k)  # (T, k), (T, k)
        cap = self.capacity(xt.shape[0])
        keep = router.keep_mask(expert, probs, self.num_experts, cap, self.drop_order)  # (T, k)
        self.routing = Routing(probs, expert, gate, keep, cap, self.num_experts)
        self.dropped = self.routing.dropped
        self.aux_loss = router.aux_loss(probs, expert, self.aux_loss_coef)

        plan = dispatch.make_plan(expert, keep, self.num_experts, self.group)  # counts exchanged
        tok = plan.order // self.top_k  # (N,) the token of each row sent
        xe = dispatch.to_experts(xt[tok], plan, self.group)  # (R, C) by source, then local expert
        p = self.params
        ye, h = experts_forward(xe, plan.runs, p["w1"], p["b1"], p["w2"], p["b2"], self.approximate)
        out = dispatch.from_experts(ye, plan, self.group)  # (N, C) back in plan.order
        g = gate.reshape(-1)[plan.order]  # (N,)
        xp = array_module(x)
        y = xp.zeros_like(xt)  # (T, C)
        scatter_add(y, tok, g[:, None] * out)  # a token's rows go to distinct experts: at most k per token
        self.cache = {"x": xt, "shape": x.shape, "plan": plan, "tok": tok, "xe": xe, "h": h, "out": out, "g": g,
                      "routing": self.routing}  # a pipeline keeps several forwards' caches in flight
        return y.reshape(x.shape)

    def backward(self, dy, aux_grad: float = 0.0):
        """dy (..., C) -> dx (..., C); adds every gradient into ``grads`` (collective over the group):
        B then W.

        ``aux_grad``: d(loss)/d(aux_loss), the balancing loss's gradient added with that weight (0: not added).
        """
        return self._b_then_w(lambda: self.backward_input(dy, aux_grad))

    def backward_input(self, dy, aux_grad: float = 0.0):
        """B: dy (..., C) -> dx (..., C), both all-to-alls of the backward included (collective over the
        group); keeps for W the rows each local expert computed and the router's logit gradient."""
        c = self._take_cache("MoELayer.backward")
        check_shape("MoELayer.backward", "dy", dy, tuple(c["shape"]))
        check_same_dtype("MoELayer.backward", "dy", dy, "router", self.params["router"])
        aux_grad = check_aux_grad("MoELayer.backward", aux_grad)
        xt, plan, tok, out, g = c["x"], c["plan"], c["tok"], c["out"], c["g"]
        rt, k, xp = c["routing"], self.top_k, array_module(xt)
        dyt = dy.reshape(-1, self.d_model)[tok]  # (N, C) the upstream gradient of each row's token
        dgate = xp.zeros(xt.shape[0] * k, dtype=xt.dtype)  # (T*k,) dropped choices: 0
        dgate[plan.order] = (dyt * out).sum(axis=1)
        dye = dispatch.to_experts(g[:, None] * dyt, plan, self.group)  # combine's backward: (R, C)
        p = self.params
        dxe, dh = experts_backward_input(dye, c["xe"], c["h"], plan.runs, p["w1"], p["w2"],
                                         self.approximate)  # (R, C), (R, F)
        dx = xp.zeros_like(xt)  # (T, C)
        scatter_add(dx, tok, dispatch.from_experts(dxe, plan, self.group))  # dispatch's backward
        dprobs = router.top_k_backward(dgate.reshape(-1, k), rt.probs, rt.expert, rt.gate)  # (T, E)
        if aux_grad:
            dprobs += router.aux_loss_backward(aux_grad, rt.probs, rt.expert, self.aux_loss_coef)
        dlogits = softmax_backward(dprobs, rt.probs)  # (T, E)
        dx += dlogits @ p["router"].T
        self.cache = ForWeight((dye, c["xe"], c["h"], dh, plan.runs, xt, dlogits))
        return dx.reshape(c["shape"])

    def backward_weight(self) -> None:
        """W: the local experts' and the router's gradients (this rank's tokens) into ``grads``; no
        communication."""
        dye, xe, h, dh, runs, xt, dlogits = self._take_for_weight("MoELayer.backward_weight")
        experts_backward_weight(dye, xe, h, dh, runs, self.grads, self.approximate)
        self.grads["router"] += xt.T @ dlogits  # (C, E), this rank's tokens

    def _whole(self, which: str) -> dict:
        """``which`` with the experts gathered over the group (E, ...) and the router copied (collective)."""
        d = getattr(self, which)
        full = {"router": d["router"].copy()}
        for k in EXPERT_NAMES:
            full[k] = d[k].copy() if self.ep_size == 1 else self.group.allgather(d[k])  # (E, ...)
        return full

    def full_grads(self, sum_partial: bool = True) -> dict:
        """Full gradients named and shaped as ``from_full`` takes them (collective): the experts gathered,
        the router summed over the group (``sum_partial=False``: this rank's share)."""
        sum_partial = check_bool("MoELayer.full_grads", "sum_partial", sum_partial)   # before the gathers
        full = self._whole("grads")
        if sum_partial and self.ep_size > 1:
            full["router"] = self.group.allreduce(full["router"])
        return full

    def full_params(self) -> dict:
        """The full weights under ``from_full``'s names (collective; new arrays)."""
        return self._whole("params")

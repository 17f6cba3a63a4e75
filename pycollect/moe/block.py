"""The MoE layer as the MLP branch of a transformer block (``ParallelBlock(ln1, attn, ln2, MoEBranch(...))``).

The block calls ``backward(dy)``; the branch adds the balancing loss's gradient with the weight the
model sets in ``aux_grad`` (the loss's own scale) before each backward. Its gradients are not partial
over the tensor-parallel group (``partial_grads`` is empty): the router's, which holds this rank's
tokens only, is averaged with the rest by data parallelism, and the experts' already hold every
token routed to them.
"""
from __future__ import annotations

from .layer import MoELayer

__all__ = ["MoEBranch"]


class MoEBranch:
    def __init__(self, moe: MoELayer):
        self.moe = moe
        self.params, self.grads = moe.params, moe.grads
        self.aux_grad = 0.0

    @property
    def aux_loss(self) -> float:
        return self.moe.aux_loss

    partial_grads = ()

    def forward(self, x):
        """x (B, T, C) this rank's tokens -> (B, T, C): the experts' weighted outputs (0 for dropped tokens)."""
        return self.moe.forward(x)

    def backward(self, dy):
        return self.moe.backward(dy, aux_grad=self.aux_grad)

    def full_grads(self, sum_partial: bool = False) -> dict:
        """The experts gathered over the expert group; the router's as it is (the caller reduced it)."""
        return self.moe.full_grads(sum_partial=False)

    def full_params(self) -> dict:
        return self.moe.full_params()

"""The MoE layer as the MLP branch of a transformer block (``ParallelBlock(ln1, attn, ln2, MoEBranch(...))``).

The block calls ``backward(dy)``; the branch adds the balancing loss's gradient with the weight the
model sets in ``aux_grad`` (the loss's own scale) before each backward. The router's gradient, which
holds this rank's tokens only, is averaged with the rest by data parallelism; the experts' already
hold every token routed to them.

Under tensor parallelism the experts are not split: every rank of the tensor-parallel group holds
the same experts (spread over the expert group, ``mesh.dp``). Without sequence parallelism the
ranks hold the same tokens and compute the same thing; with it (``sequence_parallel=True``, the
combination Megatron-Core requires) each rank routes its own slice of the sequence, so every
gradient of the branch is partial over the tensor-parallel group (``partial_grads`` names them all,
and the model sums them with the LayerNorms').
"""
from __future__ import annotations

from ..nn._base import check_bool
from .layer import MoELayer

__all__ = ["MoEBranch"]


class MoEBranch:
    def __init__(self, moe: MoELayer, sequence_parallel: bool = False):
        self.moe, self.sequence_parallel = moe, check_bool("MoEBranch", "sequence_parallel", sequence_parallel)
        self.params, self.grads = moe.params, moe.grads
        self.aux_grad = 0.0
        self.partial_grads = tuple(moe.params) if sequence_parallel else ()

    @property
    def aux_loss(self) -> float:
        return self.moe.aux_loss

    def forward(self, x):
        """x (B, T, C) this rank's tokens -> (B, T, C): the experts' weighted outputs (0 for dropped tokens)."""
        return self.moe.forward(x)

    def backward(self, dy):
        return self.moe.backward(dy, aux_grad=self.aux_grad)

    def backward_input(self, dy):
        """B: the input gradient, the balancing loss's with it (``aux_grad``); all-to-alls included."""
        return self.moe.backward_input(dy, aux_grad=self.aux_grad)

    def backward_weight(self) -> None:
        """W: the experts' and the router's gradients, no communication."""
        self.moe.backward_weight()

    def full_grads(self, sum_partial: bool = False) -> dict:
        """The experts gathered over the expert group; the router's as it is (the caller reduced it)."""
        return self.moe.full_grads(sum_partial=False)

    def full_params(self) -> dict:
        return self.moe.full_params()

"""Layers for models: pure ``*_forward`` / ``*_backward`` functions and small classes over them.

Each class holds ``params`` and ``grads`` (dicts of arrays by name, same shapes); ``forward``
keeps what ``backward`` needs, ``backward(dy)`` returns the input gradient and adds parameter
gradients into ``grads`` (accumulating across calls until ``zero_grad``). Arrays may be NumPy or
CuPy; the module is taken from the inputs. Weights of Linear are stored (C_in, C_out).
"""
from .activation import GeLU, gelu_backward, gelu_forward
from .attention import (CausalSelfAttention, Softmax, attention_backward, attention_forward, merge_heads,
                        self_attention_backward, self_attention_forward, softmax_backward, softmax_forward,
                        split_heads)
from .dropout import Dropout, dropout_mask
from .embedding import Embedding, embedding_backward, embedding_forward
from .layernorm import LayerNorm, layernorm_backward, layernorm_forward
from .linear import Linear, linear_backward, linear_forward
from .loss import CrossEntropy, cross_entropy
from ._base import Layer, erf

__all__ = [
    "Layer", "erf",
    "Linear", "linear_forward", "linear_backward",
    "GeLU", "gelu_forward", "gelu_backward",
    "LayerNorm", "layernorm_forward", "layernorm_backward",
    "Softmax", "softmax_forward", "softmax_backward",
    "attention_forward", "attention_backward", "split_heads", "merge_heads",
    "CausalSelfAttention", "self_attention_forward", "self_attention_backward",
    "Embedding", "embedding_forward", "embedding_backward",
    "CrossEntropy", "cross_entropy",
    "Dropout", "dropout_mask",
]

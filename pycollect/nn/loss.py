"""Cross-entropy: mean over tokens of -log softmax(logits)[target]."""
from __future__ import annotations

from ._base import Layer, array_module, check_float, check_shape
from .attention import softmax_forward
from .embedding import check_indices


def cross_entropy(logits, targets, ignore_index=None):
    """logits (..., V), targets (...) integers -> (loss, dlogits (..., V)), dlogits for dloss = 1.

    The mean runs over the tokens whose target is not ``ignore_index``; with none left the loss is 0.
    """
    xp = array_module(logits)
    v = logits.shape[-1]
    z = logits.reshape(-1, v)  # (N, V)
    tg = targets.reshape(-1)  # (N,)
    keep = xp.ones(tg.shape, dtype=bool) if ignore_index is None else tg != ignore_index  # (N,)
    safe = xp.where(keep, tg, 0)  # (N,)
    rows = xp.arange(z.shape[0])
    zmax = z.max(axis=-1, keepdims=True)  # (N, 1)
    lse = (zmax + xp.log(xp.exp(z - zmax).sum(axis=-1, keepdims=True)))[:, 0]  # (N,)
    nll = lse - z[rows, safe]  # (N,)
    count = int(keep.sum())
    norm = 1.0 / max(count, 1)
    loss = xp.asarray(xp.where(keep, nll, 0.0).sum() * norm, dtype=logits.dtype)  # ()
    dz = softmax_forward(z)  # (N, V)
    dz[rows, safe] -= 1.0
    dz *= (keep * norm).astype(logits.dtype)[:, None]
    return loss, dz.reshape(logits.shape)


class CrossEntropy(Layer):
    """forward(logits, targets) -> loss (0-d array); backward(dloss=1.0) -> dlogits."""

    def __init__(self, ignore_index=None):
        self.ignore_index = ignore_index
        super().__init__({})

    def forward(self, logits, targets):
        check_float("CrossEntropy.forward", "logits", logits)
        check_shape("CrossEntropy.forward", "targets", targets, tuple(logits.shape[:-1]))
        check_indices("CrossEntropy.forward", "targets", targets, logits.shape[-1], self.ignore_index)
        loss, self.cache = cross_entropy(logits, targets, self.ignore_index)
        return loss

    def backward(self, dloss=1.0):
        return self._b_then_w(lambda: self.backward_input(dloss))

    def backward_input(self, dloss=1.0):
        """dlogits scaled by ``dloss``; no weights, so B is the whole backward and frees the cache."""
        dlogits = self._take_cache("CrossEntropy.backward")
        self.cache = None
        return dlogits * dloss

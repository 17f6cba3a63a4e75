"""Token plus position embedding: wte (V, C), wpe (T_max, C)."""
from __future__ import annotations

import numpy as np

from ._base import (ForWeight, Layer, array_module, check_array, check_float, check_same_dtype, check_shape, normal,
                    scatter_add)


def embedding_forward(idx, wte, wpe):
    """idx (B, T) integers -> (B, T, C) = wte[idx] + wpe[:T]."""
    t = idx.shape[-1]
    return wte[idx] + wpe[:t]  # (B, T, C)


def embedding_backward(dout, idx, wte, wpe):
    """Gradients of ``embedding_forward``: dwte (V, C) and dwpe (T_max, C); repeated tokens add up."""
    xp = array_module(dout)
    c = wte.shape[1]
    t = idx.shape[-1]
    dwte = xp.zeros_like(wte)  # (V, C)
    scatter_add(dwte, idx.reshape(-1), dout.reshape(-1, c))
    dwpe = xp.zeros_like(wpe)  # (T_max, C)
    dwpe[:t] = dout.reshape(-1, t, c).sum(axis=0)
    return dwte, dwpe


def check_indices(where: str, name: str, idx, limit: int, ignore_index=None) -> None:
    """TypeError for non-integer ``idx``; ValueError for values outside [0, limit) (``ignore_index`` aside)."""
    check_array(where, name, idx)
    if idx.dtype.kind not in "iu":
        raise TypeError(f"{where}: {name} has dtype {idx.dtype}, expected an integer dtype")
    vals = idx if ignore_index is None else idx[idx != ignore_index]
    if vals.size:
        lo, hi = int(vals.min()), int(vals.max())
        if lo < 0 or hi >= limit:
            raise ValueError(f"{where}: {name} holds values in [{lo}, {hi}], expected [0, {limit})")


class Embedding(Layer):
    """params ``wte`` (V, C) and ``wpe`` (T_max, C); forward takes idx (B, T), backward returns None."""

    def __init__(self, wte, wpe):
        check_float("Embedding", "wte", wte)
        check_shape("Embedding", "wte", wte, (None, None))
        check_shape("Embedding", "wpe", wpe, (None, wte.shape[1]))
        check_same_dtype("Embedding", "wpe", wpe, "wte", wte)
        super().__init__({"wte": wte, "wpe": wpe})

    @classmethod
    def create(cls, v: int, t_max: int, c: int, *, std: float = 0.02, rng=None, dtype=np.float32,
               xp=np) -> "Embedding":
        rng = np.random.default_rng(rng)
        return cls(normal((v, c), std, rng, dtype, xp), normal((t_max, c), std, rng, dtype, xp))

    def forward(self, idx):
        wte, wpe = self.params["wte"], self.params["wpe"]
        check_array("Embedding.forward", "idx", idx)
        check_shape("Embedding.forward", "idx", idx, (None, None))
        check_indices("Embedding.forward", "idx", idx, wte.shape[0])
        if idx.shape[1] > wpe.shape[0]:
            raise ValueError(f"Embedding.forward: idx has T={idx.shape[1]}, longer than T_max={wpe.shape[0]}")
        self.cache = idx
        return embedding_forward(idx, wte, wpe)

    def backward_input(self, dout):
        """No input gradient (the input is integers): keeps (dout, idx) for W and returns None."""
        idx = self._take_cache("Embedding.backward")
        check_shape("Embedding.backward", "dout", dout, idx.shape + (self.params["wte"].shape[1],))
        self.cache = ForWeight((dout, idx))
        return None

    def backward_weight(self) -> None:
        dout, idx = self._take_for_weight("Embedding.backward_weight")
        dwte, dwpe = embedding_backward(dout, idx, self.params["wte"], self.params["wpe"])
        self.grads["wte"] += dwte
        self.grads["wpe"] += dwpe

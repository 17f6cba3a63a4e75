"""Vocabulary parallelism: the token embedding and the cross-entropy split along V (Megatron-LM).

``VocabParallelEmbedding`` holds rows ``[r*V/p, (r+1)*V/p)`` of ``wte`` on rank r of a group of p;
each rank looks up the tokens that fall in its rows (zeros for the others) and one allreduce
(reduce_from_group: allreduce forward / identity backward) makes the (B, T, C) output replicated;
the replicated position table ``wpe`` is added once, after the reduction.

``VocabParallelCrossEntropy`` takes logits split along V, (B, T, V/p) on each rank as a
ColumnParallelLinear head without ``gather_output`` leaves them, and never gathers them: the
log-sum-exp and the target logit come from three allreduces of (B, T) arrays (the maximum, the
sum of exponentials, the target logit from the rank that owns it). Backward returns this rank's
shard of dlogits. Both take their group (a ``pycollect.Communicator``) explicitly.
"""
from __future__ import annotations

from ..nn._base import Layer, array_module, check_float, check_same_dtype, check_shape, scatter_add
from ..nn.embedding import check_indices
from .mappings import allgather_along, reduce_from_group
from .tensor import _check_full, _shard

__all__ = ["VocabParallelEmbedding", "VocabParallelCrossEntropy"]


def _allreduce(x, op: str, group):
    """``x`` reduced over the group with ``op``; the group of one returns ``x``."""
    return x if group.size == 1 else group.allreduce(x, op=op)


def _owned(ids, lo: int, hi: int):
    """Mask of the ids in [lo, hi) and those ids made local (0 where not owned)."""
    xp = array_module(ids)
    mine = (ids >= lo) & (ids < hi)
    return mine, xp.where(mine, ids - lo, 0)


# -- the embedding --------------------------------------------------------------------------------------
def vocab_embedding_forward(idx, wte_shard, lo: int):
    """idx (B, T) full ids -> (B, T, C) partial: ``wte_shard`` rows for ids in [lo, lo + V/p), zeros elsewhere."""
    mine, local = _owned(idx, lo, lo + wte_shard.shape[0])  # (B, T), (B, T)
    out = wte_shard[local]  # (B, T, C)
    out[~mine] = 0
    return out


def vocab_embedding_backward(dout, idx, wte_shard, wpe, lo: int):
    """dwte_shard (V/p, C): scatter-add of dout over the owned ids; dwpe (T_max, C): dout summed over B."""
    xp = array_module(dout)
    c, t = wte_shard.shape[1], idx.shape[-1]
    mine, local = _owned(idx.reshape(-1), lo, lo + wte_shard.shape[0])  # (B*T,), (B*T,)
    dwte = xp.zeros_like(wte_shard)  # (V/p, C)
    scatter_add(dwte, local[mine], dout.reshape(-1, c)[mine])
    dwpe = xp.zeros_like(wpe)  # (T_max, C)
    dwpe[:t] = dout.reshape(-1, t, c).sum(axis=0)
    return dwte, dwpe


class VocabParallelEmbedding(Layer):
    """params ``wte`` (V/p, C), this rank's rows, and ``wpe`` (T_max, C) replicated; idx (B, T) -> (B, T, C)."""

    def __init__(self, wte_shard, wpe, group):
        check_float("VocabParallelEmbedding", "wte_shard", wte_shard)
        check_shape("VocabParallelEmbedding", "wte_shard", wte_shard, (None, None))
        check_shape("VocabParallelEmbedding", "wpe", wpe, (None, wte_shard.shape[1]))
        check_same_dtype("VocabParallelEmbedding", "wpe", wpe, "wte_shard", wte_shard)
        super().__init__({"wte": wte_shard, "wpe": wpe})
        self.group = group
        self.vocab = wte_shard.shape[0] * group.size  # V
        self.lo = group.rank * wte_shard.shape[0]  # first row this rank holds
        self._reduce = reduce_from_group(group)

    @classmethod
    def from_full(cls, params: dict, group) -> "VocabParallelEmbedding":
        """This rank's rows of full ``{"wte": (V, C), "wpe": (T_max, C)}``, the same on every rank; copies."""
        where = "VocabParallelEmbedding.from_full"
        _check_full(where, params, {"wte": (None, None), "wpe": (None, None)})
        wte, wpe = params["wte"], params["wpe"]
        check_shape(where, "wte", wte, (None, None))
        check_shape(where, "wpe", wpe, (None, wte.shape[1]))
        n = _shard("VocabParallelEmbedding", "V (wte.shape[0])", wte.shape[0], group)
        lo = group.rank * n
        return cls(wte[lo:lo + n].copy(), wpe.copy(), group)  # (V/p, C), (T_max, C)

    def forward(self, idx):
        """idx (B, T) full token ids, replicated over the group -> (B, T, C) replicated: one allreduce."""
        wte, wpe = self.params["wte"], self.params["wpe"]
        array_module(idx)
        check_shape("VocabParallelEmbedding.forward", "idx", idx, (None, None))
        check_indices("VocabParallelEmbedding.forward", "idx", idx, self.vocab)
        if idx.shape[1] > wpe.shape[0]:
            raise ValueError(f"VocabParallelEmbedding.forward: idx has T={idx.shape[1]}, "
                             f"longer than T_max={wpe.shape[0]}")
        self.cache = idx
        out = self._reduce.forward(vocab_embedding_forward(idx, wte, self.lo))  # allreduce  # (B, T, C)
        return out + wpe[:idx.shape[1]]  # once, after the reduction

    def backward(self, dout):
        """dout (B, T, C) replicated; adds into ``grads`` this rank's ``wte`` rows and ``wpe``; returns None."""
        idx = self._take_cache("VocabParallelEmbedding.backward")
        check_shape("VocabParallelEmbedding.backward", "dout", dout, idx.shape + (self.params["wte"].shape[1],))
        dout = self._reduce.backward(dout)  # identity
        dwte, dwpe = vocab_embedding_backward(dout, idx, self.params["wte"], self.params["wpe"], self.lo)
        self.grads["wte"] += dwte
        self.grads["wpe"] += dwpe
        return None

    def full_grads(self) -> dict:
        """``{"wte": (V, C), "wpe": (T_max, C)}``: the row shards gathered (collective), ``wpe`` copied."""
        g = self.grads["wte"]  # (V/p, C)
        wte = allgather_along(g, 0, self.group)  # (V, C)
        return {"wte": g.copy() if wte is g else wte, "wpe": self.grads["wpe"].copy()}


# -- the cross-entropy ----------------------------------------------------------------------------------
def vocab_cross_entropy(logits_shard, targets, group, ignore_index=None):
    """logits (..., V/p) this rank's columns, targets (...) full ids -> (loss, dlogits shard (..., V/p)).

    Three allreduces of (N,) arrays, N the number of tokens: max, sum of exponentials, target logit.
    The mean runs over the tokens whose target is not ``ignore_index``; with none left the loss is 0.
    """
    xp = array_module(logits_shard)
    vp = logits_shard.shape[-1]
    lo = group.rank * vp
    z = logits_shard.reshape(-1, vp)  # (N, V/p)
    tg = targets.reshape(-1)  # (N,)
    keep = xp.ones(tg.shape, dtype=bool) if ignore_index is None else tg != ignore_index  # (N,)
    mine, local = _owned(tg, lo, lo + vp)  # (N,), (N,)
    mine &= keep
    rows = xp.arange(z.shape[0])
    zmax = _allreduce(z.max(axis=-1), "max", group)  # (N,), the max over the full vocabulary
    e = xp.exp(z - zmax[:, None])  # (N, V/p)
    total = _allreduce(e.sum(axis=-1), "sum", group)  # (N,)
    zt = _allreduce(xp.where(mine, z[rows, local], 0.0).astype(z.dtype), "sum", group)  # (N,)
    nll = zmax + xp.log(total) - zt  # (N,)
    count = int(keep.sum())
    norm = 1.0 / max(count, 1)
    loss = xp.asarray(xp.where(keep, nll, 0.0).sum() * norm, dtype=logits_shard.dtype)  # ()
    dz = e / total[:, None]  # (N, V/p), this rank's columns of the softmax
    dz[rows[mine], local[mine]] -= 1.0
    dz *= (keep * norm).astype(logits_shard.dtype)[:, None]
    return loss, dz.reshape(logits_shard.shape)


class VocabParallelCrossEntropy(Layer):
    """forward(logits (B, T, V/p), targets (B, T)) -> loss (0-d, the same on every rank).

    backward(dloss=1.0) -> this rank's dlogits (B, T, V/p).
    """

    def __init__(self, group, ignore_index=None):
        super().__init__({})
        self.group = group
        self.ignore_index = ignore_index

    def forward(self, logits, targets):
        where = "VocabParallelCrossEntropy.forward"
        check_float(where, "logits", logits)
        check_shape(where, "targets", targets, tuple(logits.shape[:-1]))
        check_indices(where, "targets", targets, logits.shape[-1] * self.group.size, self.ignore_index)
        loss, self.cache = vocab_cross_entropy(logits, targets, self.group, self.ignore_index)
        return loss

    def backward(self, dloss=1.0):
        return self._take_cache("VocabParallelCrossEntropy.backward") * dloss

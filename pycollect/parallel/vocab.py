"""Vocabulary parallelism: the token embedding and the cross-entropy split along V (Megatron-LM).

``VocabParallelEmbedding`` holds rows ``[r*V/p, (r+1)*V/p)`` of ``wte`` on rank r of a group of p;
each rank looks up the tokens that fall in its rows (zeros for the others) and one allreduce
(reduce_from_group: allreduce forward / identity backward) makes the (B, T, C) output replicated;
the replicated position table ``wpe`` is added once, after the reduction.

With sequence parallelism (``sequence_parallel=True``) the output is this rank's part of the
sequence, (B, T/p, C) with rank r holding positions r*T/p:(r+1)*T/p, as the sequence-parallel
blocks take it: the partial lookups are reduce-scattered along T (reduce_scatter_to_sequence)
instead of allreduced, and each rank adds its rows of ``wpe``. Backward allgathers dout along T for
the ``wte`` rows (every rank's tokens may hit them) and adds into ``wpe`` only this rank's
positions, so the ``wpe`` gradient is partial over the group (``partial_grads``), to be summed.

``VocabParallelCrossEntropy`` takes logits split along V, (B, T, V/p) on each rank as a
ColumnParallelLinear head without ``gather_output`` leaves them, and never gathers them: the
log-sum-exp and the target logit come from three allreduces of (B, T) arrays (the maximum, the
sum of exponentials, the target logit from the rank that owns it). Backward returns this rank's
shard of dlogits. Both take their group (a ``pycollect.Communicator``) explicitly.

Every rank's shard is V/p wide. Built by ``from_full`` (or with ``equal_shards=True``) it is so by construction;
built by hand, the embedding's first forward (the cross-entropy's every forward: its logits come per call) agrees the
widths in one allgather of an int and refuses uneven ones on every rank (``np.array_split`` of a V the group does not
divide): rank r's shard is taken to start at r * V/p.
"""
from __future__ import annotations

from ..nn._base import (ForWeight, Layer, array_module, check_array, check_bool, check_float, check_same_dtype,
                        check_shape, scatter_add)
from ..nn.embedding import check_indices
from .agree import OwnChecks, agree_equal_shards, agree_full, agree_layout, as_text, check_group
from .mappings import reduce_from_group, reduce_scatter_to_sequence
from .tensor import _check_full, _seq_shard, _shard, _sum_partial, gathered

__all__ = ["VocabParallelEmbedding", "VocabParallelCrossEntropy"]


def _allreduce(x, op: str, group):
    """``x`` reduced over the group with ``op``; the group of one returns ``x``."""
    return x if group.size == 1 else group.allreduce(x, op=op)


def _owned(ids, lo: int, hi: int):
    """Mask of the ids in [lo, hi) and those ids made local (0 where not owned), in int64: ids of a narrow dtype
    (int8, uint8) would overflow against a shard's bounds."""
    xp = array_module(ids)
    ids = ids.astype(xp.int64, copy=False)
    mine = (ids >= lo) & (ids < hi)
    return mine, xp.where(mine, ids - lo, 0)


# -- the embedding --------------------------------------------------------------------------------------
def vocab_embedding_forward(idx, wte_shard, lo: int):
    """idx (B, T) full ids -> (B, T, C) partial: ``wte_shard`` rows for ids in [lo, lo + V/p), zeros elsewhere."""
    mine, local = _owned(idx, lo, lo + wte_shard.shape[0])  # (B, T), (B, T)
    out = wte_shard[local]  # (B, T, C)
    out[~mine] = 0
    return out


def vocab_wte_backward(dout, idx, wte_shard, lo: int):
    """dwte_shard (V/p, C): scatter-add of dout (B, T, C) over the ids (B, T) in [lo, lo + V/p)."""
    c = wte_shard.shape[1]
    mine, local = _owned(idx.reshape(-1), lo, lo + wte_shard.shape[0])  # (B*T,), (B*T,)
    dwte = array_module(dout).zeros_like(wte_shard)  # (V/p, C)
    scatter_add(dwte, local[mine], dout.reshape(-1, c)[mine])
    return dwte


def position_backward(dout, wpe, t0: int = 0):
    """dwpe (T_max, C): dout (B, T', C) summed over B into positions t0:t0+T', zeros elsewhere."""
    dwpe = array_module(dout).zeros_like(wpe)  # (T_max, C)
    dwpe[t0:t0 + dout.shape[1]] = dout.sum(axis=0)
    return dwpe


def vocab_embedding_backward(dout, idx, wte_shard, wpe, lo: int):
    """dwte_shard (V/p, C): scatter-add of dout over the owned ids; dwpe (T_max, C): dout summed over B."""
    return vocab_wte_backward(dout, idx, wte_shard, lo), position_backward(dout, wpe)


class VocabParallelEmbedding(Layer):
    """params ``wte`` (V/p, C), this rank's rows, and ``wpe`` (T_max, C) replicated; idx (B, T) -> (B, T, C).

    With ``sequence_parallel`` idx (B, T) -> (B, T/p, C), this rank's part of the sequence, and the
    ``wpe`` gradient is partial (``partial_grads``).
    """

    def __init__(self, wte_shard, wpe, group, sequence_parallel: bool = False, equal_shards: bool = False):
        """``equal_shards``: the caller knows every rank's ``wte_shard`` has V/p rows (``from_full``); else the first
        forward agrees the widths (one allgather of an int) and refuses uneven ones."""
        check_float("VocabParallelEmbedding", "wte_shard", wte_shard)
        check_shape("VocabParallelEmbedding", "wte_shard", wte_shard, (None, None))
        check_shape("VocabParallelEmbedding", "wpe", wpe, (None, wte_shard.shape[1]))
        check_same_dtype("VocabParallelEmbedding", "wpe", wpe, "wte_shard", wte_shard)
        sequence_parallel = check_bool("VocabParallelEmbedding", "sequence_parallel", sequence_parallel)
        equal_shards = check_bool("VocabParallelEmbedding", "equal_shards", equal_shards)
        super().__init__({"wte": wte_shard, "wpe": wpe})
        self.group = group
        self.vocab = wte_shard.shape[0] * group.size  # V
        self.lo = group.rank * wte_shard.shape[0]  # first row this rank holds
        self.sequence_parallel = bool(sequence_parallel)
        self._reduce = reduce_scatter_to_sequence(group) if sequence_parallel else reduce_from_group(group)
        self._shards_agreed = bool(equal_shards)

    @property
    def partial_grads(self) -> tuple:
        """``("wpe",)`` with sequence_parallel (each rank adds its own positions only), else ``()``."""
        return ("wpe",) if self.sequence_parallel else ()

    @classmethod
    def from_full(cls, params: dict, group, sequence_parallel: bool = False) -> "VocabParallelEmbedding":
        """This rank's rows of full ``{"wte": (V, C), "wpe": (T_max, C)}``, the same on every rank; copies."""
        where = "VocabParallelEmbedding.from_full"
        check_group(where, group)
        n = 0
        with OwnChecks() as own:
            _check_full(where, params, {"wte": (None, None), "wpe": (None, None)})
            wte, wpe = params["wte"], params["wpe"]
            check_shape(where, "wte", wte, (None, None))
            check_shape(where, "wpe", wpe, (None, wte.shape[1]))
            n = _shard("VocabParallelEmbedding", "V (wte.shape[0])", wte.shape[0], group)
            check_bool(where, "sequence_parallel", sequence_parallel)
        agree_full(where, params, f"sequence_parallel {bool(sequence_parallel)}", group, own.failed)
        lo = group.rank * n
        # (V/p, C), (T_max, C)
        return cls(wte[lo:lo + n].copy(), wpe.copy(), group, sequence_parallel, equal_shards=True)

    def _positions(self, t: int) -> tuple:
        """(first position, count) of this rank's output: (0, T), or (r*T/p, T/p) with sequence_parallel."""
        if not self.sequence_parallel:
            return 0, t
        n = t // self.group.size
        return self.group.rank * n, n

    def forward(self, idx):
        """idx (B, T) full token ids, replicated over the group -> (B, T, C) replicated: one allreduce.

        With sequence_parallel -> (B, T/p, C), positions r*T/p:(r+1)*T/p: one reduce-scatter along T
        (ValueError unless the group size divides T).
        """
        where, wte, wpe = "VocabParallelEmbedding.forward", self.params["wte"], self.params["wpe"]
        check_array(where, "idx", idx)
        check_shape(where, "idx", idx, (None, None))
        if not self._shards_agreed:   # before any check that reads V: a rank with a wider shard would pass them
            agree_equal_shards(where, "V (wte_shard.shape[0])", wte.shape[0], self.group)
            self._shards_agreed = True
        check_indices(where, "idx", idx, self.vocab)
        if idx.shape[1] > wpe.shape[0]:
            raise ValueError(f"{where}: idx has T={idx.shape[1]}, longer than T_max={wpe.shape[0]}")
        if self.sequence_parallel:
            _seq_shard(where, "idx", idx, self.group)
        self.cache = idx
        # allreduce (B, T, C), or with sequence_parallel the reduce-scatter along T (B, T/p, C)
        out = self._reduce.forward(vocab_embedding_forward(idx, wte, self.lo))
        t0, t = self._positions(idx.shape[1])
        return out + wpe[t0:t0 + t]  # once, after the reduction

    def backward_input(self, dout):
        """dout (B, T, C) replicated; no input gradient (the input is integers): returns None.

        With sequence_parallel dout is (B, T/p, C), this rank's part, allgathered along T here (B holds
        the communication) and kept for W with dout and idx.
        """
        idx = self._take_cache("VocabParallelEmbedding.backward")
        t0, t = self._positions(idx.shape[1])
        check_shape("VocabParallelEmbedding.backward", "dout", dout,
                    (idx.shape[0], t, self.params["wte"].shape[1]))
        check_same_dtype("VocabParallelEmbedding.backward", "dout", dout, "wte", self.params["wte"])
        dfull = self._reduce.backward(dout)  # identity, or the allgather along T  # (B, T, C)
        self.cache = ForWeight((dfull, dout, idx))
        return None

    def backward_weight(self) -> None:
        """Adds into ``grads`` this rank's ``wte`` rows and ``wpe`` (with sequence_parallel only this
        rank's positions: partial); no communication."""
        dfull, dout, idx = self._take_for_weight("VocabParallelEmbedding.backward_weight")
        t0, _ = self._positions(idx.shape[1])
        self.grads["wte"] += vocab_wte_backward(dfull, idx, self.params["wte"], self.lo)  # (V/p, C)
        self.grads["wpe"] += position_backward(dout, self.params["wpe"], t0)  # (T_max, C)

    def full_grads(self, sum_partial: bool = True) -> dict:
        """``{"wte": (V, C), "wpe": (T_max, C)}``: the row shards gathered (collective), ``wpe`` copied.

        With sequence_parallel ``wpe`` is summed over the group, or with ``sum_partial=False`` copied as it is.
        """
        check_bool("VocabParallelEmbedding.full_grads", "sum_partial", sum_partial)   # before the gathers
        full = {"wte": gathered(self.grads["wte"], 0, self.group), "wpe": self.grads["wpe"].copy()}  # (V, C)
        return _sum_partial(full, self.partial_grads, self.group, sum_partial)

    def full_params(self) -> dict:
        """``{"wte": (V, C), "wpe": (T_max, C)}``, new arrays (collective)."""
        return {"wte": gathered(self.params["wte"], 0, self.group), "wpe": self.params["wpe"].copy()}


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

    def __init__(self, group, ignore_index=None, equal_shards: bool = False):
        """``equal_shards``: the caller knows every rank's logits hold V/p columns (a head built by ``from_full``);
        else every forward agrees the widths (one allgather of an int) and refuses uneven ones. Every forward, not
        the first only: logits come per call, and a rank whose width alone changed would agree alone and leave
        the others waiting in the next allreduce."""
        super().__init__({})
        check_group("VocabParallelCrossEntropy", group)
        with OwnChecks() as own:   # raised after the agreement, on every rank
            check_bool("VocabParallelCrossEntropy", "equal_shards", equal_shards)
        # the loss is the mean over the targets every rank counts alike: ignore_index agreed (one allgather, here)
        agree_layout("VocabParallelCrossEntropy", "ignore_index or equal_shards",
                     f"ignore_index {as_text(ignore_index)}, equal_shards {bool(equal_shards)}", group, own.failed)
        self.group = group
        self.ignore_index = ignore_index
        self._equal_shards = bool(equal_shards)

    def forward(self, logits, targets):
        where = "VocabParallelCrossEntropy.forward"
        check_float(where, "logits", logits)
        check_shape(where, "targets", targets, tuple(logits.shape[:-1]))
        if not self._equal_shards:
            agree_equal_shards(where, "V (logits.shape[-1])", logits.shape[-1], self.group)
        check_indices(where, "targets", targets, logits.shape[-1] * self.group.size, self.ignore_index)
        loss, self.cache = vocab_cross_entropy(logits, targets, self.group, self.ignore_index)
        return loss

    def backward(self, dloss=1.0):
        return self._b_then_w(lambda: self.backward_input(dloss))

    def backward_input(self, dloss=1.0):
        """This rank's dlogits scaled by ``dloss``; no weights, so B is the whole backward and frees the cache."""
        dlogits = self._take_cache("VocabParallelCrossEntropy.backward")
        self.cache = None
        return dlogits * dloss

"""The GPT on a process mesh: Megatron tensor (and sequence) parallelism over ``mesh.tp``, bucketed
data parallelism over ``mesh.dp``. Its single-process twin is ``ReferenceGPT``.

Per step on a tensor-parallel group of p > 1 (B, T this rank's micro-batch, C the width, V the
vocabulary), the communication is Megatron-LM's:

    forward   embedding: 1 allreduce (B*T*C); each block: 2 allreduces (B*T*C);
              head: none (the input is replicated); loss: 3 allreduces of B*T (max, sum, target logit)
    backward  head: 1 allreduce (B*T*C); each block: 2 allreduces (B*T*C); embedding: none

With ``sequence_parallel`` every allreduce of B*T*C becomes a reduce-scatter (forward) or its
conjugate pair, so a block moves 2 allgathers and 2 reduce-scatters each way; the embedding
reduce-scatters, the head allgathers forward and reduce-scatters backward, and
``finish_grads`` sums the sequence-partial gradients (LayerNorms, row-parallel biases, ``wpe``)
over the group in one allreduce. Over ``mesh.dp`` the gradients are averaged in buckets that start
during backward (``DataParallel``).

One step::

    model.zero_grad()
    loss = model.forward(idx, targets)    # idx, targets (B, T): this data-parallel rank's batch
    model.backward()
    model.finish_grads()                  # waits for the data-parallel buckets, sums partial grads
    optimizer.step()                      # AdamW(model.params, model.grads): this rank's shards
"""
from __future__ import annotations

from contextlib import contextmanager

import numpy as np

from ..nn._base import array_module, check_shape, is_float
from ..nn.dropout import Dropout
from ..nn.embedding import check_indices
from ..nn.layernorm import LayerNorm
from ..parallel.attention import ParallelAttention, ParallelBlock
from ..parallel.data import DataParallel
from ..parallel.mappings import allreduce_partial_grads, copy_to_group, gather_from_sequence
from ..parallel.mesh import ProcessMesh
from ..parallel.vocab import VocabParallelCrossEntropy, VocabParallelEmbedding
from ..optim import scale_to_norm, sum_of_squares
from .config import GPTConfig, block_names, expert_names, param_shapes, uncounted_names
from .data import IGNORE

__all__ = ["GPT", "check_full_params", "build_block", "mesh_grad_norm"]


def check_full_params(where: str, config: GPTConfig, params: dict):
    """ValueError/TypeError unless ``params`` has exactly the model's names and shapes, one float dtype."""
    expected = param_shapes(config)
    missing, extra = sorted(set(expected) - set(params)), sorted(set(params) - set(expected))
    if missing or extra:
        raise ValueError(f"{where}: params lack {missing[:4]}{'...' if len(missing) > 4 else ''} and have "
                         f"unexpected {extra[:4]}{'...' if len(extra) > 4 else ''}")
    dtype = params["wte"].dtype
    for name, shape in expected.items():
        array_module(params[name])
        check_shape(where, name, params[name], shape)
        if params[name].dtype != dtype or not is_float(dtype):
            raise TypeError(f"{where}: {name} has dtype {params[name].dtype}; every parameter must have "
                            f"one floating dtype (wte has {dtype})")
    return dtype


def embed(embedding, drop, idx, dropout_key, first_row: int, n_layer: int, seq_rank: int):
    """idx (B, T) -> the embedding after its dropout, (B, T, C) or this rank's (B, T/p, C) slice of the
    sequence (``seq_rank``: its place in the sequence, 0 without sequence parallelism); the mask sits
    at the global positions (rows from ``first_row``), as the single process draws it."""
    x = embedding.forward(idx)  # (B, T or T/p, C)
    b, t = idx.shape
    key = None if dropout_key is None else (*dropout_key, n_layer, 0)
    return drop.forward(x, key, (first_row, seq_rank * x.shape[1], 0), (first_row + b, t, x.shape[2]))


def mesh_grad_norm(grads: dict, config: GPTConfig, mesh) -> float:
    """The full gradient's 2-norm from this rank's ``grads`` (collective over tp, pp and, with experts, dp).

    Tensor-parallel shards are summed over ``mesh.tp``, stages over ``mesh.pp``, each value once
    (``uncounted_names``), experts over ``mesh.dp`` (each rank holds its own); the rest is the same
    on every data-parallel rank."""
    skip = uncounted_names(config, mesh)
    experts = frozenset(expert_names(config))
    local = np.array([sum_of_squares(grads, skip=skip | experts),  # [the rest, the experts]
                      sum_of_squares(grads, skip=skip, only=experts)])
    for group in (mesh.tp, mesh.pp):
        if group.size > 1:
            local = group.allreduce(local, op="sum")
    if experts and mesh.dp.size > 1:
        local[1] = float(mesh.dp.allreduce(local[1:], op="sum")[0])
    return float(np.sqrt(local.sum()))


def head_backward(dlogits, xf, wte, dwte):
    """The tied head's backward: dlogits (B, T, V/p), its input xf (B, T, C) -> dxf (B, T, C), partial
    over the tensor-parallel group; the head's share of the gradient added into ``dwte`` (V/p, C)."""
    dwte += dlogits.reshape(-1, wte.shape[0]).T @ xf.reshape(-1, xf.shape[-1])
    return dlogits @ wte


def build_block(config: GPTConfig, p: dict, mesh, sequence_parallel: bool) -> ParallelBlock:
    """Block ``p`` (its parameters under ``block_names``): a dense MLP over ``mesh.tp``, or experts over ``mesh.dp``."""
    if not config.n_experts:
        return ParallelBlock.from_full(p, config.n_head, mesh.tp, eps=config.eps, approximate=config.approximate,
                                       sequence_parallel=sequence_parallel, dropout=config.dropout)
    from ..moe import MoEBranch, MoELayer  # the experts build on the layers: imported when used
    ln1 = LayerNorm(p["ln1_w"].copy(), p["ln1_b"].copy(), config.eps)
    ln2 = LayerNorm(p["ln2_w"].copy(), p["ln2_b"].copy(), config.eps)
    attn = ParallelAttention.from_full({k: p[k] for k in ("w_qkv", "b_qkv", "w_proj", "b_proj")},
                                       nh=config.n_head, group=mesh.tp, sequence_parallel=sequence_parallel)
    moe = MoELayer.from_full({k: p[k] for k in ("router", "w1", "b1", "w2", "b2")}, top_k=config.moe_top_k,
                             capacity_factor=config.moe_capacity_factor, group=mesh.dp,
                             drop_tokens=not config.moe_dropless, aux_loss_coef=config.moe_aux_coef,
                             approximate=config.approximate)
    return ParallelBlock(ln1, attn, ln2, MoEBranch(moe, sequence_parallel), config.dropout)


class GPT:
    """GPT-2-style model over ``mesh`` (a ``ProcessMesh`` with pp = 1); see the module docstring.

    ``params`` / ``grads``: dicts under the full model's names holding this rank's shards (the
    layers' own arrays, so an optimizer over them updates the model).
    """

    def __init__(self, config: GPTConfig, mesh: ProcessMesh, embedding: VocabParallelEmbedding,
                 blocks: list, lnf: LayerNorm, sequence_parallel: bool, bucket_bytes: int | None):
        self.config, self.mesh, self.sequence_parallel = config, mesh, sequence_parallel
        self.tp, self.dp = mesh.tp, mesh.dp
        self.embedding, self.blocks, self.lnf = embedding, blocks, lnf
        self.loss = VocabParallelCrossEntropy(self.tp, ignore_index=IGNORE)
        self.drop = Dropout(config.dropout)
        self._head_in = gather_from_sequence(self.tp, seq_axis=1) if sequence_parallel else copy_to_group(self.tp)
        self._block_names = block_names(config)
        self.params, self.grads = self._named("params"), self._named("grads")
        self.partial_grads = self._partial_names()
        self.expert_names = expert_names(config)  # held E / dp per rank: not averaged by data parallelism
        self._aux_share = 1.0 / self.tp.size if config.n_experts and sequence_parallel else 1.0
        self._experts = frozenset(self.expert_names)
        order = [n for n in param_shapes(config) if n not in self._experts]
        self._dp = None if self.dp.size == 1 or bucket_bytes is None else DataParallel(
            [(n, self.params[n], self.grads[n]) for n in order], self.dp, bucket_bytes=bucket_bytes)
        self._head_cache = None
        self.hooks = None  # see _hook
        self._accumulating = False  # inside no_sync
        self._synced_backward = False  # a backward outside no_sync since the last finish_grads
        self._finished = True  # no gradient yet: full_grads is the zero gradient

    @classmethod
    def from_full(cls, config: GPTConfig, params: dict, mesh: ProcessMesh, sequence_parallel: bool = False,
                  bucket_bytes: int | None = 25 * 2**20) -> "GPT":
        """This rank's shards of the full ``params`` (names of ``param_shapes(config)``, the same on every rank).

        ``bucket_bytes=None``: no data-parallel reduction here (an optimizer such as ``pc.zero.ZeroAdamW``
        reduces over ``mesh.dp`` instead)."""
        where = "GPT.from_full"
        if not isinstance(config, GPTConfig):
            raise TypeError(f"{where}: config must be a GPTConfig, got {type(config).__name__}")
        if not isinstance(mesh, ProcessMesh):
            raise TypeError(f"{where}: mesh must be a pycollect.parallel.ProcessMesh, got {type(mesh).__name__}")
        if mesh.pp_size != 1:
            raise ValueError(f"{where}: mesh has pp = {mesh.pp_size}; this model runs on meshes with pp = 1")
        if not isinstance(sequence_parallel, bool):
            raise TypeError(f"{where}: sequence_parallel must be True or False, got {sequence_parallel!r}")
        config.check_tensor_parallel(mesh.tp_size)
        check_full_params(where, config, params)
        tp, sp = mesh.tp, sequence_parallel
        embedding = VocabParallelEmbedding.from_full({"wte": params["wte"], "wpe": params["wpe"]}, tp,
                                                     sequence_parallel=sp)
        blocks = [build_block(config, {k: params[f"h{i}.{k}"] for k in block_names(config)}, mesh, sp)
                  for i in range(config.n_layer)]
        lnf = LayerNorm(params["lnf_w"].copy(), params["lnf_b"].copy(), config.eps)
        return cls(config, mesh, embedding, blocks, lnf, sp, bucket_bytes)

    # -- names ----------------------------------------------------------------------------------------
    def _named(self, which: str) -> dict:
        emb, lnf = getattr(self.embedding, which), getattr(self.lnf, which)
        out = {"wte": emb["wte"], "wpe": emb["wpe"]}
        for i, b in enumerate(self.blocks):
            layer = getattr(b, which)
            out.update({f"h{i}.{k}": layer[k] for k in self._block_names})
        out.update({"lnf_w": lnf["w"], "lnf_b": lnf["b"]})
        return out

    def _partial_names(self) -> tuple:
        """Names whose gradient holds only this rank's part of the sequence (sequence parallelism)."""
        if not self.sequence_parallel:
            return ()
        names = [n for n in ("wte", "wpe") if n in self.embedding.partial_grads]
        for i, b in enumerate(self.blocks):
            names += [f"h{i}.{k}" for k in self._block_names if k in b.partial_grads]
        return tuple(names) + ("lnf_w", "lnf_b")

    # -- one step -------------------------------------------------------------------------------------
    def _check_batch(self, idx, targets) -> None:
        where = "GPT.forward"
        xp, wp = array_module(idx), array_module(self.params["wte"])
        if array_module(targets) is not xp or xp is not wp:
            raise TypeError(f"{where}: idx and targets must be {wp.__name__} arrays like the parameters, got "
                            f"{xp.__name__} and {array_module(targets).__name__}")
        check_shape(where, "idx", idx, (None, None))
        check_shape(where, "targets", targets, tuple(idx.shape))
        b, t = idx.shape
        if t > self.config.block_size:
            raise ValueError(f"{where}: idx has T = {t} tokens, more than block_size = {self.config.block_size}")
        if self.sequence_parallel and t % self.tp.size:
            raise ValueError(f"{where}: with sequence parallelism T = {t} must divide by the tensor-parallel "
                             f"size {self.tp.size}")
        check_indices(where, "targets", targets, self.config.vocab_size, IGNORE)

    def forward(self, idx, targets, dropout_key=None, first_row: int = 0):
        """idx, targets (B, T) token ids, replicated over ``mesh.tp`` -> mean cross-entropy (0-d array)
        over the scored tokens (target != -1). Data-parallel ranks average their means, which is the
        global mean when every rank scores as many tokens (true of ``reverse_batch`` and ``text_batch``).

        ``dropout_key`` (seed, step) turns dropout on (``config.dropout``); ``first_row`` is idx's first
        row in the global batch. Masks depend on (key, global position) only, so they equal the
        single-process model's on any mesh (``nn.dropout``)."""
        self._check_batch(idx, targets)
        if isinstance(first_row, bool) or not isinstance(first_row, int) or first_row < 0:
            raise ValueError(f"GPT.forward: first_row must be a non-negative integer, got {first_row!r}")
        self._hook("before_forward", "embedding")
        x = embed(self.embedding, self.drop, idx, dropout_key, first_row, self.config.n_layer,
                  self.tp.rank if self.sequence_parallel else 0)  # (B, T, C), or (B, T/p, C)
        self._hook("after_forward", "embedding")
        for i, block in enumerate(self.blocks):
            self._hook("before_forward", i)
            x = block.forward(x, None if dropout_key is None else (*dropout_key, i), first_row)
            self._hook("after_forward", i)
        self._hook("before_forward", "head")
        xf = self._head_in.forward(self.lnf.forward(x))  # (B, T, C) on every rank of the group
        wte = self.params["wte"]  # (V/p, C)
        self._head_cache = xf
        logits = xf @ wte.T  # (B, T, V/p): this rank's columns, never gathered
        loss = self.loss.forward(logits, targets)
        self._hook("after_forward", "head")
        if self.config.n_experts:  # every MoE block's balancing loss joins this rank's loss
            loss = loss + array_module(loss).asarray(self._aux_loss(), dtype=loss.dtype)
        return loss

    def _aux_loss(self) -> float:
        """The blocks' balancing losses; with sequence parallelism each tensor-parallel rank routed its
        own slice of the sequence, and the loss is their mean (one 1-element allreduce)."""
        aux = sum(b.mlp.aux_loss for b in self.blocks)
        if self._aux_share == 1.0:
            return aux
        return float(self.tp.allreduce(np.array([aux]), op="sum")[0]) * self._aux_share

    def backward(self, dloss: float = 1.0) -> None:
        """Adds this rank's gradients of ``dloss * loss``; data-parallel buckets start as layers finish."""
        if self._head_cache is None:
            raise RuntimeError("GPT.backward: called before forward")
        xf, self._head_cache = self._head_cache, None
        self._finished = False
        self._synced_backward = not self._accumulating
        self._hook("before_backward", "head")
        dlogits = self.loss.backward(dloss)  # (B, T, V/p)
        dxf = head_backward(dlogits, xf, self.params["wte"], self.grads["wte"])  # (B, T, C)
        dx = self._head_in.backward(dxf)  # (B, T, C) or (B, T/p, C)
        dx = self.lnf.backward(dx)
        self._hook("after_backward", "head")
        self._ready("lnf_w", "lnf_b")
        for i in reversed(range(len(self.blocks))):
            self._hook("before_backward", i)
            if self.config.n_experts:  # the balancing loss is added to the loss (a tp rank's share of it)
                self.blocks[i].mlp.aux_grad = dloss * self._aux_share
            dx = self.blocks[i].backward(dx)
            self._hook("after_backward", i)
            self._ready(*(f"h{i}.{k}" for k in self._block_names))
        self._hook("before_backward", "embedding")
        self.embedding.backward(self.drop.backward(dx))
        self._hook("after_backward", "embedding")
        self._ready("wte", "wpe")

    def _hook(self, event: str, group) -> None:
        """``hooks.<event>(group)`` around each layer group ("embedding", block i, "head"): how ZeRO
        stage 3 gathers a group's parameters just before it runs and frees them after."""
        if self.hooks is not None:
            getattr(self.hooks, event)(group)

    def _ready(self, *names) -> None:
        if self._dp is not None:
            for n in names:
                if n not in self._experts:
                    self._dp.grad_ready(n)


    @contextmanager
    def no_sync(self):
        """Micro-batches inside accumulate gradients with no data-parallel communication; the
        backward after the block (outside it) is the last one, then ``finish_grads``."""
        if self._synced_backward:
            raise RuntimeError("GPT.no_sync: a backward outside no_sync() has run since the last finish_grads; "
                               "call finish_grads() first (accumulating micro-batches go inside, the last outside)")
        self._accumulating = True
        try:
            if self._dp is None:
                yield self
            else:
                with self._dp.no_sync():
                    yield self
        finally:
            self._accumulating = False

    def finish_grads(self) -> None:
        """Once per step after the last backward: data-parallel average, then the sequence-partial sums."""
        if self._accumulating:
            raise RuntimeError("GPT.finish_grads: called inside no_sync(); call it once after the last "
                               "micro-batch's backward, outside no_sync()")
        if self._finished:
            raise RuntimeError("GPT.finish_grads: no backward since the last finish_grads (or zero_grad)")
        if self._dp is not None:
            self._dp.finish()
            for n in self.expert_names:  # every token of the group already in: the mean over dp ranks' losses
                self.grads[n] /= self.dp.size
        if self.partial_grads and self.tp.size > 1:
            allreduce_partial_grads([self.grads[n] for n in self.partial_grads], self.tp)
        self._finished, self._synced_backward = True, False

    def grads_reduced_elsewhere(self) -> None:
        """Mark the gradients final without ``finish_grads``: for an owner (ZeRO) whose hooks already
        summed the sequence-partial gradients over tp and reduce the rest over dp themselves."""
        self._finished, self._synced_backward = True, False

    def zero_grad(self) -> None:
        for g in self.grads.values():
            g[...] = 0
        self._finished, self._synced_backward = True, False

    def clip_grad_norm(self, max_norm: float) -> float:
        """Scale the gradients so the full gradient's 2-norm is at most ``max_norm``; returns the norm before.

        After ``finish_grads``. Tensor-parallel shards are summed over ``mesh.tp`` (replicated ones once),
        experts over ``mesh.dp`` (each rank holds its own); the rest is the same on every dp rank."""
        norm = mesh_grad_norm(self.grads, self.config, self.mesh)
        scale_to_norm(self.grads, max_norm, norm)
        return norm

    # -- the full model, for checks -------------------------------------------------------------------
    def full_grads(self) -> dict:
        """Every full gradient under the full names (collective over ``mesh.tp``); after ``finish_grads``."""
        if not self._finished:
            raise RuntimeError("GPT.full_grads: gradients are not final; call finish_grads() after backward")
        out = dict(self.embedding.full_grads(sum_partial=False))
        for i, b in enumerate(self.blocks):
            out.update({f"h{i}.{k}": v for k, v in b.full_grads(sum_partial=False).items()})
        out.update({"lnf_w": self.grads["lnf_w"].copy(), "lnf_b": self.grads["lnf_b"].copy()})
        return {n: out[n] for n in param_shapes(self.config)}

    def full_params(self) -> dict:
        """Every full parameter under the full names, new arrays (collective over ``mesh.tp``)."""
        out = dict(self.embedding.full_params())
        for i, b in enumerate(self.blocks):
            out.update({f"h{i}.{k}": v for k, v in b.full_params().items()})
        out.update({"lnf_w": self.params["lnf_w"].copy(), "lnf_b": self.params["lnf_b"].copy()})
        return {n: out[n] for n in param_shapes(self.config)}

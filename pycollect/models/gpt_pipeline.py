"""The GPT in 3D: pipeline stages over ``mesh.pp``, each a set of model chunks in tensor (and
sequence) parallel over ``mesh.tp``, data parallel over ``mesh.dp``.

The L blocks are split into K = pp * v contiguous model chunks (``layer_split``, default as even as
possible, every chunk at least one block); model chunk 0 also holds the embedding, model chunk K-1
the final LayerNorm, the head and the loss. The head is tied to the embedding: the stage of chunk
K-1 keeps its own copy of this tensor-parallel rank's ``wte`` rows, and after backward the two copies'
gradients are summed over the *embedding group* (the first and the last stage, Megatron's), so
both copies take the same optimizer step and stay equal.

``step(idx, targets)`` runs one training step's forward and backward over ``microbatches``
micro-batches with the pipeline schedule (``pycollect.parallel.Pipeline``); a chunk's data-parallel
buckets start as soon as its last micro-batch's backward is done, overlapping the pipeline's drain;
then the reductions finish: data-parallel average, sequence-partial sums over the tensor-parallel
group, the tied ``wte``. ``params``/``grads`` are this rank's shards under the full names it holds.

With experts (``config.n_experts``) each stage's blocks are mixture-of-experts blocks whose experts
are spread over ``mesh.dp`` (as in ``GPT``); every micro-batch routes on its own and keeps its
routing for its own backward, and the step's loss adds every stage's balancing losses.
"""
from __future__ import annotations

import numpy as np
from mpi4py import MPI

from ..comm import Communicator
from ..nn._base import array_module
from ..optim import scale_to_norm
from ..nn.dropout import Dropout
from ..nn.layernorm import LayerNorm
from ..parallel.data import DataParallel
from ..parallel.mappings import allreduce_partial_grads, copy_to_group, gather_from_sequence
from ..parallel.pipeline import Pipeline
from ..parallel.vocab import VocabParallelCrossEntropy, VocabParallelEmbedding
from ..pipeline.actions import model_chunk
from ..pipeline.schedules import check_schedule_args
from .config import GPTConfig, block_names, expert_names, param_shapes
from .data import IGNORE
from .gpt import build_block, check_full_params, embed, head_backward, mesh_grad_norm

__all__ = ["PipelinedGPT", "split_layers"]


def split_layers(n_layer: int, chunks: int, layer_split=None) -> list[range]:
    """Block indices of each model chunk: ``layer_split`` (a count per chunk) or as even as possible."""
    if layer_split is None:
        if n_layer < chunks:
            raise ValueError(f"PipelinedGPT: {chunks} model chunks (pp x virtual stages) but only {n_layer} "
                             f"layers: every chunk needs at least one layer (more stages than layers)")
        base, extra = divmod(n_layer, chunks)
        layer_split = [base + (1 if k < extra else 0) for k in range(chunks)]
    layer_split = list(layer_split)
    if len(layer_split) != chunks or sum(layer_split) != n_layer or any(
            isinstance(n, bool) or not isinstance(n, (int, np.integer)) for n in layer_split):
        raise ValueError(f"PipelinedGPT: layer_split {layer_split} must give {chunks} integer counts summing to "
                         f"n_layer = {n_layer}")
    empty = [k for k, n in enumerate(layer_split) if n < 1]
    if empty:
        raise ValueError(f"PipelinedGPT: layer_split {layer_split} leaves model chunk(s) {empty} without a layer")
    starts = np.cumsum([0, *layer_split])
    return [range(int(starts[k]), int(starts[k + 1])) for k in range(chunks)]


class GPTChunk:
    """One model chunk: blocks ``layers``; the embedding when first; final LayerNorm, head, loss when last."""

    def __init__(self, config: GPTConfig, params: dict, mesh, layers: range, first: bool, last: bool,
                 sequence_parallel: bool, shared_wte=None):
        tp = mesh.tp
        self.config, self.tp, self.layers = config, tp, layers
        self.first, self.last, self.sequence_parallel = first, last, sequence_parallel
        sp = sequence_parallel
        self.embedding = (VocabParallelEmbedding.from_full({"wte": params["wte"], "wpe": params["wpe"]}, tp,
                                                           sequence_parallel=sp) if first else None)
        self.drop = Dropout(config.dropout)
        self._names = block_names(config)
        self.blocks = [build_block(config, {k: params[f"h{i}.{k}"] for k in self._names}, mesh, sp) for i in layers]
        self.params, self.grads = {}, {}
        if first:
            self.params.update(wte=self.embedding.params["wte"], wpe=self.embedding.params["wpe"])
            self.grads.update(wte=self.embedding.grads["wte"], wpe=self.embedding.grads["wpe"])
        for i, b in zip(layers, self.blocks):
            self.params.update({f"h{i}.{k}": b.params[k] for k in self._names})
            self.grads.update({f"h{i}.{k}": b.grads[k] for k in self._names})
        if last:
            self.lnf = LayerNorm(params["lnf_w"].copy(), params["lnf_b"].copy(), config.eps)
            self.loss = VocabParallelCrossEntropy(tp, ignore_index=IGNORE)
            self._head_in = gather_from_sequence(tp, seq_axis=1) if sp else copy_to_group(tp)
            if first:  # one chunk holds both ends
                self.head_w, self.head_g = self.embedding.params["wte"], self.embedding.grads["wte"]
            elif shared_wte is not None:  # chunk 0 on this stage: the same arrays
                self.head_w, self.head_g = shared_wte
            else:  # the head's own copy of this tp rank's rows of wte
                v = config.vocab_size // tp.size
                lo = tp.rank * v
                self.head_w = params["wte"][lo:lo + v].copy()  # (V/p, C)
                self.head_g = array_module(self.head_w).zeros_like(self.head_w)
                self.params["wte"], self.grads["wte"] = self.head_w, self.head_g
            self.params.update(lnf_w=self.lnf.params["w"], lnf_b=self.lnf.params["b"])
            self.grads.update(lnf_w=self.lnf.grads["w"], lnf_b=self.lnf.grads["b"])
        self._head_x = {}
        self.data = None
        self.aux_total = 0.0  # the MoE blocks' balancing losses summed over this step's micro-batches

    def set_data(self, idx, targets, dropout_key, first_rows, loss_scale, on_final=None, aux_share=1.0) -> None:
        """Per micro-batch inputs: lists of (B/m, T) arrays, the dropout key, each one's first global row.

        ``on_final(names)`` is called after the last micro-batch's backward on this chunk, when its
        gradients are final (the data-parallel buckets can start while the pipeline drains).
        ``aux_share``: this rank's share of the balancing losses (1/tp under sequence parallelism)."""
        self.data = (idx, targets, dropout_key, first_rows, loss_scale)
        self._on_final, self._backwards = on_final, 0
        self.aux_total = 0.0
        if self.config.n_experts:  # each micro-batch's balancing losses join its loss, scaled alike
            for b in self.blocks:
                b.mlp.aux_grad = loss_scale * aux_share

    def _t_local(self) -> int:
        t = self.data[0][0].shape[1]
        return t // self.tp.size if self.sequence_parallel else t

    def _spec(self):
        idx = self.data[0][0]
        return (idx.shape[0], self._t_local(), self.config.n_embd), self._dtype

    def input_spec(self):
        return None if self.first else self._spec()

    def output_spec(self):
        return None if self.last else self._spec()

    @property
    def _dtype(self):
        return next(iter(self.params.values())).dtype.name

    def _key(self, layer: int, micro: int):
        key = self.data[2]
        return None if key is None else (*key, layer)

    def forward(self, x, micro: int):
        idx, targets, key, first_rows, _ = self.data
        row0 = first_rows[micro]
        if self.first:
            x = embed(self.embedding, self.drop, idx[micro], key, row0, self.config.n_layer,
                      self.tp.rank if self.sequence_parallel else 0)  # (B, T or T/p, C)
        for i, b in zip(self.layers, self.blocks):
            x = b.forward(x, self._key(i, micro), row0)
        if self.config.n_experts:
            self.aux_total += sum(b.mlp.aux_loss for b in self.blocks)
        if not self.last:
            return x
        xf = self._head_in.forward(self.lnf.forward(x))  # (B, T, C)
        self._head_x[micro] = xf
        return self.loss.forward(xf @ self.head_w.T, targets[micro])  # logits (B, T, V/p)

    def backward(self, dy, micro: int):
        if self.last:
            xf = self._head_x.pop(micro)
            dlogits = self.loss.backward(self.data[4])  # (B, T, V/p)
            dy = self.lnf.backward(self._head_in.backward(head_backward(dlogits, xf, self.head_w, self.head_g)))
        for b in reversed(self.blocks):
            dy = b.backward(dy)
        if self.first:
            self.embedding.backward(self.drop.backward(dy))
            dy = None
        self._backwards += 1
        if self._on_final is not None and self._backwards == len(self.data[0]):
            self._on_final(list(self.grads))
        return dy

    def partial_names(self) -> list[str]:
        if not self.sequence_parallel:
            return []
        names = ["wpe"] if self.first else []
        for i, b in zip(self.layers, self.blocks):
            names += [f"h{i}.{k}" for k in self._names if k in b.partial_grads]
        return names + (["lnf_w", "lnf_b"] if self.last else [])

    def whole(self, which: str) -> dict:
        """``which`` ("params" or "grads") of this chunk, gathered over the tp group (collective)."""
        out = {}
        if self.first:
            e = self.embedding.full_params() if which == "params" else self.embedding.full_grads(sum_partial=False)
            out.update(e)
        for i, b in zip(self.layers, self.blocks):
            w = b.full_params() if which == "params" else b.full_grads(sum_partial=False)
            out.update({f"h{i}.{k}": v for k, v in w.items()})
        if self.last:
            d = getattr(self.lnf, which)
            out.update(lnf_w=d["w"].copy(), lnf_b=d["b"].copy())
        return out


class PipelinedGPT:
    """See the module docstring. ``from_full`` builds this rank's chunks; ``step`` trains one step."""

    def __init__(self, config, mesh, chunks, chunk_layers, schedule, microbatches, virtual_stages,
                 sequence_parallel, bucket_bytes):
        self.config, self.mesh, self.chunks = config, mesh, chunks
        self.chunk_layers = chunk_layers  # every model chunk's block indices
        self.schedule, self.m, self.v = schedule, microbatches, virtual_stages
        self.sequence_parallel = sequence_parallel
        self.tp, self.dp, self.pp = mesh.tp, mesh.dp, mesh.pp
        self.params, self.grads = {}, {}
        for c in chunks:
            self.params.update(c.params)
            self.grads.update(c.grads)
        self.expert_names = [n for n in expert_names(config) if n in self.params]  # E / dp each: not averaged
        self._experts = frozenset(self.expert_names)
        order = [n for n in param_shapes(config) if n in self.params and n not in self.expert_names]
        self._aux_share = 1.0 / self.tp.size if config.n_experts and sequence_parallel else 1.0
        self._dp = None if self.dp.size == 1 or bucket_bytes is None else DataParallel(
            [(n, self.params[n], self.grads[n]) for n in order], self.dp, bucket_bytes=bucket_bytes)
        self.partial_grads = [n for c in chunks for n in c.partial_names()]
        self._embedding_group = self._tie_group()
        self._order = {n: i for i, n in enumerate(param_shapes(config))}  # forward order of use
        self._pipelines = {}
        self.pipeline = None

    @classmethod
    def from_full(cls, config: GPTConfig, params: dict, mesh, sequence_parallel: bool = False,
                  schedule: str = "1f1b", microbatches: int = 1, virtual_stages: int = 1, layer_split=None,
                  bucket_bytes: int = 25 * 2**20) -> "PipelinedGPT":
        """This rank's chunks of the full ``params`` (the same on every rank); checks before any communication.

        ``bucket_bytes=None``: no data-parallel reduction here (an optimizer such as ``pc.zero.ZeroAdamW``
        reduces over ``mesh.dp`` instead)."""
        where = "PipelinedGPT.from_full"
        if not isinstance(config, GPTConfig):
            raise TypeError(f"{where}: config must be a GPTConfig, got {type(config).__name__}")
        p, v = mesh.pp_size, virtual_stages
        check_schedule_args(schedule, p, microbatches, v)
        config.check_tensor_parallel(mesh.tp_size)
        check_full_params(where, config, params)
        chunk_layers = split_layers(config.n_layer, p * v, layer_split)
        stage, last = mesh.pp_rank, p * v - 1
        chunks = []
        for c in range(v):
            k = model_chunk(stage, c, p)
            shared = None
            if k == last and p == 1 and k != 0:  # chunk 0 lives here too: tie to its arrays
                emb = chunks[0].embedding
                shared = (emb.params["wte"], emb.grads["wte"])
            chunks.append(GPTChunk(config, params, mesh, chunk_layers[k], k == 0, k == last,
                                   sequence_parallel, shared))
        return cls(config, mesh, chunks, chunk_layers, schedule, microbatches, v, sequence_parallel, bucket_bytes)

    def _tie_group(self):
        """The first and the last stage of this (tp, dp) column, when they differ: the tied wte's group."""
        p = self.mesh.pp_size
        if p == 1:
            return None
        world = self.mesh.comm
        member = self.mesh.pp_rank in (0, p - 1)
        color = self.mesh.tp_rank + self.mesh.dp_rank * self.mesh.tp_size if member else MPI.UNDEFINED
        sub = world.mpi.Split(color, self.mesh.pp_rank)
        return None if sub == MPI.COMM_NULL else Communicator(sub)

    def owner(self, name: str) -> int:
        """The pipeline stage holding ``name`` (wte: the first stage; its copy on the last is tied)."""
        p = self.mesh.pp_size
        if name in ("wte", "wpe"):
            return 0
        if name.startswith("lnf"):
            return (p * self.v - 1) % p
        layer = int(name[1:].split(".", 1)[0])
        k = next(k for k, r in enumerate(self.chunk_layers) if layer in r)
        return k % p

    # -- one step -------------------------------------------------------------------------------------
    def zero_grad(self) -> None:
        for g in self.grads.values():
            g[...] = 0

    def step(self, idx, targets, dropout_key=None, first_row: int = 0, dloss: float = 1.0) -> float:
        """Forward and backward of this data-parallel rank's batch (B, T) in ``microbatches`` micro-batches,
        then the gradient reductions. Returns the mean loss over the micro-batches (on every rank).
        ``dloss``: the gradients are those of ``dloss * loss`` (a loss scale for float16)."""
        b, t = idx.shape
        if b % self.m:
            raise ValueError(f"PipelinedGPT.step: the batch of {b} rows does not divide into "
                             f"microbatches = {self.m}")
        if t > self.config.block_size:
            raise ValueError(f"PipelinedGPT.step: T = {t} is more than block_size = {self.config.block_size}")
        if self.sequence_parallel and t % self.tp.size:
            raise ValueError(f"PipelinedGPT.step: with sequence parallelism T = {t} must divide by the "
                             f"tensor-parallel size {self.tp.size}")
        rows = b // self.m
        ids, tgs = np.split(idx, self.m), np.split(targets, self.m)
        firsts = [first_row + j * rows for j in range(self.m)]
        for c in self.chunks:
            c.set_data(ids, tgs, dropout_key, firsts, dloss / self.m, self._chunk_final, self._aux_share)
        key = (rows, t)
        if key not in self._pipelines:
            self._pipelines[key] = Pipeline(self.chunks, self.pp, self.schedule, self.m, self.v)
        self.pipeline = self._pipelines[key]
        losses = self.pipeline.run()
        self._finish()
        total = np.array([sum(losses) / self.m if losses else 0.0])
        if self.config.n_experts:  # every stage's balancing losses; under SP the tp ranks' mean
            aux = np.array([sum(c.aux_total for c in self.chunks) / self.m])
            if self._aux_share != 1.0:
                aux = self.tp.allreduce(aux, op="sum") * self._aux_share
            total += aux
        if self.pp.size > 1:  # the last stage has the cross-entropy; every rank reports the sum
            total = self.pp.allreduce(total, op="sum")
        return float(total[0])

    def _chunk_final(self, names) -> None:
        """A chunk's gradients are final: start its data-parallel buckets (backward order), so the
        reduction overlaps the rest of the pipeline's drain. Every name lives in one chunk of a stage
        (the head's tied ``wte`` copy only on another stage), so none is marked twice."""
        if self._dp is None:
            return
        for name in sorted(names, key=self._order.get, reverse=True):
            if name not in self._experts:
                self._dp.grad_ready(name)

    def _finish(self) -> None:
        if self._dp is not None:
            self._dp.all_ready()  # every gradient is final after the flush
            self._dp.finish()
            for n in self.expert_names:  # every token of the group already in: the mean over dp ranks' losses
                self.grads[n] /= self.dp.size
        if self.partial_grads and self.tp.size > 1:
            allreduce_partial_grads([self.grads[n] for n in self.partial_grads], self.tp)
        if self._embedding_group is not None:
            g = self.grads["wte"]
            g[...] = self._embedding_group.allreduce(g, op="sum")

    def clip_grad_norm(self, max_norm: float) -> float:
        """Clip by the global 2-norm of the full gradient (shards over tp, stages over pp, experts over
        dp, once each)."""
        norm = mesh_grad_norm(self.grads, self.config, self.mesh)
        scale_to_norm(self.grads, max_norm, norm)
        return norm

    # -- the full model ---------------------------------------------------------------------------------
    def _gathered(self, which: str) -> dict:
        mine = {}
        for c in self.chunks:
            mine.update(c.whole(which))
        out = {}
        for name, shape in param_shapes(self.config).items():
            root = self.owner(name)
            if self.pp.size == 1:
                out[name] = mine[name]
                continue
            buf = mine[name] if self.mesh.pp_rank == root else np.empty(shape, dtype=self._dtype())
            out[name] = self.pp.broadcast(np.ascontiguousarray(buf), root=root)
        return out

    def _dtype(self):
        return next(iter(self.params.values())).dtype

    def full_params(self) -> dict:
        """Every full parameter, on every rank (collective over tp and pp)."""
        return self._gathered("params")

    def full_grads(self) -> dict:
        """Every full gradient after ``step`` (collective over tp and pp)."""
        return self._gathered("grads")

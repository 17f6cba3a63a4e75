"""What every GPT on a mesh shares, written once: ``GPT`` (one chunk, pp = 1) and ``PipelinedGPT``
(chunks over ``mesh.pp``) are both a ``MeshGPT`` over this rank's ``GPTChunk``s.

Here live the names (``params``/``grads`` under the full model's names), the data-parallel buckets,
the gradients' finishing (data-parallel average, experts' mean, sequence-partial sums over tp, the
tied ``wte``'s two copies over the embedding group), clipping by the global norm, and the full model
gathered over tp and pp (``full_params``/``full_grads``).
"""
from __future__ import annotations

import numpy as np

from ..nn._base import array_module, check_array, check_shape, is_float
from ..nn.embedding import check_indices
from ..optim import positive, scale_to_norm, sum_of_squares
from ..parallel.agree import agree_full
from ..parallel.data import DataParallel
from ..parallel.mappings import allreduce_partial_grads
from ..pipeline.actions import stage_of
from .config import GPTConfig, expert_names, param_shapes, uncounted_names
from .data import IGNORE

__all__ = ["MeshGPT", "agree_model", "check_batch", "check_full_params", "mesh_grad_norm"]


def check_full_params(where: str, config: GPTConfig, params: dict):
    """ValueError/TypeError unless ``params`` has exactly the model's names and shapes, one float dtype."""
    if not isinstance(params, dict):
        raise TypeError(f"{where}: params must be a dict name -> array (the full model's), got {type(params).__name__}")
    expected = param_shapes(config)
    missing, extra = sorted(set(expected) - set(params)), sorted(set(params) - set(expected))
    if missing or extra:
        raise ValueError(f"{where}: params lack {missing[:4]}{'...' if len(missing) > 4 else ''} and have "
                         f"unexpected {extra[:4]}{'...' if len(extra) > 4 else ''}")
    for name in expected:   # arrays first: a list's missing dtype was an AttributeError naming nothing
        try:
            array_module(params[name])
        except TypeError as e:
            raise TypeError(f"{where}: params[{name!r}]: {e}") from None
    dtype = params["wte"].dtype
    for name, shape in expected.items():
        check_shape(where, name, params[name], shape)
        if params[name].dtype != dtype or not is_float(dtype):
            raise TypeError(f"{where}: {name} has dtype {params[name].dtype}; every parameter must have "
                            f"one floating dtype (wte has {dtype})")
    return dtype


def agree_model(where: str, config, params, mesh, settings: str, failed: BaseException | None) -> None:
    """The config, the full parameters' names, dtypes and shapes and ``settings`` agreed over the whole mesh where
    a model is built, this rank's own refused argument (``failed``) raised after it on every rank: a rank refusing
    alone left the others waiting in its first layer's agreement, and ranks built from other configs would build
    other layers (one allgather of a digest)."""
    agree_full(where, params, f"config {config!r}, {settings}", mesh.comm, failed)


def check_batch(where: str, model: "MeshGPT", idx, targets, first_row) -> tuple[int, int]:
    """(B, T) of a step's token ids, checked as every rank of the model holds them (the same idx and targets
    on every tensor-parallel and pipeline rank): shapes, the backend of the parameters, ids within the
    vocabulary (targets may be IGNORE), T within block_size (and divisible under sequence parallelism),
    ``first_row``. Every rank raises alike, before any message; a pipeline's stages would otherwise find a bad
    id only where it is used (the embedding on the first, the loss on the last) and leave the others waiting."""
    xp, tp = check_array(where, "idx", idx), check_array(where, "targets", targets)
    wp = array_module(next(iter(model.params.values()))) if model.params else xp
    if tp is not xp or xp is not wp:
        raise TypeError(f"{where}: idx and targets must be {wp.__name__} arrays like the parameters, got "
                        f"{xp.__name__} and {tp.__name__}")
    check_shape(where, "idx", idx, (None, None))
    check_shape(where, "targets", targets, tuple(idx.shape))
    b, t = idx.shape
    if t == 0:   # the attention's softmax over no position raised NumPy's "zero-size array to reduction"
        raise ValueError(f"{where}: idx has T = 0 tokens; a sequence needs at least one (up to block_size = "
                         f"{model.config.block_size})")
    if t > model.config.block_size:
        raise ValueError(f"{where}: idx has T = {t} tokens, more than block_size = {model.config.block_size}")
    if model.sequence_parallel and t % model.tp.size:
        raise ValueError(f"{where}: with sequence parallelism T = {t} must divide by the tensor-parallel "
                         f"size {model.tp.size}")
    check_indices(where, "idx", idx, model.config.vocab_size)
    check_indices(where, "targets", targets, model.config.vocab_size, IGNORE)
    if isinstance(first_row, bool) or not isinstance(first_row, (int, np.integer)) or first_row < 0:
        raise ValueError(f"{where}: first_row must be a non-negative integer, got {first_row!r}")
    return b, t


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


class MeshGPT:
    """This rank's ``chunks`` of the GPT on ``mesh``; ``chunk_layers``: every model chunk's block indices
    (K = pp x ``virtual_stages`` of them). ``bucket_bytes=None``: no data-parallel reduction here (an
    optimizer such as ``pc.zero.ZeroAdamW`` reduces over ``mesh.dp`` instead). ``embedding_group``:
    the first and the last stage, whose two copies of ``wte`` are summed after backward (or None).
    ``vshape``: the chunks placed V-wise (``pipeline.actions.model_chunk``), as zbv runs them."""

    def __init__(self, config: GPTConfig, mesh, chunks: list, chunk_layers: list, virtual_stages: int,
                 sequence_parallel: bool, bucket_bytes: int | None, embedding_group=None, vshape: bool = False):
        self.config, self.mesh, self.chunks, self.vshape = config, mesh, chunks, vshape
        self.chunk_layers, self.virtual_stages = chunk_layers, virtual_stages
        self.sequence_parallel = sequence_parallel
        self.tp, self.dp, self.pp = mesh.tp, mesh.dp, mesh.pp
        self.params: dict = {}   # name -> this rank's array, every chunk's
        self.grads: dict = {}
        for c in chunks:
            self.params.update(c.params)
            self.grads.update(c.grads)
        self.expert_names = [n for n in expert_names(config) if n in self.params]  # E / dp each: not averaged
        self._experts = frozenset(self.expert_names)
        self.partial_grads = tuple(n for c in chunks for n in c.partial_names())
        aux_share = 1.0 / self.tp.size if config.n_experts and sequence_parallel else 1.0
        for c in chunks:
            c.aux_share, c.on_final = aux_share, self._grads_final
        order = [n for n in param_shapes(config) if n in self.params and n not in self._experts]
        self._dp = None if self.dp.size == 1 or bucket_bytes is None else DataParallel(
            [(n, self.params[n], self.grads[n]) for n in order], self.dp, bucket_bytes=bucket_bytes)
        self._embedding_group = embedding_group

    # -- gradients ------------------------------------------------------------------------------------
    def _grads_final(self, names) -> None:
        """A layer group's gradients are final for the step: start its data-parallel buckets, so the
        reduction overlaps the rest of backward. Every name lives in one chunk of a stage (the head's
        tied ``wte`` copy only on another stage), so none is marked twice."""
        if self._dp is not None:
            for n in names:
                if n not in self._experts:
                    self._dp.grad_ready(n)

    def _reduce_grads(self) -> None:
        """Data-parallel average (experts: the mean over dp ranks' losses, every token already in),
        sequence-partial sums over tp, the tied ``wte``'s two copies summed over the embedding group."""
        if self._dp is not None:
            self._dp.finish()
            for n in self.expert_names:
                self.grads[n] /= self.dp.size
        if self.partial_grads and self.tp.size > 1:
            allreduce_partial_grads([self.grads[n] for n in self.partial_grads], self.tp)
        if self._embedding_group is not None:
            g = self.grads["wte"]
            g[...] = self._embedding_group.allreduce(g, op="sum")

    def _aux_loss(self, micro_batches: int) -> float:
        """The chunks' balancing losses per micro-batch; under sequence parallelism each tp rank routed
        its own slice of the sequence, and the loss is their mean (one 1-element allreduce)."""
        aux = sum(c.aux_total for c in self.chunks) / micro_batches
        share = self.chunks[0].aux_share
        if share == 1.0:
            return aux
        return float(self.tp.allreduce(np.array([aux]), op="sum")[0]) * share

    def zero_grad(self) -> None:
        for g in self.grads.values():
            g[...] = 0

    def clip_grad_norm(self, max_norm: float) -> float:
        """Scale the gradients so the full gradient's 2-norm is at most ``max_norm``; returns the norm
        before. After the gradients are final; see ``mesh_grad_norm`` for what is summed where."""
        max_norm = positive(f"{type(self).__name__}.clip_grad_norm", "max_norm", max_norm)   # -1 flipped every sign
        norm = mesh_grad_norm(self.grads, self.config, self.mesh)
        scale_to_norm(self.grads, max_norm, norm)
        return norm

    # -- the full model -------------------------------------------------------------------------------
    def owner(self, name: str) -> int:
        """The pipeline stage holding ``name`` (wte: the first stage; its copy on the last is tied)."""
        p = self.mesh.pp_size
        if name in ("wte", "wpe"):
            return 0
        if name.startswith("lnf"):
            return stage_of(p * self.virtual_stages - 1, p, self.vshape)[0]
        layer = int(name[1:].split(".", 1)[0])
        return stage_of(next(k for k, r in enumerate(self.chunk_layers) if layer in r), p, self.vshape)[0]

    def _gathered(self, which: str) -> dict:
        """Every full ``which`` under the full names, new arrays (collective over tp and pp)."""
        mine: dict = {}
        for c in self.chunks:
            mine.update(c.whole(which))
        if self.pp.size == 1:
            return {n: mine[n] for n in param_shapes(self.config)}
        dtype = next(iter(self.params.values())).dtype
        out = {}
        for name, shape in param_shapes(self.config).items():
            root = self.owner(name)
            buf = mine[name] if self.mesh.pp_rank == root else np.empty(shape, dtype=dtype)
            out[name] = self.pp.broadcast(np.ascontiguousarray(buf), root=root)
        return out

    def full_params(self) -> dict:
        """Every full parameter, on every rank, new arrays (collective over tp and pp)."""
        return self._gathered("params")

    def full_grads(self) -> dict:
        """Every full gradient, once final (collective over tp and pp)."""
        return self._gathered("grads")

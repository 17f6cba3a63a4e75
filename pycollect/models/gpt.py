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

It is the pipeline's special case: one ``GPTChunk`` holding every layer, on a mesh with pp = 1;
names, finishing, clipping and the full model are ``MeshGPT``'s, as for ``PipelinedGPT``.

One step::

    model.zero_grad()
    loss = model.forward(idx, targets)    # idx, targets (B, T): this data-parallel rank's batch
    model.backward()
    model.finish_grads()                  # waits for the data-parallel buckets, sums partial grads
    optimizer.step()                      # AdamW(model.params, model.grads): this rank's shards
"""
from __future__ import annotations

from contextlib import contextmanager

from ..nn._base import array_module, check_bool
from ..parallel.agree import OwnChecks
from ..parallel.mesh import ProcessMesh, check_mesh
from .chunk import GPTChunk, MicroBatches
from .config import GPTConfig
from .mesh_gpt import MeshGPT, agree_model, check_batch, check_full_params

__all__ = ["GPT"]


class GPT(MeshGPT):
    """GPT-2-style model over ``mesh`` (a ``ProcessMesh`` with pp = 1); see the module docstring.

    ``params`` / ``grads``: dicts under the full model's names holding this rank's shards (the
    layers' own arrays, so an optimizer over them updates the model).
    """

    def __init__(self, config: GPTConfig, mesh: ProcessMesh, chunk: GPTChunk, sequence_parallel: bool,
                 bucket_bytes: int | None):
        super().__init__(config, mesh, [chunk], [chunk.layers], 1, sequence_parallel, bucket_bytes)
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
        check_mesh(where, mesh)   # no group to agree over: raised at once
        with OwnChecks() as own:   # this rank's own checks, raised after the agreement on every rank
            if not isinstance(config, GPTConfig):
                raise TypeError(f"{where}: config must be a GPTConfig, got {type(config).__name__}")
            if mesh.pp_size != 1:
                raise ValueError(f"{where}: mesh has pp = {mesh.pp_size}; this model runs on meshes with pp = 1")
            sequence_parallel = check_bool(where, "sequence_parallel", sequence_parallel)
            config.check_tensor_parallel(mesh.tp_size)
            check_full_params(where, config, params)
        agree_model(where, config, params, mesh, f"sequence_parallel {bool(sequence_parallel)}, bucket_bytes "
                    f"{bucket_bytes!r}", own.failed)
        chunk = GPTChunk(config, params, mesh, range(config.n_layer), True, True, sequence_parallel)
        return cls(config, mesh, chunk, sequence_parallel, bucket_bytes)

    # -- the one chunk's layers -----------------------------------------------------------------------
    @property
    def chunk(self) -> GPTChunk:
        return self.chunks[0]

    @property
    def embedding(self):
        return self.chunk.embedding

    @property
    def blocks(self) -> list:
        return self.chunk.blocks

    @property
    def lnf(self):
        return self.chunk.lnf

    @property
    def hooks(self):
        """``hooks.<event>(group)`` around each layer group ("embedding", block i, "head"): how ZeRO
        stage 3 gathers a group's parameters just before it runs and frees them after."""
        return self.chunk.hooks

    @hooks.setter
    def hooks(self, hooks) -> None:
        self.chunk.hooks = hooks

    # -- one step -------------------------------------------------------------------------------------
    def forward(self, idx, targets, dropout_key=None, first_row: int = 0):
        """idx, targets (B, T) token ids, replicated over ``mesh.tp`` -> mean cross-entropy (0-d array)
        over the scored tokens (target != -1). Data-parallel ranks average their means, which is the
        global mean when every rank scores as many tokens (true of ``reverse_batch`` and ``text_batch``).

        ``dropout_key`` (seed, step) turns dropout on (``config.dropout``); ``first_row`` is idx's first
        row in the global batch. Masks depend on (key, global position) only, so they equal the
        single-process model's on any mesh (``nn.dropout``)."""
        check_batch("GPT.forward", self, idx, targets, first_row)
        self.chunk.set_data(MicroBatches([idx], [targets], dropout_key, [first_row], 1.0))
        loss = self.chunk.forward(None, 0)
        if self.config.n_experts:  # every MoE block's balancing loss joins this rank's loss
            loss = loss + array_module(loss).asarray(self._aux_loss(1), dtype=loss.dtype)
        return loss

    def backward(self, dloss: float = 1.0) -> None:
        """Adds this rank's gradients of ``dloss * loss``; data-parallel buckets start as layers finish."""
        if self.chunk.data is None or not self.chunk.has_pending(0):
            raise RuntimeError("GPT.backward: called before forward")
        self._finished = False
        self._synced_backward = not self._accumulating
        self.chunk.data.loss_scale = dloss
        self.chunk.backward(None, 0)

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
        self._reduce_grads()
        self._finished, self._synced_backward = True, False

    def grads_reduced_elsewhere(self) -> None:
        """Mark the gradients final without ``finish_grads``: for an owner (ZeRO) whose hooks already
        summed the sequence-partial gradients over tp and reduce the rest over dp themselves."""
        self._finished, self._synced_backward = True, False

    def zero_grad(self) -> None:
        super().zero_grad()
        self._finished, self._synced_backward = True, False

    def full_grads(self) -> dict:
        """Every full gradient under the full names (collective over ``mesh.tp``); after ``finish_grads``."""
        if not self._finished:
            raise RuntimeError("GPT.full_grads: gradients are not final; call finish_grads() after backward")
        return super().full_grads()

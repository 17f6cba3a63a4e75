"""The GPT in 3D: pipeline stages over ``mesh.pp``, each a set of model chunks in tensor (and
sequence) parallel over ``mesh.tp``, data parallel over ``mesh.dp``.

The L blocks are split into K = pp * v contiguous model chunks (``layer_split``, default as even as
possible, every chunk at least one block); model chunk 0 also holds the embedding, model chunk K-1
the final LayerNorm, the head and the loss. The head is tied to the embedding: the stage of chunk
K-1 keeps its own copy of this tensor-parallel rank's ``wte`` rows, and after backward the two copies'
gradients are summed over the *embedding group* (the first and the last stage, Megatron's), so
both copies take the same optimizer step and stay equal. Under ``schedule="zbv"`` the chunks are
placed V-wise (stage s holds model chunks s and 2p - 1 - s): the first stage holds both the
embedding and the head, which share one ``wte`` there, and there is no embedding group.

The zero-bubble schedules (``zb-h1``, ``zb-h2``, ``zbv``) split each backward in B and W
(``GPTChunk.backward_input`` / ``backward_weight``); a layer group's data-parallel buckets then
start at its last W of the step.

``step(idx, targets)`` runs one training step's forward and backward over ``microbatches``
micro-batches with the pipeline schedule (``pycollect.parallel.Pipeline``); a layer group's
data-parallel buckets start as soon as its last micro-batch's backward is done, overlapping the
pipeline's drain; then the reductions finish: data-parallel average, sequence-partial sums over the tensor-parallel
group, the tied ``wte``. ``params``/``grads`` are this rank's shards under the full names it holds.
The chunks (``GPTChunk``) and everything after backward (``MeshGPT``) are those of ``GPT``, which
is this model's case of one stage holding one chunk.

With experts (``config.n_experts``) each stage's blocks are mixture-of-experts blocks whose experts
are spread over ``mesh.dp`` (as in ``GPT``); every micro-batch routes on its own and keeps its
routing for its own backward, and the step's loss adds every stage's balancing losses.
"""
from __future__ import annotations

import numpy as np

from ..nn._base import check_bool
from ..parallel.agree import OwnChecks
from ..parallel.mesh import check_mesh
from ..parallel.pipeline import Pipeline
from ..pipeline.actions import model_chunk
from ..pipeline.schedules import check_schedule_args, vshaped
from .chunk import GPTChunk, MicroBatches
from .config import GPTConfig
from .mesh_gpt import MeshGPT, agree_model, check_batch, check_full_params

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


class PipelinedGPT(MeshGPT):
    """See the module docstring. ``from_full`` builds this rank's chunks; ``step`` trains one step."""

    def __init__(self, config, mesh, chunks, chunk_layers, schedule, microbatches, virtual_stages,
                 sequence_parallel, bucket_bytes):
        vshape = vshaped(schedule)
        super().__init__(config, mesh, chunks, chunk_layers, virtual_stages, sequence_parallel, bucket_bytes,
                         None if vshape else _embedding_group(mesh), vshape)
        self.schedule, self.microbatches = schedule, microbatches
        self._pipelines = {}  # (rows, T) -> the Pipeline run for micro-batches of that shape
        self.pipeline = None

    @classmethod
    def from_full(cls, config: GPTConfig, params: dict, mesh, sequence_parallel: bool = False,
                  schedule: str = "1f1b", microbatches: int = 1, virtual_stages: int = 1, layer_split=None,
                  bucket_bytes: int | None = 25 * 2**20) -> "PipelinedGPT":
        """This rank's chunks of the full ``params`` (the same on every rank); checks before any communication.

        ``bucket_bytes=None``: no data-parallel reduction here (an optimizer such as ``pc.zero.ZeroAdamW``
        reduces over ``mesh.dp`` instead)."""
        where = "PipelinedGPT.from_full"
        check_mesh(where, mesh)   # no group to agree over: raised at once
        p, v = mesh.pp_size, virtual_stages
        chunk_layers: list[range] = []
        with OwnChecks() as own:   # this rank's own checks, raised after the agreement on every rank
            if not isinstance(config, GPTConfig):
                raise TypeError(f"{where}: config must be a GPTConfig, got {type(config).__name__}")
            check_schedule_args(schedule, p, microbatches, v, ("mesh.pp_size", "microbatches", "virtual_stages"))
            sequence_parallel = check_bool(where, "sequence_parallel", sequence_parallel)
            config.check_tensor_parallel(mesh.tp_size)
            check_full_params(where, config, params)
            chunk_layers = split_layers(config.n_layer, p * v, layer_split)
        agree_model(where, config, params, mesh, f"sequence_parallel {bool(sequence_parallel)}, schedule {schedule!r}, "
                    f"microbatches {microbatches!r}, virtual_stages {virtual_stages!r}, layers "
                    f"{[len(r) for r in chunk_layers]}, bucket_bytes {bucket_bytes!r}", own.failed)
        stage, last, vshape = mesh.pp_rank, p * v - 1, vshaped(schedule)
        chunks: list[GPTChunk] = []
        for c in range(v):
            k = model_chunk(stage, c, p, vshape)
            shared = None
            if k == last and (p == 1 or vshape) and k != 0:  # chunk 0 lives here too: tie to its arrays
                shared = (chunks[0].params["wte"], chunks[0].grads["wte"])
            chunks.append(GPTChunk(config, params, mesh, chunk_layers[k], k == 0, k == last,
                                   sequence_parallel, shared))
        return cls(config, mesh, chunks, chunk_layers, schedule, microbatches, v, sequence_parallel, bucket_bytes)

    # -- one step -------------------------------------------------------------------------------------
    def _check_batch(self, idx, targets, first_row) -> None:
        where = "PipelinedGPT.step"
        b, _ = check_batch(where, self, idx, targets, first_row)   # every stage alike, before any message
        if b % self.microbatches:
            raise ValueError(f"{where}: the batch of {b} rows does not divide into microbatches = {self.microbatches}")

    def step(self, idx, targets, dropout_key=None, first_row: int = 0, dloss: float = 1.0) -> float:
        """Forward and backward of this data-parallel rank's batch (B, T) in ``microbatches`` micro-batches,
        then the gradient reductions. Returns the mean loss over the micro-batches (on every rank).
        ``dloss``: the gradients are those of ``dloss * loss`` (a loss scale for float16)."""
        self._check_batch(idx, targets, first_row)
        m = self.microbatches
        rows, t = idx.shape[0] // m, idx.shape[1]
        data = MicroBatches(np.split(idx, m), np.split(targets, m), dropout_key,
                            [first_row + j * rows for j in range(m)], dloss / m)
        for c in self.chunks:
            c.set_data(data)
        if (rows, t) not in self._pipelines:
            self._pipelines[rows, t] = Pipeline(self.chunks, self.pp, self.schedule, m, self.virtual_stages)
        self.pipeline = self._pipelines[rows, t]
        losses = self.pipeline.run()  # (m,) on the stage of the last chunk, () elsewhere
        self._reduce_grads()
        total = np.array([sum(losses) / m if losses else 0.0])
        if self.config.n_experts:  # every stage's balancing losses; under SP the tp ranks' mean
            total += self._aux_loss(m)
        if self.pp.size > 1:  # the last stage has the cross-entropy; every rank reports the sum
            total = self.pp.allreduce(total, op="sum")
        return float(total[0])


def _embedding_group(mesh):
    """The first and the last stage of this (tp, dp) column, when they differ: the tied wte's group."""
    p = mesh.pp_size
    if p == 1:
        return None
    member = mesh.pp_rank in (0, p - 1)
    # a group of the mesh's Communicator: its settings, freed with it
    return mesh.comm.split(mesh.tp_rank + mesh.dp_rank * mesh.tp_size if member else None, mesh.pp_rank)

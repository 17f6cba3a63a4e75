"""The GPT in 3D (``PipelinedGPT``: pipeline over ``mesh.pp``, tensor parallel over ``mesh.tp``) with
ZeroAdamW over ``mesh.dp``: Megatron's distributed optimizer, ZeRO stages 0 to 2.

Each rank's optimizer holds the parameters of its own stage's chunks (its tensor-parallel shards),
sharded over the data-parallel group. A step runs the pipeline schedule over the micro-batches with
no data-parallel traffic (the pipeline sums the sequence-partial gradients over tp and the tied
``wte``'s two copies over the first and the last stage), then ``opt.step`` reduce-scatters the
gradients, updates its shards and allgathers the parameters into the model. The overflow check and
the clipping norm span the model-parallel group (every rank with the same data-parallel rank: all
stages, all tensor-parallel shards), each value counted once: a tensor-parallel replica only on tp
rank 0, the tied ``wte`` only on the first stage. With experts, each rank's own are the optimizer's
``owned_params`` (as in ``ZeroGPT``).

Stage 3 is refused: its just-in-time parameter gathers would run inside every micro-batch's forward
and backward of a pipeline schedule (DeepSpeed refuses ZeRO-2 and -3 with pipelines; stage 2 is
allowed here because the gradients are reduced once per step, after the schedule has drained).
"""
from __future__ import annotations

from contextlib import nullcontext

import numpy as np

from ..models.gpt_pipeline import PipelinedGPT
from ..parallel.agree import OwnChecks
from .gpt import agree_settings, zero_adamw_for
from .optimizer import check_stage

__all__ = ["ZeroPipelinedGPT"]


class ZeroPipelinedGPT:
    """``model`` (a PipelinedGPT without its own data-parallel reduction) and ``opt`` (ZeroAdamW)."""

    def __init__(self, config, params: dict, mesh, stage: int, sequence_parallel: bool = False,
                 schedule: str = "1f1b", microbatches: int = 1, virtual_stages: int = 1, layer_split=None,
                 lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0,
                 max_grad_norm: float | None = None, loss_scale=None, bucket_bytes: int = 4 << 20,
                 accumulate: str | None = None):
        where = "ZeroPipelinedGPT"
        with OwnChecks() as own:
            stage = check_stage(where, stage)
            if stage == 3:
                raise ValueError(f"{where}: ZeRO stage 3 does not run with pipeline parallelism (its parameter "
                                 f"gathers would repeat in every micro-batch); use stage 0, 1 or 2")
        # refused on one rank alone, they left the others waiting where the model is built
        agree_settings(where, mesh, own.failed, stage=stage, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                       max_grad_norm=max_grad_norm, loss_scale=loss_scale, bucket_bytes=bucket_bytes,
                       accumulate=accumulate)
        self.mesh, self.stage, self.config = mesh, stage, config
        self.model = PipelinedGPT.from_full(config, params, mesh, sequence_parallel=sequence_parallel,
                                            schedule=schedule, microbatches=microbatches,
                                            virtual_stages=virtual_stages, layer_split=layer_split, bucket_bytes=None)
        # every stage and shard of this data-parallel replica
        model_parallel = mesh.comm.split(mesh.dp_rank, mesh.tp_rank + mesh.pp_rank * mesh.tp_size)
        assert model_parallel is not None, "every rank gives a color: each is in a group"
        self.model_parallel = model_parallel
        self.opt = zero_adamw_for(self.model, stage, self.model_parallel, lr=lr, betas=betas, eps=eps,
                                  weight_decay=weight_decay, loss_scale=loss_scale, max_grad_norm=max_grad_norm,
                                  bucket_bytes=bucket_bytes, accumulate=accumulate)

    def step(self, idx, targets, dropout_key=None, first_row: int = 0) -> float:
        """The pipeline's forward and backward of this data-parallel rank's batch, then the optimizer
        step; returns the loss (the mean over the micro-batches, on every rank)."""
        self.model.zero_grad()
        with np.errstate(over="ignore", invalid="ignore") if self.opt.dynamic_loss_scale else nullcontext():
            loss = self.model.step(idx, targets, dropout_key, first_row, dloss=self.opt.loss_scale)
        self.opt.step(self.model.grads)
        return loss

    def full_params(self) -> dict:
        """Every full parameter, on every rank (collective over tp and pp)."""
        return self.model.full_params()

    def memory_report(self) -> dict:
        return self.opt.memory_report()

    def free(self) -> None:
        """Release the model-parallel group (the mesh stays the caller's)."""
        self.model_parallel.free()

"""The training loop: AdamW on a GPT over a mesh, or on its single-process twin, from the same data.

It sits above ``models`` and ``zero`` (it builds models of both), so that neither imports the other
upward: ``zero`` builds on ``models``, and this loop on both.

The global batch of step s is a pure function of (seed, s) (``data.py``); data-parallel rank d
takes its rows, and splits them into ``micro_batches`` micro-batches whose gradients accumulate
with no data-parallel communication until the last. Each micro-batch's loss is a mean over its
tokens and is back-propagated scaled by 1/micro_batches, so the step's gradient is the gradient
of the mean loss over the global batch, the same as ``ReferenceGPT`` on the whole batch at once.
"""
from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np

from .models.config import GPTConfig, init_params, no_decay_names
from .models.data import read_text, reverse_batch, shard_rows, text_batch
from .models.gpt import GPT
from .models.gpt_pipeline import PipelinedGPT
from .models.reference import ReferenceGPT
from .optim import AdamW, clip_grad_norm, positive
from .parallel.agree import OwnChecks, agree_layout, as_text
from .parallel.mesh import check_mesh
from .zero import ZeroGPT, ZeroPipelinedGPT

__all__ = ["TrainConfig", "global_batch", "train", "train_reference"]


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 20
    batch: int = 8  # the global batch, in sequences
    micro_batches: int = 1
    lr: float = 1e-3
    betas: tuple = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    clip: float | None = None
    seed: int = 0
    task: str = "reverse"  # or "text"
    text: str | None = None  # the file for task "text"
    dtype: str = "float64"

    def check(self, dp: int = 1) -> None:
        """ValueError naming the first setting that cannot work on ``dp`` data-parallel ranks."""
        if self.steps < 0 or self.batch < 1 or self.micro_batches < 1:
            raise ValueError(f"TrainConfig: steps >= 0, batch >= 1 and micro_batches >= 1 needed, got "
                             f"steps={self.steps}, batch={self.batch}, micro_batches={self.micro_batches}")
        if self.batch % (dp * self.micro_batches):
            raise ValueError(f"TrainConfig: batch = {self.batch} does not divide by dp x micro_batches = "
                             f"{dp} x {self.micro_batches}")
        if self.task not in ("reverse", "text"):
            raise ValueError(f"TrainConfig: task must be 'reverse' or 'text', got {self.task!r}")
        if self.task == "text" and not self.text:
            raise ValueError("TrainConfig: task 'text' needs a text file")
        if self.clip is not None:
            positive("TrainConfig", "clip", self.clip)
        if np.dtype(self.dtype).kind != "f":
            raise ValueError(f"TrainConfig: dtype must be a floating dtype, got {self.dtype!r}")


def global_batch(config: GPTConfig, train: TrainConfig, step: int, text=None):
    """(idx, targets), (B, T) each with T = config.block_size, the same on every rank."""
    if train.task == "text":
        return text_batch(text, train.batch, config.block_size, train.seed, step)
    return reverse_batch(train.batch, config.block_size, config.vocab_size, train.seed, step)


def _optimizer(model, config: GPTConfig, train: TrainConfig) -> AdamW:
    return AdamW(model.params, model.grads, lr=train.lr, betas=train.betas, eps=train.eps,
                 weight_decay=train.weight_decay,
                 no_decay=[n for n in no_decay_names(config) if n in model.params])  # a stage holds some


def train(config: GPTConfig, train_cfg: TrainConfig, mesh, sequence_parallel: bool = False,
          params: dict | None = None, on_step=None, schedule: str | None = None, virtual_stages: int = 1,
          layer_split=None, zero_stage: int | None = None):
    """Train the GPT on ``mesh``; returns (model, optimizer, history). ``history``: one dict per step
    (step, loss averaged over the data-parallel group, seconds); ``on_step(record)`` sees each.

    With ``mesh.pp > 1`` or a ``schedule`` ("gpipe", "1f1b", "interleaved", "interleaved-mcore", "zb-h1",
    "zb-h2", "zbv" with ``virtual_stages=2``) the model is a
    ``PipelinedGPT`` and the micro-batches go through the pipeline; with ``zero_stage`` the optimizer
    is ``pc.zero.ZeroAdamW`` over ``mesh.dp`` (``ZeroGPT``, stages 0 to 3, one micro-batch per step;
    in a pipeline ``ZeroPipelinedGPT``, stages 0 to 2); otherwise ``GPT`` accumulates them."""
    check_mesh("train", mesh)   # no group to agree over: raised at once
    piped = mesh.pp_size > 1 or schedule is not None
    with OwnChecks() as own:   # raised after the agreement: a rank refusing alone left the others in from_full
        if not isinstance(train_cfg, TrainConfig):
            raise TypeError(f"train: train_cfg must be a TrainConfig, got {type(train_cfg).__name__}")
        train_cfg.check(mesh.dp_size)
        if zero_stage is not None and not piped and train_cfg.micro_batches != 1:
            raise ValueError(f"train: ZeRO without a pipeline runs one micro-batch per step, got micro_batches = "
                             f"{train_cfg.micro_batches}")
    # every rank must run the same steps of the same batches: the settings agreed over the mesh (one allgather)
    agree_layout("train", "settings (train_cfg, zero_stage, schedule, virtual_stages, layer_split, sequence_parallel)",
                 f"{train_cfg!r}, zero_stage {zero_stage!r}, schedule {schedule!r}, virtual_stages "
                 f"{as_text(virtual_stages)}, layer_split {layer_split!r}, sequence_parallel {sequence_parallel!r}",
                 mesh.comm, own.failed)
    params = init_params(config, train_cfg.seed, train_cfg.dtype) if params is None else params
    if zero_stage is not None:
        pipe = dict(schedule=schedule or "1f1b", virtual_stages=virtual_stages, layer_split=layer_split) if piped else None
        return _train_zero(config, train_cfg, mesh, sequence_parallel, params, on_step, zero_stage, pipe)
    model: PipelinedGPT | GPT
    if piped:
        model = PipelinedGPT.from_full(config, params, mesh, sequence_parallel=sequence_parallel,
                                       schedule=schedule or "1f1b", microbatches=train_cfg.micro_batches,
                                       virtual_stages=virtual_stages, layer_split=layer_split)
    else:
        model = GPT.from_full(config, params, mesh, sequence_parallel=sequence_parallel)
    opt = _optimizer(model, config, train_cfg)

    def one_step(idx, targets, key):
        model.zero_grad()
        if piped:
            loss = model.step(idx, targets, key, first_row=mesh.dp_rank * idx.shape[0])
        else:
            loss = _accumulate(model, idx, targets, key, mesh, train_cfg)
        norm = None if train_cfg.clip is None else model.clip_grad_norm(train_cfg.clip)
        opt.step()
        return loss, norm
    return model, opt, _loop(config, train_cfg, on_step, one_step, mesh)


def _loop(config: GPTConfig, train_cfg: TrainConfig, on_step, one_step, mesh=None) -> list[dict]:
    """The steps every trainer shares: draw the global batch, keep this data-parallel rank's rows
    (all of them without a mesh), ``one_step(idx, targets, dropout_key) -> (loss, grad norm)``, the
    loss averaged over ``mesh.dp``, one record per step."""
    text = None
    if train_cfg.task == "text":
        assert train_cfg.text is not None  # TrainConfig.check: task "text" needs a file
        text = read_text(train_cfg.text)
    dp_rank, dp_size = (0, 1) if mesh is None else (mesh.dp_rank, mesh.dp_size)
    history = []
    for step in range(train_cfg.steps):
        t0 = time.perf_counter()
        idx, targets = shard_rows(global_batch(config, train_cfg, step, text), dp_rank, dp_size)
        key = (train_cfg.seed, step) if config.dropout > 0 else None
        loss, norm = one_step(idx, targets, key)
        if dp_size > 1:
            loss = float(mesh.dp.allreduce(np.array([loss]), op="sum")[0]) / dp_size
        record = {"step": step, "loss": loss, "seconds": time.perf_counter() - t0, "grad_norm": norm}
        history.append(record)
        if on_step is not None:
            on_step(record)
    return history


def _train_zero(config, train_cfg, mesh, sequence_parallel, params, on_step, stage, pipe):
    """ZeroGPT (pp = 1, one micro-batch per step), or with ``pipe`` (schedule settings) ZeroPipelinedGPT."""
    hyper = dict(lr=train_cfg.lr, betas=train_cfg.betas, eps=train_cfg.eps, weight_decay=train_cfg.weight_decay,
                 max_grad_norm=train_cfg.clip)
    if pipe is not None:
        model = ZeroPipelinedGPT(config, params, mesh, stage, sequence_parallel=sequence_parallel,
                                 microbatches=train_cfg.micro_batches, **pipe, **hyper)
    else:   # one micro-batch per step (train checked it)
        model = ZeroGPT(config, params, mesh, stage, sequence_parallel=sequence_parallel, **hyper)

    def one_step(idx, targets, key):
        loss = model.step(idx, targets, key, first_row=mesh.dp_rank * idx.shape[0])
        return loss, model.opt.last_grad_norm   # computed where it clips (max_grad_norm), as the plain loop's
    return model, model.opt, _loop(config, train_cfg, on_step, one_step, mesh)


def _accumulate(model: GPT, idx, targets, key, mesh, train_cfg: TrainConfig) -> float:
    """Forward and backward of each micro-batch (no data-parallel traffic but for the last), then finish."""
    m = train_cfg.micro_batches
    loss, rows = 0.0, idx.shape[0] // m  # rows per micro-batch
    for j, (mi, mt) in enumerate(zip(np.split(idx, m), np.split(targets, m))):
        first_row = mesh.dp_rank * idx.shape[0] + j * rows  # in the global batch: dropout masks by position
        with model.no_sync() if j < m - 1 else nullcontext():
            loss += float(model.forward(mi, mt, key, first_row)) / m
            model.backward(1.0 / m)
    model.finish_grads()
    return loss


def train_reference(config: GPTConfig, train_cfg: TrainConfig, params: dict | None = None, on_step=None,
                    dp: int = 1, seq_groups: int = 1):
    """The single-process twin of ``train``: the whole global batch at once; same return values.
    ``dp``: the data-parallel size of the run it stands for (experts route per rank and micro-batch);
    ``seq_groups``: its tensor-parallel size when sequence-parallel (each tp rank routes its slice)."""
    train_cfg.check(1)
    params = init_params(config, train_cfg.seed, train_cfg.dtype) if params is None else params
    model = ReferenceGPT(config, {k: v.copy() for k, v in params.items()},
                         moe_groups=dp * train_cfg.micro_batches, moe_seq_groups=seq_groups)
    opt = _optimizer(model, config, train_cfg)

    def one_step(idx, targets, key):
        model.zero_grad()
        loss = float(model.forward(idx, targets, key))
        model.backward()
        norm = None if train_cfg.clip is None else clip_grad_norm(model.grads, train_cfg.clip)
        opt.step()
        return loss, norm
    return model, opt, _loop(config, train_cfg, on_step, one_step)

"""The GPT trained with ZeroAdamW over ``mesh.dp``, at any stage.

Stages 0 to 2 leave the model its full parameters and gradients; after each layer group's backward
its gradients (summed over tp where sequence-partial) go to the optimizer, whose buckets reduce
them over ``mesh.dp`` while backward goes on (no ``DataParallel``). Stage 3 takes the parameters
away: after the optimizer has its shards, every array the model's layers hold for a parameter (in
every dict that holds it) is replaced by an empty placeholder. Hooks around each layer group
("embedding", block i, "head") put the group's parameters back just before it runs -- gathered over
``mesh.dp``, the next group's gather started while this one computes -- and take them away after.
In backward the group's gradients are made fresh, summed over the tensor-parallel group where they
are sequence-partial, handed to the optimizer (whose buckets reduce-scatter them) and dropped; only
``wte``'s gradient lives from the head's backward to the embedding's, which both add to it.

With experts (``config.n_experts``) every rank holds its own E / dp experts: they are the optimizer's
``owned_params`` (whole on this rank, never gathered, reduced or released; their master weights
and moments on this rank alone), while the router and the rest are sharded as above.
"""
from __future__ import annotations

from contextlib import nullcontext

import numpy as np

from ..models.config import block_names, no_decay_names, uncounted_names
from ..models.gpt import GPT
from ..nn._base import array_module, layers_in
from ..parallel.agree import OwnChecks, agree_layout, as_text
from ..parallel.mappings import allreduce_partial_grads
from ..parallel.mesh import check_mesh
from .optimizer import ZeroAdamW, check_stage

__all__ = ["ZeroGPT", "zero_adamw_for"]


def zero_adamw_for(model, stage: int, model_parallel, **hyper) -> ZeroAdamW:
    """ZeroAdamW over ``model.mesh.dp`` for the parameters this rank of a GPT on a mesh holds (``GPT``
    or ``PipelinedGPT``): its own experts kept whole (``owned_params``), the rest sharded. Overflow
    and the clipping norm span ``model_parallel`` (the ranks holding the model's other parts), each
    value counted once (``uncounted_names``); biases and LayerNorms do not decay."""
    config, mesh, held = model.config, model.mesh, model.params
    experts = model.expert_names  # in the model's order: the order a checkpoint stores them in
    return ZeroAdamW({n: p for n, p in held.items() if n not in experts}, mesh.dp, stage=stage,
                     no_decay=[n for n in no_decay_names(config) if n in held], model_parallel=model_parallel,
                     norm_skip=sorted(uncounted_names(config, mesh) & set(held)),
                     owned_params={n: held[n] for n in experts}, owned_grads={n: model.grads[n] for n in experts},
                     **hyper)


def agree_settings(where: str, mesh, failed: BaseException | None = None, **settings) -> None:
    """The optimizer's settings agreed over the whole mesh before anything is built: ZeroAdamW agrees them over its
    data-parallel group only, so a setting refused on one rank stopped that rank's group while the other groups
    built a model and waited in its first step (one allgather of a digest)."""
    agree_layout(where, "optimizer settings (" + ", ".join(settings) + ")",
                 ", ".join(f"{k} {as_text(v)}" for k, v in settings.items()),
                 check_mesh(where, mesh).comm, failed)


class ZeroGPT:
    """``model`` (a GPT on ``mesh`` without its own data-parallel reduction) and ``opt`` (ZeroAdamW)."""

    def __init__(self, config, params: dict, mesh, stage: int, sequence_parallel: bool = False,
                 lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0,
                 max_grad_norm: float | None = None, loss_scale=None, bucket_bytes: int = 4 << 20,
                 accumulate: str | None = None):
        with OwnChecks() as own:   # raised after the agreement, on every rank of the mesh
            stage = check_stage("ZeroGPT", stage)
        agree_settings("ZeroGPT", mesh, own.failed, stage=stage, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                       max_grad_norm=max_grad_norm, loss_scale=loss_scale, bucket_bytes=bucket_bytes,
                       accumulate=accumulate)
        self.mesh, self.stage, self.config = mesh, stage, config
        self.model = model = GPT.from_full(config, params, mesh, sequence_parallel=sequence_parallel,
                                           bucket_bytes=None)
        self.opt = zero_adamw_for(model, stage, mesh.tp, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                  loss_scale=loss_scale, max_grad_norm=max_grad_norm, bucket_bytes=bucket_bytes,
                                  accumulate=accumulate)
        self.sharded_names = list(self.opt.layout.names)  # all but the experts
        self._holders = self._find_holders()
        if stage == 3:
            self._placeholder = {n: array_module(model.params[n]).empty((0,), model.params[n].dtype)
                                 for n in self.sharded_names}
            self._release_all()
        self.model.hooks = _Hooks(self)

    # -- where each parameter and gradient array is held -----------------------------------------------
    def _find_holders(self) -> dict:
        """name -> {"params": [(dict, key)...], "grads": [...]}: every dict that holds the array (by identity)."""
        model = self.model
        by_id = {}
        for which in ("params", "grads"):
            for name, arr in getattr(model, which).items():
                by_id[(which, id(arr))] = name
        out: dict[str, dict[str, list[tuple[dict, str]]]] = {n: {"params": [], "grads": []} for n in model.params}
        dicts = [model, *model.chunks] + layers_in(model)  # the chunks' own dicts too: the head reads them
        for holder in dicts:
            for which in ("params", "grads"):
                d = getattr(holder, which, None)
                if not isinstance(d, dict):
                    continue
                for key, arr in d.items():
                    name = by_id.get((which, id(arr)))
                    if name is not None:
                        out[name][which].append((d, key))
        return out

    def _install(self, which: str, arrays: dict) -> None:
        for name, arr in arrays.items():
            for d, key in self._holders[name][which]:
                d[key] = arr

    def _release(self, which: str, names) -> None:
        self._install(which, {n: self._placeholder[n] for n in names})

    def _release_all(self) -> None:
        self._release("params", self.sharded_names)
        self._release("grads", self.sharded_names)

    # -- one step ----------------------------------------------------------------------------------------
    def step(self, idx, targets, dropout_key=None, first_row: int = 0) -> float:
        """Forward, backward and the optimizer step on this data-parallel rank's batch; returns its loss."""
        model = self.model
        if self.stage != 3:
            model.zero_grad()
        for n in model.expert_names:  # at stage 3 the hooks make the others fresh
            model.grads[n][...] = 0
        loss = float(model.forward(idx, targets, dropout_key, first_row))
        with np.errstate(over="ignore", invalid="ignore") if self.opt.dynamic_loss_scale else nullcontext():
            model.backward(self.opt.loss_scale)  # the scaled loss's gradient; overflow is the step's to find
        model.grads_reduced_elsewhere()  # the hooks summed the partial gradients and handed every one in
        self.opt.step()
        return loss

    def full_params(self) -> dict:
        """Every full parameter (collective over dp, and over tp through the model)."""
        if self.stage != 3:
            return self.model.full_params()
        local = self.opt.full_params()  # this tp rank's shards, whole over dp
        self._install("params", local)
        try:
            return self.model.full_params()
        finally:
            self._release("params", list(local))

    def memory_report(self) -> dict:
        return self.opt.memory_report()


class _Hooks:
    """Around each layer group: at stage 3 gathers its parameters for its forward and backward and
    makes its gradients fresh; at every stage, after its backward, sums its sequence-partial gradients
    over tp and hands them to the optimizer, whose buckets start reducing while backward goes on."""

    def __init__(self, owner: ZeroGPT):
        self.owner, self.opt, self.model = owner, owner.opt, owner.model
        self.sharded = owner.stage == 3
        L = owner.config.n_layer
        self.order = ["embedding", *range(L), "head"]
        self.partial = set(self.model.partial_grads) if self.model.tp.size > 1 else set()
        self.experts = set(self.model.expert_names)
        self.block_names = block_names(owner.config)

    def ranges(self, group) -> list[list[str]]:
        """The contiguous name ranges of a group in the optimizer's layout (the head needs lnf and the
        tied wte; a block's experts are not in it)."""
        if group == "embedding":
            return [["wte", "wpe"]]
        if group == "head":
            return [["lnf_w", "lnf_b"], ["wte"]]
        return [[n for n in (f"h{group}.{k}" for k in self.block_names) if n not in self.experts]]

    def _experts_of(self, group) -> list[str]:
        return [] if isinstance(group, str) else [f"h{group}.{k}" for k in self.block_names
                                                  if f"h{group}.{k}" in self.experts]

    def _gather(self, group) -> None:
        arrays: dict = {}
        for names in self.ranges(group):
            arrays.update(self.opt.gather(names))
        self.owner._install("params", arrays)

    def _prefetch(self, group) -> None:
        for names in self.ranges(group):
            self.opt.prefetch(names)

    def _names(self, group) -> list[str]:
        return [n for names in self.ranges(group) for n in names]

    def before_forward(self, group) -> None:
        if not self.sharded:
            return
        self._gather(group)
        k = self.order.index(group)
        if k + 1 < len(self.order):
            self._prefetch(self.order[k + 1])

    def after_forward(self, group) -> None:
        if self.sharded and group != "head":  # the head's parameters stay for its backward, next
            self.owner._release("params", self._names(group))

    def before_backward(self, group) -> None:
        if not self.sharded:
            return
        if group != "head":
            self._gather(group)
        k = self.order.index(group)
        if k > 0:
            self._prefetch(self.order[k - 1])
        xp = self.opt.xp
        fresh = {n: xp.zeros(self.opt.layout.shapes[n], self.opt.dtype) for n in self._names(group)
                 if not (n == "wte" and group == "embedding")}  # wte's gradient lives on from the head
        self.owner._install("grads", fresh)

    def after_backward(self, group) -> None:
        names = self._names(group)
        if self.sharded:
            self.owner._release("params", names)
        grads = self.model.grads
        handed = [n for n in names if n != "wte" or group == "embedding"]
        partial = [grads[n] for n in handed + self._experts_of(group) if n in self.partial]
        if partial:
            allreduce_partial_grads(partial, self.model.tp)
        for n in reversed(sorted(handed, key=lambda n: self.opt.layout.offsets[n])):
            self.opt.grad_ready(n, grads[n], copy=False)   # the model writes no handed-in gradient before step
        if self.sharded:
            self.owner._release("grads", handed)

"""One model chunk of the GPT on a mesh: the part of the model one stage runs, forward beside backward.

The GPT is cut into K contiguous chunks: chunk 0 holds the embedding, chunk K-1 the final
LayerNorm, the head tied to ``wte`` and the loss, and every chunk some blocks. ``GPT`` is the case
K = 1 (one chunk holding everything); ``PipelinedGPT`` spreads K = pp x v chunks over the stages.
A chunk runs the micro-batches it was handed (``set_data``) one at a time, ``forward(x, micro)`` then
``backward(dy, micro)``, the interface ``pycollect.parallel.Pipeline`` drives.

Around each layer group ("embedding", block i, "head") it calls ``hooks.<event>(group)`` when hooks
are set (ZeRO stage 3 gathers a group's parameters there), and during the step's last micro-batch
it reports each group's gradients final as soon as its backward is done (``on_final(names)``), so
the data-parallel buckets start while the rest of backward runs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from ..nn._base import array_module
from ..nn.dropout import Dropout
from ..nn.layernorm import LayerNorm
from ..parallel.attention import ParallelAttention, ParallelBlock
from ..parallel.mappings import copy_to_group, gather_from_sequence
from ..parallel.vocab import VocabParallelCrossEntropy, VocabParallelEmbedding
from .config import GPTConfig, block_names
from .data import IGNORE

if TYPE_CHECKING:
    from ..moe import MoEBranch

__all__ = ["GPTChunk", "MicroBatches", "build_block"]


@dataclass
class MicroBatches:
    """One step's micro-batches as a chunk sees them: ``idx``/``targets`` lists of (B/m, T) arrays,
    the dropout key (seed, step) or None, each micro-batch's first row in the global batch, and the
    scale of the loss whose gradient backward makes (1/m times the caller's)."""
    idx: list
    targets: list
    dropout_key: tuple | None
    first_rows: list
    loss_scale: float

    def __len__(self) -> int:
        return len(self.idx)


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


def _moe(block: ParallelBlock) -> MoEBranch:
    """The MoE branch of a block of a model with experts (``build_block`` gives every such block one)."""
    from ..moe import MoEBranch  # the experts build on the layers: imported when used
    assert isinstance(block.mlp, MoEBranch)
    return block.mlp


def head_forward(xf, wte):
    """The tied head: xf (B, T, C), wte (V/p, C) this rank's rows -> logits (B, T, V/p), never gathered."""
    return xf @ wte.T


def head_backward_input(dlogits, wte):
    """B of the tied head: dlogits (B, T, V/p) -> dxf (B, T, C), partial over the tensor-parallel group."""
    return dlogits @ wte


def head_backward_weight(dlogits, xf, dwte) -> None:
    """W of the tied head: its share of the gradient added into ``dwte`` (V/p, C), from its input xf (B, T, C)."""
    dwte += dlogits.reshape(-1, dwte.shape[0]).T @ xf.reshape(-1, xf.shape[-1])


def head_backward(dlogits, xf, wte, dwte):
    """The tied head's backward: dlogits (B, T, V/p), its input xf (B, T, C) -> dxf (B, T, C), partial
    over the tensor-parallel group; the head's share of the gradient added into ``dwte`` (V/p, C)."""
    head_backward_weight(dlogits, xf, dwte)
    return head_backward_input(dlogits, wte)


class GPTChunk:
    """Blocks ``layers``; the embedding when ``first``; final LayerNorm, head and loss when ``last``.

    ``params``/``grads``: this chunk's arrays under the full model's names (the layers' own).
    ``shared_wte``: (wte, its gradient) of chunk 0 on the same stage, which the head of a last chunk
    uses instead of a copy; without it a last chunk that is not first keeps its own copy of this
    tensor-parallel rank's rows of ``wte``, which the model ties to chunk 0's after backward."""

    def __init__(self, config: GPTConfig, params: dict, mesh, layers: range, first: bool, last: bool,
                 sequence_parallel: bool, shared_wte=None):
        tp, sp = mesh.tp, sequence_parallel
        self.config, self.tp, self.layers = config, tp, layers
        self.first, self.last, self.sequence_parallel = first, last, sp
        self.drop = Dropout(config.dropout)
        self._names = block_names(config)
        self.params: dict = {}
        self.grads: dict = {}
        self.embedding: VocabParallelEmbedding | None = None
        if first:
            self.embedding = VocabParallelEmbedding.from_full({"wte": params["wte"], "wpe": params["wpe"]}, tp,
                                                              sequence_parallel=sp)
            self._hold("wte", self.embedding, "wte")
            self._hold("wpe", self.embedding, "wpe")
        self.blocks = [build_block(config, {k: params[f"h{i}.{k}"] for k in self._names}, mesh, sp) for i in layers]
        for i, b in zip(layers, self.blocks):
            for k in self._names:
                self._hold(f"h{i}.{k}", b, k)
        # (wte, dwte) held by chunk 0 of this stage, when this last chunk is not chunk 0
        self._tied: tuple | None = None
        if last:
            self._build_head(config, params, tp, sp, shared_wte)
        self.hooks: object | None = None  # see _hook: any object with the event methods
        self.aux_share = 1.0  # this rank's share of the balancing losses (1/tp under sequence parallelism)
        self.data: MicroBatches | None = None
        # on_final(names): called as groups' gradients become final
        self.on_final: Callable[[tuple[str, ...]], None] | None = None
        self._head_x: dict = {}  # micro-batch -> the head's input xf (B, T, C), kept for its backward
        self._head_w: dict = {}  # micro-batch -> (dlogits, xf): what the head's W reads, between B and W
        self._block_of = dict(zip(layers, self.blocks))
        self._backwards = self._weights = 0  # backwards (whole, or W) run this step
        self.aux_total = 0.0  # the MoE blocks' balancing losses summed over this step's micro-batches

    def _hold(self, name: str, layer, key: str) -> None:
        self.params[name], self.grads[name] = layer.params[key], layer.grads[key]

    def _build_head(self, config, params, tp, sp, shared_wte) -> None:
        self.lnf = LayerNorm(params["lnf_w"].copy(), params["lnf_b"].copy(), config.eps)
        self.loss = VocabParallelCrossEntropy(tp, ignore_index=IGNORE, equal_shards=True)   # V/p columns each
        self._head_in = gather_from_sequence(tp, seq_axis=1) if sp else copy_to_group(tp)
        if shared_wte is not None and not self.first:  # chunk 0 lives on this stage too: tie to its arrays
            self._tied = shared_wte
        elif not self.first:  # the head's own copy of this tp rank's rows of wte
            v = config.vocab_size // tp.size
            lo = tp.rank * v
            self.params["wte"] = params["wte"][lo:lo + v].copy()  # (V/p, C)
            self.grads["wte"] = array_module(self.params["wte"]).zeros_like(self.params["wte"])
        self._hold("lnf_w", self.lnf, "w")
        self._hold("lnf_b", self.lnf, "b")

    def _head_weight(self):
        """(wte, dwte) the head uses, looked up at each use (ZeRO stage 3 swaps the arrays in the dicts)."""
        return self._tied if self._tied is not None else (self.params["wte"], self.grads["wte"])

    # -- the step's data ------------------------------------------------------------------------------
    def set_data(self, data: MicroBatches) -> None:
        """This step's micro-batches; resets the balancing losses and the counts of backwards."""
        self.data, self._backwards, self._weights, self.aux_total = data, 0, 0, 0.0

    @property
    def _step(self) -> MicroBatches:
        """This step's micro-batches: ``set_data`` comes before any forward or backward."""
        assert self.data is not None, "GPTChunk: set_data comes before forward and backward"
        return self.data

    @property
    def _embedding(self) -> VocabParallelEmbedding:
        """The embedding, which only chunk 0 (``first``) holds."""
        assert self.embedding is not None, "GPTChunk: only the first chunk has the embedding"
        return self.embedding

    def _t_local(self) -> int:
        t = self._step.idx[0].shape[1]
        return t // self.tp.size if self.sequence_parallel else t

    def _spec(self):
        dtype = next(iter(self.params.values())).dtype.name
        return (self._step.idx[0].shape[0], self._t_local(), self.config.n_embd), dtype

    def input_spec(self):
        return None if self.first else self._spec()

    def output_spec(self):
        return None if self.last else self._spec()

    def _key(self, layer: int):
        key = self._step.dropout_key
        return None if key is None else (*key, layer)

    def _hook(self, event: str, group) -> None:
        if self.hooks is not None:
            getattr(self.hooks, event)(group)

    # -- forward and backward -------------------------------------------------------------------------
    def forward(self, x, micro: int):
        """x (B, T or T/p, C), None on chunk 0 -> the next chunk's input, or on the last chunk the
        cross-entropy of micro-batch ``micro`` (0-d)."""
        row0 = self._step.first_rows[micro]
        if self.first:
            self._hook("before_forward", "embedding")
            x = self._embed(self._step.idx[micro], row0)  # (B, T, C) or (B, T/p, C)
            self._hook("after_forward", "embedding")
        for i, b in zip(self.layers, self.blocks):
            self._hook("before_forward", i)
            x = b.forward(x, self._key(i), row0)
            self._hook("after_forward", i)
        if self.config.n_experts:
            self.aux_total += sum(_moe(b).aux_loss for b in self.blocks)
        if not self.last:
            return x
        self._hook("before_forward", "head")
        xf = self._head_in.forward(self.lnf.forward(x))  # (B, T, C) on every rank of the group
        self._head_x[micro] = xf
        loss = self.loss.forward(head_forward(xf, self._head_weight()[0]), self._step.targets[micro])
        self._hook("after_forward", "head")
        return loss

    def _embed(self, idx, first_row: int):
        """idx (B, T) -> the embedding after its dropout, (B, T, C) or this rank's (B, T/p, C) slice;
        the mask sits at the global positions (rows from ``first_row``), as the single process draws it."""
        seq_rank = self.tp.rank if self.sequence_parallel else 0
        x = self._embedding.forward(idx)  # (B, T or T/p, C)
        b, t = idx.shape
        key = None if self._step.dropout_key is None else (*self._step.dropout_key, self.config.n_layer, 0)
        return self.drop.forward(x, key, (first_row, seq_rank * x.shape[1], 0), (first_row + b, t, x.shape[2]))

    def backward(self, dy, micro: int):
        """dy (B, T or T/p, C), None on the last chunk (it seeds with ``loss_scale``) -> the previous
        chunk's dy, None on chunk 0. Adds into ``grads``: B then W of each layer group in turn, between
        the group's hooks (ZeRO stage 3 gathers its parameters before and takes its gradients after)."""
        final = self._backwards == len(self._step) - 1  # the step's last micro-batch on this chunk
        for group in self._backward_groups():
            self._hook("before_backward", group)
            dy = self._group_input(group, dy, micro)
            self._group_weight(group, micro)
            self._hook("after_backward", group)
            self._final(final, *self._group_names(group))
        self._backwards += 1
        return dy

    def backward_input(self, dy, micro: int):
        """B of micro-batch ``micro``: ``backward``'s input gradient alone (every communication of the
        backward with it); the layers keep what ``backward_weight(micro)`` reads. Runs without hooks."""
        if self.hooks is not None:
            raise RuntimeError("GPTChunk.backward_input: the backward split in B and W runs without layer-group "
                               "hooks (ZeRO stage 3 wraps a whole backward in them); use backward")
        for group in self._backward_groups():
            dy = self._group_input(group, dy, micro)
        return dy

    def backward_weight(self, micro: int) -> None:
        """W of micro-batch ``micro`` after its B (the layers' caches as B left them): the weight
        gradients added into ``grads``, no communication; the step's last W reports them final."""
        final = self._weights == len(self._step) - 1
        for group in self._backward_groups():
            self._group_weight(group, micro)
            self._final(final, *self._group_names(group))
        self._weights += 1

    def _backward_groups(self) -> list:
        """The layer groups in backward order: "head", the blocks from the last, "embedding"."""
        return (["head"] if self.last else []) + list(reversed(self.layers)) + (["embedding"] if self.first else [])

    def _group_names(self, group) -> tuple:
        if group == "head":  # the head's own copy of wte is final here; chunk 0's only after the embedding
            own_copy = not self.first and self._tied is None
            return ("lnf_w", "lnf_b", *(("wte",) if own_copy else ()))
        if group == "embedding":
            return ("wte", "wpe")
        return tuple(f"h{group}.{k}" for k in self._names)

    def _group_input(self, group, dy, micro: int):
        """B of one layer group: the gradient of its input (None after the embedding)."""
        if group == "head":
            xf = self._head_x.pop(micro)
            dlogits = self.loss.backward_input(self._step.loss_scale)  # (B, T, V/p)
            self._head_w[micro] = (dlogits, xf)
            dxf = head_backward_input(dlogits, self._head_weight()[0])  # (B, T, C), partial over tp
            return self.lnf.backward_input(self._head_in.backward(dxf))  # (B, T, C) or (B, T/p, C)
        if group == "embedding":
            self._embedding.backward_input(self.drop.backward_input(dy))
            return None
        block = self._block_of[group]
        if self.config.n_experts:  # each balancing loss joins its micro-batch's loss, scaled alike
            _moe(block).aux_grad = self._step.loss_scale * self.aux_share
        return block.backward_input(dy)

    def _group_weight(self, group, micro: int) -> None:
        """W of one layer group: its weight gradients from what its B kept."""
        if group == "head":
            dlogits, xf = self._head_w.pop(micro)
            head_backward_weight(dlogits, xf, self._head_weight()[1])  # after the hook: stage 3's fresh arrays
            self.lnf.backward_weight()
        elif group == "embedding":
            self._embedding.backward_weight()
        else:
            self._block_of[group].backward_weight()

    def _final(self, final: bool, *names) -> None:
        if final and self.on_final is not None:
            self.on_final(names)

    def has_pending(self, micro: int) -> bool:
        """Whether micro-batch ``micro`` went forward through the head and waits for its backward."""
        return micro in self._head_x

    # -- names ----------------------------------------------------------------------------------------
    def partial_names(self) -> list[str]:
        """Names whose gradient holds only this rank's part of the sequence (sequence parallelism)."""
        if not self.sequence_parallel:
            return []
        names = [n for n in ("wte", "wpe") if self.first and n in self._embedding.partial_grads]
        for i, b in zip(self.layers, self.blocks):
            names += [f"h{i}.{k}" for k in self._names if k in b.partial_grads]
        return names + (["lnf_w", "lnf_b"] if self.last else [])

    def whole(self, which: str) -> dict:
        """``which`` ("params" or "grads") of this chunk, gathered over the tp group (collective)."""
        out: dict = {}
        if self.first:
            out.update(self._embedding.full_params() if which == "params"
                       else self._embedding.full_grads(sum_partial=False))
        for i, b in zip(self.layers, self.blocks):
            w = b.full_params() if which == "params" else b.full_grads(sum_partial=False)
            out.update({f"h{i}.{k}": v for k, v in w.items()})
        if self.last:
            d = getattr(self.lnf, which)
            out.update(lnf_w=d["w"].copy(), lnf_b=d["b"].copy())
        return out

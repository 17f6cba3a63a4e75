"""The GPT's configuration, its parameter names in order of use, and GPT-2's initialisation.

Parameters of the full (unsharded) model are one flat dict, name -> array, the same on every rank
when drawn from the same seed::

    wte (V, C), wpe (T_max, C)                                   embeddings; wte is also the head
    h{i}.ln1_w, h{i}.ln1_b (C,)                                  block i, i = 0 .. L-1
    h{i}.w_qkv (C, 3C) [q | k | v], h{i}.b_qkv (3C,), h{i}.w_proj (C, C), h{i}.b_proj (C,)
    h{i}.ln2_w, h{i}.ln2_b (C,), h{i}.w1 (C, F), h{i}.b1 (F,), h{i}.w2 (F, C), h{i}.b2 (C,)
    lnf_w, lnf_b (C,)                                            final LayerNorm

The head is tied to the token embedding (logits = x @ wte.T), as in GPT-2.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from ..nn._base import check_bool
from ..nn.dropout import check_rate

__all__ = ["GPTConfig", "BLOCK_NAMES", "block_names", "block_shapes", "expert_names", "param_names", "param_shapes", "init_params", "no_decay_names",
           "tp_replicated_names", "uncounted_names"]

# One block's parameters in order of use (ParallelBlock.NAMES)
BLOCK_NAMES = ("ln1_w", "ln1_b", "w_qkv", "b_qkv", "w_proj", "b_proj", "ln2_w", "ln2_b", "w1", "b1", "w2", "b2")


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"GPTConfig: {name} must be a positive integer, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class GPTConfig:
    """vocab_size V, block_size T_max, n_layer L, n_head NH, n_embd C, ffn F (default 4C); ``dropout``
    the rate after the embedding, on the attention probabilities and on each residual branch (GPT-2)."""
    vocab_size: int
    block_size: int
    n_layer: int
    n_head: int
    n_embd: int
    ffn: int | None = None
    eps: float = 1e-5
    approximate: str = "tanh"
    dropout: float = 0.0
    n_experts: int = 0  # > 0: every block's MLP is a mixture of n_experts experts (pc.moe)
    moe_top_k: int = 1
    moe_capacity_factor: float = 1.25
    moe_dropless: bool = False
    moe_aux_coef: float = 1e-2

    def __post_init__(self):
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            object.__setattr__(self, name, _positive_int(name, getattr(self, name)))
        object.__setattr__(self, "ffn", 4 * self.n_embd if self.ffn is None else _positive_int("ffn", self.ffn))
        if self.n_embd % self.n_head:
            raise ValueError(f"GPTConfig: n_embd = {self.n_embd} does not divide by n_head = {self.n_head}")
        if isinstance(self.eps, bool) or not isinstance(self.eps, (int, float, np.integer, np.floating)) \
                or not math.isfinite(self.eps) or self.eps <= 0:
            raise ValueError(f"GPTConfig: eps must be a positive finite number, got {self.eps!r}")
        object.__setattr__(self, "eps", float(self.eps))
        if self.approximate not in ("tanh", "none"):
            raise ValueError(f"GPTConfig: approximate must be 'tanh' or 'none', got {self.approximate!r}")
        check_rate("GPTConfig", self.dropout)
        # a Python bool whatever came (np.True_ too): the config's repr is what the ranks agree on
        object.__setattr__(self, "moe_dropless", check_bool("GPTConfig", "moe_dropless", self.moe_dropless))
        if self.n_experts:
            from ..moe import router  # the MoE layer's own checks, with its messages
            object.__setattr__(self, "n_experts", _positive_int("n_experts", self.n_experts))
            router.check_config("GPTConfig", self.n_experts, self.moe_top_k, self.moe_capacity_factor, "position",
                                self.moe_aux_coef)

    def to_dict(self) -> dict:
        return asdict(self)

    def num_params(self) -> int:
        return sum(math.prod(s) for s in param_shapes(self).values())

    def check_tensor_parallel(self, tp: int) -> None:
        """ValueError naming every size that does not divide by ``tp`` (heads, F, V)."""
        ffn = self.ffn
        assert ffn is not None  # __post_init__ replaced None by 4 * n_embd
        bad = [f"{name} = {v}" for name, v in (("n_head", self.n_head), ("ffn", ffn),
                                               ("vocab_size", self.vocab_size)) if v % tp]
        if bad:
            raise ValueError(f"GPTConfig: tensor parallelism over {tp} ranks needs {', '.join(bad)} to divide by "
                             f"{tp} (pad the vocabulary to a multiple of {tp}, or pick another tp)")


def block_shapes(config: GPTConfig) -> dict[str, tuple[int, ...]]:
    """One block's parameters, in order of use: dense MLP ``w1 (C, F) ... b2 (C,)``, or with experts
    ``router (C, E), w1 (E, C, F), b1 (E, F), w2 (E, F, C), b2 (E, C)``."""
    c, f, e = config.n_embd, config.ffn, config.n_experts
    assert f is not None  # __post_init__ replaced None by 4 * n_embd
    block = {"ln1_w": (c,), "ln1_b": (c,), "w_qkv": (c, 3 * c), "b_qkv": (3 * c,), "w_proj": (c, c),
             "b_proj": (c,), "ln2_w": (c,), "ln2_b": (c,)}
    if e:
        block.update({"router": (c, e), "w1": (e, c, f), "b1": (e, f), "w2": (e, f, c), "b2": (e, c)})
    else:
        block.update({"w1": (c, f), "b1": (f,), "w2": (f, c), "b2": (c,)})
    return block


def block_names(config: GPTConfig) -> tuple[str, ...]:
    return tuple(block_shapes(config))


def expert_names(config: GPTConfig) -> list[str]:
    """The experts' parameters (each rank holds E / dp of them): none in a dense model."""
    if not config.n_experts:
        return []
    return [f"h{i}.{k}" for i in range(config.n_layer) for k in ("w1", "b1", "w2", "b2")]


def param_shapes(config: GPTConfig) -> dict[str, tuple[int, ...]]:
    """Name -> shape, in order of first use in the forward pass."""
    v, t, c = config.vocab_size, config.block_size, config.n_embd
    block = block_shapes(config)
    shapes: dict[str, tuple[int, ...]] = {"wte": (v, c), "wpe": (t, c)}
    for i in range(config.n_layer):
        shapes.update({f"h{i}.{k}": s for k, s in block.items()})
    shapes.update({"lnf_w": (c,), "lnf_b": (c,)})
    return shapes


def param_names(config: GPTConfig) -> list[str]:
    return list(param_shapes(config))


def no_decay_names(config: GPTConfig) -> list[str]:
    """Biases and LayerNorm parameters: exempt from weight decay. Every weight matrix decays, the
    position table ``wpe`` included, as nanoGPT (``configure_optimizers``: every parameter of 2 or
    more dimensions) and llm.c do; experts' biases (E, F) and (E, C) are biases all the same."""
    return [n for n, s in param_shapes(config).items()
            if len(s) == 1 or n.rsplit(".", 1)[-1] in ("b1", "b2")]


def tp_replicated_names(config: GPTConfig) -> list[str]:
    """Parameters every tensor-parallel rank holds whole: LayerNorms, row-parallel biases, ``wpe``, and
    with experts the router and the experts (not split over tensor parallelism)."""
    whole: tuple[str, ...] = ("ln1_w", "ln1_b", "b_proj", "ln2_w", "ln2_b", "b2", "lnf_w", "lnf_b", "wpe", "router")
    if config.n_experts:
        whole += ("w1", "b1", "w2")
    return [n for n in param_shapes(config) if n.rsplit(".", 1)[-1] in whole]


def uncounted_names(config: GPTConfig, mesh) -> set[str]:
    """Names this rank leaves out of a global gradient norm because another rank of the model holds
    the same values and counts them: the tensor-parallel replicas on tp ranks other than 0, and the
    tied ``wte``'s copy on pipeline stages other than the first."""
    skip = set(tp_replicated_names(config)) if mesh.tp_rank != 0 else set()
    if mesh.pp_rank != 0:
        skip.add("wte")
    return skip


def init_params(config: GPTConfig, seed: int = 0, dtype=np.float32) -> dict:
    """GPT-2's initialisation: N(0, 0.02) weights, residual projections N(0, 0.02/sqrt(2L)), zero biases,
    unit LayerNorm weights. Drawn in float64 from ``seed`` and cast, so equal seeds give equal models."""
    rng = np.random.default_rng(seed)
    scaled = 0.02 / math.sqrt(2 * config.n_layer)
    out = {}
    for name, shape in param_shapes(config).items():
        leaf = name.rsplit(".", 1)[-1]
        if leaf in ("ln1_w", "ln2_w", "lnf_w"):
            value = np.ones(shape)
        elif len(shape) == 1 or leaf in ("b1", "b2"):
            value = np.zeros(shape)
        else:
            value = rng.standard_normal(shape) * (scaled if leaf in ("w_proj", "w2") else 0.02)
        out[name] = value.astype(dtype)
    return out

"""What is trained: a GPT's shape and the step's batch, its parameter counts and FLOPs (pure).

One block of hidden size H with an MLP of F (= 4H by default), as ``pycollect.models.config``::

    weights   w_qkv 3H^2, w_proj H^2, w1 HF, w2 FH            = 4H^2 + 2HF  (12H^2 at F = 4H)
    biases    b_qkv 3H, b_proj H, b1 F, b2 H                  = 5H + F      (9H)
    norms     ln1, ln2 weight and bias                         = 4H          (4H)

so 12H^2 + 13H per layer with biases and norms, 12H^2 without. The model adds the token
embedding VH (tied to the head), learned positions sH and the final norm 2H.
Under tensor parallelism over t ranks, w_qkv, b_qkv, w1, b1 (column-parallel), w_proj, w2
(row-parallel) and the embedding are split; b_proj, b2, the norms and the positions are whole
on every rank (``models.config.tp_replicated_names``).
"""
from __future__ import annotations

import math
import numbers

from dataclasses import dataclass

from . import presets

__all__ = ["ModelSpec", "PRECISIONS", "OPTIMIZERS", "layer_params", "layer_split", "stage_params", "train_flops"]

PRECISIONS = {"mixed": "mixed", "fp16": "mixed", "bf16": "mixed", "fp32": "fp32"}
OPTIMIZERS = ("adam", "momentum", "sgd")


def layer_params(hidden: int, ffn: int | None = None, biases: bool = True) -> int:
    """One block's parameters: 4H^2 + 2HF (+ 5H + F biases and 4H norms): 12H^2 (+ 13H) at F = 4H."""
    split, whole = layer_split(hidden, ffn, biases)
    return split + whole


def layer_split(hidden: int, ffn: int | None = None, biases: bool = True) -> tuple[int, int]:
    """``(split over tp, whole on every tp rank)`` of one block's parameters."""
    h = hidden
    f = 4 * h if ffn is None else ffn
    split = 4 * h * h + 2 * h * f + ((3 * h + f) if biases else 0)   # w_qkv w_proj w1 w2 (+ b_qkv b1)
    whole = (2 * h + 4 * h) if biases else 0                          # b_proj b2, ln1 ln2
    return split, whole


def _positive(where: str, name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{where}: {name} must be a positive integer, got {value!r}")
    return value


@dataclass(frozen=True)
class ModelSpec:
    """A dense GPT and its step: L layers of hidden H with A heads, vocabulary V, sequence s, MLP F.

    ``batch`` sequences per step (global), ``micro`` sequences per micro-batch on one data-parallel
    rank. ``params``: a total to use instead of the shape's own count (a model given by its count
    borrows a shape; memory, traffic and FLOPs scale to the count). ``biases`` counts biases and
    LayerNorms; ``tied`` the head shares the token embedding; ``positions`` learned positions.
    ``precision``: ``mixed`` (16-bit parameters, gradients and activations, 32-bit optimizer
    state) or ``fp32``; ``optimizer``: adam, momentum or sgd.
    """

    layers: int
    hidden: int
    heads: int
    vocab: int
    seq: int
    batch: int
    micro: int = 1
    ffn: int | None = None
    params: int | None = None
    biases: bool = True
    tied: bool = True
    positions: bool = True
    precision: str = "mixed"
    optimizer: str = "adam"

    def __post_init__(self):
        where = "ModelSpec"
        for name in ("layers", "hidden", "heads", "vocab", "seq", "batch", "micro"):
            _positive(where, name, getattr(self, name))
        if self.ffn is not None:
            _positive(where, "ffn", self.ffn)
        if self.params is not None:
            _positive(where, "params", self.params)
        if self.hidden % self.heads:
            raise ValueError(f"{where}: hidden = {self.hidden} does not divide by heads = {self.heads}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"{where}: precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        object.__setattr__(self, "precision", PRECISIONS[self.precision])
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"{where}: optimizer must be one of {', '.join(OPTIMIZERS)}, got {self.optimizer!r}")

    # -- constructors -------------------------------------------------------------------------------
    @classmethod
    def from_gpt(cls, config, batch: int, micro: int = 1, precision: str = "mixed",
                 optimizer: str = "adam") -> "ModelSpec":
        """From a ``pycollect.models.GPTConfig`` (dense): the step of ``batch`` sequences of its block_size."""
        if getattr(config, "n_experts", 0):
            raise ValueError("ModelSpec.from_gpt: the planner models dense GPTs; this config has experts")
        return cls(layers=config.n_layer, hidden=config.n_embd, heads=config.n_head, vocab=config.vocab_size,
                   seq=config.block_size, batch=batch, micro=micro, ffn=config.ffn, precision=precision,
                   optimizer=optimizer)

    @classmethod
    def from_name(cls, name: str, batch: int, micro: int = 1, seq: int | None = None, **kw) -> "ModelSpec":
        """A named shape (``presets.MODELS``), its sequence unless ``seq`` is given."""
        layers, hidden, heads, vocab, default_seq = presets.model_shape(name)
        return cls(layers, hidden, heads, vocab, seq or default_seq, batch, micro, **kw)

    @classmethod
    def from_params(cls, count: float, batch: int, micro: int = 1, seq: int | None = None,
                    vocab: int | None = None, what: str = "ModelSpec.from_params: the parameter count",
                    **kw) -> "ModelSpec":
        """``count`` parameters in the shape of the named model nearest that count (layers, hidden, heads), which
        must be within a factor of two of it (the shape sets the FLOPs and activations, the count the weights:
        1e30 parameters in a 1T shape would plan neither). ``what`` names the count in errors."""
        if isinstance(count, bool) or not isinstance(count, numbers.Real) or not 1 <= count < math.inf:
            raise ValueError(f"{what} must be a finite number of at least 1, got {count!r}")
        name, (layers, hidden, heads, default_vocab, default_seq) = presets.nearest_shape(count)
        own = presets.shape_count(layers, hidden, default_vocab, default_seq)
        if not 0.5 <= count / own <= 2:
            raise ValueError(f"{what} {count:.3g} is more than a factor of two from the nearest named shape, {name} "
                             f"({own:.3g} parameters); give the shape (layers, hidden, heads) instead")
        return cls(layers, hidden, heads, vocab or default_vocab, seq or default_seq, batch, micro,
                   params=int(round(count)), **kw)

    # -- sizes --------------------------------------------------------------------------------------
    @property
    def ffn_size(self) -> int:
        return 4 * self.hidden if self.ffn is None else self.ffn

    @property
    def tokens(self) -> int:
        """Tokens per step: batch x seq."""
        return self.batch * self.seq

    @property
    def embedding_params(self) -> int:
        """VH (twice when the head is not tied) + sH learned positions."""
        return self.vocab * self.hidden * (1 if self.tied else 2) + (self.seq * self.hidden if self.positions else 0)

    @property
    def shape_params(self) -> int:
        """The shape's own count: L x layer + embedding + final norm."""
        return (self.layers * layer_params(self.hidden, self.ffn_size, self.biases) + self.embedding_params
                + (2 * self.hidden if self.biases else 0))

    @property
    def total_params(self) -> int:
        """``params`` when given, else the shape's count."""
        return self.params if self.params is not None else self.shape_params

    @property
    def scale(self) -> float:
        """total / shape: what every per-rank parameter count is multiplied by."""
        return self.total_params / self.shape_params

    def describe(self) -> str:
        count = f"{self.total_params / 1e9:.3g}B parameters"
        shape = f"L={self.layers} H={self.hidden} A={self.heads} V={self.vocab} s={self.seq}"
        if self.params is not None:
            shape += f" (shape's own count {self.shape_params / 1e9:.3g}B)"
        return f"{count}, {shape}, batch {self.batch} x micro {self.micro}, {self.precision}, {self.optimizer}"


def stage_params(spec: ModelSpec, tp: int, pp: int, stage: int, vshape: bool = False) -> float:
    """Parameters one rank of pipeline stage ``stage`` holds (before ZeRO): its L/pp layers' share
    under tp, plus the embedding (V/tp rows, positions whole) on stage 0 and the final norm and the
    head on the stage of the last model chunk: stage pp - 1, where a tied head is a second copy of the
    embedding's rows when pp > 1 (as Megatron-LM keeps it), or, with ``vshape`` (zbv: the V's top is
    stage 0, model chunks 0 and 2pp - 1), stage 0 itself, where a tied head is the embedding it already holds."""
    sizes("stage_params", tp=tp, pp=pp)
    if isinstance(stage, bool) or not isinstance(stage, numbers.Integral) or not 0 <= stage < pp:
        raise ValueError(f"stage_params: stage must be one of the {pp} stages, 0..{pp - 1}, got {stage!r}")
    if spec.layers % pp:
        raise ValueError(f"stage_params: {spec.layers} layers do not divide into {pp} pipeline stages")
    h = spec.hidden
    split, whole = layer_split(h, spec.ffn_size, spec.biases)
    n = spec.layers // pp * (split / tp + whole)
    rows = spec.vocab * h / tp
    head_stage = 0 if vshape else pp - 1
    if stage == 0:
        n += rows + (spec.seq * h if spec.positions else 0)
    if stage == head_stage:
        n += (2 * h if spec.biases else 0) + (rows if (head_stage != 0 or not spec.tied) else 0)
    return n * spec.scale


def sizes(where: str, **given) -> None:
    """Each of ``given`` an integer of at least 1 (a size, a degree of parallelism): ValueError naming it (a 0
    divided by zero, a negative sequence length gave positive bytes)."""
    for name, value in given.items():
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise ValueError(f"{where}: {name} must be an integer of at least 1, got {value!r}")


def train_flops(spec: ModelSpec) -> float:
    """Model FLOPs of one step: 6 x parameters x tokens (forward 2, backward 4 per parameter per token)."""
    return 6.0 * spec.total_params * spec.tokens

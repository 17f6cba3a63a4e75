"""ZeRO: AdamW with optimizer state, gradients and parameters sharded over a data-parallel group."""
from .layout import FlatLayout
from .optimizer import STAGES, ZeroAdamW
from .gpt import ZeroGPT

__all__ = ["ZeroAdamW", "ZeroGPT", "FlatLayout", "STAGES"]

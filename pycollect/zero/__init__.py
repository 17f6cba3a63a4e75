"""ZeRO: AdamW with optimizer state, gradients and parameters sharded over a data-parallel group."""
from .layout import FlatLayout
from .optimizer import STAGES, ZeroAdamW
from .gpt import ZeroGPT
from .pipeline import ZeroPipelinedGPT

__all__ = ["ZeroAdamW", "ZeroGPT", "ZeroPipelinedGPT", "FlatLayout", "STAGES"]

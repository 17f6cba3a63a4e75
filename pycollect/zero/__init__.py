"""ZeRO: AdamW with optimizer state, gradients and parameters sharded over a data-parallel group."""
from .layout import FlatLayout
from .optimizer import STAGES, ZeroAdamW
from .checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from .gpt import ZeroGPT
from .pipeline import ZeroPipelinedGPT

__all__ = ["ZeroAdamW", "save_checkpoint", "load_checkpoint", "CheckpointError", "ZeroGPT", "ZeroPipelinedGPT", "FlatLayout", "STAGES"]

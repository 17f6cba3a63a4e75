"""Models built from ``pycollect.nn`` and ``pycollect.parallel``: a GPT on a process mesh (one stage,
or a pipeline of them, from the same chunks), its single-process twin and tasks to train it on. The
training loop (``python -m pycollect train``) is ``pycollect.training``, above this package and ``zero``."""
from .config import GPTConfig, init_params, no_decay_names, param_names, param_shapes
from .gpt import GPT
from .gpt_pipeline import PipelinedGPT
from .reference import ReferenceGPT

__all__ = ["GPT", "PipelinedGPT", "GPTConfig", "ReferenceGPT", "init_params", "no_decay_names", "param_names", "param_shapes"]

"""Models built from ``pycollect.nn`` and ``pycollect.parallel``: a GPT on a process mesh, its
single-process twin, tasks to train it on, and the training loop (``python -m pycollect train``)."""
from .config import GPTConfig, init_params, no_decay_names, param_names, param_shapes
from .gpt import GPT
from .gpt_pipeline import PipelinedGPT
from .reference import ReferenceGPT

__all__ = ["GPT", "PipelinedGPT", "GPTConfig", "ReferenceGPT", "init_params", "no_decay_names", "param_names", "param_shapes"]

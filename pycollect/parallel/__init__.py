"""Tensor, sequence, data and pipeline parallelism over pycollect Communicators.

``ProcessMesh`` splits a communicator into tp, dp and pp groups (Megatron's rank order);
``mappings`` holds the conjugate communication pairs that parallel layers use, each taking its
group explicitly (``copy_to_group(mesh.tp)``).
"""
from .mappings import (allreduce_partial_grads, copy_to_group, gather_from_group, gather_from_sequence, reduce_from_group,
                       reduce_scatter_to_sequence, scatter_to_group, scatter_to_sequence)
from .mesh import ProcessMesh
from .attention import ParallelAttention, ParallelBlock
from .data import DataParallel
from .pipeline import Pipeline
from .tensor import ColumnParallelLinear, ParallelMLP, RowParallelLinear
from .vocab import VocabParallelCrossEntropy, VocabParallelEmbedding

__all__ = ["ProcessMesh", "DataParallel", "Pipeline", "ColumnParallelLinear", "RowParallelLinear", "ParallelMLP", "ParallelAttention",
           "ParallelBlock", "VocabParallelEmbedding", "VocabParallelCrossEntropy", "copy_to_group", "reduce_from_group", "scatter_to_group", "gather_from_group",
           "scatter_to_sequence", "gather_from_sequence", "reduce_scatter_to_sequence", "allreduce_partial_grads"]

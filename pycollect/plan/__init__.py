"""The planner: memory, communication, bubble and step time of a parallel configuration, and a ranking.

    from pycollect import plan
    model = plan.ModelSpec.from_name("gpt3-6.7b", batch=1024, micro=1)
    cluster = plan.ClusterSpec.from_presets(64, 8, memory=80e9, peak_flops=989e12, intra="nvlink4", inter="ib-ndr")
    p = plan.predict(model, cluster, plan.ParallelConfig(dp=8, tp=8, pp=1))
    best = plan.plan(model, cluster).best

Pure functions over small dataclasses, no MPI: model.py (sizes, parameters, FLOPs), memory.py
(ZeRO and activations), comm.py (each step's collectives through ``pc.traffic`` and the cost
model), steptime.py (``predict``), checks.py (reasons to reject), rank.py (``plan``), presets.py
(named models and links). docs/planner.md states the formulas and their sources.
"""
from .checks import bubble_problem, placement_problem, size_problem
from .comm import CommOp, comm_ops
from .config import ClusterSpec, ParallelConfig, links_from_file, links_from_presets
from .memory import activation_bytes_per_layer, memory, zero_memory
from .model import ModelSpec, layer_params, stage_params, train_flops
from .rank import Plan, SearchSpace, plan
from .steptime import Prediction, predict

__all__ = ["ModelSpec", "ClusterSpec", "ParallelConfig", "Prediction", "CommOp", "Plan", "SearchSpace", "predict",
           "plan", "memory", "zero_memory", "activation_bytes_per_layer", "comm_ops", "layer_params",
           "stage_params", "train_flops", "links_from_file", "links_from_presets", "size_problem",
           "placement_problem", "bubble_problem"]

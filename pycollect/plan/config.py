"""Where it runs (ClusterSpec) and how it is split (ParallelConfig): plain data, checked on construction.

Ranks of the mesh are numbered tensor-parallel fastest, then data-parallel, then pipeline
(Megatron-LM's order): rank = tp_rank + tp * (dp_rank + dp * pp_rank), and rank r lives on node
r // gpus_per_node. So a tensor-parallel group is tp consecutive ranks, a data-parallel group
ranks tp apart, and neighbouring pipeline stages tp * dp apart.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass

from ..engine.topology import INTER, INTRA
from ..pipeline.schedules import SCHEDULES, ZERO_BUBBLE
from ..costmodel import Link, Model
from . import presets

__all__ = ["ClusterSpec", "ParallelConfig", "RECOMPUTE", "COMPUTE", "links_from_presets", "links_from_file"]

RECOMPUTE = ("none", "selective", "full")
COMPUTE = ("flat", "shapes")


def _positive_int(where: str, name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{where}: {name} must be a positive integer, got {value!r}")
    return value


def _positive_number(where: str, name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{where}: {name} must be a positive number, got {value!r}")
    return float(value)


def links_from_presets(intra: str = "nvlink4", inter: str = "ib-ndr") -> Model:
    """A cost model of two tiers from named links (``presets.LINKS``): alpha the latency, beta 1/bandwidth, each a
    GPU's port (``Link.port``): the messages a GPU sends (receives) over a tier in one round share its bandwidth."""
    tiers = {}
    for tier, name in ((INTRA, intra), (INTER, inter)):
        bandwidth, latency, _ = presets.link(name)
        tiers[tier] = Link(latency, 1.0 / bandwidth, port=True)
    return Model(tiers)


def links_from_file(path: str) -> Model:
    """The fitted model of a ``pycollect bench fit`` file: alpha and beta per tier, gamma, overhead and the terms
    fitted on measured calls (far rates, copies, fences, per-call overhead; costmodel.py).

    Reads ``{"model": {"tiers": {tier: {"alpha_s", "beta_s_per_byte"}}, "gamma_s_per_byte",
    "overhead_s_per_round"}}`` (the fit's JSON, or a tuning file that carries the model) or that
    ``model`` object alone.
    """
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: cannot read a JSON file ({e.__class__.__name__}: {e})") from None
    model = doc.get("model", doc) if isinstance(doc, dict) else None
    if not isinstance(model, dict) or not isinstance(model.get("tiers"), dict) or not model["tiers"]:
        raise ValueError(f"{path}: no fitted model (expected {{\"model\": {{\"tiers\": ...}}}} as "
                         f"'pycollect bench fit --json' writes it)")
    try:
        return Model.from_dict(model)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None


@dataclass(frozen=True)
class ClusterSpec:
    """``gpus`` ranks on nodes of ``gpus_per_node``, ``memory`` bytes and ``peak_flops`` per GPU, links per tier.

    ``compute``: ``flat`` (6 x parameters x tokens at ``peak_flops * efficiency``; a measured rate
    goes in with efficiency 1) or ``shapes`` (every GEMM of the layers and the head at the efficiency
    its shape reaches, ``compute.gemm_efficiency``, and the element-wise kernels' bytes at
    ``hbm`` bytes/s; ``efficiency`` is then not used; ``gemm_ceiling`` the largest GEMMs' fraction
    of the peak, 0.824 as measured on the H100, ``compute.GEMM_CEILING``). ``nics_per_node``: None prices an
    inter-node message on one port (one NIC per GPU, each ring on its own); a number spreads a
    group's inter-node traffic over the NICs of the node its members share, as NCCL's channels do
    (``comm.nic_factor``). ``simulate``: collectives priced by the cluster simulator (clustersim.py:
    ranks wait on late peers) where it answers, instead of each rank on its own (``comm.price``).
    """

    gpus: int
    gpus_per_node: int
    memory: float
    peak_flops: float
    links: Model
    efficiency: float = 0.5
    compute: str = "flat"
    hbm: float = 3.35e12
    nics_per_node: int | None = None
    gemm_ceiling: float = 0.824
    simulate: bool = False

    def __post_init__(self):
        where = "ClusterSpec"
        _positive_int(where, "gpus", self.gpus)
        _positive_int(where, "gpus_per_node", self.gpus_per_node)
        _positive_number(where, "memory", self.memory)
        _positive_number(where, "peak_flops", self.peak_flops)
        _positive_number(where, "efficiency", self.efficiency)
        if self.efficiency > 1:
            raise ValueError(f"ClusterSpec: efficiency must be at most 1, got {self.efficiency!r}")
        if self.compute not in COMPUTE:
            raise ValueError(f"ClusterSpec: compute must be one of {', '.join(COMPUTE)}, got {self.compute!r}")
        _positive_number(where, "hbm", self.hbm)
        _positive_number(where, "gemm_ceiling", self.gemm_ceiling)
        if self.gemm_ceiling > 1:
            raise ValueError(f"ClusterSpec: gemm_ceiling must be at most 1, got {self.gemm_ceiling!r}")
        if self.nics_per_node is not None:
            _positive_int(where, "nics_per_node", self.nics_per_node)
        if not isinstance(self.simulate, bool):
            raise ValueError(f"ClusterSpec: simulate must be True or False, got {self.simulate!r}")
        if self.gpus > self.gpus_per_node and self.gpus % self.gpus_per_node:
            raise ValueError(f"ClusterSpec: {self.gpus} GPUs do not fill nodes of {self.gpus_per_node}")
        needed = [INTRA] * (min(self.gpus, self.gpus_per_node) > 1) + [INTER] * (self.gpus > self.gpus_per_node)
        missing = [t for t in needed if t not in self.links.links]
        if missing:
            raise ValueError(f"ClusterSpec: no link for tier {', '.join(missing)} (have {', '.join(self.links.links)})")

    @classmethod
    def from_presets(cls, gpus: int, gpus_per_node: int, memory: float, peak_flops: float, intra: str = "nvlink4",
                     inter: str = "ib-ndr", efficiency: float = 0.5, **kw) -> "ClusterSpec":
        """Named links (``presets.LINKS``); ``kw``: the fields after ``efficiency`` (compute, hbm, ...)."""
        return cls(gpus, gpus_per_node, memory, peak_flops, links_from_presets(intra, inter), efficiency, **kw)

    @classmethod
    def from_tuning(cls, path: str, gpus: int, gpus_per_node: int, memory: float, flops: float,
                    efficiency: float = 1.0) -> "ClusterSpec":
        """Links fitted by ``pycollect bench fit`` and a compute rate (measured: efficiency 1)."""
        return cls(gpus, gpus_per_node, memory, flops, links_from_file(path), efficiency)

    @property
    def rate(self) -> float:
        """FLOP/s one GPU is assumed to reach: peak x efficiency."""
        return self.peak_flops * self.efficiency

    @property
    def nodes(self) -> int:
        return max(1, self.gpus // self.gpus_per_node)

    def node_of(self, rank: int) -> int:
        return rank // self.gpus_per_node


@dataclass(frozen=True)
class ParallelConfig:
    """dp x tp x pp ranks; ZeRO stage over dp; the pipeline schedule and its chunks per stage v;
    activation recomputation (none, selective, full); sequence parallelism (with tp > 1);
    ``overlap``: the data-parallel reduction overlaps backward; ``overlap_p2p``: pipeline sends and
    receives overlap compute (their time leaves the critical path); ``scatter_gather``: without
    sequence parallelism, each tensor-parallel rank sends 1/t of a stage's activation and the
    next stage allgathers it over its node (Megatron-LM's scatter/gather, Narayanan et al.
    section 4.1); ``algorithm`` of the collectives (a schedule name, or ``auto``: the cheapest
    schedule the cost model predicts)."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    zero: int = 0
    schedule: str = "1f1b"
    v: int = 1
    recompute: str = "none"
    sp: bool = True
    overlap: bool = False
    algorithm: str = "ring"
    overlap_p2p: bool = False
    scatter_gather: bool = False

    def __post_init__(self):
        where = "ParallelConfig"
        for name in ("dp", "tp", "pp", "v"):
            _positive_int(where, name, getattr(self, name))
        if self.zero not in (0, 1, 2, 3) or isinstance(self.zero, bool):
            raise ValueError(f"{where}: zero must be a stage in 0..3, got {self.zero!r}")
        if self.schedule not in SCHEDULES + ZERO_BUBBLE:
            raise ValueError(f"{where}: schedule must be one of {', '.join(SCHEDULES + ZERO_BUBBLE)}, "
                             f"got {self.schedule!r}")
        if self.schedule == "zbv" and self.v != 2:
            raise ValueError(f"{where}: zbv places v = 2 chunks per stage V-wise, got v = {self.v}")
        if self.schedule not in ("interleaved", "zbv") and self.v != 1:
            raise ValueError(f"{where}: v = {self.v} chunks per stage needs the interleaved schedule")
        if self.recompute not in RECOMPUTE:
            raise ValueError(f"{where}: recompute must be one of {', '.join(RECOMPUTE)}, got {self.recompute!r}")

    @property
    def gpus(self) -> int:
        return self.dp * self.tp * self.pp

    @property
    def sequence_parallel(self) -> bool:
        return self.sp and self.tp > 1

    def describe(self) -> str:
        pipe = f" {self.schedule}" + (f" v={self.v}" if self.v > 1 else "") if self.pp > 1 else ""
        return (f"dp={self.dp} tp={self.tp}{' sp' if self.sequence_parallel else ''} pp={self.pp}{pipe} "
                f"zero={self.zero} recompute={self.recompute}")

    def to_dict(self) -> dict:
        return {"dp": self.dp, "tp": self.tp, "pp": self.pp, "zero": self.zero,
                "schedule": self.schedule if self.pp > 1 else None, "v": self.v, "recompute": self.recompute,
                "sequence_parallel": self.sequence_parallel, "overlap": self.overlap, "algorithm": self.algorithm,
                "overlap_p2p": self.overlap_p2p, "scatter_gather": self.scatter_gather}

"""Named model shapes and links, and the parsing of SI quantities (7B, 989T, 80G, 2us).

Sources (docs/planner.md cites them in full):

- GPT-3 shapes: Brown et al., "Language Models are Few-Shot Learners" (2020), Table 2.1
  (vocabulary 50257, context 2048). Two rows do not multiply out: XL (1.3B) prints 24 heads of
  128 for d_model 2048 (16 heads of 128 are used), 13B prints d_model 5140 for 40 heads of 128
  (5120 is used).
- Megatron shapes: Narayanan et al., "Efficient Large-Scale Language Model Training on GPU
  Clusters Using Megatron-LM" (SC'21), Table 1 (vocabulary 51200, sequence 2048).
- Link bandwidths: vendor figures per direction per GPU (NVLink, PCIe) or per port (InfiniBand,
  Ethernet). Latencies are round assumed figures, not vendor numbers: they matter only for small
  messages, and ``pycollect bench fit`` measures the real ones.
"""
from __future__ import annotations

import math
import re

__all__ = ["MODELS", "LINKS", "LINK_ALIASES", "link", "model_shape", "nearest_shape", "shape_count", "parse_si",
           "parse_seconds"]

# name -> (layers, hidden, heads, vocabulary, sequence)
MODELS: dict[str, tuple[int, int, int, int, int]] = {
    "gpt3-125m": (12, 768, 12, 50257, 2048),
    "gpt3-350m": (24, 1024, 16, 50257, 2048),
    "gpt3-760m": (24, 1536, 16, 50257, 2048),
    "gpt3-1.3b": (24, 2048, 16, 50257, 2048),
    "gpt3-2.7b": (32, 2560, 32, 50257, 2048),
    "gpt3-6.7b": (32, 4096, 32, 50257, 2048),
    "gpt3-13b": (40, 5120, 40, 50257, 2048),
    "gpt3-175b": (96, 12288, 96, 50257, 2048),
    "megatron-1.7b": (24, 2304, 24, 51200, 2048),
    "megatron-3.6b": (30, 3072, 32, 51200, 2048),
    "megatron-7.5b": (36, 4096, 32, 51200, 2048),
    "megatron-18.4b": (40, 6144, 48, 51200, 2048),
    "megatron-39.1b": (48, 8192, 64, 51200, 2048),
    "megatron-76.1b": (60, 10240, 80, 51200, 2048),
    "megatron-145.6b": (80, 12288, 96, 51200, 2048),
    "megatron-310.1b": (96, 16384, 128, 51200, 2048),
    "megatron-529.6b": (105, 20480, 128, 51200, 2048),
    "megatron-1008b": (128, 25600, 160, 51200, 2048),
}

# name -> (bytes per second one way, one-way latency in seconds, source)
LINKS: dict[str, tuple[float, float, str]] = {
    "nvlink3": (300e9, 2e-6, "NVIDIA A100 datasheet: NVLink 3, 600 GB/s per GPU both ways"),
    "nvlink4": (450e9, 2e-6, "NVIDIA H100 datasheet: NVLink 4 (SXM5), 900 GB/s per GPU both ways"),
    "pcie4": (25e9, 5e-6, "PCIe 4.0 x16: 16 GT/s x 16 lanes, 128b/130b = 31.5 GB/s raw; ~25 GB/s effective"),
    "pcie5": (50e9, 5e-6, "PCIe 5.0 x16: 32 GT/s x 16 lanes, 128b/130b = 63 GB/s raw; ~50 GB/s effective"),
    "ib-hdr": (25e9, 3e-6, "NVIDIA ConnectX-6 / Quantum HDR InfiniBand: 200 Gb/s per port"),
    "ib-ndr": (50e9, 3e-6, "NVIDIA ConnectX-7 / Quantum-2 NDR InfiniBand: 400 Gb/s per port"),
    "eth-100g": (12.5e9, 10e-6, "IEEE 802.3ba 100 Gigabit Ethernet: 100 Gb/s per port"),
    "eth-400g": (50e9, 10e-6, "IEEE 802.3bs 400 Gigabit Ethernet: 400 Gb/s per port"),
}
LINK_ALIASES = {"nvlink": "nvlink4", "pcie": "pcie4", "ib": "ib-ndr", "infiniband": "ib-ndr",
                "ethernet": "eth-100g", "eth": "eth-100g", "100gbe": "eth-100g", "400gbe": "eth-400g"}


def link(name: str) -> tuple[float, float, str]:
    """``(bytes/s, latency s, source)`` of a named link (aliases: nvlink, pcie, ib, ethernet)."""
    key = LINK_ALIASES.get(name.lower(), name.lower())
    if key not in LINKS:
        raise ValueError(f"unknown link preset {name!r}; expected one of {', '.join([*LINKS, *LINK_ALIASES])}")
    return LINKS[key]


def model_shape(name: str) -> tuple[int, int, int, int, int]:
    """``(layers, hidden, heads, vocabulary, sequence)`` of a named model."""
    if name.lower() not in MODELS:
        raise ValueError(f"unknown model {name!r}; expected a parameter count (7B, 1.3e9) or one of {', '.join(MODELS)}")
    return MODELS[name.lower()]


def shape_count(layers: int, hidden: int, vocab: int, seq: int) -> int:
    """Parameters of a GPT of this shape: L(12H^2 + 13H) + VH + sH + 2H (tied head, learned positions)."""
    return layers * (12 * hidden * hidden + 13 * hidden) + vocab * hidden + seq * hidden + 2 * hidden


def nearest_shape(count: float) -> tuple[str, tuple[int, int, int, int, int]]:
    """The named model whose parameter count is nearest ``count`` (in ratio)."""
    def distance(item):
        layers, hidden, _, vocab, seq = item[1]
        return abs(math.log(shape_count(layers, hidden, vocab, seq) / count))
    return min(MODELS.items(), key=distance)


_SI = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "B": 1e9, "T": 1e12, "P": 1e15,
       "KI": 2.0 ** 10, "MI": 2.0 ** 20, "GI": 2.0 ** 30, "TI": 2.0 ** 40}


def parse_si(text: str, what: str = "quantity") -> float:
    """``"7B"`` -> 7e9, ``"989T"`` -> 9.89e14, ``"80G"`` -> 8e10, ``"80GiB"`` -> 80 * 2**30, ``"1.3e9"``.

    Decimal prefixes (K M G T P; B = billion), binary with ``i`` (Ki Mi Gi Ti); a trailing unit
    (B for bytes, FLOPS, /s) is ignored. ValueError for text that is not a non-negative number.
    """
    t = str(text).strip().replace(" ", "")
    m = re.fullmatch(r"([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)([KMGTPB]i?)?(B|FLOPS|FLOP/S|/S|B/S)?", t, re.IGNORECASE)
    if not m:
        raise ValueError(f"{what}: not a number: {text!r} (examples: 7B, 989T, 80G, 1.3e9)")
    prefix = (m.group(2) or "").upper()
    return float(m.group(1)) * _SI[prefix]


def parse_seconds(text: str, what: str = "latency") -> float:
    """``"2us"``, ``"1.5ms"``, ``"3e-6"`` (seconds) -> seconds."""
    t = str(text).strip().lower()
    for unit, scale in (("ns", 1e-9), ("us", 1e-6), ("ms", 1e-3), ("s", 1.0)):
        if t.endswith(unit):
            t, factor = t[: -len(unit)], scale
            break
    else:
        factor = 1.0
    try:
        value = float(t) * factor
    except ValueError:
        raise ValueError(f"{what}: not a time: {text!r} (examples: 2us, 1.5ms, 3e-6)") from None
    if not value >= 0 or math.isinf(value):
        raise ValueError(f"{what}: must be a finite time >= 0, got {text!r}")
    return value

"""Training data the repository makes: a synthetic task, or the bytes of any text file. No downloads.

Every function returns (idx, targets), both (B, T) int64 NumPy arrays, targets -1 where a token
is not scored (``IGNORE``). A batch is a pure function of (seed, step): every rank draws the same
global batch and keeps its rows (``shard_rows``), so runs on any mesh see the same data.
"""
from __future__ import annotations

import numpy as np

__all__ = ["IGNORE", "reverse_batch", "text_batch", "shard_rows", "read_text"]

IGNORE = -1


def _rng(seed: int, step: int) -> np.random.Generator:
    return np.random.default_rng([int(seed), int(step)])


def reverse_batch(batch: int, seq: int, vocab: int, seed: int, step: int):
    """Reverse a random string: tokens a_1..a_k (from 1..V-1), separator 0, then a_k..a_1.

    The 2k + 1 tokens give T = seq = 2k inputs and next-token targets; the k - 1 targets inside the
    random half cannot be predicted and are not scored, the separator and the reversed half are.
    A model that has learnt the task reaches a loss near 0; a blind one about log(V - 1).
    """
    if seq < 2 or seq % 2:
        raise ValueError(f"reverse_batch: seq must be even and at least 2, got {seq}")
    if vocab < 3:
        raise ValueError(f"reverse_batch: vocab must be at least 3, got {vocab}")
    k = seq // 2
    a = _rng(seed, step).integers(1, vocab, (batch, k))  # (B, k)
    full = np.concatenate([a, np.zeros((batch, 1), a.dtype), a[:, ::-1]], axis=1)  # (B, 2k+1)
    idx, targets = full[:, :-1].astype(np.int64), full[:, 1:].astype(np.int64)  # (B, T) each
    targets[:, :k - 1] = IGNORE
    return idx, targets


def read_text(path: str) -> np.ndarray:
    """The bytes of a file as tokens 0..255 (a byte-level vocabulary of 256)."""
    with open(path, "rb") as f:
        data = np.frombuffer(f.read(), dtype=np.uint8)
    if data.size < 2:
        raise ValueError(f"read_text: {path} holds {data.size} bytes; need at least 2")
    return data


def text_batch(data: np.ndarray, batch: int, seq: int, seed: int, step: int):
    """B random windows of T + 1 bytes: idx the first T, targets the next T (every token scored)."""
    if data.size < seq + 1:
        raise ValueError(f"text_batch: the text has {data.size} bytes, fewer than seq + 1 = {seq + 1}")
    starts = _rng(seed, step).integers(0, data.size - seq, batch)  # (B,)
    windows = data[starts[:, None] + np.arange(seq + 1)].astype(np.int64)  # (B, T+1)
    return windows[:, :-1].copy(), windows[:, 1:].copy()


def shard_rows(arrays, rank: int, size: int):
    """Rows [rank*B/size, (rank+1)*B/size) of each (B, ...) array; B must divide by ``size``."""
    out = []
    for a in arrays:
        if a.shape[0] % size:
            raise ValueError(f"shard_rows: batch {a.shape[0]} does not divide by the data-parallel size {size}")
        n = a.shape[0] // size
        out.append(a[rank * n:(rank + 1) * n])
    return out

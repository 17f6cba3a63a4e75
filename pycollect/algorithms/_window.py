"""Pieces the shared-memory window schedules share: the order a rank visits its peers."""
from __future__ import annotations


def peers(rank: int, size: int) -> list[int]:
    """Every other rank, starting after this one: ranks reading at once start from different windows."""
    return [(rank + k) % size for k in range(1, size)]

"""Figures for the tools and pipeline/plot.py: matplotlib imported only when a plot is asked for."""
from __future__ import annotations

import os


def pyplot():
    """matplotlib's pyplot on the Agg backend (imported only when a plot is asked for)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save_figure(fig, path: str) -> str:
    """Save ``fig`` as ``path`` (folders made), close it, return the absolute path."""
    path = os.path.abspath(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path, dpi=100)
    pyplot().close(fig)
    return path

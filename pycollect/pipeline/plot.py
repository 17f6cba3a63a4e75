"""A pipeline timeline as a picture: one row per stage, F and B blocks labelled by micro-batch.

Takes a simulated timeline (``simulate(...).timeline``) or a measured one of the same shape:
``timeline[s]`` is stage s's list of ``(start, end, action)``, ``action`` an ``Action`` or its
fields as a list (as JSON gives it back). Measured times may be absolute: the picture starts at
the earliest start. Forwards are blue, backwards orange and weight gradients (W, split off a
backward) green, lighter for higher chunks; anything
else (a measured wait or transfer) is a thin grey bar. Empty space is the bubble.
"""
from __future__ import annotations

from ..plotting import pyplot, save_figure
from .actions import B, COMPUTE, F, Action

__all__ = ["plot_timeline"]

_BLUE, _ORANGE, _GREEN = (0.16, 0.38, 0.72), (0.90, 0.45, 0.10), (0.20, 0.58, 0.30)
_COLOURS = {F: _BLUE, B: _ORANGE}       # any other computation (W) green


def _shade(rgb: tuple[float, float, float], chunk: int, chunks: int) -> tuple[float, float, float]:
    """``rgb`` for chunk 0, mixed with white up to 55% for the last chunk."""
    t = 0.55 * chunk / max(1, chunks - 1)
    r, g, b = (x + (1 - x) * t for x in rgb)
    return r, g, b


def _rows(timeline) -> list[list[tuple[float, float, Action]]]:
    return [[(float(a), float(b), act if isinstance(act, Action) else Action(*act)) for a, b, act in stage]
            for stage in timeline]


def _legend(plt, chunks: int, split: bool) -> tuple[list, list[str]]:
    """One swatch per kind of computation and chunk; W (and B named the input gradient) only when drawn."""
    kinds = [("F", _BLUE, "forward"), ("B", _ORANGE, "input gradient" if split else "backward")]
    kinds += [("W", _GREEN, "weight gradient")] * split
    handles = [plt.Rectangle((0, 0), 1, 1, color=_shade(rgb, c, chunks)) for _, rgb, _ in kinds for c in range(chunks)]
    names = [f"{op} chunk {c}" if chunks > 1 else name for op, _, name in kinds for c in range(chunks)]
    return handles, names


def plot_timeline(timeline, p: int | None = None, title: str = "", caption: str = "", path: str | None = None):
    """Draw ``timeline`` (per stage list of (start, end, action)).

    Saved as ``path`` (returned), or, without a path, the figure returned for the caller to save and close.
    """
    rows = _rows(timeline)
    p = len(rows) if p is None else p
    if p != len(rows):
        raise ValueError(f"plot_timeline: p={p} but the timeline has {len(rows)} stages")
    events = [e for row in rows for e in row]
    t0 = min((s for s, _, _ in events), default=0.0)
    t1 = max((e for _, e, _ in events), default=1.0)
    span = max(t1 - t0, 1e-12)
    chunks = 1 + max((a.chunk for _, _, a in events), default=0)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(min(24.0, 4 + 0.12 * len(events) / max(1, p) * 2.5), 1.2 + 0.55 * p))
    for s, row in enumerate(rows):
        y = p - 1 - s                                   # stage 0 on top
        ax.barh(y, span, left=0, height=0.8, color=(0.96, 0.96, 0.96), edgecolor="none")   # the idle lane
        for start, end, a in row:
            if a.op in COMPUTE:
                colour = _shade(_COLOURS.get(a.op, _GREEN), a.chunk, chunks)
                ax.barh(y, end - start, left=start - t0, height=0.8, color=colour, edgecolor="white", linewidth=0.6)
                if (end - start) / span > 0.012:
                    label = str(a.micro) if chunks == 1 else f"{a.micro}.{a.chunk}"
                    dark = 0.3 * colour[0] + 0.59 * colour[1] + 0.11 * colour[2] < 0.6
                    ax.text(start - t0 + (end - start) / 2, y, label, ha="center", va="center", fontsize=7,
                            color="white" if dark else "black")
            else:
                ax.barh(y, end - start, left=start - t0, height=0.15, color=(0.55, 0.55, 0.55))
    ax.set_yticks(range(p))
    ax.set_yticklabels([f"stage {s}" for s in reversed(range(p))])
    ax.set_xlim(0, span)
    ax.set_ylim(-0.6, p - 0.4)
    ax.set_xlabel("time")
    handles, names = _legend(plt, chunks, any(a.op not in (F, B) and a.op in COMPUTE for _, _, a in events))
    ax.legend(handles, names, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7, frameon=False)
    if title:
        ax.set_title(title)
    if caption:
        fig.text(0.01, 0.01, caption, fontsize=8, ha="left", va="bottom")
    fig.tight_layout(rect=(0, 0.06 if caption else 0, 1, 1))
    if path is None:
        return fig
    return save_figure(fig, path)

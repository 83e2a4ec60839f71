"""The figure helpers the eval reports share: a file-only matplotlib, stacked bars, a CDF, save.

matplotlib is imported on first use (``pyplot()``), not at import time, so the commands that write
no figure, and the unit tests of their tables, do not pay for it or need it installed. The Agg
backend draws to files only: the tools run on servers without a display.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

DEFAULT_DPI = 100


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg (file-only) backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def subplots(width: float, height: float, ncols: int = 1) -> tuple[Any, Any]:
    """``(figure, axes)``: one axes, or a tuple of ``ncols`` side by side."""
    return pyplot().subplots(1, ncols, figsize=(width, height))


def save(fig: Any, path: Path, *, dpi: int = DEFAULT_DPI, rect: tuple[float, float, float, float] | None = None) -> Path:
    """Lay out (inside ``rect``, figure fractions, when something is drawn below it), write, close."""
    if rect is None:
        fig.tight_layout()
    else:
        fig.tight_layout(rect=rect)
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)
    return Path(path)


def stacked_bars(ax: Any, labels: Sequence[str], layers: Sequence[tuple[str, Sequence[float], str]],
                 width: float = 0.8) -> None:
    """One bar per label; ``layers`` are ``(legend label, one value per bar, colour)``, bottom first."""
    x = list(range(len(labels)))
    bottoms = [0.0] * len(labels)
    for name, values, colour in layers:
        ax.bar(x, list(values), bottom=bottoms, color=colour, label=name, width=width)
        bottoms = [b + v for b, v in zip(bottoms, values)]
    ax.set_xticks(x, list(labels))


def cdf_points(values: Sequence[float]) -> tuple[list[float], list[float]]:
    """The empirical CDF's steps: sorted values and the fraction of values at or below each."""
    ordered = sorted(values)
    return ordered, [(i + 1) / len(ordered) for i in range(len(ordered))]


def cdf_step(ax: Any, values: Sequence[float], label: str) -> None:
    """The empirical CDF of ``values`` as a step line; nothing for no values."""
    if len(values):
        xs, ys = cdf_points(values)
        ax.step(xs, ys, where="post", label=label)

"""One look for every sweep figure: size, fonts, colours, and how a figure is saved.

Figures are ``matplotlib.figure.Figure`` objects on the Agg canvas: no pyplot, no global backend
or rcParams state; every size is passed where it is used.
"""

from __future__ import annotations

import io
from pathlib import Path

import matplotlib
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from PIL import Image

WIDTH = 10.0  # inches: two panels side by side
DPI = 130
TITLE_SIZE = 9.0
LABEL_SIZE = 9.0
TICK_SIZE = 8.0
LEGEND_SIZE = 8.0
_LEGEND_CHARS = 150  # characters of LEGEND_SIZE text across WIDTH, handles included


def new_figure(height: float) -> Figure:
    """A ``WIDTH`` x ``height`` inch figure with constrained layout (``height``: the panels and
    titles; ``legend_below`` adds its own)."""
    fig = Figure(figsize=(WIDTH, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def style_axes(ax: Axes, xlabel: str, ylabel: str | None = None) -> None:
    """Axis labels, tick sizes and a light grid."""
    ax.set_xlabel(xlabel, fontsize=LABEL_SIZE)
    if ylabel is not None:
        ax.set_ylabel(ylabel, fontsize=LABEL_SIZE)
    ax.tick_params(labelsize=TICK_SIZE)
    ax.grid(alpha=0.3, which="major")


def legend_below(fig: Figure, ax: Axes, title: str) -> None:
    """``ax``'s legend entries under the panels, as many columns as their labels' length allows
    across the figure; the figure grows by the legend's rows (the panels keep their height)."""
    handles, labels = ax.get_legend_handles_labels()
    longest = max((len(label) for label in labels), default=1)
    ncols = max(1, min(len(labels), 4, _LEGEND_CHARS // (longest + 8)))
    rows = -(-len(labels) // ncols)
    fig.set_figheight(fig.get_figheight() + 0.45 + 0.17 * rows)
    fig.legend(
        handles, labels, title=title, title_fontsize=LEGEND_SIZE, fontsize=LEGEND_SIZE,
        loc="outside lower center", ncols=ncols,
    )  # fmt: skip


def colors(n: int) -> list:
    """``n`` distinguishable colours (tab10, then tab20 for larger sets)."""
    cmap = matplotlib.colormaps["tab10" if n <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(n)]


def save(fig: Figure, path: Path, dpi: float = DPI, tight: bool = False) -> Path:
    """Write ``fig`` as a PNG at ``dpi`` (``tight``: cropped to its artists), its colours
    reduced to a 256-colour palette (no dithering): a plot's flat colours and antialiased edges
    need no more, and the file is about a third of the full-colour one. Returns ``path``."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight" if tight else None)
    with Image.open(buf) as img:
        palette = img.convert("RGB").quantize(
            256, Image.Quantize.FASTOCTREE, dither=Image.Dither.NONE
        )
    palette.save(path, optimize=True)
    return path

"""TTFT and ITL CDFs of one setting's runs at one load, each with its SLO as a vertical line.

TTFT in seconds and ITL in milliseconds, both on log x axes clipped to where the curves are.
Most ITL gaps are one decode step; what breaks lifetime goodput is the tail (stalls after a
preemption, long prefills beside a decode), so the ITL panel's y axis is a logit scale labelled
in percent, from 1% to 99.99% of gaps.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullLocator

from experiments.figure_caption import caption, legend_label
from experiments.figure_style import (
    TICK_SIZE,
    TITLE_SIZE,
    colors,
    legend_below,
    new_figure,
    save,
    style_axes,
)
from experiments.records_io import read_records
from horizon.metrics import STATUS_FINISHED, itl, ttft

_QUANTILES = np.unique(np.concatenate([np.linspace(0, 1, 1001), 1 - np.logspace(-5, -2, 150)]))
_ITL_LEVELS = (0.01, 0.1, 0.5, 0.9, 0.99, 0.999, 0.9999)


def latency_cdf_figure(
    setting: dict, rows: pd.DataFrame, rate: float, path: Path, why: str = "chosen"
) -> Path:
    """Write ``draw_latency_cdf(setting, rows, rate, why)`` to ``path``; returns ``path``."""
    return save(draw_latency_cdf(setting, rows, rate, why), path)


def draw_latency_cdf(setting: dict, rows: pd.DataFrame, rate: float, why: str) -> Figure:
    """TTFT and ITL CDFs per policy at ``rate`` (finished requests, seeds pooled); ``why`` says
    in the title how the rate was picked. Raises ``ValueError`` if no run is at ``rate``."""
    at_rate = rows[rows["rate"] == rate]
    if at_rate.empty:
        known = ", ".join(f"{r:g}" for r in sorted(rows["rate"].unique()))
        raise ValueError(f"no runs at rate {rate:g}; rates: {known}")
    policies = sorted(at_rate["policy"].unique())
    palette = colors(len(policies))
    fig = new_figure(4.0)
    ax_ttft, ax_itl = fig.subplots(1, 2)
    ttfts, itls = [], []
    for policy, color in zip(policies, palette, strict=True):
        t, gaps = _latencies(at_rate.loc[at_rate["policy"] == policy, "records_dir"])
        ttfts.append(_cdf(t))
        itls.append(_cdf(gaps * 1e3))
        label = legend_label(policy, policies)
        ax_ttft.plot(*ttfts[-1], color=color, lw=1.5, label=label)
        ax_itl.plot(*itls[-1], color=color, lw=1.5)
    ttft_slo, itl_slo = setting["slo_ttft"], setting["slo_itl"] * 1e3
    _slo_line(ax_ttft, ttft_slo, f"SLO {ttft_slo:g} s")
    _slo_line(ax_itl, itl_slo, f"SLO {itl_slo:g} ms")
    _clip_x(ax_ttft, ttfts, ttft_slo, top=1.0)
    _clip_x(ax_itl, itls, itl_slo, top=_ITL_LEVELS[-1])
    style_axes(ax_ttft, "TTFT (s, log scale)", "share of finished requests with TTFT ≤ x")
    ax_ttft.set_ylim(0, 1.01)
    style_axes(ax_itl, "ITL: gap between tokens (ms, log scale)", "share of gaps ≤ x (logit scale)")
    _percent_logit_y(ax_itl)
    legend_below(fig, ax_ttft, "policy")
    what = f"TTFT and ITL CDFs at {rate:g} req/s ({why}; seeds pooled)"
    fig.suptitle(caption(setting, at_rate, what), fontsize=TITLE_SIZE)
    return fig


def _slo_line(ax: Axes, slo: float, text: str) -> None:
    """A dashed vertical line at ``slo``, named just above the axes (off the curves)."""
    ax.axvline(slo, color="k", ls="--", lw=1)
    ax.annotate(
        text, (slo, 1), xycoords=("data", "axes fraction"), xytext=(0, 2),
        textcoords="offset points", ha="center", va="bottom", fontsize=TICK_SIZE,
    )  # fmt: skip


def _clip_x(ax: Axes, curves: list[tuple[np.ndarray, np.ndarray]], slo: float, top: float) -> None:
    """Log x from the curves' 1% point to their ``top`` quantile, the SLO always inside."""
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))  # 0.01, 1, 100: no 10^k
    lows = [x[np.searchsorted(q, 0.01)] for x, q in curves if x.size]
    highs = [x[np.searchsorted(q, top)] for x, q in curves if x.size]
    if lows:
        ax.set_xlim(min(*lows, slo / 2) / 1.3, max(*highs, 2 * slo) * 1.3)


def _percent_logit_y(ax: Axes) -> None:
    ax.set_yscale("logit")
    ax.set_ylim(_ITL_LEVELS[0], _ITL_LEVELS[-1])
    ax.set_yticks(_ITL_LEVELS, [f"{100 * q:g}%" for q in _ITL_LEVELS])
    ax.yaxis.set_minor_locator(NullLocator())


def _latencies(records_dirs: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """TTFTs and ITL gaps (s) of the finished requests of every run in ``records_dirs``."""
    ttfts, itls = [], []
    for d in records_dirs:
        rec = read_records(d)
        finished = rec.status == STATUS_FINISHED
        ttfts.append(ttft(rec)[finished])
        itls.append(itl(rec, select=finished))
    return np.concatenate(ttfts), np.concatenate(itls)


def _cdf(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x = x[np.isfinite(x) & (x > 0)]  # log axis
    if x.size == 0:
        return np.empty(0), np.empty(0)
    return np.quantile(x, _QUANTILES), _QUANTILES

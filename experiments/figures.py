"""Goodput vs load of one setting's runs, and the load its latency CDFs are drawn at.

Two panels, lifetime and TPOT goodput, a colour per policy. A policy run at several loads is a
line through its mean over seeds with a min-max band; a policy run at one load is a min-max bar
with a mark per seed and the mean, so a single-load sweep still shows its seed spread (the
policies then stand side by side on the x axis). Titles come from ``figure_caption``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from experiments.figure_caption import (
    caption,
    legend_label,
    lifetime_slo_text,
    tpot_slo_text,
)
from experiments.figure_style import TITLE_SIZE, colors, legend_below, new_figure, save, style_axes

GOOD_SHARE = 0.5  # the CDFs' default load: the highest where a policy keeps this goodput
METRICS = ("goodput_lifetime", "goodput_tpot")


def choose_rate(rows: pd.DataFrame) -> tuple[float, str]:
    """The highest rate where the best deployable policy's mean lifetime goodput is still
    >= ``GOOD_SHARE``, and why, in words.

    Oracle policies (reading true output lengths) are upper bounds and stay good far past the
    point where deployable ones collapse, so they count only if nothing else was run. If no rate
    qualifies, the lowest.
    """
    deployable = rows[~rows["oracle"]]
    considered = deployable if len(deployable) else rows
    kind = "deployable " if len(deployable) and len(deployable) < len(rows) else ""
    by_rate = considered.groupby(["rate", "policy"])["goodput_lifetime"].mean()
    best = by_rate.groupby("rate").max()
    ok = best[best >= GOOD_SHARE]
    if len(ok):
        why = f"highest load where the best {kind}policy keeps lifetime goodput ≥ {GOOD_SHARE:.0%}"
        return float(ok.index.max()), why
    return float(best.index.min()), f"no load keeps lifetime goodput ≥ {GOOD_SHARE:.0%}: lowest"


def goodput_figure(setting: dict, rows: pd.DataFrame, path: Path) -> Path:
    """Write ``draw_goodput(setting, rows)`` to ``path``; returns ``path``."""
    return save(draw_goodput(setting, rows), path)


def draw_goodput(setting: dict, rows: pd.DataFrame) -> Figure:
    """Lifetime (left) and TPOT (right) goodput vs load of ``rows``, one setting's runs."""
    policies = sorted(rows["policy"].unique())
    palette = colors(len(policies))
    single_load = rows["rate"].nunique() == 1
    fig = new_figure(4.0)
    axes = fig.subplots(1, 2, sharey=True)
    titles = (
        f"lifetime goodput: {lifetime_slo_text(setting)}",
        f"TPOT goodput: {tpot_slo_text(setting)}",
    )
    rates = sorted(rows["rate"].unique())
    span = rates[-1] - rates[0]
    for ax, metric, title in zip(axes, METRICS, titles, strict=True):
        for i, policy in enumerate(policies):
            by = rows[rows["policy"] == policy]
            label = legend_label(policy, policies)
            if single_load:
                _seed_spread(ax, float(i), by[metric].to_numpy(), 0.12, palette[i], label)
            elif by["rate"].nunique() == 1:  # dodged so single-load policies do not overlap
                x = by["rate"].iloc[0] + (i - (len(policies) - 1) / 2) * 0.008 * span
                _seed_spread(ax, x, by[metric].to_numpy(), 0.004 * span, palette[i], label)
            else:
                _mean_band(ax, by, metric, palette[i], label)
        ax.set_title(title, fontsize=TITLE_SIZE)
        ax.set_ylim(-0.02, 1.02)
        if single_load:
            _policy_axis(ax, [legend_label(p, policies) for p in policies], rates[0])
        else:
            style_axes(ax, "load (requests/s, Poisson arrivals)")
    axes[0].set_ylabel("share of arrived requests that are good", fontsize=TITLE_SIZE)
    _legend(fig, axes[0], rows)
    what = "goodput vs load" if not single_load else f"goodput at {rates[0]:g} req/s"
    fig.suptitle(caption(setting, rows, what), fontsize=TITLE_SIZE)
    return fig


def _mean_band(ax: Axes, by: pd.DataFrame, metric: str, color: tuple, label: str) -> None:
    stats = by.groupby("rate")[metric].agg(["mean", "min", "max"])
    ax.plot(stats.index, stats["mean"], marker="o", ms=4, lw=1.5, color=color, label=label)
    ax.fill_between(stats.index, stats["min"], stats["max"], alpha=0.2, lw=0, color=color)


def _seed_spread(
    ax: Axes, x: float, values: np.ndarray, width: float, color: tuple, label: str
) -> None:
    """A min-max bar over seeds at ``x``, the mean as a diamond, a ring per seed to its right."""
    mean = float(values.mean())
    yerr = [[mean - values.min()], [values.max() - mean]]
    ax.errorbar([x], [mean], yerr=yerr, fmt="D", ms=5, capsize=4, color=color, label=label)
    offsets = width * np.linspace(0.8, 1.6, len(values))  # right of the bar, apart if equal
    ax.scatter(x + offsets, values, s=14, facecolors="none", edgecolors=[color], lw=0.8)


def _policy_axis(ax: Axes, labels: list[str], rate: float) -> None:
    ax.set_xticks(range(len(labels)), labels, rotation=15, ha="right")
    ax.set_xlim(-0.6, len(labels) - 0.4)
    style_axes(ax, f"policy (every run at {rate:g} requests/s)")


def _legend(fig: Figure, ax: Axes, rows: pd.DataFrame) -> None:
    loads = rows.groupby("policy")["rate"].nunique()
    parts = []
    if (loads > 1).any():
        parts.append("line: mean over seeds, band: min-max")
    if (loads == 1).any():
        parts.append("at one load: ◆ mean, bar: min-max over seeds, ○ each seed")
    legend_below(fig, ax, "policy (" + "; ".join(parts) + ")")

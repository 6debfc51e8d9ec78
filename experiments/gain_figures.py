"""The headline's two figures from its per-setting summaries (``experiments.gain_summary``):
lifetime goodput against load with 95% bands, one panel per setting, and rate_at_90 bars with
their 95% intervals."""

from __future__ import annotations

from pathlib import Path

from experiments.figure_style import colors, legend_below, new_figure, save, style_axes


def draw(settings: dict, where: Path) -> list[Path]:
    return [goodput_figure(settings, where / "goodput_vs_load.png"),
            rate_figure(settings, where / "rate_at_90.png")]  # fmt: skip


def _palette(settings: dict) -> dict:
    rows: list[str] = []
    for s in settings.values():
        rows += [r for r in s["rate_at_90"] if r not in rows]
    return dict(zip(rows, colors(len(rows)), strict=True))


def goodput_figure(settings: dict, path: Path) -> Path:
    fig = new_figure(3.4)
    axes = fig.subplots(1, len(settings), squeeze=False)[0]
    palette = _palette(settings)
    for ax, (name, s) in zip(axes, settings.items(), strict=True):
        for row, per in s["at_load"]["goodput_lifetime"].items():
            mean = [v["mean"] for v in per]
            ax.plot(s["loads"], mean, marker="o", ms=3, lw=1.2, color=palette[row], label=row)
            ax.fill_between(s["loads"], [v["ci"][0] for v in per], [v["ci"][1] for v in per],
                            color=palette[row], alpha=0.15, lw=0)  # fmt: skip
        ax.axhline(0.9, color="grey", lw=0.8, ls="--")
        ax.set_ylim(-0.02, 1.02)
        ax.set_title(f"{name} ({len(s['conditions']['seeds'])} seeds, 95% bands)", fontsize=9)
        style_axes(ax, "mean arrival rate (req/s)", "lifetime goodput")
    legend_below(fig, max(axes, key=lambda a: len(a.get_lines())), "policy")  # every row
    return save(fig, path)


def rate_figure(settings: dict, path: Path) -> Path:
    fig = new_figure(3.6)
    axes = fig.subplots(1, len(settings), squeeze=False)[0]
    palette = _palette(settings)
    for ax, (name, s) in zip(axes, settings.items(), strict=True):
        rows = list(s["rate_at_90"])
        means = [s["rate_at_90"][r] for r in rows]
        ci = [s["rate_at_90_ci"][r] for r in rows]
        err = [[m - c[0] for m, c in zip(means, ci, strict=True)],
               [c[1] - m for m, c in zip(means, ci, strict=True)]]  # fmt: skip
        ax.barh(rows, means, xerr=err, color=[palette[r] for r in rows], capsize=2)
        ax.invert_yaxis()
        ax.set_title(f"{name}: rate at 90% goodput (95% CI)", fontsize=9)
        style_axes(ax, "req/s")
        ax.tick_params(axis="y", labelsize=7)
    return save(fig, path)

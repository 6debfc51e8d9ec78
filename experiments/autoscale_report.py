"""Renders the autoscaling study: one table and one figure (goodput against GPU-seconds).

    python -m experiments.autoscale_report [--results results/autoscale]

Reads ``<results>/autoscale.json`` (``experiments.autoscale_study``); writes
``<results>/autoscale.md`` and ``<results>/goodput_vs_gpu_seconds.png``. Numbers only; the
reading is in docs/cluster.md.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from experiments.figure_style import colors, legend_below, new_figure, save, style_axes
from experiments.report_template import table

REPO = Path(__file__).resolve().parents[1]


def summary_table(summary: list[dict]) -> str:
    rows = [
        [s["pattern"], s["row"], f"{s['delay_s']:.0f}" if s["row"] != "static" else "-",
         f"{s['goodput'][0]:.3f} [{s['goodput'][1]:.3f}, {s['goodput'][2]:.3f}]",
         f"{s['gpu_seconds'][0]:.0f} [{s['gpu_seconds'][1]:.0f}, {s['gpu_seconds'][2]:.0f}]"]
        for s in sorted(summary, key=lambda s: (s["pattern"], s["row"], s["factor"]))
    ]  # fmt: skip
    head = ["pattern", "autoscaler", "start-up delay s", "goodput [95% CI]", "GPU-s [95% CI]"]
    return table(head, rows)


def figure(summary: list[dict], path: Path) -> Path:
    patterns = sorted({s["pattern"] for s in summary})
    rows = sorted({s["row"] for s in summary})
    fig = new_figure(3.0)
    axes = fig.subplots(1, len(patterns), squeeze=False)[0]
    for ax, pattern in zip(axes, patterns):
        for row, c in zip(rows, colors(len(rows))):
            pts = sorted((s for s in summary if (s["pattern"], s["row"]) == (pattern, row)),
                         key=lambda s: s["factor"])  # fmt: skip
            xs = [s["gpu_seconds"][0] for s in pts]
            ax.plot(xs, [s["goodput"][0] for s in pts], "o-", ms=3, color=c, label=row)
        ax.set_title(pattern, fontsize=8)
        style_axes(ax, "GPU-seconds", "goodput" if ax is axes[0] else None)
    legend_below(fig, axes[0], "")
    return save(fig, path)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", default=str(REPO / "results" / "autoscale"))
    args = ap.parse_args(argv)
    res = Path(args.results)
    doc = json.loads((res / "autoscale.json").read_text())
    png = figure(doc["summary"], res / "goodput_vs_gpu_seconds.png")
    parts = [
        "# Autoscaling (simulated)\n",
        json.dumps(doc["conditions"]) + "\n",
        "Points along a line: start-up delay x1, x2, x5.\n",
        summary_table(doc["summary"]),
        "",
        f"![goodput vs GPU-seconds]({png.name})\n",
    ]
    (res / "autoscale.md").write_text("\n".join(parts))


if __name__ == "__main__":
    main()

"""Renders the disaggregation study: a table per ITL SLO and one figure.

    python -m experiments.disagg_report [--results results/disagg]

Reads ``<results>/disagg.json`` (``experiments.disagg_study``); writes ``<results>/disagg.md``
and ``<results>/goodput_per_gpu.png``. Numbers only; the reading is in docs/cluster.md.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from experiments.figure_style import colors, legend_below, new_figure, save, style_axes
from experiments.report_template import table

REPO = Path(__file__).resolve().parents[1]


def slo_table(summary: dict, key: str) -> str:
    """Rows: the study's rows; columns: loads; cells: goodput per GPU [95% CI] and p99 ITL."""
    rows = list(summary)
    loads = [x["load"] for x in summary[rows[0]][key]]
    cells = []
    for row in rows:
        cells.append(
            [row]
            + [
                f"{x['goodput_per_gpu']:.1f} [{x['ci95'][0]:.1f}, {x['ci95'][1]:.1f}]; "
                f"{1e3 * x['itl_p99']:.0f} ms"
                for x in summary[row][key]
            ]
        )
    return table(["row"] + [f"{load:g} req/s/GPU" for load in loads], cells)


def peak_table(summary: dict) -> str:
    """Per row and ITL SLO: the most goodput per GPU over the loads, and at which load."""
    keys = list(next(iter(summary.values())))
    cells = []
    for row, by in summary.items():
        best = [max(by[k], key=lambda x: x["goodput_per_gpu"]) for k in keys]
        cells.append([row] + [f"{b['goodput_per_gpu']:.1f} @ {b['load']:g}" for b in best])
    return table(["row"] + [f"peak, ITL {k[3:]} ms" for k in keys], cells)


def figure(summary: dict, path: Path) -> Path:
    keys = list(next(iter(summary.values())))
    fig = new_figure(3.0)
    axes = fig.subplots(1, len(keys), sharey=True, squeeze=False)[0]
    for ax, key in zip(axes, keys):
        for (row, by), c in zip(summary.items(), colors(len(summary))):
            xs = [x["load"] for x in by[key]]
            ax.plot(xs, [x["goodput_per_gpu"] for x in by[key]], "o-", ms=3, color=c, label=row)
        ax.plot(xs, xs, ":", color="grey", lw=0.8, label="offered")
        ax.set_title(f"ITL SLO {key[3:]} ms", fontsize=8)
        style_axes(ax, "load (req/s per GPU)", "goodput per GPU" if ax is axes[0] else None)
    legend_below(fig, axes[0], "")
    return save(fig, path)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", default=str(REPO / "results" / "disagg"))
    args = ap.parse_args(argv)
    res = Path(args.results)
    doc = json.loads((res / "disagg.json").read_text())
    s = doc["summary"]
    parts = ["# Disaggregated against co-located serving (simulated)\n",
             json.dumps(doc["conditions"]) + "\n", peak_table(s), ""]  # fmt: skip
    for key in next(iter(s.values())):
        parts += [f"Goodput per GPU [95% CI over seeds]; p99 ITL, ITL SLO {key[3:]} ms:\n",
                  slo_table(s, key), ""]  # fmt: skip
    parts.append(f"![goodput per GPU]({figure(s, res / 'goodput_per_gpu.png').name})\n")
    (res / "disagg.md").write_text("\n".join(parts))


if __name__ == "__main__":
    main()

"""The fidelity report's figures, drawn from its ``report.json``: per workload, each policy's
lifetime goodput, p99 TTFT, p99 ITL and mean E2E against load, engine and simulator side by
side (``<workload>.png``, the names the document's ``plots`` lists)."""

from __future__ import annotations

from pathlib import Path

from experiments.figure_style import save
from experiments.report_template import seeds_by_requests, slo_text

PANELS = (  # (run key, panel title, y label, scale)
    ("goodput_lifetime", "lifetime goodput", "share of requests", 1.0),
    ("ttft_p99", "p99 TTFT", "s", 1.0),
    ("itl_p99", "p99 ITL", "ms", 1e3),
    ("e2e_mean", "mean E2E", "s", 1.0),
)


def title(doc: dict, workload: str) -> str:
    """What a workload's figure shows and under which conditions."""
    c = doc["conditions"]
    cases = [x for x in c["cases"] if x["role"] == "fidelity" and x["workload"] == workload]
    return (
        f"Engine vs simulated: {workload}, the {c['model']} shape on {c['gpu']}\n"
        f"SLO: {slo_text(c['slo']['ttft_s'], c['slo']['itl_s'])}; "
        f"{seeds_by_requests([x['seed'] for x in cases], [x['requests'] for x in cases])}"
    )


def write_plots(doc: dict, out: Path) -> list[Path]:
    """One figure per workload of ``doc["runs"]`` into ``out``; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for name in doc["plots"]:
        workload = name.removesuffix(".png")
        rows = [r for r in doc["runs"] if r["workload"] == workload]
        fig, axes = plt.subplots(1, len(PANELS), figsize=(4 * len(PANELS), 3.6))
        for ax, panel in zip(axes, PANELS):
            _panel(ax, rows, *panel)
        axes[0].legend(fontsize=7)
        fig.suptitle(title(doc, workload), fontsize=10)
        fig.tight_layout()
        save(fig, out / name, dpi=110)
        plt.close(fig)
        paths.append(out / name)
    return paths


def _panel(ax, rows: list[dict], key: str, label: str, unit: str, scale: float) -> None:  # noqa: ANN001
    for i, p in enumerate(sorted({r["policy"] for r in rows})):
        pr = sorted((r for r in rows if r["policy"] == p), key=lambda r: r["rate"])
        x = [r["rate"] for r in pr]
        ax.plot(x, [scale * r[f"{key}_engine"] for r in pr], "o-", color=f"C{i}",
                label=f"{p}, engine")  # fmt: skip
        ax.plot(x, [scale * r[f"{key}_sim"] for r in pr], "x--", color=f"C{i}",
                label=f"{p}, simulated")  # fmt: skip
    ax.set_xlabel("load (req/s)")
    ax.set_ylabel(unit)
    ax.ticklabel_format(axis="y", style="plain", useOffset=False)
    ax.set_title(f"{label} ({unit})" if unit != "share of requests" else label)
    ax.grid(alpha=0.3)

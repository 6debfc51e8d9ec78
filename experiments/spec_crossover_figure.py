"""The crossover figure: speculation's speedup over plain decoding against the batch size, the
engine's measured cells beside the simulator's, one panel per drafter.

    python -m experiments.spec_crossover_figure [--fit results/spec_crossover/verify_fit.json]

Reads the cells ``experiments.spec_verify_fit`` wrote (engine speedup, the simulator's with the
fitted verification pricing) and draws, per drafter at alpha 0.7, one colour per k: the engine
solid with markers, the simulator dashed; the line at 1 is plain decoding. Writes
``crossover.png`` beside the JSON.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from experiments.figure_style import colors, legend_below, new_figure, save, style_axes

REPO = Path(__file__).resolve().parents[1]
PANELS = (
    ("draft_0.5b", "0.5B-shape draft model"),
    ("eagle3", "EAGLE-3-layout draft head"),
    ("ngram", "n-gram drafts (free)"),
)
ALPHA = 0.7


def draw(cells: list[dict]):  # noqa: ANN201 - a matplotlib Figure
    """The panels (module docstring)."""
    fig = new_figure(3.4)
    axes = fig.subplots(1, len(PANELS), sharey=True)
    ks = sorted({c["k"] for c in cells})
    palette = dict(zip(ks, colors(len(ks))))
    for ax, (drafter, title) in zip(axes, PANELS):
        for k in ks:
            sel = sorted(
                (c for c in cells if (c["drafter"], c["alpha"], c["k"]) == (drafter, ALPHA, k)),
                key=lambda c: c["batch"],
            )
            if not sel:
                continue
            b = [c["batch"] for c in sel]
            ax.plot(b, [c["speedup"] for c in sel], "o-", color=palette[k], label=f"k = {k}")
            ax.plot(b, [c["sim_fitted_speedup"] for c in sel], "--", color=palette[k])
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xscale("log", base=2)
        ax.set_title(f"{title}, α = {ALPHA}", fontsize=9)
        style_axes(ax, "batch size (held)", "tokens/s over plain decoding")
    legend_below(fig, axes[0], "engine (solid, H200, 7B shape) / simulator (dashed)")
    return fig


def main(argv: list[str] | None = None) -> Path:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fit", default=str(REPO / "results" / "spec_crossover" / "verify_fit.json"))
    args = ap.parse_args(argv)
    fit = Path(args.fit)
    cells = json.loads(fit.read_text())["cells"]
    out = save(draw(cells), fit.parent / "crossover.png")
    print(out)
    return out


if __name__ == "__main__":
    main()

"""Figures of one setting's runs: goodput vs load, and latency CDFs at one load.

Drawn on ``matplotlib.figure.Figure`` with the Agg canvas (no pyplot, no global backend state).
Every figure's title names the model shape, GPU, KV budget, workload, SLO and goodput kind.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from experiments.records_io import read_records
from horizon.metrics import STATUS_FINISHED, itl, ttft

GOOD_SHARE = 0.5  # the CDFs' default load: the highest where a policy keeps this goodput
_QUANTILES = np.unique(np.concatenate([np.linspace(0, 1, 1001), 1 - np.logspace(-5, -2, 150)]))


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
        why = f"highest load where the best {kind}policy keeps lifetime goodput >= {GOOD_SHARE:.0%}"
        return float(ok.index.max()), why
    return float(best.index.min()), f"no load keeps lifetime goodput >= {GOOD_SHARE:.0%}: lowest"


def goodput_figure(setting: dict, rows: pd.DataFrame, path: Path) -> Path:
    """Lifetime and TPOT goodput vs rate: mean over seeds, min-max band, a line per policy."""
    policies = sorted(rows["policy"].unique())
    colors = _colors(len(policies))
    fig = Figure(figsize=(12, 4.8 + 0.18 * len(policies)), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 2, sharey=True)
    itl_ms = setting["slo_itl"] * 1e3
    kinds = {
        "goodput_lifetime": f"lifetime goodput (TTFT and every ITL <= {itl_ms:g} ms)",
        "goodput_tpot": f"TPOT goodput (TTFT and mean TPOT <= {itl_ms:g} ms)",
    }
    for ax, (metric, kind) in zip(axes, kinds.items(), strict=True):
        for policy, by_policy in rows.groupby("policy", sort=True):
            stats = by_policy.groupby("rate")[metric].agg(["mean", "min", "max"])
            color = colors[policies.index(policy)]
            label = legend_label(policy, policies)
            (line,) = ax.plot(stats.index, stats["mean"], marker="o", label=label, color=color)
            ax.fill_between(
                stats.index, stats["min"], stats["max"], alpha=0.2, lw=0, color=line.get_color()
            )
        ax.set_title(kind, fontsize=10)
        ax.set_xlabel("load (requests/s)")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("share of arrived requests that are good")
    fig.legend(
        *axes[0].get_legend_handles_labels(),
        title="policy (mean over seeds, min-max band)",
        fontsize=8,
        loc="outside lower center",
        ncols=min(len(policies), 3),
    )
    title = _title(setting, "goodput vs load")
    shared = _shared_options(policies)
    if shared:
        title += f" (options of every {shared})"
    fig.suptitle(title, fontsize=10)
    fig.savefig(path, dpi=120)
    return path


def _split(label: str) -> tuple[str, str, str]:
    """``name(options)[predictor]`` -> its three parts (each may be empty but the name)."""
    m = re.fullmatch(r"([^(\[]+)(\([^)]*\))?(\[.*\])?", label)
    if m is None:
        return label, "", ""
    return m.group(1), m.group(2) or "", m.group(3) or ""


def legend_label(policy: str, policies: list[str]) -> str:
    """``policy`` without its options when every policy of its name has the same ones and they
    differ only by predictor (the options then go in a footnote, ``_shared_options``)."""
    name, opts, pred = _split(policy)
    same = {_split(p)[1] for p in policies if _split(p)[0] == name}
    return f"{name}{pred}" if opts and pred and len(same) == 1 else policy


def _shared_options(policies: list[str]) -> str:
    seen = {}
    for p in policies:
        name, opts, pred = _split(p)
        if opts and pred:
            seen.setdefault(name, set()).add(opts)
    return "; ".join(f"{n}{next(iter(o))}" for n, o in sorted(seen.items()) if len(o) == 1)


def _colors(n: int) -> list:
    """``n`` distinguishable colours (tab10, then tab20 for larger sets)."""
    import matplotlib

    cmap = matplotlib.colormaps["tab10" if n <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(n)]


def latency_cdf_figure(
    setting: dict, rows: pd.DataFrame, rate: float, path: Path, why: str = "chosen"
) -> Path:
    """TTFT and ITL CDFs per policy at ``rate`` (finished requests, seeds pooled).

    ``why`` says in the title how the rate was picked.
    """
    at_rate = rows[rows["rate"] == rate]
    if at_rate.empty:
        known = ", ".join(f"{r:g}" for r in sorted(rows["rate"].unique()))
        raise ValueError(f"no runs at rate {rate:g}; rates: {known}")
    fig = Figure(figsize=(12, 4.8), layout="constrained")
    FigureCanvasAgg(fig)
    ax_ttft, ax_itl = fig.subplots(1, 2)
    for policy, by_policy in at_rate.groupby("policy", sort=True):
        t, i = _latencies(by_policy["records_dir"])
        (line,) = ax_ttft.plot(*_cdf(t), label=policy)
        ax_itl.plot(*_cdf(i), label=policy, color=line.get_color())
    panels = ((ax_ttft, "TTFT", setting["slo_ttft"]), (ax_itl, "ITL", setting["slo_itl"]))
    for ax, name, slo in panels:
        ax.axvline(slo, color="k", ls="--", lw=1, label=f"SLO {slo:g} s")
        ax.set_xscale("log")
        ax.set_xlabel(f"{name} (s, log scale)")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8, loc="lower right", framealpha=0.9)
    ax_ttft.set_ylabel("CDF over finished requests")
    ax_ttft.set_ylim(0, 1.01)
    # Most gaps are one decode step; the tail (stalls) is what breaks lifetime goodput.
    ax_itl.set_yscale("logit")
    ax_itl.set_ylim(0.01, 1 - 1e-4)
    ax_itl.set_ylabel("CDF over all gaps of finished requests (logit scale)")
    seeds = at_rate["seed"].nunique()
    what = f"latency CDFs at {rate:g} req/s ({why}; {seeds} seed(s) pooled)"
    fig.suptitle(_title(setting, what), fontsize=10)
    fig.savefig(path, dpi=120)
    return path


def _title(setting: dict, what: str) -> str:
    return (
        f"{setting['model']} on {setting['gpu']}, {setting['num_blocks']} KV blocks of the "
        f"{setting['cost_model']} {setting['backend']}; workload {setting['workload']}; "
        f"SLO {setting['slo_name']}: TTFT <= {setting['slo_ttft']:g} s, "
        f"ITL <= {setting['slo_itl'] * 1e3:g} ms\n{what}"
    )


def _latencies(records_dirs: pd.Series) -> tuple[np.ndarray, np.ndarray]:
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

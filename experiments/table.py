"""The results table: per setting x policy x rate, mean and min/max over seeds.

Written as ``table.csv`` (every setting column, ``<metric>_{mean,min,max}``) and ``table.md``
(one section per setting, cells "mean [min, max]").
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from experiments.results import SETTING, settings

METRICS = {  # column -> (header, format of one value)
    "goodput_lifetime": ("lifetime goodput", "{:.3f}"),
    "goodput_tpot": ("TPOT goodput", "{:.3f}"),
    "ttft_p99": ("p99 TTFT (s)", "{:.3g}"),
    "itl_p99": ("p99 ITL (ms)", "{:.3g}"),
    "throughput_tok_s": ("throughput (tok/s)", "{:.0f}"),
    "preemptions": ("preemptions", "{:.0f}"),
    "recompute_waste": ("recompute waste", "{:.3f}"),
}
_SCALE = {"itl_p99": 1e3}  # shown in ms in table.md


def aggregate(results: pd.DataFrame) -> pd.DataFrame:
    """One row per setting x policy x rate: ``seeds`` and each metric's mean, min and max."""
    keys = [*SETTING, "policy", "rate"]
    grouped = results.groupby(keys, sort=True, dropna=False)
    table = grouped[list(METRICS)].agg(["mean", "min", "max"])
    table.columns = [f"{metric}_{stat}" for metric, stat in table.columns]
    table.insert(0, "seeds", grouped["seed"].nunique())
    return table.reset_index()


def write_table(results: pd.DataFrame, out_dir: str | Path) -> tuple[Path, Path]:
    """Write ``table.csv`` and ``table.md`` into ``out_dir``; returns their paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    table = aggregate(results)
    csv_path, md_path = out_dir / "table.csv", out_dir / "table.md"
    table.to_csv(csv_path, index=False)
    md_path.write_text(markdown(table))
    return csv_path, md_path


def markdown(table: pd.DataFrame) -> str:
    """``aggregate``'s table as Markdown, one section per setting."""
    parts = []
    for setting, rows in settings(table):
        parts.append(f"## {setting_line(setting)}\n")
        header = ["policy", "rate (req/s)", "seeds", *(h for h, _ in METRICS.values())]
        parts.append("| " + " | ".join(header) + " |")
        parts.append("|" + "---|" * len(header))
        for _, row in rows.sort_values(["policy", "rate"]).iterrows():
            cells = [row["policy"], f"{row['rate']:g}", str(row["seeds"])]
            cells += [_cell(row, metric) for metric in METRICS]
            parts.append("| " + " | ".join(cells) + " |")
        parts.append("")
    return "\n".join(parts)


def setting_line(setting: dict) -> str:
    """E.g. "qwen2.5-7b on H200 (3000 KV blocks), sharegpt_first_turn, SLO h200_7b: ..."."""
    return (
        f"{setting['model']} on {setting['gpu']} ({setting['num_blocks']} KV blocks), "
        f"workload {setting['workload']} ({setting['num_requests']} requests), "
        f"SLO {setting['slo_name']}: TTFT <= {setting['slo_ttft']:g} s, "
        f"ITL <= {setting['slo_itl'] * 1e3:g} ms; {setting['backend']}/{setting['cost_model']}"
    )


def _cell(row: pd.Series, metric: str) -> str:
    fmt = METRICS[metric][1]
    scale = _SCALE.get(metric, 1.0)
    mean, lo, hi = (fmt.format(row[f"{metric}_{s}"] * scale) for s in ("mean", "min", "max"))
    return mean if lo == hi else f"{mean} [{lo}, {hi}]"

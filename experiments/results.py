"""Run directories -> one table row per run (identity, setting and metrics), for tables and plots.

A *setting* is everything a run's numbers depend on except policy, rate and seed: runs of one
setting can share a figure; the table keeps settings apart.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from experiments.run_dir import RECORDS
from experiments.sweep_table import find_runs

SETTING = (
    "workload",
    "model",
    "gpu",
    "num_blocks",
    "slo_name",
    "slo_ttft",
    "slo_itl",
    "backend",
    "cost_model",
    "num_requests",
)


def load_results(paths: Iterable[str | Path]) -> pd.DataFrame:
    """One row per run found under ``paths``: run directories and packed sweep tables
    (``sweep_table.find_runs``; a packed run reads as the directory it was).

    Columns: the ``SETTING`` columns, ``policy`` (its label), ``oracle`` (the policy reads true
    output lengths), ``rate``, ``seed``, ``wall_s``,
    ``run_dir``, ``records_dir`` and every metric of the summary.
    """
    rows = []
    for run_dir, s in find_runs(paths):
        run = s["run"]
        rows.append(
            {
                **{k: run[k] for k in SETTING if k in run},
                "slo_name": run["slo"]["name"],
                "slo_ttft": run["slo"]["ttft"],
                "slo_itl": run["slo"]["itl"],
                "policy": run["policy_label"],
                "oracle": bool(run["policy_reads_true_length"]),
                "rate": float(run["rate"]),
                "seed": int(run["seed"]),
                "wall_s": s["wall_s"],
                "run_dir": str(run_dir),
                "records_dir": str(run_dir / RECORDS),
                **s["metrics"],
            }
        )
    df = pd.DataFrame(rows)
    return df.sort_values([*SETTING, "policy", "rate", "seed"], ignore_index=True)


def settings(df: pd.DataFrame) -> list[tuple[dict, pd.DataFrame]]:
    """``(setting, its rows)`` for each distinct setting in ``df``."""
    return [
        (dict(zip(SETTING, key, strict=True)), group)
        for key, group in df.groupby(list(SETTING), sort=True, dropna=False)
    ]

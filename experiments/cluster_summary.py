"""Per-seed cluster-study runs -> means with 95% t intervals, rate_at_90, paired ratios."""

from __future__ import annotations

import math
from collections import defaultdict

from experiments.cluster_settings import Setting
from experiments.gain_stats import mean_ci, paired_ratio_ci, rounded

TARGET = 0.9
PER_LOAD = (
    "goodput",
    "tpot_goodput",
    "prefix_hit_rate",
    "imbalance_max_over_mean",
    "imbalance_cv",
    "ttft_p99",
    "itl_p99",
    "routing_decisions_per_s",
)
BASELINES = ("round_robin", "least_loaded")


def rate_at(loads: list[float], goodput: list[float], target: float = TARGET) -> tuple[float, str]:
    """The load where goodput first falls to ``target``, linearly interpolated on the grid;
    ``("below" | "above")`` when it is already under at the first load or never under."""
    if goodput[0] < target:
        return loads[0], "below"
    for (l0, g0), (l1, g1) in zip(zip(loads, goodput), zip(loads[1:], goodput[1:])):
        if g1 < target:
            return l0 + (l1 - l0) * (g0 - target) / (g0 - g1), ""
    return loads[-1], "above"


def summarize_setting(setting: Setting, runs: list[dict]) -> dict:
    """Means per (row, load); rate_at_90 per row (per seed, then over seeds); ratios."""
    by = defaultdict(dict)  # (row, seed) -> {load: run}
    for r in runs:
        by[(r["row"], r["seed"])][r["load"]] = r
    rows: dict = {}
    per_seed: dict = defaultdict(dict)
    for row in setting.rows:
        seeds = sorted(s for (name, s) in by if name == row)
        loads = sorted(by[(row, seeds[0])])
        rows[row] = {"loads": loads, "per_load": _per_load(row, seeds, loads, by)}
        rates, flags = [], []
        for s in seeds:
            rate, flag = rate_at(loads, [by[(row, s)][x]["goodput"] for x in loads])
            per_seed[row][s] = rate
            rates.append(rate)
            flags.append(flag)
        rows[row]["rate_at_90"] = rounded(mean_ci(rates), 3)
        rows[row]["rate_at_90_seeds"] = rates
        rows[row]["censored"] = [f for f in flags if f]
    for row in rows:
        rows[row]["vs"] = {b: _ratio(per_seed, row, b) for b in BASELINES if b in per_seed}
    return {"rows": rows, "target": TARGET}


def _per_load(row: str, seeds: list[int], loads: list[float], by: dict) -> dict:
    out = {}
    for x in loads:
        runs = [by[(row, s)][x] for s in seeds]
        out[str(x)] = {
            k: rounded(mean_ci([r[k] for r in runs]), 4)
            for k in PER_LOAD
            if all(math.isfinite(r[k]) for r in runs)
        }
    return out


def _ratio(per_seed: dict, row: str, base: str) -> dict:
    seeds = sorted(set(per_seed[row]) & set(per_seed[base]))
    num = [per_seed[row][s] for s in seeds]
    den = [per_seed[base][s] for s in seeds]
    return rounded(paired_ratio_ci(num, den), 4)

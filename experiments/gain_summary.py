"""One setting's headline figures from per-seed measurements (``experiments.policy_gain``).

``rate90[row]`` holds one rate_at_90 per seed; ``at_load[metric][row][k]`` one value per seed at
``loads[k]``. Every figure is a mean over seeds with its 95% t interval; a ratio between two rows
is taken per seed. Rows named in ``ORACLES`` and Horizon's rows are never the strongest baseline.
"""

from __future__ import annotations

from experiments.gain_settings import HORIZON, HORIZON_MEAN, ORACLES
from experiments.gain_stats import mean_ci, paired_ratio_ci, rounded, separated


def is_baseline(row: str) -> bool:
    return row not in ORACLES and not row.startswith("horizon")


def summarise(setting, rate90, loads, at_load, conditions, runs, wall_s) -> dict:  # noqa: ANN001
    ci90 = {row: mean_ci(v) for row, v in rate90.items()}
    baselines = [row for row in rate90 if is_baseline(row)]
    strongest = max(baselines, key=lambda row: ci90[row][0]) if baselines else None
    out: dict = {
        "setting": setting,
        "conditions": conditions,
        "rate_at_90": {row: round(t[0], 2) for row, t in ci90.items()},
        "rate_at_90_ci": {row: [round(t[1], 2), round(t[2], 2)] for row, t in ci90.items()},
        "rate_at_90_seeds": rate90,
        "strongest_baseline": strongest,
        "loads": list(loads),
        "at_load": {
            m: {row: [rounded(mean_ci(v)) for v in per_load] for row, per_load in by_row.items()}
            for m, by_row in at_load.items()
        },
        "goodput_seeds": at_load["goodput_lifetime"],  # per load, per seed: for later ratios
        "runs": runs,
        "wall_s": round(wall_s, 1),
    }
    out.update(_ratios(rate90, ci90, strongest))
    out.update(_per_load(at_load["goodput_lifetime"], loads))
    return out


def _ratios(rate90: dict, ci90: dict, strongest: str | None) -> dict:
    """Horizon + learned over the strongest baseline and over Horizon + mean."""
    out: dict = {}
    h = rate90.get(HORIZON)
    pairs = {"gain_vs_strongest": strongest, "learned_vs_mean": HORIZON_MEAN}
    for key, other in pairs.items():
        if h is None or other not in rate90 or min(rate90[other]) <= 0:
            out[key] = None
            continue
        out[key] = round(ci90[HORIZON][0] / ci90[other][0], 3)  # of the means
        out[f"{key}_paired"] = rounded(paired_ratio_ci(h, rate90[other]), 3)
        out[f"{key}_separated"] = separated(ci90[HORIZON], ci90[other])
    return out


def _per_load(goodput: dict, loads) -> dict:  # noqa: ANN001
    """At each load: the baseline with the highest mean goodput and Horizon's ratio to it."""
    baselines = [row for row in goodput if is_baseline(row)]
    if not baselines:
        return {}
    best, ratio, vs_mean = [], [], []
    for k in range(len(loads)):
        if HORIZON in goodput and HORIZON_MEAN in goodput and min(goodput[HORIZON_MEAN][k]) > 0:
            vs_mean.append(
                rounded(paired_ratio_ci(goodput[HORIZON][k], goodput[HORIZON_MEAN][k]), 3)
            )
        top = max(baselines, key=lambda row: sum(goodput[row][k]) / len(goodput[row][k]))
        best.append(top)
        if HORIZON in goodput and min(goodput[top][k]) > 0:
            ratio.append(rounded(paired_ratio_ci(goodput[HORIZON][k], goodput[top][k]), 3))
        else:
            ratio.append(None)
    out = {"strongest_at_load": best, "goodput_vs_strongest_at_load": ratio}
    if len(vs_mean) == len(loads):
        out["learned_vs_mean_at_load"] = vs_mean
    return out

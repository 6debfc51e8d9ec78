"""The headline's files from its per-setting JSON: ``policy_gain.json``, ``policy_gain.md`` and
the figures (``experiments.gain_figures``). Computes nothing the settings files do not hold."""

from __future__ import annotations

import json
from pathlib import Path

from experiments.gain_settings import SETTINGS

HEADLINE_KEYS = (
    "rate_at_90",
    "rate_at_90_ci",
    "strongest_baseline",
    "gain_vs_strongest",
    "gain_vs_strongest_paired",
    "gain_vs_strongest_separated",
    "learned_vs_mean",
    "learned_vs_mean_paired",
    "learned_vs_mean_separated",
)
TABLE_METRICS = (  # (metric, column title, digits) at the load nearest 1.0x the best rate_at_90
    ("goodput_lifetime", "goodput", 3),
    ("throughput_tok_s", "throughput (tok/s)", 0),
    ("ttft_p99", "p99 TTFT (s)", 2),
    ("itl_p99", "p99 ITL (ms)", 1),
    ("preemptions", "preemptions", 0),
    ("recompute_waste", "recompute waste", 3),
)


def combine(where: Path) -> dict:
    """Every ``<where>/settings/<name>.json`` (in SETTINGS' order) and the headline keys."""
    found = {s: where / "settings" / f"{s}.json" for s in SETTINGS}
    settings = {s: json.loads(p.read_text()) for s, p in found.items() if p.exists()}
    if not settings:
        raise ValueError(f"no setting results under {where / 'settings'}")
    first = next(iter(settings.values()))
    headline = {k: first.get(k) for k in HEADLINE_KEYS}
    headline["setting"] = first["setting"]
    headline["settings"] = {s: {k: r.get(k) for k in HEADLINE_KEYS} for s, r in settings.items()}
    return {"headline": headline, "settings": settings}


def write_report(where: Path) -> dict:
    from experiments.gain_figures import draw

    combined = combine(where)
    # the headline keys only: every other figure is in settings/<name>.json, once
    (where / "policy_gain.json").write_text(json.dumps(combined["headline"], indent=1))
    (where / "policy_gain.md").write_text(markdown(combined["settings"]))
    draw(combined["settings"], where)
    return combined


def markdown(settings: dict) -> str:
    lines: list[str] = []
    for name, s in settings.items():
        lines += _setting_tables(name, s)
    return "\n".join(lines) + "\n"


def _setting_tables(name: str, s: dict) -> list[str]:
    c = s["conditions"]
    k = min(range(len(s["loads"])), key=lambda i: abs(c["load_fractions"][i] - 1.0))
    at = s["loads"][k]
    head = (
        f"### {name}: {c['workload']}, {c['arrival']} arrivals; {c['model']} on {c['gpu']} "
        f"({c['cost_model']} cost model, {c['num_blocks']} blocks), SLO {c['slo']}; "
        f"{len(c['seeds'])} seeds x {c['num_requests']} requests; {c['interval']}"
    )
    cols = " | ".join(t for _, t, _ in TABLE_METRICS)
    rule = "|---" * (2 + len(TABLE_METRICS)) + "|"
    lines = [head, "", f"rate_at_90 and, at {at:g} req/s, the other figures:", "",
             f"| policy | rate_at_90 (req/s) | {cols} |", rule]  # fmt: skip
    for row in s["rate_at_90"]:
        lo, hi = s["rate_at_90_ci"][row]
        cells = [f"{s['rate_at_90'][row]:.1f} [{lo:.1f}, {hi:.1f}]"]
        for m, _, d in TABLE_METRICS:
            v = s["at_load"][m][row][k]
            x = 1000.0 if m == "itl_p99" else 1.0
            lo, hi = v["ci"][0] * x, v["ci"][1] * x
            cells.append(f"{v['mean'] * x:.{d}f} [{lo:.{d}f}, {hi:.{d}f}]")
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    lines += ["", "Lifetime goodput by load (req/s):", ""]
    lines.append("| policy | " + " | ".join(f"{x:g}" for x in s["loads"]) + " |")
    lines.append("|---" * (1 + len(s["loads"])) + "|")
    for row, per in s["at_load"]["goodput_lifetime"].items():
        lines.append(f"| {row} | " + " | ".join(f"{v['mean']:.3f}" for v in per) + " |")
    ratios = s.get("goodput_vs_strongest_at_load") or []
    if ratios:
        cells = [f"{r['mean']:.2f} [{r['ci'][0]:.2f}, {r['ci'][1]:.2f}] vs {b}" if r else "n/a"
                 for r, b in zip(ratios, s["strongest_at_load"], strict=True)]  # fmt: skip
        lines.append("| horizon_learned ÷ strongest baseline | " + " | ".join(cells) + " |")
    vs_mean = s.get("learned_vs_mean_at_load") or []
    if vs_mean:
        cells = [f"{r['mean']:.3f} [{r['ci'][0]:.3f}, {r['ci'][1]:.3f}]" for r in vs_mean]
        lines.append("| horizon_learned ÷ horizon_mean | " + " | ".join(cells) + " |")
    lines.append("")
    return lines

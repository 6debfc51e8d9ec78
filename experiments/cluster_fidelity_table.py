"""The cluster fidelity comparison's one-table summary: every simulator variant on one row.

``variants_table(doc)`` renders ``experiments.cluster_fidelity compare``'s document as the
table docs/cluster.md quotes (``results/cluster_fidelity/variants.md``): per variant the cases
within max(2 pts, the engine's noise band), the mean and largest goodput error, the loads at
which the router order agrees up to ties and the best router is the same, and the geometric
mean bias of mean ITL and mean TTFT over the cases.
"""

from __future__ import annotations

import math

from experiments.report_template import table

VARIANTS = (  # (side, summary key, label)
    ("sim", "summary", "(a) fitted to co-located steps"),
    ("sim_shared_device", "summary_shared_device", "(b) isolated model, shared device (FCFS)"),
    ("sim_timeslice", "summary_timeslice", "(c) isolated model, time slices"),
    (
        "sim_colocated",
        "summary_colocated",
        "(d) co-located own-part model, drawn slices (held-out load)",
    ),
    (
        "sim_colocated_other_workload",
        "summary_colocated_other_workload",
        "(d) the same, fitted to the other workload",
    ),
    (
        "sim_colocated_in_sample",
        "summary_colocated_in_sample",
        "(d) the same, fitted to every case (in sample)",
    ),
    ("sim_quantum", "summary_quantum", "(e) isolated model, round-robin turns (held-out slice)"),
)


def bias_pct(cases: list[dict], side: str, key: str) -> float:
    """Geometric mean of ``side``'s ``key`` over the engine's, less 1, in percent."""
    logs = [math.log(c[side][key] / c["engine"][key]) for c in cases]
    return 100 * (math.exp(sum(logs) / len(logs)) - 1)


def variants_table(doc: dict) -> str:
    rows = []
    for side, key, label in VARIANTS:
        if key not in doc:
            continue
        s, ranks = doc[key], doc[key]["rankings"]
        rows.append(
            [
                label,
                f"{s['cases_within_band']} of {s['cases']}",
                f"{s['mean_abs_error_pts']:.1f} / {s['max_abs_error_pts']:.1f}",
                f"{sum(k['agrees_up_to_ties'] for k in ranks)} of {len(ranks)} loads",
                f"{sum(k['engine_order'][0] == k['sim_order'][0] for k in ranks)} of {len(ranks)}",
                f"{bias_pct(doc['cases'], side, 'itl_mean'):+.1f}% / "
                f"{bias_pct(doc['cases'], side, 'ttft_mean'):+.1f}%",
            ]
        )
    head = [
        "simulator",
        "cases within max(2 pts, noise)",
        "mean / max error pts",
        "router order agrees (up to ties)",
        "best router the same",
        "mean ITL / mean TTFT bias (geometric)",
    ]
    return table(head, rows) + "\n"

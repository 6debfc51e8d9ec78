"""Renders the cluster studies and the cluster fidelity comparison: tables and figures.

    python -m experiments.cluster_report [--results DIR] [--fidelity DIR]

Reads ``<results>/<setting>.json`` (``experiments.cluster_study``) and
``<fidelity>/cluster_fidelity.json`` (``experiments.cluster_fidelity compare``); writes
``<results>/cluster.md`` with one figure per setting (goodput against load per router), the
hit-rate-against-imbalance figure and the per-replica queue figure, and
``<fidelity>/cluster_fidelity.md``. Numbers only; the reading is in docs/cluster.md.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from experiments.figure_style import colors, legend_below, new_figure, save, style_axes
from experiments.report_template import table

REPO = Path(__file__).resolve().parents[1]


def _ci(d: dict, digits: int = 1) -> str:
    lo, hi = d["ci"]
    return f"{d['mean']:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def setting_table(doc: dict) -> str:
    rows = doc["summary"]["rows"]
    mid = rows[next(iter(rows))]["loads"][len(rows[next(iter(rows))]["loads"]) // 2]
    out = []
    for name, r in rows.items():
        at = r["per_load"][str(mid)]
        vs = r["vs"]
        out.append(
            [
                name,
                _ci(r["rate_at_90"]) + (" (censored)" if r["censored"] else ""),
                _ci(vs["round_robin"], 3) if "round_robin" in vs else "-",
                _ci(vs["least_loaded"], 3) if "least_loaded" in vs else "-",
                f"{at['goodput']['mean']:.3f}",
                f"{at['prefix_hit_rate']['mean']:.3f}",
                f"{at['imbalance_max_over_mean']['mean']:.3f}",
                f"{1e3 * at['ttft_p99']['mean']:.0f}",
            ]
        )
    head = [
        "router",
        "rate_at_90",
        "x round_robin",
        "x least_loaded",
        f"goodput @ {mid:g}",
        "hit rate",
        "imbalance max/mean",
        "p99 TTFT ms",
    ]
    return table(head, out)


def goodput_figure(doc: dict, path: Path) -> Path:
    rows = doc["summary"]["rows"]
    fig = new_figure(3.6)
    ax = fig.add_subplot(111)
    for c, (name, r) in zip(colors(len(rows)), rows.items()):
        ys = [r["per_load"][str(x)]["goodput"]["mean"] for x in r["loads"]]
        ax.plot(r["loads"], ys, marker="o", ms=3, color=c, label=name)
    style_axes(ax, doc["conditions"]["load_unit"], "cluster goodput (lifetime)")
    legend_below(fig, ax, "router")
    return save(fig, path)


def hit_imbalance_figure(docs: dict, path: Path) -> Path:
    fig = new_figure(3.6)
    ax = fig.add_subplot(111)
    names = sorted({n for d in docs.values() for n in d["summary"]["rows"]})
    color = dict(zip(names, colors(len(names))))
    for marker, d in zip("osD", docs.values()):
        for name, r in d["summary"]["rows"].items():
            at = r["per_load"][str(r["loads"][len(r["loads"]) // 2])]
            ax.scatter(
                at["imbalance_max_over_mean"]["mean"],
                at["prefix_hit_rate"]["mean"],
                color=color[name],
                marker=marker,
                s=18,
            )
    for name in names:
        ax.scatter([], [], color=color[name], label=name)
    style_axes(ax, "load imbalance (max / mean work), middle load", "prefix-cache hit rate")
    ax.set_title(" ".join(f"{m} {s}" for m, s in zip("osD", docs)), fontsize=8)
    legend_below(fig, ax, "router")
    return save(fig, path)


def queue_figure(docs: dict, path: Path) -> Path:
    runs = [
        r
        for d in docs.values()
        for r in d["runs"]
        if "queue_trace" in r and r["row"] in ("round_robin", "prefix_aware")
    ]
    fig = new_figure(3.6)
    axes = fig.subplots(1, len(runs), sharey=True, squeeze=False)[0]
    for ax, r in zip(axes, runs):
        q = r["queue_trace"]
        for i, series in enumerate(q["waiting"]):
            ax.plot(q["t"], series, lw=0.8, label=f"replica {i}")
        ax.set_title(f"{r['setting']}\n{r['row']} @ {r['load']:g}", fontsize=7)
        style_axes(ax, "s", "waiting requests" if ax is axes[0] else None)
    return save(fig, path)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", default=str(REPO / "results" / "cluster"))
    ap.add_argument("--fidelity", default=str(REPO / "results" / "cluster_fidelity"))
    args = ap.parse_args(argv)
    res = Path(args.results)
    docs = {p.stem: json.loads(p.read_text()) for p in sorted(res.glob("*.json"))}
    parts = ["# Cluster studies (simulated)\n"]
    for name, d in docs.items():
        c = d["conditions"]
        parts.append(f"## {name}\n\n{json.dumps({k: c[k] for k in c if k != 'rows'})}\n")
        parts.append(setting_table(d))
        parts.append(f"\n![{name}]({goodput_figure(d, res / f'{name}_goodput.png').name})\n")
    parts.append(
        f"![hit vs imbalance]({hit_imbalance_figure(docs, res / 'hit_vs_imbalance.png').name})\n"
    )
    parts.append(f"![queues]({queue_figure(docs, res / 'queues.png').name})\n")
    (res / "cluster.md").write_text("\n".join(parts))
    fid = Path(args.fidelity) / "cluster_fidelity.json"
    if fid.exists():
        (fid.parent / "cluster_fidelity.md").write_text(fidelity_page(json.loads(fid.read_text())))


def fidelity_page(doc: dict) -> str:
    s, d = doc["summary"], doc["summary_shared_device"]
    ts = doc.get("summary_timeslice")
    sliced = (
        []
        if ts is None
        else [
            "Router order, isolated replica's model, steps time-sliced on the shared device:\n",
            _ranking_table(ts["rankings"]),
            "",
        ]
    )
    steps = (
        []
        if "step_times" not in doc
        else [
            "Step times (ms, q50 / q90 / q99) and the share of steps over the ITL SLO, every "
            "case's steps pooled per replica count and workload:\n",
            _step_table(doc["step_times"]),
            "",
        ]
    )
    q = doc.get("summary_quantum")
    turns = (
        []
        if q is None
        else [
            "Router order, isolated replica's model, round-robin turns on one simulated GPU "
            f"(time slice chosen without the load: {json.dumps(doc['quantum_chosen_ms'])} ms):\n",
            _ranking_table(q["rankings"]),
            "",
            "Round-robin turns at each time slice, every case judged at it (in sample):\n",
            _grid_table(doc["quantum_grid"]),
            "",
        ]
    )
    return "\n".join(
        [
            "# Cluster simulator against co-located engine replicas\n",
            json.dumps(doc["conditions"]) + "\n",
            _case_table(doc["cases"]),
            "",
            *steps,
            "Router order, simulator fitted to the co-located steps:\n",
            _ranking_table(s["rankings"]),
            "",
            "Router order, isolated replica's model on one shared device:\n",
            _ranking_table(d["rankings"]),
            "",
            *sliced,
            *turns,
            _summary_line("Fitted to the co-located steps", s),
            _summary_line("Isolated model on a shared device", d),
            *([] if ts is None else [_summary_line("Isolated model, time-sliced device", ts)]),
            *([] if q is None else [_summary_line("Isolated model, round-robin turns", q)]),
            f"Noise band (repeat): "
            f"{json.dumps({k: round(v, 1) for k, v in s['noise_band_pts'].items()})}.\n",
        ]
    )


def _summary_line(label: str, s: dict) -> str:
    return (
        f"{label}: cases within max(2 pts, noise band) {s['cases_within_band']} of "
        f"{s['cases']}; mean |error| {s['mean_abs_error_pts']:.1f} pts, largest "
        f"{s['max_abs_error_pts']:.1f} pts; router order agrees up to ties at "
        f"{sum(k['agrees_up_to_ties'] for k in s['rankings'])} of {len(s['rankings'])} loads, "
        f"best router the same at "
        f"{sum(k['engine_order'][0] == k['sim_order'][0] for k in s['rankings'])}.\n"
    )


def _grid_table(grid: list[dict]) -> str:
    rows = [
        [
            f"{g['quantum_ms']:g}",
            f"{g['cases_within_band']}",
            f"{g['mean_abs_error_pts']:.1f} / {g['max_abs_error_pts']:.1f}",
            f"{g['order_agrees']} of {g['loads']}",
        ]
        for g in grid
    ]
    head = ["time slice ms", "cases within band", "mean / max error pts", "router order agrees"]
    return table(head, rows)


def _step_table(groups: list[dict]) -> str:
    known = ("engine", "sim", "sim_shared_device", "sim_timeslice", "sim_quantum")
    sides = [k for k in known if k in groups[0]]
    rows = [
        [g["n"], g["workload"], g["kind"]]
        + [" / ".join(f"{v:.1f}" for v in g[k]["ms"]) for k in sides]
        + [" / ".join(f"{g[k]['over_itl_slo']:.3f}" for k in sides)]
        for g in groups
    ]
    names = {
        "engine": "engine",
        "sim": "sim",
        "sim_shared_device": "shared device",
        "sim_timeslice": "time slices",
        "sim_quantum": "turns",
    }
    head = ["N", "workload", "steps"] + [names[k] for k in sides]
    head.append("over ITL SLO " + " / ".join(names[k] for k in sides))
    return table(head, rows)


def _case_table(cases: list[dict]) -> str:
    rows = []
    for r in cases:
        e, s, o = r["engine"], r["sim"], r["sim_other_workload_fit"]
        d = r["sim_shared_device"]
        ts = r.get("sim_timeslice")
        sliced = (
            []
            if ts is None
            else [
                f"{ts['goodput']:.3f}",
                f"{r['goodput_error_pts_timeslice']:+.1f}",
            ]
        )
        qt = r.get("sim_quantum")
        if qt is not None:
            sliced += [f"{qt['goodput']:.3f}", f"{r['goodput_error_pts_quantum']:+.1f}"]
        rows.append(
            [
                r["n"],
                r["workload"],
                f"{r['load']:g}",
                r["router"] + (" (repeat)" if r["repeat"] else ""),
                f"{e['goodput']:.3f}",
                f"{s['goodput']:.3f}",
                f"{r['goodput_error_pts']:+.1f}",
                f"{o['goodput']:.3f}",
                f"{d['goodput']:.3f}",
                f"{r['goodput_error_pts_shared_device']:+.1f}",
                *sliced,
                f"{e['prefix_hit_rate']:.2f} / {s['prefix_hit_rate']:.2f}",
                _ms(e, s, d, *([] if ts is None else [ts]), "itl_mean"),
                _ms(e, s, d, *([] if ts is None else [ts]), "itl_p99"),
            ]
        )
    has_ts = any("sim_timeslice" in r for r in cases)
    has_q = any("sim_quantum" in r for r in cases)
    lat = "eng / sim / shared" + (" / sliced" if has_ts else "")
    head = [
        "N",
        "workload",
        "load",
        "router",
        "engine goodput",
        "sim goodput",
        "error pts",
        "sim (other-workload fit)",
        "sim (shared device)",
        "error pts (shared device)",
        *(["sim (time slices)", "error pts (time slices)"] if has_ts else []),
        *(["sim (turns)", "error pts (turns)"] if has_q else []),
        "hit rate eng / sim",
        f"mean ITL ms {lat}",
        f"p99 ITL ms {lat}",
    ]
    return table(head, rows)


def _ms(*sides_and_key) -> str:  # noqa: ANN002
    *sides, key = sides_and_key
    return " / ".join(f"{1e3 * x[key]:.1f}" for x in sides)


def _ranking_table(rankings: list[dict]) -> str:
    rows = [
        [
            k["n"],
            k["workload"],
            f"{k['load']:g}",
            " > ".join(k["engine_order"]),
            " > ".join(k["sim_order"]),
            "yes" if k["agrees_up_to_ties"] else "no",
            f"{k['band_pts']:.1f}",
        ]
        for k in rankings
    ]
    head = ["N", "workload", "load", "engine order", "sim order", "agrees up to ties", "band pts"]
    return table(head, rows)


if __name__ == "__main__":
    main()

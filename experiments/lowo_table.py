"""Leave-one-workload-out's figures per held-out workload (``summaries``) and its page
(``table``), from the document ``experiments.lowo`` writes as ``lowo.json``."""

from __future__ import annotations

from collections import defaultdict

from experiments.fidelity_ranking import rank_pairs, same_ranking

COST_MODELS = ("engine", "physical")


def _rankings(runs: list[dict], cm: str) -> tuple[int, int]:
    """(cases whose policy ranking by goodput the simulator with ``cm`` reproduces, cases with
    more than one policy)."""
    by_case: dict[tuple, dict] = defaultdict(dict)
    for r in runs:
        by_case[(r["source"], r["case"])][r["policy"]] = r
    same = total = 0
    for pol in by_case.values():
        if len(pol) < 2:
            continue
        eng = rank_pairs({p: r["goodput_measured"] for p, r in pol.items()})
        sim = rank_pairs({p: r[f"goodput_sim_{cm}"] for p, r in pol.items()})
        same += same_ranking(eng, sim)
        total += 1
    return same, total


def summaries(doc: dict) -> list[dict]:
    """Per (model, held-out workload, cost model): the held-out steps' bias and MAPE, the
    worst re-simulated run errors (goodput over the runs not on a cliff), the ranking, and
    which of ``doc["targets"]`` are met."""
    t = doc["targets"]
    out = []
    for s in doc["steps"]:
        cm = s["cost_model"]
        runs = [
            r for r in doc["runs"] if (r["model"], r["workload"]) == (s["model"], s["held_out"])
        ]
        row = {k: s[k] for k in ("model", "held_out", "cost_model", "bias", "bias_raw", "mape")}
        row["runs"] = len(runs)
        if runs:
            off = [r for r in runs if not r["on_cliff"]]
            row["itl_mean"] = max(abs(r[f"itl_mean_err_{cm}"]) for r in runs)
            row["e2e_mean"] = max(abs(r[f"e2e_mean_err_{cm}"]) for r in runs)
            row["goodput_pts"] = max((abs(r[f"goodput_err_pts_{cm}"]) for r in off), default=0.0)
            row["on_cliff"] = len(runs) - len(off)
            row["ranking_same"], row["ranking_cases"] = _rankings(runs, cm)
            if cm == "physical" and "in_band_physical" in runs[0]:
                row["in_band_runs"] = sum(r["in_band_physical"] for r in runs)
        row["met"] = {
            k: (abs(row[k]) <= t[k]) if k in row else None
            for k in ("bias", "mape", "itl_mean", "e2e_mean", "goodput_pts")
        }
        row["worst_share"] = max(abs(row.get(k, 0.0)) / t[k] for k in row["met"])
        out.append(row)
    return out


def _pct(v: float | None, signed: bool = False) -> str:
    if v is None:
        return "-"
    return f"{v:+.2%}" if signed else f"{v:.2%}"


def _met(row: dict) -> str:
    """The targets this row misses ("none" where it meets all it was judged on)."""
    bad = [k for k, ok in row["met"].items() if ok is False]
    if row.get("ranking_same", 0) < row.get("ranking_cases", 0):
        bad.append("ranking")
    return ", ".join(bad) or ("none" if row["runs"] else "none (steps only)")


def band_counts(doc: dict) -> dict[str, tuple[int, int]]:
    """Per shape: (runs whose engine goodput lies in the physical fit's scatter band, runs
    with a band); shapes without a band are left out."""
    out: dict[str, tuple[int, int]] = {}
    for r in doc["runs"]:
        if "in_band_physical" in r:
            k, n = out.get(r["model"], (0, 0))
            out[r["model"]] = (k + bool(r["in_band_physical"]), n + 1)
    return out


def _summary_table(rows: list[dict]) -> list[str]:
    lines = [
        "| shape | held-out workload | cost model | step bias | (raw) | step MAPE | runs "
        "| worst ITL | worst E2E | worst goodput (off-cliff) | on cliff | ranking | not met |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(rows, key=lambda r: (r["model"], -r["worst_share"])):
        gp = f"{r['goodput_pts']:.1f} pts" if "goodput_pts" in r else "-"
        rank = f"{r['ranking_same']}/{r['ranking_cases']}" if "ranking_cases" in r else "-"
        lines.append(
            f"| {r['model']} | {r['held_out']} | {r['cost_model']} | {_pct(r['bias'], True)} "
            f"| {_pct(r['bias_raw'], True)} | {_pct(r['mape'])} | {r['runs']} "
            f"| {_pct(r.get('itl_mean'))} | {_pct(r.get('e2e_mean'))} | {gp} "
            f"| {r.get('on_cliff', '-')} | {rank} | {_met(r)} |"
        )
    return lines


def _run_table(runs: list[dict]) -> list[str]:
    lines = [
        "| shape | run | goodput measured | goodput err, engine / physical (pts) "
        "| ITL err, engine / physical | E2E err, engine / physical | 1% cliff (pts) "
        "| physical band |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        e, p = (r[f"goodput_err_pts_{c}"] for c in COST_MODELS)
        cliff = f"{r['cliff_pts']:.1f}" + (" **cliff**" if r["on_cliff"] else "")
        band = "-"
        if "goodput_band_physical" in r:
            lo, hi = r["goodput_band_physical"]
            band = f"{lo:.3f}-{hi:.3f}" + ("" if r["in_band_physical"] else " **out**")
        lines.append(
            f"| {r['model']} | {r['case']}/{r['policy']} | {r['goodput_measured']:.3f} "
            f"| {e:+.1f} / {p:+.1f} "
            f"| {r['itl_mean_err_engine']:+.2%} / {r['itl_mean_err_physical']:+.2%} "
            f"| {r['e2e_mean_err_engine']:+.2%} / {r['e2e_mean_err_physical']:+.2%} | {cliff} "
            f"| {band} |"
        )
    return lines


def _lease_lines(leases: dict) -> list[str]:
    lines = []
    for model, by_dir in leases.items():
        for d, info in by_dir.items():
            probe = ""
            if "probe_repeat" in info:
                same = "same plans" if info["probe_same_plans"] else "plans differ"
                probe = f"; probe repeat {info['probe_repeat']:+.2%} ({same})"
            anchor = f" (anchor {info['anchor']})" if info["anchor"] else " (no anchor: 1)"
            lines.append(f"* {model} `{d}`: offset {info['offset']:.4f}{anchor}{probe}")
    return lines


def table(doc: dict) -> str:
    """The page: per held-out workload, worst first (by the largest share of a target used);
    then every re-simulated run; then the leases' offsets."""
    rows = doc.get("summary") or summaries(doc)
    t = doc["targets"]
    head = (
        f"Targets (issue 23): step bias within ±{t['bias']:.1%} after the lease offset, step "
        f"MAPE ≤ {t['mape']:.0%}, mean ITL and E2E within {t['itl_mean']:.0%}, goodput within "
        f"{t['goodput_pts']:g} points off a cliff, the ranking identical. `{doc['command']}`."
    )
    parts = [head, "", *_summary_table(rows), ""]
    for model, (k, n) in band_counts(doc).items():
        seeds = len(doc.get("noise_seeds", []))
        parts.append(
            f"* {model}: the engine's goodput inside the physical fit's scatter band ({seeds} "
            f"seeds) in {k} of {n} runs (target {t['in_band']:.0%})"
        )
    parts += ["", "Every re-simulated run (sim − engine):", ""]
    parts += [*_run_table(doc["runs"]), "", "Leases:", "", *_lease_lines(doc["leases"])]
    return "\n".join(parts) + "\n"

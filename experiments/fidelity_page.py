"""The fidelity report's page, rendered from its ``report.json`` (``experiments.fidelity_report``)
into ``templates/fidelity.md``: each field a table or a value, formatted, never a sentence made
from the numbers. The page's hand-written notes are kept (``experiments.report_template``).
"""

from __future__ import annotations

from pathlib import Path

from experiments.report_template import pct, seed_range, seeds_by_requests, slo_text, table
from experiments.report_template import write_page as _write

LATENCY = ("ttft_mean", "ttft_p99", "itl_mean", "itl_p99", "e2e_mean", "e2e_p99")


def write_page(doc: dict, path: Path) -> str:
    """Render ``doc`` into ``path`` (keeping the notes there); returns the page."""
    return _write(path, "fidelity.md", fields(doc))


def fields(doc: dict) -> dict[str, str]:
    """The template's fields of ``doc``."""
    cond, tgt = doc["conditions"], doc["targets"]
    return {
        "model": cond["model"],
        "conditions": _rows(_conditions(cond)),
        "cases": _cases(cond["cases"]),
        "commands": _commands(cond),
        "headline": _headline(doc),
        "noise_seeds": seed_range(cond["noise_seeds"]),
        "in_band": _in_band(doc["headline"], tgt),
        "scatter": _scatter(doc),
        "step_mape": _step_mape(doc["step_mape"]),
        "chosen": f"the model “{cond['cost_model']['name']}” (`simulator/engine_cost_model.py`, "
        f"calibration file `{cond['cost_model']['file']}`)",
        "coefficients": _coefficients(doc["cost_model"]),
        "runs": _runs(doc["runs"]),
        "tie_pts": f"{tgt['tie_pts']:g}",
        "ranking": _ranking(doc["ranking"]),
        "refresh": _refresh(doc["runs"]),
        "repeat": _repeat(doc["repeat"]),
        "plots": ", ".join(f"`{p}`" for p in doc["plots"]),
    }


def _rows(pairs: list[tuple[str, str]]) -> str:
    return "\n".join(f"| {k} | {v} |" for k, v in pairs)


def _conditions(c: dict) -> list[tuple[str, str]]:
    eng, slo = c["engine"], c["slo"]
    loop = {
        "pipelined": "pipelined: a step planned while the previous one runs "
        "(`EngineConfig.async_steps`; `Simulation(pipelined=True)`)",
        "serial": "serial: each step's tokens read before the next is planned",
    }[eng["loop"]]
    commit = ", ".join(eng["commits"]) or "not recorded in the runs' meta.json"
    by_role = {}
    for case in c["cases"]:
        by_role.setdefault(case["role"], []).append(case)
    runs = "; ".join(
        f"{role}: {seeds_by_requests([x['seed'] for x in cs], [x['requests'] for x in cs])}"
        for role, cs in sorted(by_role.items(), key=lambda kv: kv[0] != "fidelity")
    )
    return [
        ("engine runs", f"`{eng['dir']}`, {', '.join(eng['dates'])}; commit: {commit}"),
        ("engine runs again", f"`{eng['repeat_dir']}`" if eng["repeat_dir"] else "none"),
        ("engine loop", loop),
        ("simulator", "`simulator.Simulation` on the same requests, scheduler and policies; "
         "arrivals queued at step boundaries; stopped at each case's time limit"),
        ("GPU", c["gpu"]),
        ("software", f"torch {c['torch']}, triton {c['triton']}"),
        ("model", f"the {c['model']} shape (seeded random weights, bf16)"),
        ("scheduler", ", ".join(f"{k} {v}" for k, v in c["scheduler"].items())),
        ("SLO", f"{slo_text(slo['ttft_s'], slo['itl_s'])} ({slo['goodput']} goodput; preset "
         f"`{slo['preset']}`)"),
        ("seeds × requests", runs),
        ("noise seeds", seed_range(c["noise_seeds"])),
    ]  # fmt: skip


def _cases(cases: list[dict]) -> str:
    heads = ("case", "role", "workload", "load (req/s)", "seed", "requests", "time limit (s)",
             "policies")  # fmt: skip
    return table(heads, [
        (c["name"], c["role"], c["workload"], f"{c['rate']:g}", c["seed"], c["requests"],
         "-" if c["max_time_s"] is None else f"{c['max_time_s']:.1f}", ", ".join(c["policies"]))
        for c in cases
    ])  # fmt: skip


def _commands(c: dict) -> str:
    eng = c["engine"]
    compare = f"python -m experiments.fidelity compare {eng['dir']}"
    if eng["repeat_dir"]:
        compare += f" --repeat {eng['repeat_dir']}"
    if c["report_dir"] != "docs/fidelity":
        compare += f" --report {c['report_dir']}"
    return "\n".join([
        f"python -m experiments.fidelity export --model {c['model']}    # requests + manifest",
        f"python -m experiments.engine_replay --manifest {c['inputs']}/manifest.json --out DIR"
        "  # GPU",
        compare + "   # this page (CPU, a few minutes)",
    ])  # fmt: skip


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _headline(doc: dict) -> str:
    h, met, tgt = doc["headline"], doc["met"], doc["targets"]
    bias, again = h["one_percent_sensitivity"], h.get("engine_repeat_errors", {})
    rows = [("step-time MAPE, held-out steps", f"{100 * h['step_mape']:.2f}%",
             f"<= {100 * tgt['step_mape']:g}%", _yes(met["step_mape"]), "", "")]  # fmt: skip
    for m in LATENCY:
        k = f"{m}_err"
        rows.append((k, pct(h[k]), f"<= {100 * tgt['latency']:g}%", _yes(met[k]),
                     pct(again[k]) if k in again else "", pct(bias[k])))  # fmt: skip
    g_rep = h.get("engine_repeat_goodput_diff_pts")
    rows.append(("goodput_err_pts", f"{h['goodput_err_pts']:.2f}", f"<= {tgt['goodput_pts']:g}",
                 _yes(met["goodput_err_pts"]), "" if g_rep is None else f"{g_rep:.2f}",
                 f"{bias['goodput_err_pts']:.2f}"))  # fmt: skip
    rep = (
        f"{h['engine_repeat_ranking_identical']} (sim against the second run: "
        f"{h['ranking_identical_vs_repeat']})"
        if "engine_repeat_ranking_identical" in h
        else ""
    )
    rows.append(("ranking_identical", f"{h['ranking_identical']} (with a band per side: "
                 f"{h['ranking_identical_band_per_side']})", "true",
                 _yes(met["ranking_identical"]), rep, ""))  # fmt: skip
    heads = ("figure", "measured", "target", "met", "engine vs itself", "1% step-time bias")
    return table(heads, rows)


def _in_band(h: dict, tgt: dict) -> str:
    rows = [("the engine's runs", h["engine_goodput_in_sim_band"])]
    if "engine_repeat_in_sim_band" in h:
        rows.append(("the engine's runs again", h["engine_repeat_in_sim_band"]))
    head = f"goodput within the simulator's range over seeds (±{100 * tgt['band_slack']:g} point)"
    return table(("runs", head), rows)


def _scatter(doc: dict) -> str:
    h, w = doc["headline"], doc["within_target"]
    n, rows = w["runs"], []
    for key, v in w["figures"].items():
        fmt = (lambda x: f"{x:.1f} pts") if key == "goodput_err_pts" else pct
        rows.append((key, fmt(h[key]), f"{v['deterministic']}/{n}",
                     fmt(h["with_step_noise"][key]), f"{v['with_scatter']:.1f}/{n}"))  # fmt: skip
    heads = ("figure", "deterministic: worst", "within target", "with scatter: worst",
             "within target")  # fmt: skip
    return table(heads, rows)


def _step_mape(step_mape: dict) -> str:
    return table(("model", "MAPE all", "decode-only", "mixed", "steps"), [
        (name, f"{s['all']:.2f}%", f"{s['decode_only']:.2f}%", f"{s['mixed']:.2f}%", s["steps"])
        for name, s in step_mape.items()
    ])  # fmt: skip


def _coefficients(rep: dict) -> str:
    knee = rep["knee_tokens"]
    return "\n".join([
        "- decode-only: " + ", ".join(f"{k} {v:.4g}" for k, v in rep["decode_only_us"].items()),
        "- mixed: " + ", ".join(f"{k} {v:.4g}" for k, v in rep["mixed_us"].items()),
        f"- knee: {knee} tokens" if knee is not None else "- knee: none (`tokens_past_knee` 0)",
    ])  # fmt: skip


def _pair(r: dict, k: str, scale: float = 1.0, fmt: str = ".3f") -> str:
    err = f" ({pct(r[k + '_err'])})" if k + "_err" in r else ""
    return f"{scale * r[k + '_engine']:{fmt}} / {scale * r[k + '_sim']:{fmt}}{err}"


def _runs(runs: list[dict]) -> str:
    heads = ("case", "policy", "goodput", "TTFT mean (s)", "TTFT p99 (s)", "ITL mean (ms)",
             "ITL p99 (ms)", "E2E mean (s)", "E2E p99 (s)", "preemptions", "steps", "model bias",
             "goodput, sim with scatter")  # fmt: skip
    return table(heads, [
        (r["case"], r["policy"], _pair(r, "goodput_lifetime"), _pair(r, "ttft_mean"),
         _pair(r, "ttft_p99"), _pair(r, "itl_mean", 1e3, ".2f"), _pair(r, "itl_p99", 1e3, ".2f"),
         _pair(r, "e2e_mean"), _pair(r, "e2e_p99"),
         f"{r['preemptions_engine']} / {r['preemptions_sim']}",
         f"{r['steps_engine']} / {r['steps_sim']}", f"{100 * r['model_bias']:+.1f}%",
         f"{r['goodput_sim_band'][0]:.3f}-{r['goodput_sim_band'][1]:.3f}")
        for r in runs
    ])  # fmt: skip


def _flag(v: bool | None) -> str:
    return "-" if v is None else str(v)


def _ranking(ranking: dict) -> str:
    def goodputs(g: dict) -> str:
        return "; ".join(
            f"{p} {v['engine']:.3f} / "
            + ("-" if v["engine_again"] is None else f"{v['engine_again']:.3f}")
            + f" / {v['sim']:.3f}"
            for p, v in g.items()
        )

    heads = (
        "case",
        "sim = engine",
        "sim = engine again",
        "engine = engine again",
        "sim = engine, band per side",
        "goodput by policy: engine / engine again / sim",
    )
    return table(heads, [
        (name, v["identical"], _flag(v["sim_vs_engine_again"]),
         _flag(v["engine_vs_engine_again"]), v["band_per_side"], goodputs(v["goodput"]))
        for name, v in ranking.items()
    ])  # fmt: skip


def _refresh(runs: list[dict]) -> str:
    rows = [
        (r["case"], r["policy"], r["pre_refresh_steps"], f"{r['pre_refresh_ratio']:.2f}×",
         f"{r['decode_ratio']:.2f}×", f"{1e3 * r['itl_p99_engine']:.2f} / "
         f"{1e3 * r['itl_p99_sim']:.2f}")
        for r in runs
        if r["pre_refresh_steps"]
    ]  # fmt: skip
    if not rows:
        return "(no run refreshes its predictions)"
    heads = ("case", "policy", "steps before a refresh", "measured/modelled before a refresh",
             "other decode-only steps", "p99 ITL (ms), engine / sim")  # fmt: skip
    return table(heads, rows)


def _repeat(repeat: list[dict]) -> str:
    if not repeat:
        return "(no second engine runs: `--repeat` not given)"

    def three(r: dict, k: str, scale: float = 1.0, fmt: str = ".3f") -> str:
        return " / ".join(f"{scale * v:{fmt}}" for v in r[k])

    heads = ("case", "policy", "goodput", "sim with scatter (min-max)", "p99 TTFT (s)",
             "p99 ITL (ms)", "mean E2E (s)", "preemptions", "goodput diff (pts)",
             "p99 TTFT diff")  # fmt: skip
    return table(heads, [
        (r["case"], r["policy"], three(r, "goodput_lifetime"),
         f"{r['band'][0]:.3f}-{r['band'][1]:.3f}", three(r, "ttft_p99"),
         three(r, "itl_p99", 1e3, ".2f"), three(r, "e2e_mean"),
         three(r, "preemptions", 1.0, ".0f"), f"{r['goodput_diff_pts']:.1f}",
         pct(r["errors"]["ttft_p99"]))
        for r in repeat
    ])  # fmt: skip

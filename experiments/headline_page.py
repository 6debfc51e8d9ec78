"""The headline-on-the-engine page, rendered from ``headline_engine.json``
(``experiments.headline_engine.compare``) into ``templates/headline_engine.md``: each field a
table or a value, formatted, never a sentence made from the numbers. The page's hand-written
notes are kept (``experiments.report_template``).
"""

from __future__ import annotations

from pathlib import Path

from experiments.fidelity_compare import BAND_SLACK
from experiments.report_template import seed_range, seeds_by_requests, slo_text, table
from experiments.report_template import write_page as _write

HEADS = (  # (metric, column, format) of the policy table after the goodput columns
    ("throughput_tok_s", "throughput (tok/s)", "{:.0f}"),
    ("ttft_p99", "p99 TTFT (s)", "{:.2f}"),
    ("itl_p99", "p99 ITL (ms)", "{:.1f}"),
    ("recompute_waste", "recompute waste", "{:.3f}"),
    ("preemptions", "preemptions", "{:.0f}"),
)
SCALE = {"itl_p99": 1e3}  # shown in ms


def write_page(doc: dict, path: Path) -> str:
    """Render ``doc`` (the JSON as written) into ``path``, keeping the notes there; returns the
    page."""
    return _write(path, "headline_engine.md", fields(doc))


def fields(doc: dict) -> dict[str, str]:
    """The template's fields of ``doc``."""
    noise = doc["noise_seeds"]
    return {
        "title": f"{', '.join(doc['mean'])} at {doc['rate']:g} req/s, the {doc['model']} shape",
        "conditions": "\n".join(f"| {k} | {v} |" for k, v in _conditions(doc)),
        "policies": _policies(doc),
        "gains": _gains(doc),
        "steps": _steps(doc),
        "noise_seeds": seed_range(range(noise)) if noise else "none",
        "in_band": table(
            ("runs", f"engine goodput within the simulator's range (±{100 * BAND_SLACK:g} point)"),
            [("every seed and policy", doc["engine_in_noise_band"])],
        )
        if noise
        else "(not simulated: `--noise-seeds 0`)",
        "scatter": _scatter(doc) if noise else "",
    }


def _command(doc: dict) -> str:
    cmd = f"python -m experiments.headline_engine compare {doc['engine']['dir']}"
    cmd += f" --out {doc['report_dir']}"
    if doc["cost_scale"] != 1.0:
        cmd += f" --cost-scale {doc['cost_scale']:g}"
    if doc["noise_seeds"]:
        cmd += f" --noise-seeds {doc['noise_seeds']}"
    return f"`{cmd}`"


def _conditions(doc: dict) -> list[tuple[str, str]]:
    eng, slo = doc["engine"], doc["slo"]
    commit = ", ".join(eng["commits"]) or "not recorded in the runs' meta.json"
    scale = "" if doc["cost_scale"] == 1.0 else f", every step time × {doc['cost_scale']:g}"
    return [
        ("engine runs", f"`{eng['dir']}` (one folder per seed), {', '.join(eng['dates'])}; "
         f"commit: {commit}"),
        ("simulator", "`simulator.Simulation` on the same requests, scheduler, policies and "
         f"predictions; cost model `{doc['cost_model']}`{scale}; the engine's pipelined loop, "
         "arrivals queued at step boundaries"),
        ("GPU", doc["gpu"]),
        ("software", f"torch {doc['torch']}, triton {doc['triton']}"),
        ("model", f"the {doc['model']} shape (seeded random weights)"),
        ("workload", doc["workload"]),
        ("load", f"{doc['rate']:g} req/s"),
        ("seeds × requests", seeds_by_requests(doc["seeds"], [doc["num_requests"]])),
        ("SLO", f"{slo_text(slo['ttft_s'], slo['itl_s'])} ({slo['goodput']} goodput; preset "
         f"`{slo['preset']}`)"),
        ("scheduler", ", ".join(f"{k} {v}" for k, v in doc["scheduler"].items())),
        ("time limit", _time_limit(doc)),
        ("regenerate", _command(doc)),
    ]  # fmt: skip


def _time_limit(doc: dict) -> str:
    if doc["max_time_s"] is None:
        return "none"
    drain = "" if doc["drain_s"] is None else f": {doc['drain_s']:g} s after its last arrival"
    return f"{doc['max_time_s']:.1f} s (seed {doc['seeds'][-1]}{drain})"


def _side(r: dict, k: str, fmt: str) -> str:
    scale = SCALE.get(k, 1.0)
    return f"{fmt.format(r[k]['engine'] * scale)} / {fmt.format(r[k]['sim'] * scale)}"


def _policies(doc: dict) -> str:
    seeds = doc["seeds"]
    heads = ["policy", "lifetime goodput", *(f"goodput, seed {s}" for s in seeds)]
    rows = []
    for p, r in doc["mean"].items():
        g, sp = r["goodput_lifetime"], doc["goodput_spread"][p]
        cells = [
            p,
            f"{g['engine']:.3f} [{sp['engine'][0]:.3f}, {sp['engine'][1]:.3f}] / "
            f"{g['sim']:.3f} [{sp['sim'][0]:.3f}, {sp['sim'][1]:.3f}]",
        ]
        cells += [_side(doc["per_seed"][str(s)][p], "goodput_lifetime", "{:.3f}") for s in seeds]
        rows.append(cells + [_side(r, k, fmt) for k, _, fmt in HEADS])
    return table(heads + [h for _, h, _ in HEADS], rows)


def _gains(doc: dict) -> str:
    rows = [
        (f"goodput {k.replace('_vs_', ' / ')}", v["engine"], v["sim"])
        for k, v in doc["gain"].items()
    ]
    t = doc["throughput_vs_fcfs"]
    if t is not None:
        rows.append(("throughput horizon_learned / fcfs", t["engine"], t["sim"]))
    if not rows:
        return "(none: the runs hold no pair of horizon_learned and another policy)"
    return table(("ratio of means", "engine", "simulator"), rows)


def _per_run(doc: dict):  # noqa: ANN202 - (seed, policy, row) of every run
    return ((s, p, r) for s in doc["seeds"] for p, r in doc["per_seed"][str(s)].items())


def _signed(v: float | None) -> str:
    return "-" if v is None else f"{v:+.2f}"


def _steps(doc: dict) -> str:
    heads = ("seed", "policy", "steps", "bias", "decode-only bias", "MAPE", "MAPE, mixed steps")
    return table(heads, [
        (s, p, r["steps"]["count"], f"{r['steps']['bias_pct']:+.2f}",
         _signed(r["steps"]["decode_bias_pct"]), f"{r['steps']['mape_pct']['all']:.2f}",
         f"{r['steps']['mape_pct']['mixed']:.2f}")
        for s, p, r in _per_run(doc)
    ])  # fmt: skip


def _scatter(doc: dict) -> str:
    heads = ("seed", "policy", "engine", "simulator", "simulator with scatter")
    return table(heads, [
        (s, p, f"{r['goodput_lifetime']['engine']:.3f}", f"{r['goodput_lifetime']['sim']:.3f}",
         f"{r['goodput_noise_band'][0]:.3f}-{r['goodput_noise_band'][1]:.3f}")
        for s, p, r in _per_run(doc)
    ])  # fmt: skip

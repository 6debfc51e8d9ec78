"""Verification's host terms fitted to the engine's measured speculative runs, and the simulator's
speedups beside the engine's, cell by cell.

    python -m experiments.spec_verify_fit [--out results/spec_crossover]

Inputs (``executor.spec_bench`` JSON, the 7B shape under stated acceptance, held batch: the
workload of ``experiments.spec_crossover``): the n-gram grid k 1-8 x batch 1-64 at alpha 0.7
(``spec7b_ngram_kgrid.json``) is the **fit set**; n-gram at alpha 0.5 and 0.9 (k 4,
``spec7b_ngram.json``) and the 0.5B-shape draft model (alpha 0.7, k 1-8 x batch 1-64,
``spec7b_draft.json``) and the EAGLE-3-layout draft head (alpha 0.7, k 1-8 x batch 1-64,
``spec7b_eagle3.json``) are **held out**. The simulator runs each cell with the same draws, hence
the same plans (every request is queued at t = 0: the plans do not depend on time), so its wall
time is linear in the two host terms of ``simulator.verification_cost.VerifyCost``::

    sim(a, b) = sim(0, 0) + a * verification steps + b * verifications

(the counts from two probe runs). The engine's plain run at the same batch calibrates each
cell: its target is the measured speculative wall time times simulated / measured plain wall
time, so the terms explain the verification step's cost relative to a plain step's, which is
what a speedup compares. ``a, b >= 0`` minimise the mean squared relative error on the fit set.
Writes ``verify_fit.json`` (the terms, every cell: engine speedup and the simulator's with
verifies as prefill chunks, as decode rows, and as decode rows with the fitted terms) and
``verify_fit.md``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from experiments import compact_json
from experiments import spec_crossover as sc
from experiments.report_template import table
from horizon.speculation import SpeculationConfig
from simulator.verification_cost import VerifyCost

REPO = Path(__file__).resolve().parents[1]
INPUTS = {  # set -> (file, drafter in spec_crossover's names)
    "fit": ("spec7b_ngram_kgrid.json", "ngram"),
    "ngram": ("spec7b_ngram.json", "ngram"),
    "draft": ("spec7b_draft.json", "draft_0.5b"),
    "eagle3": ("spec7b_eagle3.json", "eagle3"),
}
PROBE_S = 1e-3
VARIANTS = ("chunks", "rows", "fitted")


def engine_cells(directory: Path) -> list[dict]:
    """Every measured speculative cell with its plain run's wall time (held-out sets drop the
    cells the fit set has)."""
    cells, seen = [], set()
    for name, (file, drafter) in INPUTS.items():
        res = json.loads((directory / file).read_text())
        rows = [r for r in res["rows"] if not r.get("skipped")]
        plain = {r["batch"]: r["wall_s"] for r in rows if r["k"] == 0}
        for r in rows:
            key = (drafter, r["alpha"] if r["k"] else None, r["batch"], r["k"])
            if r["k"] == 0 or key in seen or r["batch"] not in plain:
                continue
            seen.add(key)
            cells.append(
                {"set": name, "drafter": drafter, "alpha": r["alpha"], "batch": r["batch"]}
                | {"k": r["k"], "wall_s": r["wall_s"], "plain_wall_s": plain[r["batch"]]}
                | {"speedup": r["speedup"]}
            )
    return cells


def simulate_cells(cells: list[dict]) -> None:
    """Each cell's simulated wall times: plain, speculative under each shape, and the probes'
    counts of verification steps and verifications (in place)."""
    cost, draft_model = sc._cost("qwen2.5-7b"), sc._cost("qwen2.5-0.5b")
    plain: dict[int, float] = {}
    for c in cells:
        b = c["batch"]
        if b not in plain:
            plain[b] = sc._run(b, None, 0.5, cost, None)["makespan_s"]
        spec = SpeculationConfig(policy="fixed", num_draft_tokens=c["k"])
        draft = sc._draft_cost(c["drafter"], b, draft_model)

        def wall(verify: VerifyCost, b=b, spec=spec, draft=draft, c=c) -> float:  # noqa: ANN001
            return sc._run(b, spec, c["alpha"], cost, draft, verify)["makespan_s"]

        rows = wall(VerifyCost())
        c |= {"sim_plain_s": plain[b], "sim_chunks_s": wall(VerifyCost("prefill_chunks"))}
        c |= {"sim_rows_s": rows}
        c["verify_steps"] = (wall(VerifyCost(per_step_s=PROBE_S)) - rows) / PROBE_S
        c["verifies"] = (wall(VerifyCost(per_verify_s=PROBE_S)) - rows) / PROBE_S


def fit_terms(cells: list[dict]) -> tuple[float, float]:
    """Non-negative ``(per_step_s, per_verify_s)`` minimising the squared relative error of
    the fit set's targets."""
    fit = [c for c in cells if c["set"] == "fit"]
    target = np.array([c["wall_s"] * c["sim_plain_s"] / c["plain_wall_s"] for c in fit])
    base = np.array([c["sim_rows_s"] for c in fit])
    x = np.array([[c["verify_steps"], c["verifies"]] for c in fit]) / target[:, None]
    y = (target - base) / target
    best = (float(np.sum(y**2)), 0.0, 0.0)
    for cols in ((0, 1), (0,), (1,)):
        coef = np.linalg.lstsq(x[:, cols], y, rcond=None)[0]
        if (coef < 0).any():
            continue
        full = np.zeros(2)
        full[list(cols)] = coef
        err = float(np.sum((y - x @ full) ** 2))
        if err < best[0]:
            best = (err, float(full[0]), float(full[1]))
    return best[1], best[2]


def speedups(cells: list[dict], per_step_s: float, per_verify_s: float) -> None:
    """Each cell's simulated speedup under each variant (in place)."""
    for c in cells:
        fitted = c["sim_rows_s"] + per_step_s * c["verify_steps"] + per_verify_s * c["verifies"]
        walls = {"chunks": c["sim_chunks_s"], "rows": c["sim_rows_s"], "fitted": fitted}
        for v, w in walls.items():
            c[f"sim_{v}_speedup"] = c["sim_plain_s"] / w


def summary(cells: list[dict]) -> dict:
    """Per set and variant: mean absolute relative error of the speedup, and the crossover
    batches (engine / each variant) per drafter, alpha and k."""
    out: dict = {"speedup_mape": {}, "crossover": {}}
    for s in INPUTS:
        sel = [c for c in cells if c["set"] == s]
        if not sel:
            continue
        out["speedup_mape"][s] = {
            v: float(np.mean([abs(c[f"sim_{v}_speedup"] / c["speedup"] - 1) for c in sel]))
            for v in VARIANTS
        }
    groups = sorted({(c["drafter"], c["alpha"], c["k"]) for c in cells})
    for d, a, k in groups:
        sel = sorted(
            (c for c in cells if (c["drafter"], c["alpha"], c["k"]) == (d, a, k)),
            key=lambda c: c["batch"],
        )
        cross = {"engine": next((c["batch"] for c in sel if c["speedup"] < 1), None)}
        for v in VARIANTS:
            cross[v] = next((c["batch"] for c in sel if c[f"sim_{v}_speedup"] < 1), None)
        cross["batches"] = [c["batch"] for c in sel]
        out["crossover"][f"{d} alpha={a} k={k}"] = cross
    return out


def render(report: dict) -> str:
    """``verify_fit.md``: the terms, the error per set, the crossovers."""
    t = report["terms"]
    mape = report["summary"]["speedup_mape"]
    err = [[s, *(f"{100 * m[v]:.1f}%" for v in VARIANTS)] for s, m in mape.items()]
    cross = [
        [g, *("none" if c[v] is None else str(c[v]) for v in ("engine", *VARIANTS))]
        for g, c in report["summary"]["crossover"].items()
    ]
    return "\n".join(
        [
            "# Verification steps: host terms fitted to the engine's speculative runs",
            "",
            "Written by `python -m experiments.spec_verify_fit` from " + report["inputs"] + ".",
            "",
            f"per verification step {1e3 * t['per_step_s']:.3f} ms, per verifying request "
            f"{1e3 * t['per_verify_s']:.4f} ms (fitted on the set `fit`)",
            "",
            "Mean absolute relative error of the simulated speedup over plain decoding:",
            "",
            table(
                ["set", "as prefill chunks", "as decode rows", "decode rows + fitted terms"], err
            ),
            "",
            "Crossover batch (smallest measured batch slower than plain; none: none up to 64):",
            "",
            table(["cells", "engine", "chunks", "rows", "rows + fit"], cross),
            "",
        ]
    )


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--inputs", default=str(REPO / "results" / "spec_bench"))
    ap.add_argument("--out", default=str(REPO / "results" / "spec_crossover"))
    args = ap.parse_args(argv)
    cells = engine_cells(Path(args.inputs))
    simulate_cells(cells)
    per_step_s, per_verify_s = fit_terms(cells)
    speedups(cells, per_step_s, per_verify_s)
    files = ", ".join(f"`{f}`" for f, _ in INPUTS.values())
    report = {
        "inputs": f"results/spec_bench: {files}",
        "terms": {"per_step_s": per_step_s, "per_verify_s": per_verify_s, "shape": "decode_rows"},
        "summary": summary(cells),
        "cells": cells,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "verify_fit.json").write_text(compact_json.dumps(report))
    (out / "verify_fit.md").write_text(render(report))
    print(render(report))
    return report


if __name__ == "__main__":
    main()

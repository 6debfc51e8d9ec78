"""The fidelity report as one JSON document (``report.json``): every figure the page shows and
the conditions they were measured under, computed from ``experiments.fidelity_compare``'s
parts. ``experiments.fidelity_page`` renders it; nothing there computes a figure.

Keys: ``conditions`` (engine runs, GPU, software, model, scheduler, SLO, cost model, noise seeds,
cases with their workload, load, seed and requests), ``targets``, ``headline`` (the dict
``compare`` prints and returns), ``met`` (each headline figure against its target),
``within_target`` (runs within target, deterministic and with scatter), ``step_mape`` (as in
``steps_mape.json``), ``cost_model`` (its coefficients), ``runs`` (one row per run, as in
``table.csv``), ``ranking`` (per case), ``repeat`` (the second engine runs) and ``plots``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from experiments.fidelity_compare import (
    BAND_SLACK,
    GOODPUT_TARGET_PTS,
    LATENCY_TARGET,
    METRICS,
    NOISE_SEEDS,
    SENSITIVITY_SCALES,
    STEP_MAPE_TARGET,
    _err_key,
    _repo_path,
    engine_dates,
)
from experiments.fidelity_ranking import TIE_PTS, same_ranking

FORMAT = "horizon-fidelity-report"
VERSION = 1


def document(  # noqa: ANN001 - s: fidelity_compare._Setup; model: EngineCostModel
    s,
    *,
    step_mape: dict,
    model,
    cal_file: Path,
    table: list[dict],
    ranking: dict,
    result: dict,
    repeat: list[dict],
    noisy: list[list[dict]],
    dirs: dict,
) -> dict:
    """The report's document. ``dirs``: the engine runs' folder, the repeat's (or None) and
    the report's, as the page names them."""
    return {
        "format": FORMAT,
        "version": VERSION,
        "conditions": _conditions(s, dirs, cal_file),
        "targets": {
            "step_mape": STEP_MAPE_TARGET,
            "latency": LATENCY_TARGET,
            "goodput_pts": GOODPUT_TARGET_PTS,
            "tie_pts": TIE_PTS,
            "band_slack": BAND_SLACK,
        },
        "headline": result,
        "met": _met(result),
        "within_target": _within_target(table, noisy),
        "step_mape": step_mape,
        "cost_model": model.report(),
        "runs": table,
        "ranking": _ranking(ranking, table, repeat),
        "repeat": repeat,
        "plots": [f"{w}.png" for w in sorted({r["workload"] for r in table})],
    }


def _conditions(s, dirs: dict, cal_file: Path) -> dict:  # noqa: ANN001
    from experiments.fidelity import PRESETS

    m, meta = s.m, s.meta
    cases = [c for c in m.cases if c.role in ("calibration", "fidelity")]  # manifest order
    return {
        "engine": {
            "dir": dirs["engine"],
            "repeat_dir": dirs["repeat"],
            "loop": "pipelined" if s.pipelined else "serial",
            **engine_dates(list(s.metas.values())),
        },
        "gpu": meta["gpu"],
        "torch": meta.get("torch"),
        "triton": meta.get("triton"),
        "model": m.model,
        "scheduler": m.scheduler,
        "slo": {
            "ttft_s": m.ttft_slo,
            "itl_s": m.itl_slo,
            "preset": m.notes.get("slo_preset"),
            "goodput": "lifetime",
        },
        "cost_model": {"name": "linear, online steps", "file": _repo_path(cal_file)},
        "noise_seeds": list(NOISE_SEEDS),
        "sensitivity_scales": list(SENSITIVITY_SCALES),
        "cases": [
            {
                "name": c.name,
                "role": c.role,
                "workload": c.workload,
                "rate": c.rate,
                "seed": c.seed,
                "requests": s.runs[(c.name, c.policies[0])].num_requests,
                "max_time_s": c.max_time,
                "policies": list(c.policies),
            }
            for c in cases
        ],
        "report_dir": dirs["report"],
        # where export writes this shape's manifest (a shape without a preset: EXPORT_DIR)
        "inputs": PRESETS[m.model].out if m.model in PRESETS else "EXPORT_DIR",
    }


def _met(result: dict) -> dict[str, bool]:
    """Each headline figure against its target."""
    out = {"step_mape": result["step_mape"] <= STEP_MAPE_TARGET}
    out |= {f"{k}_err": result[f"{k}_err"] <= LATENCY_TARGET for k in METRICS}
    out["goodput_err_pts"] = result["goodput_err_pts"] <= GOODPUT_TARGET_PTS
    out["ranking_identical"] = bool(result["ranking_identical"])
    return out


def _within_target(table: list[dict], noisy: list[list[dict]]) -> dict:
    """Per error: the runs within target with the deterministic model, and their mean count
    over the noise seeds."""
    figures = {}
    for k in (*METRICS, "goodput_err_pts"):
        key = _err_key(k)
        tgt = GOODPUT_TARGET_PTS if k == "goodput_err_pts" else LATENCY_TARGET
        figures[key] = {
            "deterministic": int(sum(r[key] <= tgt for r in table)),
            "with_scatter": float(np.mean([sum(r[k] <= tgt for r in errs) for errs in noisy])),
        }
    return {"runs": len(table), "figures": figures}


def _ranking(ranking: dict, table: list[dict], repeat: list[dict]) -> dict:
    """Per case: whether the sides rank alike (the simulator and the engine; each against the
    engine's second runs where every policy ran again, else None), each policy's goodput on
    each side, and each side's gaps in points."""
    out = {}
    for name, v in ranking.items():
        again = {r["policy"]: r["goodput_lifetime"][1] for r in repeat if r["case"] == name}
        has_again = "engine_again" in v
        out[name] = {
            "identical": v["identical"],
            "band_per_side": v["band_per_side"],
            "sim_vs_engine_again": same_ranking(v["sim"], v["engine_again"]) if has_again else None,
            "engine_vs_engine_again": (
                same_ranking(v["engine"], v["engine_again"]) if has_again else None
            ),
            "goodput": {
                r["policy"]: {
                    "engine": r["goodput_lifetime_engine"],
                    "engine_again": again.get(r["policy"]),
                    "sim": r["goodput_lifetime_sim"],
                }
                for r in table
                if r["case"] == name
            },
            "gap_pts": {
                side: {f"{a} - {b}": gap for (a, b), gap in v[side].items()}
                for side in ("engine", "sim", "engine_again")
                if side in v
            },
        }
    return out

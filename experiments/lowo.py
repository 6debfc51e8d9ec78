"""Leave-one-workload-out: each step-cost model fitted without a workload, judged on its steps.

``python -m experiments.lowo`` writes ``results/lowo/lowo.json`` and ``table.md``. The committed
engine records of ``results/fidelity/engine*`` (H200; fcfs, horizon, memory_first; several
loads) are grouped by model and workload (the case name: ``first`` = ShareGPT first turns,
``multi`` = multi-turn sessions; ``cal_`` cases are the same workloads). For each held-out
workload both ``EngineCostModel`` and ``PhysicalCostModel`` are fitted on the *other* workloads'
steps only (not the calibration CSV, which holds every workload's steps); judged on the held-out
steps by bias (sum predicted / sum measured - 1) and MAPE.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import numpy as np

from horizon.metrics.records import RunRecords
from simulator.engine_cost_model import EngineCostModel, rows_of
from simulator.physical_cost_model import PhysicalCostModel

SOURCES = {
    "qwen2.5-7b": (
        "results/fidelity/engine_qwen2.5-7b",
        "results/fidelity/engine_qwen2.5-7b_repeat",
    ),
    "qwen2.5-0.5b": ("results/fidelity/engine", "results/fidelity/engine_repeat"),
}


def workload_rows(dirs: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Step rows per workload (``first``/``multi``) of every record under ``dirs``."""
    groups: dict[str, list] = defaultdict(list)
    for d in dirs:
        for path in sorted(Path(d).glob("*/*/records.npz")):
            case = path.parent.parent.name.removeprefix("cal_")
            groups[case.split("_r")[0]].append(RunRecords.load_npz(str(path)))
    return {w: rows_of(recs) for w, recs in groups.items()}


def judge(model, rows: np.ndarray) -> dict:  # noqa: ANN001 - anything with predict_rows
    rows = rows[(rows[:, 0] + rows[:, 1]) > 0]
    y, pred = rows[:, -1], model.predict_rows(rows)
    return {
        "bias": float(pred.sum() / y.sum() - 1),
        "mape": float(np.mean(np.abs(pred - y) / y)),
        "steps": len(y),
    }


def lowo(model_name: str, groups: dict[str, np.ndarray]) -> list[dict]:
    out = []
    for held in sorted(groups):
        train = np.concatenate([r for w, r in groups.items() if w != held])
        fits = {
            "engine": EngineCostModel.fit(train),
            "physical": PhysicalCostModel.fit(train, model=model_name),
        }
        for name, m in fits.items():
            out.append(
                {
                    "model": model_name,
                    "held_out": held,
                    "cost_model": name,
                    "train_steps": len(train),
                    **judge(m, groups[held]),
                }
            )
    return out


def table(rows: list[dict]) -> str:
    lines = [
        "| shape | held-out workload | cost model | steps | bias | MAPE |",
        "|---|---|---|---|---|---|",
    ]
    for r in sorted(rows, key=lambda r: (r["model"], -r["mape"])):
        lines.append(
            f"| {r['model']} | {r['held_out']} | {r['cost_model']} | {r['steps']} "
            f"| {r['bias']:+.2%} | {r['mape']:.2%} |"
        )
    return "\n".join(lines) + "\n"


def main(out: str = "results/lowo") -> None:
    rows = [r for m, dirs in SOURCES.items() for r in lowo(m, workload_rows(dirs))]
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / "lowo.json").write_text(
        json.dumps({"command": "python -m experiments.lowo", "rows": rows}, indent=1)
    )
    (Path(out) / "table.md").write_text(table(rows))
    print(table(rows))


if __name__ == "__main__":
    main()

"""The cluster cases' workloads on one engine replica alone, against the one-replica model.

    python -m experiments.cluster_fidelity export --alone   # gpu_inputs/cluster/n1/
    bash docs/notes/run_cluster.sh 1        # on the GPU (carry gpu_inputs/cluster)
    python -m experiments.cluster_fidelity tabulate ENGINE --out DIR   # ENGINE holds n1/ only
    python -m experiments.cluster_alone [--table results/cluster_fidelity]

``tabulate`` writes the one-replica cases to ``engine_alone.json`` and their steps to
``steps_n1_<workload>.csv.xz``. Here: the isolated model's (``cluster_fidelity.
isolated_cost_model``) step bias and MAPE on those steps, by step kind, and each case's figures
on the engine beside the simulator's (one replica, that model). Writes ``<table>/alone.json``
and prints a markdown table of it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from experiments import cluster_fidelity as cf

FIGURES = ("goodput", "ttft_mean", "itl_mean", "e2e_mean")


def step_bias(model, rows: np.ndarray) -> dict:  # noqa: ANN001 - an EngineCostModel
    """Per step kind: steps, the model's total over the measured total less 1 (%), MAPE (%)."""
    rows = rows[(rows[:, 0] + rows[:, 1]) > 0]
    pred, t = model.predict_rows(rows), rows[:, -1]
    out = {}
    for kind, m in (("decode", rows[:, 0] == 0), ("mixed", rows[:, 0] > 0)):
        out[kind] = {
            "steps": int(m.sum()),
            "bias_pct": 100 * float(pred[m].sum() / t[m].sum() - 1),
            "mape_pct": 100 * float(np.mean(np.abs(pred[m] - t[m]) / t[m])),
        }
    return out


def alone(table: Path) -> dict:
    """The document ``alone.json`` holds (module docstring)."""
    from horizon.workload import load_sharegpt, tokenize_corpus
    from simulator.engine_cost_model import read_steps

    model = cf.isolated_cost_model()
    cases = json.loads((table / "engine_alone.json").read_text())
    steps = {w: step_bias(model, read_steps(table / cf.steps_file(1, w))[0])
             for w in sorted({cf.parse_case(1, c["case"]).workload for c in cases})}  # fmt: skip
    cache = cf.REPO / "data" / "cache" / "sharegpt_qwen2.5.npz"
    tokenized = tokenize_corpus(load_sharegpt(), cache)
    rows = []
    for c in cases:
        sim = cf.figures(cf.simulate_case(cf.parse_case(1, c["case"]), model, tokenized))
        pairs = {k: {"engine": c["engine"][k], "sim": sim[k]} for k in FIGURES}
        rows.append({"case": c["case"], "meta": c["meta"], **pairs})
    return {"model": "isolated (one replica alone, engine-fitted)", "steps": steps, "cases": rows}


def render(doc: dict) -> str:
    """Two markdown tables: the step bias by workload and kind, the cases' figures."""
    lines = ["| workload | kind | steps | model bias | MAPE |", "|---|---|---|---|---|"]
    for w, kinds in doc["steps"].items():
        for kind, s in kinds.items():
            lines.append(f"| {w} | {kind} | {s['steps']} | {s['bias_pct']:+.1f}% | "
                         f"{s['mape_pct']:.1f}% |")  # fmt: skip
    lines += ["", "| case | goodput engine / sim | mean TTFT ms | mean ITL ms | mean E2E s |",
              "|---|---|---|---|---|"]  # fmt: skip
    for r in doc["cases"]:
        g, t, i, e = (r[k] for k in FIGURES)
        lines.append(
            f"| {r['case']} | {g['engine']:.3f} / {g['sim']:.3f} | {1e3 * t['engine']:.1f} / "
            f"{1e3 * t['sim']:.1f} | {1e3 * i['engine']:.2f} / {1e3 * i['sim']:.2f} | "
            f"{e['engine']:.2f} / {e['sim']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--table", default=str(cf.REPO / "results" / "cluster_fidelity"))
    args = ap.parse_args(argv)
    table = Path(args.table)
    doc = alone(table)
    (table / "alone.json").write_text(json.dumps(doc, separators=(",", ":")) + "\n")
    print(render(doc))


if __name__ == "__main__":
    main()

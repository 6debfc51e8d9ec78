"""Carry a workload to the GPU engine and bring its run back as a run directory.

    python -m experiments.engine_runs export OUT.json [hydra overrides...]
    python -m experiments.engine_runs import ENGINE_DIR RUN_DIR [hydra overrides...]

``export`` builds the requests of a run config (the same overrides as ``experiments.run``) and
saves them (``horizon.workload.requests_file``) for ``experiments.engine_replay`` on the GPU
machine.
``import`` reads what the replay wrote (``records.npz``, ``meta.json``) and writes the run
directory layout of a simulator run (records as Parquet, ``summary.json`` with the metrics under
the config's SLO), with ``backend: engine``, so ``experiments.plot`` and the comparison read both
alike. Give ``import`` the overrides the export used (policy included): the summary names them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from experiments.components import build_components
from experiments.config_store import run_config
from experiments.run_dir import SUMMARY, write_run_dir
from experiments.runner import RunResult
from experiments.workloads import DataSources, make_workload
from horizon.metrics import RunRecords, summarize
from horizon.workload.requests_file import save_requests


def export(path: str, overrides: list[str]) -> int:
    cfg = run_config(overrides)
    workload = make_workload(cfg, DataSources(cfg.data))
    save_requests(workload.new_requests(), path)
    return len(workload.requests)


def import_run(engine_dir: str, run_dir: str, overrides: list[str]) -> dict:
    cfg = run_config(overrides)
    meta = json.loads((Path(engine_dir) / "meta.json").read_text())
    records = RunRecords.load_npz(str(Path(engine_dir) / "records.npz"))
    records.check()
    sources = DataSources(cfg.data)
    parts = build_components(cfg, sources)
    workload = make_workload(cfg, sources)
    if len(workload.requests) != records.num_requests:
        raise ValueError(
            f"{engine_dir} has {records.num_requests} requests, the config builds "
            f"{len(workload.requests)}: give import the overrides the export used"
        )
    result = RunResult(records, summarize(records, slo=parts.slo), 0, float(meta["wall_s"]))
    summary = write_run_dir(run_dir, cfg, parts, workload, result)
    summary["run"].update(backend="engine", cost_model="measured", gpu=meta["gpu"], engine=meta)
    (Path(run_dir) / SUMMARY).write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) >= 2 and args[0] == "export":
        n = export(args[1], args[2:])
        print(f"wrote {n} requests to {args[1]}")
    elif len(args) >= 3 and args[0] == "import":
        s = import_run(args[1], args[2], args[3:])
        print(f"{args[2]}: lifetime goodput {s['metrics']['goodput_lifetime']:.3f}")
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main()

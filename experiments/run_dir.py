"""A run's directory: its records, its summary and its resolved config.

    <run dir>/
        config.yaml     the run's typed config, resolved (what to pass to reproduce it)
        summary.json    {"run": identity, "goodput": kinds, "workload": stats, "metrics": ...}
        records/        RunRecords (experiments.records_io)

``run.py`` writes one beside Hydra's ``.hydra/``; ``sweep.py`` writes one per grid point. Readers
find runs by their ``summary.json``, recursively, so any mix of sweep, multirun and single-run
directories can be tabulated and plotted together.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable
from pathlib import Path

from omegaconf import OmegaConf

from experiments.components import Components
from experiments.config import RunConfig
from experiments.length_predictor import predictor_identity
from experiments.records_io import write_records
from experiments.runner import RunResult
from horizon.request import SLO
from horizon.workload import Workload

SUMMARY = "summary.json"
RECORDS = "records"
CONFIG = "config.yaml"


def goodput_kinds(slo: SLO) -> dict[str, str]:
    """What ``goodput_lifetime`` and ``goodput_tpot`` mean for this SLO, in words."""
    ttft, itl = f"{slo.ttft:g} s", f"{slo.itl * 1e3:g} ms"
    return {
        "goodput_lifetime": f"lifetime: finished, TTFT <= {ttft} and every ITL <= {itl}; "
        "share of arrived requests",
        "goodput_tpot": f"TPOT (vLLM --goodput ttft:{slo.ttft * 1e3:g} tpot:{slo.itl * 1e3:g}): "
        f"finished, TTFT <= {ttft} and mean TPOT <= {itl}; share of arrived requests",
    }


def run_identity(cfg: RunConfig, parts: Components) -> dict:
    """Who the run is: what a table groups by and a figure's title names."""
    return {
        "policy": cfg.policy.name,
        "policy_options": dict(cfg.policy.options),
        "policy_label": cfg.policy.label,
        "policy_reads_true_length": parts.policy.reads_true_length,  # an oracle upper bound
        # what a reserving policy held back per request, as it ran (memory_first's cap)
        "policy_reservation": getattr(parts.policy, "reservation", None),
        "rate": cfg.rate,
        "seed": cfg.seed,
        "num_requests": cfg.num_requests,
        "workload": cfg.workload.name,
        "model": parts.shape.name,
        "gpu": parts.gpu.name,
        "num_blocks": parts.scheduler.num_blocks,
        "num_blocks_from": "config"
        if cfg.model.num_blocks is not None
        else (f"gpu_memory_utilization={cfg.model.gpu_memory_utilization}"),
        "block_size": parts.scheduler.block_size,
        "slo": {"name": cfg.slo.name, "ttft": parts.slo.ttft, "itl": parts.slo.itl},
        "backend": cfg.backend.name,
        "cost_model": cfg.backend.cost_model,
        "cost_model_options": dict(cfg.backend.cost_model_options),
        # the fitted model's files and their SHA-256 (engine_fitted: fitted once per file)
        "cost_model_provenance": getattr(parts.cost_model, "provenance", None),
        "step_mode": cfg.backend.step_mode,
        "max_time": cfg.backend.max_time,
        "conversations": cfg.workload.conversations,
        **predictor_identity(parts.predictor, cfg.policy.predictor_config),
    }


def write_run_dir(
    directory: str | Path,
    cfg: RunConfig,
    parts: Components,
    workload: Workload,
    result: RunResult,
) -> dict:
    """Write ``directory`` and return the summary written.

    A new directory appears whole or not at all (written as ``<name>.partial``, then renamed),
    so a run that fails while writing leaves nothing named like a run; an existing one (hydra's
    run directory, holding ``.hydra/``) is written into."""
    directory = Path(directory)
    if directory.exists():
        return _write(directory, cfg, parts, workload, result)
    partial = directory.with_name(directory.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)  # a leftover of a killed run
    partial.mkdir(parents=True)
    summary = _write(partial, cfg, parts, workload, result)
    partial.rename(directory)
    return summary


def _write(
    directory: Path, cfg: RunConfig, parts: Components, workload: Workload, result: RunResult
) -> dict:
    write_records(result.records, directory / RECORDS)
    summary = {
        "run": run_identity(cfg, parts),
        "goodput": goodput_kinds(parts.slo),
        "wall_s": result.wall_s,
        "stalled": result.stalled,
        "workload": workload.stats,
        "metrics": result.metrics,
    }
    (directory / SUMMARY).write_text(json.dumps(summary, indent=2) + "\n")
    (directory / CONFIG).write_text(OmegaConf.to_yaml(OmegaConf.structured(cfg)))
    return summary


def find_run_dirs(paths: Iterable[str | Path]) -> list[Path]:
    """Every directory under ``paths`` (or equal to one) holding a ``summary.json``, sorted.

    Raises:
        FileNotFoundError: a path does not exist.
        ValueError: no run directory was found.
    """
    found: set[Path] = set()
    for p in map(Path, paths):
        if not p.exists():
            raise FileNotFoundError(f"no such directory: {p}")
        found.update(s.parent for s in p.rglob(SUMMARY) if not s.parent.name.endswith(".partial"))
    if not found:
        raise ValueError(f"no {SUMMARY} under {', '.join(map(str, paths))}")
    return sorted(found)


def read_summary(run_dir: str | Path) -> dict:
    return json.loads((Path(run_dir) / SUMMARY).read_text())

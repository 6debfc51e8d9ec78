"""One simulator run, configured by Hydra (``configs/run.yaml``).

    python -m experiments.run                                  # the documented setting, fcfs
    python -m experiments.run policy=horizon rate=60 seed=1
    python -m experiments.run -m policy=fcfs,horizon rate=40,60 hydra/launcher=joblib
    python -m experiments.run --config-dir myconfigs policy=mylab_lwf   # a policy of one's own

Writes the run directory (``run_dir.py``) into Hydra's output directory, beside ``.hydra/``,
and the run's one-line result into ``run.log`` there. Every launcher runs the same job
(``jobs.run_job``): a user error is one line and exit status 2; a failed job of a multirun is
named at the end while the others keep their results.
"""

from __future__ import annotations

import logging
from pathlib import Path

import hydra
from omegaconf import DictConfig

from experiments.components import build_components
from experiments.config import RunConfig
from experiments.config_store import register_configs
from experiments.jobs import run_job
from experiments.run_dir import write_run_dir
from experiments.runner import simulate
from experiments.workloads import DataSources, make_workload

log = logging.getLogger(__name__)


def execute(cfg: RunConfig, out_dir: str | Path) -> dict:
    """Build, simulate and write one run; returns its summary.

    The workload is built first: a request count the data cannot supply fails before a
    predictor is trained."""
    sources = DataSources(cfg.data)
    workload = make_workload(cfg, sources)
    parts = build_components(cfg, sources)
    result = simulate(cfg, workload, parts)
    return write_run_dir(out_dir, cfg, parts, workload, result)


def _run(cfg: RunConfig, out_dir: Path) -> dict:
    log.info("setting: %s", setting_line(cfg))
    summary = execute(cfg, out_dir)
    m = summary["metrics"]
    log.info(
        "%s rate=%g seed=%d: goodput lifetime %.3f, TPOT %.3f (%.2f s) -> %s",
        cfg.policy.label,
        cfg.rate,
        cfg.seed,
        m["goodput_lifetime"],
        m["goodput_tpot"],
        summary["wall_s"],
        out_dir,
    )
    return summary


def setting_line(cfg: RunConfig) -> str:
    """What the run simulates, in one line (also in its summary.json)."""
    blocks = cfg.model.num_blocks if cfg.model.num_blocks is not None else "from GPU memory"
    return (
        f"{cfg.model.shape} on {cfg.model.gpu}, {blocks} KV blocks, "
        f"{cfg.workload.name} ({cfg.workload.conversations} conversations), "
        f"{cfg.num_requests} requests, SLO TTFT <= {cfg.slo.ttft:g} s and every ITL <= "
        f"{cfg.slo.itl * 1e3:g} ms, cost model {cfg.backend.cost_model}"
    )


@hydra.main(config_path="../configs", config_name="run", version_base="1.3")
def main(dict_cfg: DictConfig) -> dict | None:
    return run_job(dict_cfg, _run)


if __name__ == "__main__":
    register_configs()
    main()

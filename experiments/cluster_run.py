"""One simulated cluster run, configured by hydra (``configs/cluster_run.yaml``).

    python -m experiments.cluster_run                                   # 4 x 7B, least_loaded
    python -m experiments.cluster_run router=prefix_aware traffic=shared_prefix load=35
    python -m experiments.cluster_run -m router=round_robin,prefix_aware,weighted load=25,35
    python -m experiments.cluster_run router.name=mylab.routers:MyRouter  # a router of one's own

Writes ``summary.json`` (cluster and per-replica figures, the setting) into hydra's output
directory. The workloads and parts are the studies' (``experiments.cluster_study``).
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict
from pathlib import Path

import hydra
from omegaconf import DictConfig

from experiments.cluster_config import ClusterRunConfig
from experiments.cluster_settings import SETTINGS, Setting
from experiments.cluster_setup import build_router, simulate_cluster
from experiments.config_store import register_configs
from experiments.jobs import run_job

log = logging.getLogger(__name__)


def execute(cfg: ClusterRunConfig, out_dir: Path) -> dict:
    from experiments.cluster_study import Inputs, Task
    from horizon.cluster.metrics import cluster_summary
    from horizon.request import SLO

    inputs = Inputs()
    options = SETTINGS[cfg.traffic].options  # the studies' workload of that kind
    setting = Setting("run", "run", cfg.traffic, (cfg.load,), options=options)
    task = Task("run", "run", cfg.load, cfg.seed, cfg.requests, cfg.sessions)
    requests, sessions = inputs.workload(setting, task)
    uses = cfg.router.name == "horizon"
    setups = [
        s.setup(inputs.predictor() if uses else None, inputs.cost_models)
        for s in cfg.cluster.specs()
    ]
    router = build_router(
        cfg.router.name, dict(cfg.router.options), cfg.slo_ttft, inputs.predictor if uses else None
    )
    rec = simulate_cluster(setups, router, requests, sessions, cfg.cluster.view_delay)
    summary = {"setting": asdict(cfg), **cluster_summary(rec, SLO(cfg.slo_ttft, cfg.slo_itl))}
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    log.info(
        "%s, %s at %g: cluster goodput %.3f, hit rate %.3f -> %s",
        cfg.router.name,
        cfg.traffic,
        cfg.load,
        summary["goodput"],
        summary["prefix_hit_rate"],
        out_dir,
    )
    return summary


@hydra.main(config_path="../configs", config_name="cluster_run", version_base="1.3")
def main(dict_cfg: DictConfig) -> dict | None:
    return run_job(dict_cfg, execute)


if __name__ == "__main__":
    register_configs()
    main()

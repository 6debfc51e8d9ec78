"""One simulator run, configured by Hydra (``configs/run.yaml``).

    python -m experiments.run policy=fcfs workload=sharegpt_first_turn model=qwen2.5-7b \\
        slo=h200_7b backend=sim rate=20 seed=0
    python -m experiments.run -m policy=fcfs,sjf_prompt rate=10,40 seed=0,1   # basic launcher

Writes the run directory (``run_dir.py``) into Hydra's output directory, beside ``.hydra/``.
"""

from __future__ import annotations

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from experiments.components import build_components
from experiments.config import RunConfig
from experiments.config_store import register_configs
from experiments.run_dir import write_run_dir
from experiments.runner import simulate
from experiments.workloads import DataSources, make_workload


def execute(cfg: RunConfig, out_dir: str) -> dict:
    """Build, simulate and write one run; returns its summary."""
    sources = DataSources(cfg.data)
    parts = build_components(cfg, sources)
    workload = make_workload(cfg, sources)
    result = simulate(cfg, workload, parts)
    return write_run_dir(out_dir, cfg, parts, workload, result)


@hydra.main(config_path="../configs", config_name="run", version_base="1.3")
def main(dict_cfg: DictConfig) -> None:
    cfg = OmegaConf.to_object(dict_cfg)
    assert isinstance(cfg, RunConfig)
    out_dir = HydraConfig.get().runtime.output_dir
    summary = execute(cfg, out_dir)
    m = summary["metrics"]
    print(
        f"{cfg.policy.label} rate={cfg.rate:g} seed={cfg.seed}: "
        f"goodput lifetime {m['goodput_lifetime']:.3f}, TPOT {m['goodput_tpot']:.3f} "
        f"({summary['wall_s']:.2f} s) -> {out_dir}"
    )


if __name__ == "__main__":
    register_configs()
    main()

"""The main job: every policy x rate x seed of a grid, in one process (``configs/sweep.yaml``).

    python -m experiments.sweep                 # the default KV-bound grid (sweep=kv_bound)
    python -m experiments.sweep sweep=quick     # a smoke test
    python -m experiments.sweep model.num_blocks=5000 sweep.seeds=[0]

The tokenized corpus is loaded once, a workload is built per (rate, seed) and every run gets
fresh requests and a fresh policy. Each run's directory (``run_dir.py``) goes to
``<sweep dir>/runs/``; the table and figures (``plot.report``) to the sweep dir. Group choices and
overrides given here apply to every run, except ``policy``, ``rate``, ``seed`` and
``num_requests``, which the grid sets.
"""

from __future__ import annotations

import time
from pathlib import Path

import hydra
from hydra import compose
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from experiments.components import build_components
from experiments.config import PolicyConfig, SweepConfig
from experiments.config_store import register_configs
from experiments.plot import report
from experiments.run_dir import write_run_dir
from experiments.runner import simulate
from experiments.workloads import DataSources, make_workload

GRID_KEYS = ("policy", "policy.name", "rate", "seed", "num_requests")


def grid_policies(cfg: SweepConfig, overrides: list[str]) -> dict[str, PolicyConfig]:
    """Each of ``cfg.sweep.policies`` (``policy/`` options) as composed with ``overrides``.

    Raises:
        ValueError: an override sets what the grid sets.
    """
    for o in overrides:
        key = o.lstrip("+~").split("=", 1)[0]
        if key in GRID_KEYS:
            raise ValueError(
                f"{key} is set by the sweep grid, not by the override {o!r}: use "
                "sweep.policies=[...], sweep.rates=[...], sweep.seeds=[...], sweep.num_requests=N"
            )
    policies = {}
    for option in cfg.sweep.policies:
        composed = OmegaConf.to_object(compose("sweep", overrides=[*overrides, f"policy={option}"]))
        assert isinstance(composed, SweepConfig)
        policies[option] = composed.policy
    return policies


def run_grid(cfg: SweepConfig, policies: dict[str, PolicyConfig], sweep_dir: Path) -> None:
    """Run every grid point, writing ``sweep_dir/runs/<policy option>_rate<r>_seed<s>/``."""
    grid = cfg.sweep
    sources = DataSources(cfg.data)
    i = 0
    for rate in grid.rates:
        for seed in grid.seeds:
            base = cfg.run_config(rate=rate, seed=seed, num_requests=grid.num_requests)
            workload = make_workload(base, sources)
            for option, policy in policies.items():
                i += 1
                run_cfg = cfg.run_config(
                    policy=policy, rate=rate, seed=seed, num_requests=grid.num_requests
                )
                parts = build_components(run_cfg, sources)
                result = simulate(run_cfg, workload, parts)
                run_dir = sweep_dir / "runs" / f"{option}_rate{rate:g}_seed{seed}"
                write_run_dir(run_dir, run_cfg, parts, workload, result)
                m = result.metrics
                print(
                    f"run {i}/{grid.size}: {option:12s} rate {rate:6g} seed {seed}: "
                    f"goodput lifetime {m['goodput_lifetime']:.3f} TPOT {m['goodput_tpot']:.3f}"
                    f"  ({result.wall_s:.2f} s)",
                    flush=True,
                )


@hydra.main(config_path="../configs", config_name="sweep", version_base="1.3")
def main(dict_cfg: DictConfig) -> None:
    start = time.perf_counter()
    cfg = OmegaConf.to_object(dict_cfg)
    assert isinstance(cfg, SweepConfig)
    hc = HydraConfig.get()
    sweep_dir = Path(hc.runtime.output_dir)
    policies = grid_policies(cfg, list(hc.overrides.task))
    print(
        f"sweep: {cfg.sweep.size} runs ({len(policies)} policies x {len(cfg.sweep.rates)} rates "
        f"x {len(cfg.sweep.seeds)} seeds, {cfg.sweep.num_requests} requests each) -> {sweep_dir}",
        flush=True,
    )
    run_grid(cfg, policies, sweep_dir)
    for path in report([sweep_dir / "runs"], sweep_dir):
        print(f"wrote {path}")
    print(f"sweep done in {time.perf_counter() - start:.1f} s: {sweep_dir}")


if __name__ == "__main__":
    register_configs()
    main()

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

import sys
import time
from pathlib import Path

import hydra
from hydra import compose
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from experiments.components import build_components
from experiments.config import SweepConfig
from experiments.config_store import register_configs
from experiments.errors import one_line
from experiments.jobs import run_job
from experiments.plot import report
from experiments.policy_config import PolicyConfig
from experiments.run import setting_line
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


def run_grid(
    cfg: SweepConfig, policies: dict[str, PolicyConfig], sweep_dir: Path
) -> list[tuple[str, str]]:
    """Run every grid point, writing ``sweep_dir/runs/<policy option>_rate<r>_seed<s>/``.

    A run that fails is skipped (no directory is left for it) and the others go on; returns
    the failed runs' names and one-line errors. The first workload is built before anything
    runs, so a request count the data cannot supply fails before a predictor is trained."""
    grid = cfg.sweep
    sources = DataSources(cfg.data)
    make_workload(cfg.run_config(num_requests=grid.num_requests), sources)  # fail fast
    failed: list[tuple[str, str]] = []
    done = 0
    bar = tqdm(total=grid.size, desc="sweep", unit="run", disable=None, file=sys.stderr)
    with bar:  # seed-major: one seed's requests at every load in a row (a predictor's memo holds)
        for seed in grid.seeds:
            for rate in grid.rates:
                base = cfg.run_config(rate=rate, seed=seed, num_requests=grid.num_requests)
                workload = make_workload(base, sources)
                for option, policy in policies.items():
                    name = f"{option}_rate{rate:g}_seed{seed}"
                    run_cfg = cfg.run_config(
                        policy=policy, rate=rate, seed=seed, num_requests=grid.num_requests
                    )
                    try:
                        line = _run_point(run_cfg, workload, sources, sweep_dir / "runs" / name)
                    except Exception as e:  # one run's failure must not lose the others
                        failed.append((name, one_line(e)))
                        line = f"{name}: FAILED: {one_line(e)}"
                    bar.update()
                    done += 1
                    tqdm.write(f"run {done}/{grid.size}: {line}", file=sys.stdout)
    return failed


def _run_point(cfg, workload, sources: DataSources, run_dir: Path) -> str:  # noqa: ANN001
    parts = build_components(cfg, sources)
    result = simulate(cfg, workload, parts)
    write_run_dir(run_dir, cfg, parts, workload, result)
    m = result.metrics
    return (
        f"{run_dir.name}: goodput lifetime {m['goodput_lifetime']:.3f} "
        f"TPOT {m['goodput_tpot']:.3f}  ({result.wall_s:.2f} s)"
    )


def _sweep(cfg: SweepConfig, sweep_dir: Path) -> None:
    start = time.perf_counter()
    policies = grid_policies(cfg, list(HydraConfig.get().overrides.task))
    print(
        f"sweep: {cfg.sweep.size} runs ({len(policies)} policies x {len(cfg.sweep.rates)} rates "
        f"x {len(cfg.sweep.seeds)} seeds, {cfg.sweep.num_requests} requests each) -> {sweep_dir}",
        flush=True,
    )
    print(f"setting: {setting_line(cfg.run_config(num_requests=cfg.sweep.num_requests))}")
    failed = run_grid(cfg, policies, sweep_dir)
    if len(failed) < cfg.sweep.size:
        for path in report([sweep_dir / "runs"], sweep_dir):
            print(f"wrote {path}")
    print(f"sweep done in {time.perf_counter() - start:.1f} s: {sweep_dir}")
    if failed:
        print(f"{len(failed)} of {cfg.sweep.size} runs failed:", file=sys.stderr)
        for name, line in failed:
            print(f"  {name}: {line}", file=sys.stderr)
        raise SystemExit(1)


@hydra.main(config_path="../configs", config_name="sweep", version_base="1.3")
def main(dict_cfg: DictConfig) -> None:
    run_job(dict_cfg, _sweep)


if __name__ == "__main__":
    register_configs()
    main()

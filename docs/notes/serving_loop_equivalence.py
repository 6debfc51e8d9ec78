"""Lab note (2026-12-01): digests of simulator records over 324 configurations, to check that
the one serving loop (horizon.serving_loop, 9d946f2) simulates exactly as the simulator's own
loop did before it (1526ecd). Run it from the root of each tree (cwd first on sys.path),
e.g. ``git worktree add /tmp/base 1526ecd``, then
``(cd /tmp/base && python /path/to/this.py /tmp/base.json)`` and
``python docs/notes/serving_loop_equivalence.py /tmp/new.json``, and compare the two JSON files:
every digest was equal. ROOT: a checkout holding the calibration files and golden logs."""

import itertools
import json
import sys
from pathlib import Path

sys.path.insert(0, ".")
import numpy as np

from horizon.metrics.records import RunRecords
from horizon.model_shape import model_shape
from horizon.policies import make_policy
from horizon.request import Request
from horizon.scheduler_config import SchedulerConfig
from horizon.workload.requests_file import load_requests
from predictors import make_predictor
from simulator import Simulation, gpu_spec, make_cost_model
from simulator.replay_cost_model import ReplayCostModel

ROOT = Path(__file__).resolve().parents[2]  # this checkout (calibration, golden logs)
shape, gpu = model_shape("qwen2.5-7b"), gpu_spec("H200")


def reqs(n, rate, seed):
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1 / rate, n))
    p = rng.integers(5, 900, n)
    o = rng.integers(2, 700, n)
    return [Request(i, float(t[i]), int(p[i]), 2048, int(o[i])) for i in range(n)]


def policy(name):
    if name == "horizon":
        return make_policy("horizon", predictor=make_predictor("oracle"), ttft_slo=1.0)
    if name == "horizon_noisy":
        return make_policy(
            "horizon", predictor=make_predictor("noisy_oracle", sigma=0.5, seed=1), ttft_slo=1.0
        )
    return make_policy(name)


costs = {
    "roofline": lambda: make_cost_model("roofline", shape=shape, gpu=gpu),
    "engine": lambda: make_cost_model(
        "engine_fitted",
        shape=shape,
        gpu=gpu,
        path=str(ROOT / "calibration/h200_qwen2.5-7b_online.csv.gz"),
    ),
    "noisy": lambda: make_cost_model(
        "engine_fitted",
        shape=shape,
        gpu=gpu,
        path=str(ROOT / "calibration/h200_qwen2.5-7b_online.csv.gz"),
        noise_seed=3,
    ),
}
out = {}
for pol, cost, pipe, hold, load, mt, mode in itertools.product(
    ["fcfs", "sjf_prompt", "memory_first", "horizon", "oracle_srpt", "horizon_noisy"],
    list(costs),
    [False, True],
    [False, True],
    [(400, 8.0), (1500, 120.0)],
    [None, 6.0],
    ["event", "reference"],
):
    if mode == "reference" and (cost != "engine" or pol not in ("fcfs", "horizon")):
        continue
    n, rate = load
    cfg = SchedulerConfig(num_blocks=1500, step_mode=mode)
    rec = Simulation(
        reqs(n, rate, 1),
        cfg,
        policy(pol),
        costs[cost](),
        max_time=mt,
        check_every=50,
        arrivals_at_step_boundaries=hold,
        pipelined=pipe,
    ).run()
    out[f"{pol}/{cost}/pipe{pipe}/hold{hold}/{n}/{mt}/{mode}"] = rec.digest()
# the golden engine logs replayed (wake_delay path)
g = ROOT / "tests/data/golden"
m = json.loads((g / "manifest.json").read_text())
sc = SchedulerConfig(**m["scheduler"])
for case in ("golden_first_r40", "golden_burst_r800"):
    for p in ("fcfs", "horizon"):
        log = RunRecords.load_npz(str(g / f"{case}.{p}.npz"))
        pol = policy(p)
        sim = Simulation(
            load_requests(g / f"{case}.json"),
            sc,
            pol,
            ReplayCostModel(log.step_start, log.step_end, pipelined=True),
            arrivals_at_step_boundaries=True,
            pipelined=True,
        )
        out[f"golden/{case}/{p}"] = sim.run().digest()
with open(sys.argv[1], "w") as f:
    json.dump(out, f, indent=1)
print(len(out), "configs")

"""Lab note (2026-12-01): the engine's serving loop before (its own serial and pipelined loops,
``executor/engine.py`` at 1526ecd, saved beside this file as old_engine.py by
``git show 1526ecd:executor/engine.py > old_engine.py``) and after (``horizon.serving_loop``):
same model (0.5B shape, random weights), same requests, alternating; greedy tokens offline and
step times online. Run on the GPU machine from the repository root:
``python3 docs/notes/serving_loop_ab.py`` (writes $OUT/loop_ab.json; result kept as
results/engine/serving_loop_ab.json)."""

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import numpy as np
import old_engine
import torch

from executor.bench import device_random_weights
from executor.engine import Engine, EngineConfig
from executor.model import CausalLM, ModelConfig
from horizon.policies import make_policy
from horizon.request import Request
from predictors import make_predictor


def reqs(n, rate, seed):
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1 / rate, n)) if rate else np.zeros(n)
    p = rng.integers(16, 700, n)
    o = rng.integers(8, 500, n)
    return [Request(i, float(t[i]), int(p[i]), 2048, int(o[i])) for i in range(n)]


def pol(name):
    return (
        make_policy("horizon", predictor=make_predictor("oracle"), ttft_slo=0.25)
        if name == "horizon"
        else make_policy(name)
    )


cfg = ModelConfig.for_preset("qwen2.5-0.5b")
model = CausalLM(cfg, device="cuda", dtype=torch.bfloat16)
device_random_weights(model, seed=0)
ec = EngineConfig(num_blocks=1500, max_model_len=4096)
engines = {"old": old_engine.Engine(model, ec), "new": Engine(model, ec)}
for e in engines.values():
    e.warmup()
out, rows = {}, []
# offline greedy: identical tokens
for name, e in engines.items():
    rec = e.run_offline(reqs(200, 0, 1), pol("fcfs"))
    rec.check()
    out[name] = {k: list(v) for k, v in e.outputs.items()}
same = out["old"] == out["new"]
print("offline greedy outputs identical:", same, flush=True)
# online A/B, alternating, two rounds, two policies
for rnd in range(2):
    for policy in ("fcfs", "horizon"):
        for name in ("old", "new") if rnd == 0 else ("new", "old"):
            e = engines[name]
            t0 = time.perf_counter()
            rec = e.run_online(reqs(2000, 160.0, 7), pol(policy))
            wall = time.perf_counter() - t0
            rec.check()
            d = 1e3 * rec.step_durations()
            mixed = rec.prefill_tokens > 0
            gaps = np.diff(np.concatenate([[0.0], rec.step_end]))
            rows.append(
                dict(
                    round=rnd,
                    policy=policy,
                    loop=name,
                    wall_s=round(wall, 2),
                    steps=len(d),
                    finished=int((rec.status == 0).sum()),
                    preemptions=int(rec.num_preemptions.sum()),
                    decode_ms=round(float(d[~mixed].mean()), 4),
                    mixed_ms=round(float(d[mixed].mean()), 4),
                    last_token_s=round(float(rec.step_end[-1]), 3),
                )
            )
            print(rows[-1], flush=True)
with open(os.path.join(os.environ.get("OUT", "."), "loop_ab.json"), "w") as f:
    doc = {"offline_identical": same, "rows": rows, "gpu": torch.cuda.get_device_name()}
    json.dump(doc, f, indent=1)
print("\nloop  policy   decode ms  mixed ms  wall s   (means of the two rounds)")
for policy in ("fcfs", "horizon"):
    for name in ("old", "new"):
        r = [x for x in rows if x["policy"] == policy and x["loop"] == name]
        dec, mix, wall = (np.mean([x[k] for x in r]) for k in ("decode_ms", "mixed_ms", "wall_s"))
        print(f"{name:4s}  {policy:8s} {dec:.4f}  {mix:.4f}  {wall:.2f}")

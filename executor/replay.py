"""Replay a saved workload online on the engine (GPU), for the sim-vs-engine comparison.

    python -m executor.replay --requests runs.json --model qwen2.5-0.5b --policy fcfs \\
        --num-blocks 1500 --out DIR

Arrivals are replayed on the wall clock (``Engine.run_online``), output lengths are forced to the
trace's, weights are seeded random (step cost does not depend on their values). Writes
``DIR/<policy>/records.npz`` (numpy only: the GPU machine has no pyarrow) and ``meta.json``;
``python -m experiments.import_engine_run DIR/<policy> --slo ...`` turns them into a run directory
that ``experiments.plot`` reads like a simulator run.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from executor.bench import device_random_weights
from executor.engine import Engine, EngineConfig
from executor.model import CausalLM, ModelConfig
from horizon.policies import make_policy
from horizon.workload.requests_file import load_requests


def _policy(name: str, ttft: float):  # noqa: ANN202
    if name == "horizon_oracle":
        from predictors import make_predictor

        return make_policy("horizon", predictor=make_predictor("oracle"), ttft_slo=ttft)
    return make_policy(name)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", required=True)
    ap.add_argument("--model", default="qwen2.5-0.5b")
    ap.add_argument("--policy", action="append", required=True)
    ap.add_argument("--num-blocks", type=int, required=True)
    ap.add_argument("--ttft-slo", type=float, default=0.25)
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda", help="cpu: a slow dry run (torch attention)")
    ap.add_argument("--limit", type=int, default=None, help="replay only the first N requests")
    args = ap.parse_args(argv)
    cfg = ModelConfig.for_preset(args.model)
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    model = CausalLM(cfg, device=args.device, dtype=dtype)
    device_random_weights(model, seed=0)
    engine = Engine(model, EngineConfig(num_blocks=args.num_blocks, max_model_len=4096))
    engine.warmup()
    for name in args.policy:
        requests = load_requests(args.requests)[: args.limit]
        t0 = time.perf_counter()
        rec = engine.run_online(requests, _policy(name, args.ttft_slo))
        wall = time.perf_counter() - t0
        rec.check()
        out = Path(args.out) / name
        out.mkdir(parents=True, exist_ok=True)
        rec.save_npz(str(out / "records.npz"))
        meta = {
            "policy": name,
            "model": args.model,
            "gpu": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
            "num_blocks": args.num_blocks,
            "requests_file": args.requests,
            "num_requests": len(requests),
            "wall_s": wall,
            "torch": torch.__version__,
        }
        (out / "meta.json").write_text(json.dumps(meta, indent=1))
        fin = int((rec.status == 0).sum())
        print(f"{name}: {fin}/{len(requests)} finished, {len(rec.step_end)} steps, {wall:.1f} s")


if __name__ == "__main__":
    main()

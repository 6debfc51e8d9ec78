"""Replay saved workloads online on the engine (GPU), for the sim-vs-engine comparison.

    python -m experiments.engine_replay --requests runs.json --model qwen2.5-0.5b \\
        --policy fcfs --policy horizon --predictor oracle --num-blocks 1500 --out DIR
    python -m experiments.engine_replay --manifest DIR/manifest.json --out DIR2 [--role fidelity]

Arrivals are replayed on the wall clock (``Engine.run_online``), output lengths are forced to the
trace's, weights are seeded random (step cost does not depend on their values). Writes
``DIR/<policy>/records.npz`` (numpy only: the GPU machine has no pyarrow) and ``meta.json``
(with ``--manifest``: ``DIR2/<case>/<policy>/``, every case and policy of the manifest, see
``experiments.fidelity_manifest``). ``python -m experiments.engine_runs import`` turns a run into
a run directory that ``experiments.plot`` reads like a simulator run; ``python -m
experiments.fidelity compare`` reads a manifest's runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import torch

from executor.bench import device_random_weights
from executor.engine import Engine, EngineConfig
from executor.model import CausalLM, ModelConfig
from horizon.workload.requests_file import load_requests


def _policy(name: str, predictor: str | None, ttft: float):  # noqa: ANN202
    """A policy by name or import path, by the one factory; ``predictor`` (a predictor that
    needs no training, e.g. ``oracle``) goes to a policy that takes one."""
    from experiments.policy_config import PolicyConfig
    from experiments.policy_factory import build_policy, ready_predictor
    from horizon.policies.registry import POLICIES
    from horizon.registry import takes

    takes_one = predictor is not None and takes(POLICIES.resolve(name), "predictor")
    cfg = PolicyConfig(name, predictor={"name": predictor} if takes_one else None)
    return build_policy(cfg, ttft, ready_predictor).policy


def _engine(model_name: str, device: str, config: EngineConfig) -> Engine:
    cfg = ModelConfig.for_preset(model_name)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = CausalLM(cfg, device=device, dtype=dtype)
    device_random_weights(model, seed=0)
    engine = Engine(model, config)
    t0 = time.perf_counter()
    engine.warmup()
    print(f"graphs captured in {time.perf_counter() - t0:.1f} s")
    return engine


def _run(engine: Engine, requests, policy, out: Path, meta: dict, max_time=None) -> None:  # noqa: ANN001
    t0 = time.perf_counter()
    rec = engine.run_online(requests, policy, max_time=max_time)
    wall = time.perf_counter() - t0
    rec.check()
    out.mkdir(parents=True, exist_ok=True)
    rec.save_npz(str(out / "records.npz"))
    gpu = torch.cuda.get_device_name() if engine.device.type == "cuda" else "cpu"
    import triton

    meta = {
        **meta,
        "gpu": gpu,
        "wall_s": wall,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "engine": dataclasses.asdict(engine.config),
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=1))
    fin = int((rec.status == 0).sum())
    dur = 1e3 * rec.step_durations()
    mixed = rec.prefill_tokens > 0
    dec = f"{dur[~mixed].mean():.2f}" if (~mixed).any() else "-"
    mix = f"{dur[mixed].mean():.2f}" if mixed.any() else "-"
    print(
        f"{out.parent.name}/{out.name}: {fin}/{len(requests)} finished, {len(dur)} steps "
        f"(mean ms: decode-only {dec}, mixed {mix}), {wall:.1f} s",
        flush=True,
    )


def replay_manifest(
    path: str, out: str, device: str, roles: list[str] | None, cases: list[str] | None = None
) -> None:
    from experiments.fidelity_manifest import Manifest

    m = Manifest.load(path)
    config = EngineConfig(**m.scheduler)  # speculation: the n-gram drafter, serial steps
    engine = _engine(m.model, device, config)
    base = Path(path).parent
    for case in m.cases:
        if (roles and case.role not in roles) or (cases and case.name not in cases):
            continue
        for name in case.policies:
            spec = m.policies[name]
            requests = load_requests(base / case.requests)
            meta = {"case": case.name, "role": case.role, "policy": name, "model": m.model,
                    "commit": m.notes.get("commit")}  # fmt: skip
            policy = spec.build(m.ttft_slo)
            _run(engine, requests, policy, Path(out) / case.name / name, meta, case.max_time)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--manifest", help="run every case and policy of a fidelity manifest")
    ap.add_argument("--role", action="append", help="with --manifest: only cases of this role")
    ap.add_argument("--case", action="append", help="with --manifest: only this case")
    ap.add_argument("--requests")
    ap.add_argument("--model", default="qwen2.5-0.5b")
    ap.add_argument("--policy", action="append", help="a policy name or package.module:Class")
    ap.add_argument("--predictor", help="for policies that take one, e.g. oracle")
    ap.add_argument("--num-blocks", type=int)
    ap.add_argument("--ttft-slo", type=float, default=0.25)
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda", help="cpu: a slow dry run (torch attention)")
    ap.add_argument("--limit", type=int, default=None, help="replay only the first N requests")
    args = ap.parse_args(argv)
    if args.manifest:
        replay_manifest(args.manifest, args.out, args.device, args.role, args.case)
        return
    if not (args.requests and args.policy and args.num_blocks):
        ap.error("give --manifest, or --requests, --policy and --num-blocks")
    engine = _engine(
        args.model, args.device, EngineConfig(num_blocks=args.num_blocks, max_model_len=4096)
    )
    for name in args.policy:
        requests = load_requests(args.requests)[: args.limit]
        meta = {
            "policy": name,
            "model": args.model,
            "num_blocks": args.num_blocks,
            "requests_file": args.requests,
            "num_requests": len(requests),
        }
        policy = _policy(name, args.predictor, args.ttft_slo)
        _run(engine, requests, policy, Path(args.out) / name, meta)


if __name__ == "__main__":
    main()

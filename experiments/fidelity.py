"""How far to trust the simulator: the same workloads and policies on the engine and on the
simulator, metric by metric.

    python -m experiments.fidelity export [--model qwen2.5-0.5b] [--out DIR]    # CPU
    python -m experiments.engine_replay --manifest gpu_inputs/fidelity/manifest.json --out DIR # GPU
    python -m experiments.fidelity compare results/fidelity/engine \
        [--repeat results/fidelity/engine_repeat] [--report docs/fidelity]

Each model shape has a ``Preset`` (``PRESETS``: scheduler, SLO preset, cases; its manifest goes
to ``gpu_inputs/fidelity`` for the 0.5B, ``gpu_inputs/fidelity_<shape>`` otherwise); ``compare``
reads the shape from the engine runs.

``export`` builds the requests of every case (ShareGPT first-turn and multi-turn workloads at
several loads, one seed; ``experiments.fidelity_manifest``) and the manifest. The GPU call
replays them online on the engine and saves each run's records (their step rows carry the plan
shape and the measured duration). ``compare`` fits the step cost model to the steps of the
calibration cases, runs the simulator on the fidelity cases with it, and reports per metric
the relative error of the simulator against the engine (``experiments.fidelity_compare``): the
report's figures go to ``report.json``, and its page is rendered from that file, keeping the
page's hand-written notes. Its LAST line is one JSON object.
``results/fidelity/engine`` holds the committed engine runs; ``compare`` rebuilds the requests
(``export``, seeded) when ``gpu_inputs/fidelity`` is absent.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

from experiments.fidelity_manifest import Case, Manifest, PolicySpec, source_commit

SCHEDULER = {
    "num_blocks": 1500,
    "block_size": 16,
    "max_num_batched_tokens": 2048,
    "max_num_seqs": 256,
    "max_model_len": 4096,
    "enable_prefix_caching": True,
    "step_mode": "event",
}
POLICIES = {
    "fcfs": PolicySpec("fcfs"),
    "memory_first": PolicySpec("memory_first"),
    "horizon": PolicySpec(
        "horizon",
        {"headroom": 0.05, "refresh_every": 16, "max_wait_s": 60.0, "triage": True},
        "oracle",
    ),
}
ALL = tuple(POLICIES)
# (name, role, workload, rate, seed, seconds of arrivals, policies)
CASES = (
    ("golden_first_r40", "golden", "sharegpt_first_turn", 40.0, 2, 1.25, ("fcfs", "horizon")),
    ("golden_burst_r800", "golden", "sharegpt_first_turn", 800.0, 3, 0.15, ("fcfs", "horizon")),
    # calibration cases (other seed, other loads) alternate with the fidelity cases, so that a
    # drift of the machine's speed over the GPU run touches both alike
    ("cal_first_r45", "calibration", "sharegpt_first_turn", 45.0, 1, 8.0, ALL),
    ("first_r60", "fidelity", "sharegpt_first_turn", 60.0, 0, 10.0, ALL),
    ("cal_first_r100", "calibration", "sharegpt_first_turn", 100.0, 1, 8.0, ALL),
    ("first_r120", "fidelity", "sharegpt_first_turn", 120.0, 0, 10.0, ALL),
    ("cal_first_r140", "calibration", "sharegpt_first_turn", 140.0, 1, 8.0, ALL),
    ("first_r180", "fidelity", "sharegpt_first_turn", 180.0, 0, 10.0, ALL),
    ("cal_first_r165", "calibration", "sharegpt_first_turn", 165.0, 1, 8.0, ALL),
    ("cal_multi_r45", "calibration", "sharegpt_multi_turn", 45.0, 1, 8.0, ALL),
    ("multi_r30", "fidelity", "sharegpt_multi_turn", 30.0, 0, 10.0, ALL),
    ("cal_multi_r75", "calibration", "sharegpt_multi_turn", 75.0, 1, 8.0, ALL),
    ("multi_r60", "fidelity", "sharegpt_multi_turn", 60.0, 0, 10.0, ALL),
    ("multi_r90", "fidelity", "sharegpt_multi_turn", 90.0, 0, 10.0, ALL),
)
# The 7B shape on the headline's KV-bound pool (3,000 blocks, experiments/policy_gain.py) and
# SLO preset; loads scaled to its capacity (a 7B step is 3-10x a 0.5B one), the last of each
# workload near its knee. No golden cases: the committed golden logs are the 0.5B's.
CASES_7B = (
    ("cal_first_r20", "calibration", "sharegpt_first_turn", 20.0, 1, 8.0, ALL),
    ("first_r30", "fidelity", "sharegpt_first_turn", 30.0, 0, 10.0, ALL),
    ("cal_first_r45", "calibration", "sharegpt_first_turn", 45.0, 1, 8.0, ALL),
    ("first_r60", "fidelity", "sharegpt_first_turn", 60.0, 0, 10.0, ALL),
    ("cal_first_r75", "calibration", "sharegpt_first_turn", 75.0, 1, 8.0, ALL),
    ("first_r90", "fidelity", "sharegpt_first_turn", 90.0, 0, 10.0, ALL),
    ("cal_first_r100", "calibration", "sharegpt_first_turn", 100.0, 1, 8.0, ALL),
    ("cal_multi_r15", "calibration", "sharegpt_multi_turn", 15.0, 1, 8.0, ALL),
    ("multi_r10", "fidelity", "sharegpt_multi_turn", 10.0, 0, 10.0, ALL),
    ("cal_multi_r25", "calibration", "sharegpt_multi_turn", 25.0, 1, 8.0, ALL),
    ("multi_r20", "fidelity", "sharegpt_multi_turn", 20.0, 0, 10.0, ALL),
    ("multi_r30", "fidelity", "sharegpt_multi_turn", 30.0, 0, 10.0, ALL),
    # above the top multi-turn load, as the first-turn calibration reaches above its own
    ("cal_multi_r35", "calibration", "sharegpt_multi_turn", 35.0, 1, 8.0, ALL),
)


@dataclass(frozen=True)
class Preset:
    """What one model shape's fidelity experiment runs: the scheduler, SLO preset and cases."""

    model: str
    slo_preset: str
    scheduler: dict
    cases: tuple
    out: str  # the default export folder (gpu_inputs/...)


PRESETS = {
    "qwen2.5-0.5b": Preset("qwen2.5-0.5b", "h200_0.5b", SCHEDULER, CASES, "gpu_inputs/fidelity"),
    "qwen2.5-7b": Preset(
        "qwen2.5-7b",
        "h200_7b",
        {**SCHEDULER, "num_blocks": 3000},
        CASES_7B,
        "gpu_inputs/fidelity_qwen2.5-7b",
    ),
}
MODEL = "qwen2.5-0.5b"  # the default preset
DRAIN_S = 5.0  # runs stop this long after the last arrival (an overloaded queue never drains)


def preset(model: str) -> Preset:
    if model not in PRESETS:
        raise ValueError(f"no fidelity preset for model {model!r}; have {sorted(PRESETS)}")
    return PRESETS[model]


def export(out: str | None = None, model: str = MODEL) -> Manifest:
    """Build every case's requests and the manifest of ``model``'s preset under ``out``
    (default: the preset's folder)."""
    from experiments.config_store import run_config
    from experiments.workloads import DataSources, make_workload
    from horizon.workload.requests_file import save_requests

    pre = preset(model)
    outdir = Path(out or pre.out)
    outdir.mkdir(parents=True, exist_ok=True)
    cases, slo, sources = [], None, None
    for name, role, workload, rate, seed, seconds, policies in pre.cases:
        n = max(1, round(rate * seconds))
        cfg = run_config(
            [
                f"model={pre.model}",
                f"slo={pre.slo_preset}",
                f"workload={workload}",
                # every conversation, as when the committed engine runs were exported (the
                # workload configs' default became the held-out half since)
                "workload.conversations=all",
                f"rate={rate}",
                f"seed={seed}",
                f"num_requests={n}",
                f"model.num_blocks={pre.scheduler['num_blocks']}",
                f"scheduler.max_model_len={pre.scheduler['max_model_len']}",
            ]
        )
        sources = sources or DataSources(cfg.data)
        slo = cfg.slo.slo
        requests = make_workload(cfg, sources).new_requests()
        save_requests(requests, outdir / f"{name}.json")
        last = max(r.arrival_time for r in requests)
        cases.append(
            Case(name, role, workload, rate, seed, f"{name}.json", policies, last + DRAIN_S)
        )
        print(f"{name}: {len(requests)} requests over {last:.1f} s")
    m = Manifest(
        model=pre.model,
        scheduler=dict(pre.scheduler),
        ttft_slo=slo.ttft,
        itl_slo=slo.itl,
        policies=dict(POLICIES),
        cases=tuple(cases),
        notes={"slo_preset": pre.slo_preset, "drain_s": DRAIN_S, "commit": source_commit()},
    )
    m.save(outdir / "manifest.json")
    return m


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export")
    e.add_argument("--out", default=None, help="default: the preset's gpu_inputs folder")
    e.add_argument("--model", default=MODEL, choices=sorted(PRESETS))
    c = sub.add_parser("compare")
    c.add_argument("engine_dir")
    c.add_argument("--manifest", default=None)
    c.add_argument("--report", default="docs/fidelity")
    c.add_argument("--repeat", default=None, help="a second engine run of some cases")
    args = ap.parse_args(argv)
    if args.cmd == "export":
        m = export(args.out, args.model)
        out = args.out or preset(args.model).out
        print(json.dumps({"cases": len(m.cases), "manifest": f"{out}/manifest.json"}))
    else:
        from experiments.fidelity_compare import compare

        compare(args.engine_dir, args.manifest, args.report, repeat_dir=args.repeat)


if __name__ == "__main__":
    main()

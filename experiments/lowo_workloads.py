"""The workloads leave-one-workload-out adds to the fidelity runs' two, as a GPU manifest.

    python -m experiments.lowo_workloads export [--model qwen2.5-7b] [--out DIR]   # CPU
    bash docs/notes/run_lowo.sh                                                    # GPU

Three workloads of other shapes than ShareGPT's first turns and multi-turn sessions, each at two
Poisson loads (the higher near the fcfs knee) under fcfs and horizon + oracle, on the scheduler
and SLO of the model's fidelity preset (``experiments.fidelity.PRESETS``):

* ``longout``: ShareGPT first turns whose reply has >= 400 tokens (real prompts; answers about
  2.2x ShareGPT's mean: 567 against 254 tokens);
* ``azconv``: the Azure 2023 conversation trace's prompt and output lengths (rows in file
  order; synthetic prompt ids, so no prefix hits: mean prompt ~780, output ~270 tokens);
* ``azcode``: the Azure code trace's lengths (long prompts, short answers: ~1,220 / ~23).

The manifest also holds, in the order run: ``probe_warmup``, ``probe_0`` and ``probe_1`` (the
speed probe: fixed requests all at t = 0, so every plan is the same on every lease; the warm-up
first, discarded: an engine's first run after graph capture has slower first large mixed steps,
+1.0% mean mixed step on the 7B and +10.7% on the 0.5B, where the runs after it agree within
0.3%, ``bash docs/notes/run_probe.sh``; ``probe_0`` second and ``probe_1`` last: ``probe_1``
against ``probe_0`` measures its repeatability), and ``anchor_<case>``, one committed fidelity
case replayed under fcfs: its measured/modelled step time against the committed run's is the
lease's speed offset (``experiments.lowo`` reads these by name; none of them is a workload).
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from horizon.request import Request

REPO = Path(__file__).resolve().parents[1]
SECONDS = 8.0  # of arrivals per case, as the fidelity calibration cases
SEED = 0
POLICIES = ("fcfs", "horizon")
# name -> (workload config, overrides)
WORKLOADS = {
    "longout": (
        "sharegpt_first_turn",
        ("workload.conversations=all", "workload.min_output_tokens=400",
         "workload.max_total_tokens=4096"),
    ),
    "azconv": (
        "azure_conv",
        ("workload.arrival=poisson", "workload.max_output_tokens=1024",
         "workload.max_prompt_tokens=3072", "workload.max_total_tokens=4096"),
    ),
    "azcode": (
        "azure_conv",
        ("workload.trace_path=${data.trace_dir}/AzureLLMInferenceTrace_code.csv.gz",
         "workload.arrival=poisson", "workload.max_output_tokens=1024",
         "workload.max_prompt_tokens=3072", "workload.max_total_tokens=4096"),
    ),
}  # fmt: skip
# Two Poisson loads per workload and shape: half the knee, and the knee, where the simulator
# (engine_fitted, the engine's loop, these requests) keeps fcfs' goodput at 0.92-0.97 and a
# quarter more load drops it below 0.9 (7B: longout 24 -> 0.953, 27 -> 0.704; azconv 18 -> 0.917,
# 20 -> 0.819; azcode 44 -> 0.940, 50 -> 0.468. 0.5B: longout 48 between 45 -> 0.969 and 50 ->
# 0.887; azconv 40 -> 0.919, 60 -> 0.235; azcode 220 between 200 -> 0.999 and 240 -> 0.439)
LOADS = {
    "qwen2.5-7b": {"longout": (12.0, 24.0), "azconv": (9.0, 18.0), "azcode": (22.0, 44.0)},
    "qwen2.5-0.5b": {"longout": (24.0, 48.0), "azconv": (20.0, 40.0), "azcode": (110.0, 220.0)},
}
ANCHOR = {"qwen2.5-7b": "first_r30", "qwen2.5-0.5b": "first_r60"}
PROBE = (64, 256, 200, 32, 1024, 32)  # n, prompt, output of two groups, all at t = 0


def probe_requests() -> list[Request]:
    """The speed probe's requests: 64 x (256 prompt, 200 output) and 32 x (1024, 32), all
    arriving at 0 (lengths only: the engine's synthetic prompt ids are seeded by request id)."""
    n1, p1, o1, n2, p2, o2 = PROBE
    groups = [(p1, o1)] * n1 + [(p2, o2)] * n2
    return [Request(i, 0.0, p, o, o) for i, (p, o) in enumerate(groups)]


def cases(model: str) -> list[tuple[str, str, float]]:
    """(case name, workload, rate) of ``model``'s workload cases, loads interleaved."""
    out = []
    for i in range(2):  # every workload's lower load, then every workload's higher one
        for w, rates in LOADS[model].items():
            out.append((f"{w}_r{rates[i]:g}", w, rates[i]))
    return out


def build(model: str, workload: str, rate: float, sources=None):  # noqa: ANN001, ANN201
    """(requests, SLO, the ``DataSources``) of ``workload`` at ``rate`` for ``model``'s preset."""
    from experiments.config_store import run_config
    from experiments.fidelity import preset
    from experiments.workloads import DataSources, make_workload

    pre = preset(model)
    name, overrides = WORKLOADS[workload]
    cfg = run_config(
        [
            f"model={model}",
            f"slo={pre.slo_preset}",
            f"workload={name}",
            *overrides,
            f"rate={rate}",
            f"seed={SEED}",
            f"num_requests={max(1, round(rate * SECONDS))}",
            f"model.num_blocks={pre.scheduler['num_blocks']}",
            f"scheduler.max_model_len={pre.scheduler['max_model_len']}",
        ]
    )
    sources = sources or DataSources(cfg.data)
    return make_workload(cfg, sources).new_requests(), cfg.slo.slo, sources


def export(model: str, out: str | None = None):  # noqa: ANN201 - a Manifest
    """Every case's requests and the manifest under ``out`` (default:
    ``gpu_inputs/lowo/<model>``)."""
    from experiments.fidelity import DRAIN_S, preset
    from experiments.fidelity import POLICIES as SPECS
    from experiments.fidelity import export as fidelity_export
    from experiments.fidelity_manifest import Case, Manifest, source_commit
    from horizon.workload.requests_file import save_requests

    pre = preset(model)
    outdir = Path(out or REPO / "gpu_inputs" / "lowo" / model)
    outdir.mkdir(parents=True, exist_ok=True)
    save_requests(probe_requests(), outdir / "probe.json.gz")
    probe = [Case(f"probe_{i}", "calibration", "probe", 0.0, 0, "probe.json.gz", ("fcfs",))
             for i in ("warmup", 0, 1)]  # fmt: skip
    fid = Path(pre.out if Path(pre.out).is_absolute() else REPO / pre.out)
    if not (fid / "manifest.json").exists():  # the committed runs' requests, rebuilt (seeded)
        fidelity_export(str(fid), model)
    anchor = next(c for c in Manifest.load(fid / "manifest.json").cases if c.name == ANCHOR[model])
    shutil.copy(fid / anchor.requests, outdir / f"anchor_{anchor.requests}")
    name, file = f"anchor_{anchor.name}", f"anchor_{anchor.requests}"
    anchored = Case(name, "calibration", anchor.workload, anchor.rate, anchor.seed, file,
                    ("fcfs",), anchor.max_time)  # fmt: skip
    runs, sources, slo = [], None, None
    for name, workload, rate in cases(model):
        requests, slo, sources = build(model, workload, rate, sources)
        save_requests(requests, outdir / f"{name}.json.gz")
        last = max(r.arrival_time for r in requests)
        runs.append(Case(name, "fidelity", workload, rate, SEED, f"{name}.json.gz", POLICIES,
                         last + DRAIN_S))  # fmt: skip
        print(f"{name}: {len(requests)} requests over {last:.1f} s")
    m = Manifest(
        model=model,
        scheduler=dict(pre.scheduler),
        ttft_slo=slo.ttft,
        itl_slo=slo.itl,
        policies={p: SPECS[p] for p in POLICIES},
        cases=(probe[0], probe[1], anchored, *runs, probe[2]),
        notes={"slo_preset": pre.slo_preset, "drain_s": DRAIN_S, "commit": source_commit(),
               "seconds": SECONDS, "workloads": {w: list(o) for w, (_, o) in WORKLOADS.items()}},
    )  # fmt: skip
    m.save(outdir / "manifest.json")
    return m


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export")
    e.add_argument("--model", action="append", choices=sorted(LOADS), help="default: both")
    e.add_argument("--out", default=None, help="default: gpu_inputs/lowo/<model>")
    args = ap.parse_args(argv)
    for model in args.model or sorted(LOADS, reverse=True):
        m = export(model, args.out)
        print(json.dumps({"model": model, "cases": len(m.cases)}))


if __name__ == "__main__":
    main()

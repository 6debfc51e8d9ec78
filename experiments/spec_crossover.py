"""Speculative decoding's crossover, simulated: k drafts x batch size x acceptance rate.

    python -m experiments.spec_crossover --simulate [--out results/spec_crossover]

For every acceptance rate ``alpha`` (stated: each draft accepted with probability ``alpha``
given the ones before it, ``horizon.acceptance``), drafter, ``k`` in 1..8 and batch size B in
1, 2, 4, ..., 256, one simulated run of the 7B shape on an H200 (the engine-fitted cost model,
the engine's loop): ``2B + 6`` requests of a 512-token prompt and 128..383 output tokens (spread
so that requests finish apart), all queued at t = 0 with ``max_num_seqs = B``, so B requests
decode at once and a finished one is replaced at once (continuous refill). Each run is compared
with plain decoding of the same requests: output tokens/s and mean TPOT, and the *crossover*:
the smallest B at which speculation is slower than plain decoding.

Drafters: ``ngram`` (model-free: drafting costs nothing on the GPU), ``draft_0.5b`` (a
Qwen2.5-0.5B draft model: each draft position costs one decode step of the 0.5B shape over the
batch, from its engine-fitted cost model, plus the paged drafter's measured fixed cost per
proposal, ``draft_fixed_s``) and ``eagle3`` (a draft head in EAGLE-3's layout on the 7B's
width, ``executor.draft_head``: its measured cost per position and per proposal).
Verification is priced by the 7B cost model as the engine runs it by default, k + 1 decode
rows per verifying request, plus the host terms per verification step and per verifying
request that ``experiments.spec_verify_fit`` fitted to the engine's measured runs
(``--verify-fit``, its ``verify_fit.json``; ``simulator.verification_cost``).
Writes ``sim.json`` (every run) and ``table.md``.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import time
from pathlib import Path

import numpy as np

from experiments import compact_json
from experiments.report_template import table
from horizon.acceptance import AcceptanceModel
from horizon.metrics.latency import tpot
from horizon.model_shape import model_shape
from horizon.plan import StepPlan
from horizon.policies import make_policy
from horizon.request import Request
from horizon.scheduler_config import SchedulerConfig
from horizon.speculation import SpeculationConfig, expected_tokens
from simulator import Simulation, gpu_spec, make_cost_model
from simulator.verification_cost import DraftCost, VerifyCost

REPO = Path(__file__).resolve().parents[1]
KS = tuple(range(1, 9))
BATCHES = tuple(2**i for i in range(9))
ALPHAS = (0.5, 0.7, 0.9)
PROMPT = 512
LABEL = (
    "simulated, stated acceptance, verification as expanded decode rows with host terms "
    "fitted to the engine's speculative runs (experiments.spec_verify_fit)"
)
VERIFY_FIT = REPO / "results" / "spec_crossover" / "verify_fit.json"
DRAFT_BENCH = REPO / "results" / "spec_bench"
DRAFTER = "draft:qwen2.5-0.5b"  # the spec_bench drafter whose measured costs draft_0.5b takes
HEAD_DRAFTER = "eagle3"  # and eagle3's
DRAFTERS = ("ngram", "draft_0.5b", "eagle3")
CALIBRATION = {
    "qwen2.5-7b": "calibration/h200_qwen2.5-7b_online.csv.gz",
    "qwen2.5-0.5b": "calibration/h200_qwen2.5-0.5b_online.csv.gz",
}


def _requests(batch: int) -> list[Request]:
    n = 2 * batch + 6
    return [Request(i, 0.0, PROMPT, 128 + (i * 97) % 256, 128 + (i * 97) % 256) for i in range(n)]


def _cost(shape: str):  # noqa: ANN202
    return make_cost_model(
        "engine_fitted", shape=model_shape(shape), gpu=gpu_spec("H200"), path=CALIBRATION[shape]
    )


@functools.lru_cache(maxsize=8)
def _proposal_fits(directory: Path, drafter: str) -> tuple[tuple[float, float, float], ...]:
    """(log2 batch, seconds per position, fixed seconds) per measured batch: the slope and
    intercept of the paged drafter's proposal time (``draft_cost`` rows of the spec_bench
    runs with ``--drafter drafter``: ms per position x k) against k. Read and fitted once per
    directory and drafter."""
    runs = [json.loads(f.read_text()) for f in sorted(directory.glob("*.json"))]
    rows = [
        r
        for run in runs
        if run.get("args", {}).get("drafter") == drafter
        for r in run.get("draft_cost") or []
    ]
    pts = []
    for b in sorted({r["batch"] for r in rows}):
        sel = [r for r in rows if r["batch"] == b]
        if len({r["k"] for r in sel}) < 2:
            continue
        k = np.array([r["k"] for r in sel], dtype=float)
        total = np.array([r["paged_ms_per_position"] for r in sel]) * k
        slope, icept = np.polyfit(k, total, 1)
        pts.append((math.log2(b), float(slope) * 1e-3, max(0.0, float(icept) * 1e-3)))
    return tuple(pts)


def _interp(batch: int, pts: tuple, col: int) -> float:
    """Column ``col`` of ``pts`` interpolated in log2(batch), held beyond the measured ones."""
    return float(np.interp(math.log2(batch), [p[0] for p in pts], [p[col] for p in pts]))


def draft_fixed_s(batch: int, directory: Path = DRAFT_BENCH) -> float:
    """The paged drafter's fixed cost per proposal at ``batch``, in seconds
    (``executor.spec_bench --draft-cost`` at k 1, 2, 4 and 8, whose slope against k is the
    draft model's engine decode step within 1%), interpolated in log2(batch), held beyond the
    measured batches; 0 without measurements."""
    pts = _proposal_fits(directory, DRAFTER)
    return _interp(batch, pts, 2) if pts else 0.0


def _draft_cost(drafter: str, batch: int, draft_model, directory: Path = DRAFT_BENCH) -> DraftCost:  # noqa: ANN001
    """``ngram``: free. ``draft_0.5b``: per draft position, one 0.5B decode step of the batch
    over its mean context (prompt plus half the mean output); per drafting step, the paged
    drafter's measured fixed cost (``draft_fixed_s``). ``eagle3``: no cost model of its own
    (the engine cannot serve a draft head): per position and per drafting step, the slope and
    intercept of its measured proposal times against k (``HEAD_DRAFTER``'s runs)."""
    if drafter == "ngram":
        return DraftCost("ngram")
    if drafter == "eagle3":
        pts = _proposal_fits(directory, HEAD_DRAFTER)
        if not pts:
            raise FileNotFoundError(f"eagle3: no {HEAD_DRAFTER} draft_cost rows in {directory}")
        return DraftCost(
            "model", per_position_s=_interp(batch, pts, 1), per_step_s=_interp(batch, pts, 2)
        )
    dummy = tuple(Request(i, 0.0, 1, 1, 1) for i in range(batch))
    plan = StepPlan(0, 0.0, dummy, (), decode_context_tokens=batch * (PROMPT + 128))
    per_position = draft_model.step_time(plan)
    return DraftCost(
        "model", per_position_s=per_position, per_step_s=draft_fixed_s(batch, directory)
    )


def _run(  # noqa: PLR0913
    batch: int,
    spec: SpeculationConfig | None,
    alpha: float,
    cost,  # noqa: ANN001
    draft: DraftCost | None,
    verify: VerifyCost | None = None,
) -> dict:
    shape = model_shape("qwen2.5-7b")
    cfg = SchedulerConfig(
        num_blocks=shape.kv_blocks(gpu_spec("H200").memory_bytes, 0.9, 16),
        max_num_seqs=batch,
        speculation=spec,
    )
    sim = Simulation(
        _requests(batch),
        cfg,
        make_policy("fcfs"),
        cost,
        pipelined=True,
        arrivals_at_step_boundaries=True,
        acceptance=AcceptanceModel.geometric(alpha, seed=0),
        draft_cost=draft,
        verify_cost=verify,
    )
    rec = sim.run()
    makespan = float(rec.step_end[-1])
    tokens = int(rec.num_output_tokens.sum())
    s = sim.scheduler
    return {
        "makespan_s": makespan,
        "tokens_per_s": tokens / makespan,
        "mean_tpot_ms": 1e3 * float(tpot(rec).mean()),
        "tokens_per_step": tokens / len(rec.step_end),
        "accepted_per_draft": s.num_accepted / s.num_drafted if s.num_drafted else 0.0,
    }


def load_verify(path: str | Path) -> VerifyCost:
    """The fitted verification pricing of a ``verify_fit.json``."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(
            f"--verify-fit: {p} not found (python -m experiments.spec_verify_fit)"
        )
    t = json.loads(p.read_text())["terms"]
    return VerifyCost(t["shape"], t["per_step_s"], t["per_verify_s"], source=str(p.name))


def simulate(verify: VerifyCost) -> dict:
    """Every run of the grid (module docstring), with its plain-decoding baseline."""
    cost, draft_model = _cost("qwen2.5-7b"), _cost("qwen2.5-0.5b")
    plain = {b: _run(b, None, 0.5, cost, None) for b in BATCHES}
    rows = []
    for drafter in DRAFTERS:
        for alpha in ALPHAS:
            for b in BATCHES:
                draft = _draft_cost(drafter, b, draft_model)
                for k in KS:
                    spec = SpeculationConfig(policy="fixed", num_draft_tokens=k)
                    row = _run(b, spec, alpha, cost, draft, verify)
                    base = plain[b]
                    row.update(drafter=drafter, alpha=alpha, batch=b, k=k)
                    row["speedup"] = row["tokens_per_s"] / base["tokens_per_s"]
                    row["tpot_ratio"] = row["mean_tpot_ms"] / base["mean_tpot_ms"]
                    rows.append(row)
    conditions = _conditions() | {
        "verification": f"{verify.shape}, {1e3 * verify.per_step_s:.3f} ms per step, "
        f"{1e3 * verify.per_verify_s:.4f} ms per verifying request ({verify.source})"
    }
    return {"label": LABEL, "conditions": conditions, "plain": plain, "runs": rows}


def _conditions() -> dict:
    return {
        "model": "qwen2.5-7b",
        "gpu": "H200",
        "cost_model": CALIBRATION["qwen2.5-7b"] + " (engine_fitted, engine loop)",
        "draft_model_cost": CALIBRATION["qwen2.5-0.5b"] + " (0.5B decode step per position, "
        "plus the paged drafter's measured fixed cost per proposal: results/spec_bench "
        "draft_cost rows at k 1-8, 0.45 ms at batch 1 to 1.04 ms at 64)",
        "draft_head_cost": "eagle3: per position and per proposal, the slope and intercept "
        "against k of its measured proposal times (results/spec_bench draft_cost rows of "
        "--drafter eagle3 at k 1, 2, 8 and batch 1, 16, 64), interpolated in log2(batch)",
        "acceptance": "geometric: draft i accepted with prob alpha given 1..i-1 (seed 0)",
        "workload": f"2B+6 requests, prompt {PROMPT}, output 128..383, all at t=0, "
        "max_num_seqs=B (continuous refill), policy fcfs, speculation policy fixed",
        "token_budget": "max_num_batched_tokens 2048: at B=256 k is capped at 7",
    }


def crossover(rows: list[dict], drafter: str, alpha: float, k: int) -> int | None:
    """Smallest batch at which speculation with ``k`` drafts is slower than plain decoding."""
    for b in BATCHES:
        r = next(
            r
            for r in rows
            if (r["drafter"], r["alpha"], r["batch"], r["k"]) == (drafter, alpha, b, k)
        )
        if r["speedup"] < 1.0:
            return b
    return None


def render(report: dict) -> str:
    """``table.md``: per drafter and alpha, speedup over plain decoding by k (rows) and batch
    (columns), and the crossover batch of each k."""
    rows = report["runs"]
    out = [
        "# Speculative decoding crossover: " + report["label"],
        "",
        "Written by `python -m experiments.spec_crossover --simulate` (every figure with more "
        "digits in `sim.json`). Cells: output tokens/s with speculation over plain decoding at "
        "the same batch size (> 1: speculation is faster). Crossover: the smallest batch size "
        "at which it is slower (— : none up to 256).",
        "",
        table(["condition", "value"], report["conditions"].items()),
    ]
    for drafter in DRAFTERS:
        for alpha in ALPHAS:
            body = []
            for k in KS:
                cells = [
                    f"{r['speedup']:.2f}"
                    for b in BATCHES
                    for r in rows
                    if (r["drafter"], r["alpha"], r["batch"], r["k"]) == (drafter, alpha, b, k)
                ]
                cross = crossover(rows, drafter, alpha, k)
                ideal = f"{expected_tokens(alpha, k):.2f}"
                body.append([str(k), ideal, *cells, "—" if cross is None else str(cross)])
            heads = ["k", "tokens/verify", *[f"B={b}" for b in BATCHES], "crossover"]
            out += ["", f"## {drafter}, alpha = {alpha}", "", table(heads, body)]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--simulate", action="store_true", help="run the simulator's grid")
    ap.add_argument("--out", default=str(REPO / "results" / "spec_crossover"))
    ap.add_argument("--verify-fit", default=str(VERIFY_FIT), help="a spec_verify_fit JSON")
    args = ap.parse_args(argv)
    if not args.simulate:
        ap.error("only --simulate exists so far (the engine's grid is to come)")
    t0 = time.perf_counter()
    report = simulate(load_verify(args.verify_fit))
    report["wall_s"] = round(time.perf_counter() - t0, 1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sim.json").write_text(compact_json.dumps(report))
    (out / "table.md").write_text(render(report))
    print(f"{len(report['runs'])} runs in {report['wall_s']} s -> {out}")
    return report


if __name__ == "__main__":
    main()

"""Speculation on the engine under stated acceptance, at a held batch size: the simulator's grid.

The workload and configuration of ``experiments.spec_crossover`` (its simulated grid), so the
two compare cell for cell: at batch ``B``, ``2B + 6`` requests of a ``prompt``-token prompt
(seeded synthetic ids) and ``out_base + (i * 97) % out_span`` output tokens (128..383 by
default), all queued at t = 0, ``max_num_seqs = B`` (continuous refill: B requests run and a
finished one is replaced at once), FCFS, ``max_num_batched_tokens`` 2048, a pool with room for
every request (no preemption). Plain: the engine as it runs by default (pipelined, graphs).
Speculation: the ``fixed`` policy with ``k`` drafts, serial steps, and acceptance *stated*
(``EngineConfig.acceptance``: geometric, each draft accepted with probability ``alpha`` given
the ones before, the simulator's model and seed), since the target's random weights accept
nothing real; the drafts (n-gram lookup padded to ``k``, or a draft model's decode steps) and
the verification forward run for real, so their costs are measured. Every row says so.

Per cell: output tokens/s (tokens over the run's wall time, prefill included), mean TPOT
(the ITL of ``horizon.metrics.latency.tpot``), both against plain at the same batch, steps,
drafts accepted per draft, and the drafter's own time (``draft_s``, its share of the wall
time, ms per draft forward of the batch: ``draft_ms_per_step``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence

import numpy as np
import torch

from executor.drafter import Drafter, NgramDrafter
from horizon.acceptance import AcceptanceModel
from horizon.metrics.latency import tpot
from horizon.request import Request
from horizon.speculation import SpeculationConfig


@dataclasses.dataclass(frozen=True)
class HeldWorkload:
    """The grid's requests at one batch size (``experiments.spec_crossover``'s defaults)."""

    prompt: int = 512
    out_base: int = 128
    out_span: int = 256
    token_budget: int = 2048

    def requests(self, batch: int) -> list[Request]:
        n = 2 * batch + 6
        outs = [self.out_base + (i * 97) % self.out_span for i in range(n)]
        return [Request(i, 0.0, self.prompt, o, o) for i, o in enumerate(outs)]

    def max_len(self, k_max: int) -> int:
        return self.prompt + self.out_base + self.out_span + k_max + 16


def held_engine(  # noqa: ANN201
    model,  # noqa: ANN001
    batch: int,
    work: HeldWorkload,
    k_max: int,
    verify_as_decode: bool = True,
):
    """An engine for the grid at ``batch`` (graphs captured, the expanded verification ones of
    ``k_max`` drafts too); ``verify_as_decode``: ``EngineConfig``'s."""
    from executor.engine import Engine, EngineConfig

    max_len = work.max_len(k_max)
    per_req = -(-max_len // 16)
    cfg = EngineConfig(
        num_blocks=(2 * batch + 6) * per_req + 64,
        max_num_seqs=batch,
        max_num_batched_tokens=max(work.token_budget, batch),
        max_model_len=max_len,
        verify_as_decode=verify_as_decode,
    )
    engine = Engine(model, cfg)
    engine.warmup(max_drafts=k_max)
    return engine


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def run_cell(engine, work: HeldWorkload, batch: int, k: int, alpha: float | None, drafter):  # noqa: ANN001
    """One run of the grid: plain (``k == 0``) or speculation with ``k`` drafts under stated
    acceptance ``alpha`` (the simulator's ``AcceptanceModel.geometric(alpha, seed=0)``)."""
    base = engine.config
    stated = AcceptanceModel.geometric(alpha or 0.0, seed=0)
    if k:
        spec = SpeculationConfig(policy="fixed", num_draft_tokens=k)
        engine.config = dataclasses.replace(base, speculation=spec, acceptance=stated)
        engine.runner.drafter = drafter
    if hasattr(drafter, "reset_counters"):
        drafter.reset_counters()
    try:
        _sync()
        t0 = time.perf_counter()
        rec = engine.run_offline(work.requests(batch))
        _sync()
        wall = time.perf_counter() - t0
    finally:
        engine.config = base
    s = engine.scheduler
    tokens = int(rec.num_output_tokens.sum())
    row = {
        "batch": batch,
        "k": k,
        "alpha": alpha,
        "acceptance_model": stated.label if k else None,
        "wall_s": wall,
        "tokens": tokens,
        "tok_s": tokens / wall,
        "mean_tpot_ms": 1e3 * float(np.nanmean(tpot(rec))),
        "steps": len(rec.step_durations()),
        "accepted_per_draft": s.num_accepted / s.num_drafted if s.num_drafted else None,
        "expected_per_draft": None,
        "verify_as_decode": base.verify_as_decode,
        "verify_steps": dict(engine.runner.num_verify_steps),
    }
    if k:
        row["expected_per_draft"] = float(stated.survival(k).sum()) / k
        row["draft_s"] = getattr(drafter, "time_s", None)
        row["draft_steps"] = getattr(drafter, "num_steps", None)
        row["drafts_ahead"] = getattr(drafter, "num_ahead", None)  # proposals launched ahead
        if row["draft_s"] is not None and row["draft_steps"]:
            row["draft_share"] = row["draft_s"] / wall
            row["draft_ms_per_step"] = 1e3 * row["draft_s"] / row["draft_steps"]
    return row


def held_grid(
    model,  # noqa: ANN001
    make_drafter: Callable[[int, int], Drafter],
    batches: Sequence[int],
    ks: Sequence[int],
    alphas: Sequence[float],
    work: HeldWorkload,
    budget_s: float | None = None,
    on_row: Callable[[dict], None] = lambda r: None,
    verify_as_decode: bool = True,
) -> list[dict]:
    """Every cell (plain, then each alpha and k) per batch size, smallest batch first; cells
    not started before ``budget_s`` seconds are skipped (listed as ``skipped`` rows).
    ``make_drafter(batch, max_len)`` gives the drafter of a batch size; ``verify_as_decode``:
    ``EngineConfig``'s."""
    t_start = time.perf_counter()
    rows = []
    for b in batches:
        cells = [(0, None)] + [(k, a) for a in alphas for k in ks]
        if budget_s is not None and time.perf_counter() - t_start > budget_s:
            rows += [{"batch": b, "k": k, "alpha": a, "skipped": True} for k, a in cells]
            continue
        engine = held_engine(model, b, work, max(ks), verify_as_decode)
        drafter = make_drafter(b, engine.config.max_model_len)
        warm_drafter(drafter, b, model.config.vocab_size)
        plain = None
        for k, a in cells:
            if budget_s is not None and time.perf_counter() - t_start > budget_s:
                rows.append({"batch": b, "k": k, "alpha": a, "skipped": True})
                continue
            r = run_cell(engine, work, b, k, a, drafter)
            plain = plain or r
            r["speedup"] = r["tok_s"] / plain["tok_s"]
            r["tpot_ratio"] = r["mean_tpot_ms"] / plain["mean_tpot_ms"]
            rows.append(r)
            on_row(r)
        del engine, drafter
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return rows


def warm_drafter(drafter: Drafter, batch: int, vocab: int) -> None:
    """Capture a drafter's graphs and compile its kernels (its prefill's too) before timing:
    two proposals for ``batch`` seeded histories, then forgotten."""
    if hasattr(drafter, "capture_graphs"):
        drafter.capture_graphs()
    rng = np.random.default_rng(0)
    hist = [rng.integers(0, min(vocab, 500), 40) for _ in range(batch)]
    ids = [-1 - i for i in range(batch)]  # no request of a run has a negative id
    for _ in range(2):
        drafts = drafter.propose_batch(hist, [2] * batch, ids)
        hist = [np.concatenate([h, d[:1], [1]]) for h, d in zip(hist, drafts)]
    for i in ids:
        drafter.forget(i)


def crossovers(rows: list[dict], batches: Sequence[int]) -> dict[str, int | None]:
    """Per ``alpha`` and ``k``: the smallest measured batch at which speculation is slower than
    plain (None: faster at every measured batch)."""
    out: dict[str, int | None] = {}
    done = [r for r in rows if r["k"] and not r.get("skipped")]
    for a, k in sorted({(r["alpha"], r["k"]) for r in done}):
        cells = {r["batch"]: r["speedup"] for r in done if (r["alpha"], r["k"]) == (a, k)}
        out[f"alpha={a} k={k}"] = next((b for b in batches if cells.get(b, 2.0) < 1.0), None)
    return out


def ngram_drafter(batch: int, max_len: int) -> Drafter:
    """The n-gram drafter padded to ``k`` (stated acceptance: every verification has ``k + 1``
    query tokens, as the simulator prices it)."""
    return NgramDrafter(pad=True)


def compare_simulated(rows: list[dict], sim: dict, drafter: str) -> None:
    """Add the simulator's figures of each measured cell (``experiments.spec_crossover``'s
    ``sim.json``: ``drafter`` is ``ngram`` or ``draft_0.5b``) to its row: ``sim_speedup``,
    ``sim_tpot_ratio``, ``sim_accepted_per_draft`` (the same draws: equal to the engine's
    when both ran the same plans)."""
    runs = {(r["drafter"], r["alpha"], r["batch"], r["k"]): r for r in sim["runs"]}
    for r in rows:
        s = runs.get((drafter, r.get("alpha"), r["batch"], r["k"]))
        if s is not None and not r.get("skipped"):
            r["sim_speedup"] = s["speedup"]
            r["sim_tpot_ratio"] = s["tpot_ratio"]
            r["sim_accepted_per_draft"] = s["accepted_per_draft"]


HEAD = (
    f"{'batch':>5} {'alpha':>5} {'k':>3} {'tok/s':>10} {'x plain':>8} {'sim x':>6} "
    f"{'TPOT ms':>8} {'x TPOT':>7} {'steps':>6} {'acc/draft':>9} {'sim acc':>7} {'draft s':>8}"
)


def _f(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def row_text(r: dict) -> str:
    if r.get("skipped"):
        return f"{r['batch']:>5} {r['alpha'] or '-':>5} {r['k'] or '-':>3}  (skipped: budget)"
    return (
        f"{r['batch']:>5} {r['alpha'] or '-':>5} {r['k'] or '-':>3} {r['tok_s']:>10,.0f} "
        f"{r['speedup']:>8.2f} {_f(r.get('sim_speedup'), '.2f'):>6} "
        f"{r['mean_tpot_ms']:>8.2f} {r['tpot_ratio']:>7.2f} {r['steps']:>6} "
        f"{_f(r['accepted_per_draft'], '.3f'):>9} {_f(r.get('sim_accepted_per_draft'), '.3f'):>7} "
        f"{_f(r.get('draft_s'), '.2f'):>8}"
    )

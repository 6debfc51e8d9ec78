"""Builders of small RunRecords by hand (imported by the other metrics tests), and their checks."""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from horizon.metrics.records import (
    STATUS_FINISHED,
    STATUS_REJECTED,
    STATUS_UNFINISHED,
    STEP_PLAN_COLUMNS,
    RunRecords,
)

FIN, REJ, UNF = STATUS_FINISHED, STATUS_REJECTED, STATUS_UNFINISHED
NAN = math.nan


class Req(NamedTuple):
    """One request: arrival, its output-token times, status, and optional extras.

    ``admit`` defaults to the arrival time for a request that emitted a token, NaN otherwise;
    ``computed`` defaults to prompt + tokens + recomputed.
    """

    arrival: float
    tokens: tuple[float, ...] = ()
    status: int = FIN
    prompt: int = 8
    ttft_slo: float = NAN
    itl_slo: float = NAN
    admit: float | None = None
    preemptions: int = 0
    recomputed: int = 0
    computed: int | None = None


class Step(NamedTuple):
    start: float
    end: float
    prefill: int = 0
    decode: int = 0
    running: int = 0
    waiting: int = 0
    kv_used: int = 0
    budget: int = 512


def make_records(
    requests: list[Req], steps: list[Step] = (), num_kv_blocks: int = 100, block_size: int = 16
) -> RunRecords:
    """RunRecords from hand-written requests and steps (mixed dtypes, as a recorder may use)."""
    n = len(requests)
    counts = np.array([len(r.tokens) for r in requests], dtype=np.int64)
    status = np.array([r.status for r in requests], dtype=np.int8)
    # An unfinished request would have gone on: its true length exceeds what it emitted.
    true_out = np.where(status == FIN, counts, counts + 5)
    admit = [(r.arrival if r.tokens else NAN) if r.admit is None else r.admit for r in requests]
    computed = [
        r.prompt + len(r.tokens) + r.recomputed if r.computed is None else r.computed
        for r in requests
    ]
    offsets = np.zeros(n + 1, dtype=np.int64)
    offsets[1:] = np.cumsum(counts)
    token_times = [t for r in requests for t in r.tokens]
    s = list(steps)
    return RunRecords(
        request_id=np.arange(n, dtype=np.int64),
        arrival_time=np.array([r.arrival for r in requests], dtype=np.float64),
        num_prompt_tokens=np.array([r.prompt for r in requests], dtype=np.int64),
        true_output_tokens=true_out.astype(np.int64),
        max_output_tokens=(true_out + 100).astype(np.int64),
        num_output_tokens=counts,
        status=status,
        reject_reason=["too long" if r.status == REJ else "" for r in requests],
        ttft_slo=np.array([r.ttft_slo for r in requests], dtype=np.float64),
        itl_slo=np.array([r.itl_slo for r in requests], dtype=np.float64),
        first_admit_time=np.array(admit, dtype=np.float64),
        num_preemptions=np.array([r.preemptions for r in requests], dtype=np.int32),
        computed_tokens=np.array(computed, dtype=np.int64),
        recomputed_tokens=np.array([r.recomputed for r in requests], dtype=np.int64),
        cached_tokens=np.zeros(n, dtype=np.int64),
        token_times=np.array(token_times, dtype=np.float64),
        token_offsets=offsets,
        step_start=np.array([x.start for x in s], dtype=np.float64),
        step_end=np.array([x.end for x in s], dtype=np.float64),
        prefill_tokens=np.array([x.prefill for x in s], dtype=np.int32),
        decode_tokens=np.array([x.decode for x in s], dtype=np.int32),
        num_running=np.array([x.running for x in s], dtype=np.int32),
        num_waiting=np.array([x.waiting for x in s], dtype=np.int32),
        kv_used_blocks=np.array([x.kv_used for x in s], dtype=np.int32),
        token_budget=np.array([x.budget for x in s], dtype=np.int32),
        **{c: np.full(len(s), -1, dtype=np.int64) for c in STEP_PLAN_COLUMNS},
        num_kv_blocks=num_kv_blocks,
        block_size=block_size,
    )


def synthetic_records(num_requests: int, mean_tokens: int, seed: int = 0) -> RunRecords:
    """A large, plausible run built with numpy only (for speed and round-trip tests).

    Statuses mix finished / rejected / unfinished; some requests have no token; every request
    carries an SLO.
    """
    rng = np.random.default_rng(seed)
    n = num_requests
    arrival = np.sort(rng.uniform(0.0, n / 50.0, n))
    status = rng.choice(np.array([FIN, REJ, UNF], dtype=np.int8), size=n, p=[0.9, 0.04, 0.06])
    counts = rng.integers(1, 2 * mean_tokens, n)
    counts[status == REJ] = 0
    counts[(status == UNF) & (rng.random(n) < 0.5)] = 0
    offsets = np.zeros(n + 1, dtype=np.int64)
    offsets[1:] = np.cumsum(counts)
    token_times = _synthetic_token_times(rng, arrival, counts, offsets)
    true_out = np.where(status == FIN, counts, counts + 7)
    prompt = rng.integers(10, 2000, n)
    recomputed = np.where(rng.random(n) < 0.05, rng.integers(1, 500, n), 0)
    return RunRecords(
        request_id=np.arange(n, dtype=np.int64),
        arrival_time=arrival,
        num_prompt_tokens=prompt,
        true_output_tokens=true_out.astype(np.int64),
        max_output_tokens=(true_out + 50).astype(np.int64),
        num_output_tokens=counts.astype(np.int64),
        status=status,
        reject_reason=["kv" if s == REJ else "" for s in status],
        ttft_slo=np.full(n, 0.5),
        itl_slo=np.full(n, 0.1),
        first_admit_time=np.where(counts > 0, arrival + 0.05, np.nan),
        num_preemptions=(recomputed > 0).astype(np.int32),
        computed_tokens=(prompt + counts + recomputed).astype(np.int64),
        recomputed_tokens=recomputed.astype(np.int64),
        cached_tokens=(prompt // 4).astype(np.int64),
        token_times=token_times,
        token_offsets=offsets,
        **_synthetic_steps(rng, float(arrival[0]), float(token_times.max()), len(token_times)),
        num_kv_blocks=1000,
        block_size=16,
    )


def _synthetic_token_times(
    rng: np.random.Generator, arrival: np.ndarray, counts: np.ndarray, offsets: np.ndarray
) -> np.ndarray:
    """Each request's token times: its first a random wait after arrival, then random gaps."""
    n, m = len(arrival), int(offsets[-1])
    owner = np.repeat(np.arange(n), counts)
    first = arrival + rng.exponential(0.2, n)
    gaps = rng.exponential(0.02, m)
    gaps[offsets[:-1][counts > 0]] = 0.0  # each request's first token sits at its `first`
    within = np.cumsum(gaps) - np.repeat(
        np.cumsum(gaps)[offsets[:-1][counts > 0]], counts[counts > 0]
    )
    return first[owner] + within


def _synthetic_steps(
    rng: np.random.Generator, first_arrival: float, last_token: float, num_tokens: int
) -> dict[str, np.ndarray]:
    """Step columns: one step per 10 tokens, evenly spread to just after the last token."""
    num_steps = max(num_tokens // 10, 1)
    step_end = np.linspace(first_arrival + 0.01, last_token + 0.01, num_steps)
    return {
        "step_start": step_end - 0.005,
        "step_end": step_end,
        "prefill_tokens": rng.integers(0, 400, num_steps).astype(np.int32),
        "decode_tokens": rng.integers(0, 100, num_steps).astype(np.int32),
        "num_running": rng.integers(0, 100, num_steps).astype(np.int32),
        "num_waiting": rng.integers(0, 5, num_steps).astype(np.int32),
        "kv_used_blocks": rng.integers(0, 1000, num_steps).astype(np.int32),
        "token_budget": np.full(num_steps, 512, dtype=np.int32),
        **{c: rng.integers(0, 9, num_steps) for c in STEP_PLAN_COLUMNS},
    }


def test_make_records_builds_valid_csr_records():
    rec = make_records(
        [Req(0.0, (1.0, 2.0)), Req(0.5, (), REJ), Req(1.0, (3.0,), UNF)],
        [Step(0.0, 1.0), Step(1.0, 2.0)],
    )
    rec.check()
    assert rec.token_offsets.tolist() == [0, 2, 2, 3]
    assert rec.tokens_of(2).tolist() == [3.0]
    assert np.isnan(rec.first_admit_time[1]) and rec.first_admit_time[2] == 1.0


def test_synthetic_records_are_valid_and_sorted_within_requests():
    rec = synthetic_records(2_000, 20, seed=3)
    rec.check()
    gaps = np.diff(rec.token_times)
    inner = rec.token_offsets[1:-1]
    inner = inner[(inner > 0) & (inner < len(rec.token_times))]
    keep = np.ones(len(gaps), dtype=bool)
    keep[inner - 1] = False
    assert np.all(gaps[keep] >= 0)
    first = rec.token_times[rec.token_offsets[:-1][rec.num_output_tokens > 0]]
    assert np.all(first >= rec.arrival_time[rec.num_output_tokens > 0])

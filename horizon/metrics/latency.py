"""Per-request latencies over ``RunRecords``: TTFT, ITL, TPOT, E2E and queue wait.

Names as a vLLM user knows them (docs/design.md, "Metrics"). Every function is vectorised over
the flat ``token_times`` and its CSR ``token_offsets``; none loops over requests or tokens in
Python.

Per-request functions return a float64 array of length N (one value per request row), NaN where
the value is undefined for that request; ``itl`` is the one flat array (one value per gap).

Gaps in the flat token array (gap j lies between token j and token j + 1):

    token_times   | r0 t0  r0 t1  r0 t2 | r1 t0 | r2 t0  r2 t1 |
    np.diff       |    g0     g1     g2     g3      g4         |
    same request? |    yes    yes    NO     NO      yes        |

A gap is dropped iff token j + 1 is the first token of a request, i.e. j + 1 is one of the inner
offsets ``token_offsets[1:-1]`` (offsets of empty requests repeat and are harmless).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from horizon.metrics.records import STATUS_FINISHED, STATUS_UNFINISHED, RunRecords


def num_tokens(rec: RunRecords) -> np.ndarray:
    """Output tokens per request, from the CSR offsets (equals ``rec.num_output_tokens``)."""
    return np.diff(rec.token_offsets)


def first_token_time(rec: RunRecords) -> np.ndarray:
    """Time of each request's first output token (NaN when it emitted none)."""
    out = np.full(rec.num_requests, np.nan)
    has = num_tokens(rec) > 0
    out[has] = rec.token_times[rec.token_offsets[:-1][has]]
    return out


def last_token_time(rec: RunRecords) -> np.ndarray:
    """Time of each request's last output token (NaN when it emitted none)."""
    out = np.full(rec.num_requests, np.nan)
    has = num_tokens(rec) > 0
    out[has] = rec.token_times[rec.token_offsets[1:][has] - 1]
    return out


def ttft(rec: RunRecords) -> np.ndarray:
    """Time to first token = first token time - arrival, per request (NaN when no token).

    Defined for unfinished requests that emitted a token too; filter on ``rec.status`` to choose
    the population.
    """
    return first_token_time(rec) - rec.arrival_time


def e2e(rec: RunRecords) -> np.ndarray:
    """End-to-end latency = last token time - arrival, per request; NaN unless finished."""
    out = last_token_time(rec) - rec.arrival_time
    out[rec.status != STATUS_FINISHED] = np.nan
    return out


def tpot(rec: RunRecords) -> np.ndarray:
    """Time per output token = (E2E - TTFT) / (output tokens - 1), per request.

    NaN unless the request finished with at least 2 tokens (a single token has no TPOT).
    """
    n = num_tokens(rec)
    out = np.full(rec.num_requests, np.nan)
    ok = (rec.status == STATUS_FINISHED) & (n >= 2)
    out[ok] = (last_token_time(rec)[ok] - first_token_time(rec)[ok]) / (n[ok] - 1)
    return out


def _gaps_per_request(rec: RunRecords) -> np.ndarray:
    return np.maximum(num_tokens(rec) - 1, 0)


def itl(rec: RunRecords, select: np.ndarray | None = None) -> np.ndarray:
    """Inter-token latencies: every gap between consecutive output tokens of the same request.

    Args:
        select: optional boolean mask over requests (length N); only their gaps are returned.

    Returns:
        A flat float64 array, gaps of request 0 first, then request 1, ...; request i
        contributes ``max(output tokens - 1, 0)`` gaps. Gaps that cross a request boundary
        in the flat ``token_times`` are never included.
    """
    times = np.asarray(rec.token_times, dtype=np.float64)
    m = len(times)
    gaps = np.diff(times)
    within = np.ones(max(m - 1, 0), dtype=bool)
    inner = np.asarray(rec.token_offsets[1:-1])
    inner = inner[(inner > 0) & (inner < m)]
    within[inner - 1] = False
    gaps = gaps[within]
    if select is not None:
        select = np.asarray(select, dtype=bool)
        if select.shape != (rec.num_requests,):
            raise ValueError(f"select must be a bool mask of length {rec.num_requests}")
        gaps = gaps[np.repeat(select, _gaps_per_request(rec))]
    return gaps


def max_itl(rec: RunRecords) -> np.ndarray:
    """Largest ITL of each request (NaN when it has fewer than 2 tokens)."""
    gaps = itl(rec)
    per = _gaps_per_request(rec)
    out = np.full(rec.num_requests, np.nan)
    nonempty = per > 0
    starts = (np.cumsum(per) - per)[nonempty]
    if starts.size:
        out[nonempty] = np.maximum.reduceat(gaps, starts)
    return out


def queue_wait(rec: RunRecords, until: float | None = None) -> np.ndarray:
    """Queue wait = first admission - arrival, per request.

    NaN for a request never admitted, unless ``until`` is given: then an *unfinished* request
    that was never admitted (still waiting when the run ended) gets ``until - arrival``, a lower
    bound on its wait, so that starvation shows in a maximum. Rejected requests stay NaN.
    """
    out = rec.first_admit_time - rec.arrival_time
    if until is not None:
        # A rejected request stopped waiting when it was rejected; only unfinished ones wait on.
        waiting = np.isnan(rec.first_admit_time) & (rec.status == STATUS_UNFINISHED)
        out = np.where(waiting, until - rec.arrival_time, out)
    return np.asarray(out, dtype=np.float64)


def percentiles(x: np.ndarray, ps: Sequence[float] = (50, 90, 99)) -> np.ndarray:
    """Percentiles of ``x`` ignoring NaN (numpy's linear interpolation, as vLLM reports them).

    Returns one float per entry of ``ps``; all NaN when ``x`` has no non-NaN value.
    """
    x = np.asarray(x, dtype=np.float64)
    x = x[~np.isnan(x)]
    if x.size == 0:
        return np.full(len(ps), np.nan)
    return np.percentile(x, ps)

"""Run span and throughput (tokens/s, requests/s).

The run's span is [first arrival, last step end]: the time the system was offered work until it
stopped working. Every rate in this package ("per second") divides by ``duration``.
"""

from __future__ import annotations

import numpy as np

from horizon.metrics.latency import num_tokens
from horizon.metrics.records import STATUS_FINISHED, RunRecords


def run_span(rec: RunRecords) -> tuple[float, float]:
    """(first arrival, last step end). NaN ends for a run without requests or steps.

    A run without steps but with tokens (not produced by either backend, but possible in a
    hand-built record) ends at its last token.
    """
    start = float(np.min(rec.arrival_time)) if rec.num_requests else np.nan
    ends = [float(np.max(a)) for a in (rec.step_end, rec.token_times) if len(a)]
    return start, (max(ends) if ends else np.nan)


def duration(rec: RunRecords) -> float:
    """Length of the run's span in seconds (NaN when it is empty or not positive)."""
    start, end = run_span(rec)
    d = end - start
    return d if d > 0 else np.nan


def per_second(count: float, rec: RunRecords) -> float:
    """``count`` divided by the run's duration (NaN when the duration is undefined)."""
    return float(count / duration(rec))


def output_throughput(rec: RunRecords) -> float:
    """Output tokens per second: every emitted token (unfinished requests' too) over the span."""
    return per_second(int(num_tokens(rec).sum()), rec)


def total_throughput(rec: RunRecords) -> float:
    """Prompt + output tokens per second, vLLM's "total token throughput".

    Counts the prompt of every request that emitted at least one token (its prefill completed)
    plus every emitted token; recomputation is not counted again (see ``recompute_waste``).
    """
    out = num_tokens(rec)
    prompts = int(rec.num_prompt_tokens[out > 0].sum())
    return per_second(prompts + int(out.sum()), rec)


def request_throughput(rec: RunRecords) -> float:
    """Finished requests per second over the span."""
    return per_second(int(np.count_nonzero(rec.status == STATUS_FINISHED)), rec)

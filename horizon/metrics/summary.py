"""One flat, JSON-friendly dict of a run's headline metrics.

Populations: latency distributions (``ttft_*``, ``itl_*``, ``tpot_*``, ``e2e_*``) are over
*finished* requests, as vLLM's benchmark reports them, so that all of them describe the same
requests; what did not finish shows in the goodputs and in ``rejected``/``unfinished``. Queue
waits are over every request that was admitted, plus each unfinished request never admitted,
counted as waiting until the run's end (a lower bound, so starvation shows in the maximum).

Values are Python ``int`` or ``float``; an undefined value is ``nan`` (an empty run gives NaNs, not
exceptions). ``json.dumps`` writes NaN as ``NaN``.
"""

from __future__ import annotations

import numpy as np

from horizon.metrics.fairness import fairness_jain
from horizon.metrics.goodput import SLOLike, lifetime_good, tpot_good
from horizon.metrics.latency import e2e, itl, percentiles, queue_wait, tpot, ttft
from horizon.metrics.records import (
    STATUS_FINISHED,
    STATUS_REJECTED,
    STATUS_UNFINISHED,
    RunRecords,
)
from horizon.metrics.throughput import (
    duration,
    output_throughput,
    per_second,
    request_throughput,
    run_span,
    total_throughput,
)
from horizon.metrics.utilisation import kv_utilisation_max, kv_utilisation_mean
from horizon.metrics.waste import (
    preempted_requests,
    preemptions,
    prefill_chunk_waste,
    prefix_hit_rate,
    recompute_waste,
)


def _mean(x: np.ndarray) -> float:
    x = x[~np.isnan(x)]
    return float(x.mean()) if x.size else np.nan


def _max(x: np.ndarray) -> float:
    x = x[~np.isnan(x)]
    return float(x.max()) if x.size else np.nan


def _distribution(name: str, x: np.ndarray) -> dict[str, float]:
    p50, p90, p99 = percentiles(x, (50, 90, 99))
    return {
        f"{name}_mean": _mean(x),
        f"{name}_p50": float(p50),
        f"{name}_p90": float(p90),
        f"{name}_p99": float(p99),
    }


def _share(count: int, total: int) -> float:
    return count / total if total else np.nan


def summarize(
    rec: RunRecords,
    slo: SLOLike | None = None,
    tpot_goodput: tuple[float, float] | None = None,
) -> dict[str, float | int]:
    """Headline metrics of a run, with flat keys (seconds, tokens, requests; shares in [0, 1]).

    Args:
        slo: run-wide SLO, filling requests whose own ``ttft_slo``/``itl_slo`` is NaN.
        tpot_goodput: (ttft, tpot) thresholds in seconds for ``goodput_tpot``, like vLLM's
            ``--goodput ttft:X tpot:Y`` (which takes milliseconds). Default: each request's own
            SLO, i.e. ttft <= SLO.ttft and mean TPOT <= SLO.itl.

    Raises:
        ValueError: when a request has no SLO and ``slo`` is not given (from ``slo_arrays``).

    Keys: requests, finished, rejected, unfinished, duration_s, goodput_lifetime,
    goodput_lifetime_rps, goodput_tpot, goodput_tpot_rps, {ttft,itl,tpot,e2e}_{mean,p50,p90,p99},
    itl_max, queue_wait_{mean,p99,max}, throughput_tok_s, throughput_total_tok_s,
    throughput_req_s, output_tokens, preemptions, preempted_requests, recompute_waste,
    prefix_hit_rate,
    prefill_chunk_waste, kv_util_mean, kv_util_max, fairness_jain.
    """
    finished = rec.status == STATUS_FINISHED
    out = _counts(rec, finished, slo, tpot_goodput)
    out.update(_latencies(rec, finished))
    out.update(_usage(rec))
    return out


def _counts(
    rec: RunRecords,
    finished: np.ndarray,
    slo: SLOLike | None,
    tpot_goodput: tuple[float, float] | None,
) -> dict[str, float | int]:
    """Requests by outcome, the run's duration and both goodputs."""
    n = rec.num_requests
    good_life = int(np.count_nonzero(lifetime_good(rec, slo)))
    ttft_max, tpot_max = tpot_goodput if tpot_goodput is not None else (None, None)
    good_tpot = int(np.count_nonzero(tpot_good(rec, ttft_max, tpot_max, slo)))
    return {
        "requests": n,
        "finished": int(np.count_nonzero(finished)),
        "rejected": int(np.count_nonzero(rec.status == STATUS_REJECTED)),
        "unfinished": int(np.count_nonzero(rec.status == STATUS_UNFINISHED)),
        "duration_s": float(duration(rec)),
        "goodput_lifetime": _share(good_life, n),
        "goodput_lifetime_rps": per_second(good_life, rec),
        "goodput_tpot": _share(good_tpot, n),
        "goodput_tpot_rps": per_second(good_tpot, rec),
    }


def _latencies(rec: RunRecords, finished: np.ndarray) -> dict[str, float]:
    """TTFT, ITL, TPOT and end-to-end distributions of finished requests; queue waits."""
    gaps = itl(rec, select=finished)
    waits = queue_wait(rec, until=run_span(rec)[1])
    out = _distribution("ttft", np.where(finished, ttft(rec), np.nan))
    out.update(_distribution("itl", gaps))
    out["itl_max"] = _max(gaps)
    out.update(_distribution("tpot", tpot(rec)))
    out.update(_distribution("e2e", e2e(rec)))
    out["queue_wait_mean"] = _mean(waits)
    out["queue_wait_p99"] = float(percentiles(waits, (99,))[0])
    out["queue_wait_max"] = _max(waits)
    return out


def _usage(rec: RunRecords) -> dict[str, float | int]:
    """Throughput, preemption and recompute waste, prefix hits, KV use and fairness."""
    return {
        "throughput_tok_s": output_throughput(rec),
        "throughput_total_tok_s": total_throughput(rec),
        "throughput_req_s": request_throughput(rec),
        "output_tokens": int(len(rec.token_times)),
        "preemptions": preemptions(rec),
        "preempted_requests": preempted_requests(rec),
        "recompute_waste": recompute_waste(rec),
        "prefix_hit_rate": prefix_hit_rate(rec),
        "prefill_chunk_waste": prefill_chunk_waste(rec),
        "kv_util_mean": kv_utilisation_mean(rec),
        "kv_util_max": kv_utilisation_max(rec),
        "fairness_jain": fairness_jain(rec),
    }

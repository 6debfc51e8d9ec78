"""Run records and the pure functions over them (docs/design.md, "Metrics").

Recording lives in the backends; this package only stores the schema (``records``) and computes:
latencies (``latency``), goodput (``goodput``), throughput, waste, KV utilisation, fairness, and
one flat ``summarize`` dict. No file I/O and no plotting here (see ``experiments/``).
"""

from horizon.metrics.fairness import fairness_jain, jain_index, min_steps, slowdown
from horizon.metrics.goodput import (
    goodput_lifetime,
    goodput_lifetime_rps,
    goodput_tpot,
    goodput_tpot_rps,
    lifetime_good,
    slo_arrays,
    tpot_good,
)
from horizon.metrics.latency import (
    e2e,
    first_token_time,
    itl,
    last_token_time,
    max_itl,
    num_tokens,
    percentiles,
    queue_wait,
    tpot,
    ttft,
)
from horizon.metrics.records import (
    STATUS_FINISHED,
    STATUS_HANDED_OFF,
    STATUS_REJECTED,
    STATUS_UNFINISHED,
    RunRecords,
)
from horizon.metrics.summary import summarize
from horizon.metrics.throughput import (
    duration,
    output_throughput,
    request_throughput,
    run_span,
    total_throughput,
)
from horizon.metrics.utilisation import kv_utilisation, kv_utilisation_max, kv_utilisation_mean
from horizon.metrics.waste import (
    preempted_requests,
    preemptions,
    prefill_chunk_waste,
    prefix_hit_rate,
    recompute_waste,
)

__all__ = [
    "STATUS_FINISHED",
    "STATUS_HANDED_OFF",
    "STATUS_REJECTED",
    "STATUS_UNFINISHED",
    "RunRecords",
    "duration",
    "e2e",
    "fairness_jain",
    "first_token_time",
    "goodput_lifetime",
    "goodput_lifetime_rps",
    "goodput_tpot",
    "goodput_tpot_rps",
    "itl",
    "jain_index",
    "kv_utilisation",
    "kv_utilisation_max",
    "kv_utilisation_mean",
    "last_token_time",
    "lifetime_good",
    "max_itl",
    "min_steps",
    "num_tokens",
    "output_throughput",
    "percentiles",
    "preempted_requests",
    "preemptions",
    "prefill_chunk_waste",
    "queue_wait",
    "prefix_hit_rate",
    "recompute_waste",
    "request_throughput",
    "run_span",
    "slo_arrays",
    "slowdown",
    "summarize",
    "tpot",
    "tpot_good",
    "total_throughput",
    "ttft",
]

"""Serving metrics in Prometheus' text format, under the names vLLM uses (``vllm:``), so that
dashboards and scrapers made for vLLM read them.

Histograms (seconds): ``vllm:time_to_first_token_seconds`` (arrival at the engine to the first
token read back), ``vllm:inter_token_latency_seconds`` (every gap between two tokens of a
request), ``vllm:e2e_request_latency_seconds`` (arrival to the last token). Gauges:
``vllm:num_requests_running``, ``vllm:num_requests_waiting`` (queued in the scheduler or not
yet taken in), ``vllm:kv_cache_usage_perc`` (share of KV blocks in use, 0-1). Counters:
``vllm:num_preemptions_total``, ``vllm:prompt_tokens_total``, ``vllm:generation_tokens_total``,
``vllm:request_success_total{finished_reason=...}`` (stop, length, abort, error). Every
sample carries ``model_name``. Observed on the asyncio loop (one thread: no locks).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence

from executor.serve.events import FINISH_REASONS, Event
from executor.serve.live_engine import Stats


def _buckets(text: str) -> tuple[float, ...]:
    return tuple(float(x) for x in text.split())


# vLLM's bucket bounds (seconds); inter-token ones also below 10 ms, a small model's step
TTFT_BUCKETS = _buckets(
    "0.001 0.005 0.01 0.02 0.04 0.06 0.08 0.1 0.25 0.5 0.75 1 2.5 5 7.5 10 20 40 80 160 640 2560"
)
ITL_BUCKETS = _buckets(
    "0.001 0.0025 0.005 0.0075 0.01 0.015 0.02 0.025 0.03 0.04 0.05 0.075 0.1 0.15 0.2 0.3 0.4 "
    "0.5 0.75 1 2.5 5 7.5 10 20 40 80"
)
E2E_BUCKETS = _buckets("0.3 0.5 0.8 1 1.5 2 2.5 5 10 15 20 30 40 50 60 120 240 480 960 1920 7680")


class Histogram:
    """Cumulative-bucket histogram (Prometheus' ``le`` buckets, ``+Inf`` last)."""

    def __init__(self, name: str, help_text: str, buckets: Sequence[float]) -> None:
        self.name, self.help = name, help_text
        self.buckets = tuple(buckets)
        self.counts = [0] * (len(self.buckets) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1

    def render(self, labels: str) -> list[str]:
        out = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        total = 0
        for le, c in zip((*self.buckets, math.inf), self.counts):
            total += c
            bound = "+Inf" if le == math.inf else repr(float(le))
            out.append(f'{self.name}_bucket{{{labels},le="{bound}"}} {total}')
        out.append(f"{self.name}_sum{{{labels}}} {self.sum!r}")
        out.append(f"{self.name}_count{{{labels}}} {self.count}")
        return out


class ServingMetrics:
    """Per-request latencies and token counts, observed from the engine's events."""

    def __init__(self, model_name: str) -> None:
        self.labels = f'model_name="{_escape(model_name)}"'
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds", "Time to first token in seconds.", TTFT_BUCKETS
        )
        self.itl = Histogram(
            "vllm:inter_token_latency_seconds", "Inter-token latency in seconds.", ITL_BUCKETS
        )
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "End-to-end request latency in seconds.",
            E2E_BUCKETS,
        )
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.finished = dict.fromkeys(FINISH_REASONS, 0)

    def arrived(self, num_prompt_tokens: int) -> None:
        self.prompt_tokens += num_prompt_tokens

    def observe(self, event: Event, arrival: float, last: float | None) -> None:
        """One event of a request that arrived at ``arrival`` and last emitted at ``last``."""
        if event.token_ids:
            self.generation_tokens += len(event.token_ids)
            if last is None:
                self.ttft.observe(event.time - arrival)
            else:
                self.itl.observe(event.time - last)
        if event.finish_reason is not None:
            self.finished[event.finish_reason] += 1
            if event.num_output_tokens:
                self.e2e.observe(event.time - arrival)

    def render(self, stats: Stats, waiting: int) -> str:
        """The exposition text (``text/plain; version=0.0.4``)."""
        lab = self.labels
        lines: list[str] = []
        gauges = (
            ("vllm:num_requests_running", "Requests running on the engine.", stats.running),
            ("vllm:num_requests_waiting", "Requests waiting to be scheduled.", waiting),
            ("vllm:kv_cache_usage_perc", "KV-cache usage, 1 means 100 percent.", stats.kv_usage),
        )
        for name, text, value in gauges:
            lines += [f"# HELP {name} {text}", f"# TYPE {name} gauge", f"{name}{{{lab}}} {value}"]
        counters = (
            ("vllm:num_preemptions", "Preemptions by recompute.", stats.num_preemptions),
            ("vllm:prompt_tokens", "Prompt tokens of arrived requests.", self.prompt_tokens),
            ("vllm:generation_tokens", "Generated tokens.", self.generation_tokens),
        )
        for name, text, value in counters:
            lines += [f"# HELP {name} {text}", f"# TYPE {name} counter"]
            lines.append(f"{name}_total{{{lab}}} {value}")
        name = "vllm:request_success"
        lines += [f"# HELP {name} Finished requests by reason.", f"# TYPE {name} counter"]
        for reason, n in self.finished.items():
            lines.append(f'{name}_total{{{lab},finished_reason="{reason}"}} {n}')
        for h in (self.ttft, self.itl, self.e2e):
            lines += h.render(lab)
        return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

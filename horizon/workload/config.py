"""What workload to build: source, sampling mode, arrival process, length filters, seed."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from horizon.workload.split import CONVERSATION_SETS

SOURCES = ("sharegpt", "azure")
MODES = ("first_turn", "multi_turn")
ARRIVALS = ("poisson", "gamma", "trace")


@dataclass(frozen=True)
class WorkloadConfig:
    """A workload's recipe; ``build_workload`` turns it (plus loaded data) into requests.

    Fields:
        source: ``"sharegpt"`` (prompts are token ids from ShareGPT conversations) or
            ``"azure"`` (lengths only, from an Azure trace's rows in file order; needs
            ``trace_path``; first-turn mode only).
        sharegpt_path: the ShareGPT JSON the tokenized corpus came from; None = the packaged one.
        mode: ``"first_turn"`` (each request is one conversation's first user turn) or
            ``"multi_turn"`` (every answered user turn, with its chat history as the prompt).
        num_requests: how many requests, >= 1.
        arrival: ``"poisson"``, ``"gamma"`` (with ``burstiness``) or ``"trace"`` (the
            timestamps of ``trace_path``, sped up by ``trace_rate_scale``).
        rate: mean requests/s for poisson and gamma.
        burstiness: gamma shape (1 = Poisson, < 1 burstier).
        trace_path: an Azure 2023 trace CSV (for ``arrival="trace"`` and ``source="azure"``).
        trace_rate_scale: 2 replays the trace twice as fast.
        seed: fixes which conversations are sampled and the synthetic arrival times.
        max_output_tokens: every request's output cap; longer replies are clamped to it.
        min_prompt_tokens, min_output_tokens, max_prompt_tokens, max_total_tokens: vLLM-style
            filters on the templated prompt length and the reply length (each None = off).
        multi_turn_concurrency: conversations in progress at once in multi-turn mode.
        slo_ttft, slo_itl: per-request SLO in seconds (both or neither).
        conversations: ``"all"``, or only the ``"train"`` or ``"held_out"`` conversations of
            the split given by ``split_seed`` and ``split_test_fraction`` (the rule a learned
            predictor is trained with: ``horizon.workload.split``).
    """

    source: str = "sharegpt"
    sharegpt_path: str | None = None
    mode: str = "first_turn"
    num_requests: int = 1000
    arrival: str = "poisson"
    rate: float = 1.0
    burstiness: float = 1.0
    trace_path: str | None = None
    trace_rate_scale: float = 1.0
    seed: int = 0
    max_output_tokens: int = 2048
    min_prompt_tokens: int | None = 4
    min_output_tokens: int | None = 4
    max_prompt_tokens: int | None = 1024
    max_total_tokens: int | None = 2048
    multi_turn_concurrency: int = 16
    slo_ttft: float | None = None
    slo_itl: float | None = None
    conversations: str = "all"
    split_seed: int = 0
    split_test_fraction: float = 0.2

    def __post_init__(self) -> None:
        for name, known in (
            ("source", SOURCES),
            ("mode", MODES),
            ("arrival", ARRIVALS),
            ("conversations", CONVERSATION_SETS),
        ):
            if getattr(self, name) not in known:
                raise ValueError(
                    f"WorkloadConfig.{name} must be one of {', '.join(known)}; "
                    f"got {getattr(self, name)!r}"
                )
        for name in ("sharegpt_path", "trace_path"):
            v = getattr(self, name)
            if v is not None:
                if not isinstance(v, (str, os.PathLike)):
                    raise ValueError(f"WorkloadConfig.{name} must be a path or None, got {v!r}")
                object.__setattr__(self, name, os.fspath(v))
        for name in ("num_requests", "max_output_tokens", "multi_turn_concurrency"):
            _check_int(self, name, minimum=1)
        _check_int(self, "seed", minimum=0)
        _check_int(self, "split_seed", minimum=0)
        if not 0 < self.split_test_fraction < 1:
            raise ValueError(
                "WorkloadConfig.split_test_fraction must be in (0, 1), "
                f"got {self.split_test_fraction!r}"
            )
        for name in ("rate", "burstiness", "trace_rate_scale"):
            _check_positive(self, name)
        for name in ("min_prompt_tokens", "min_output_tokens"):
            _check_int(self, name, minimum=0, optional=True)
        for name in ("max_prompt_tokens", "max_total_tokens"):
            _check_int(self, name, minimum=1, optional=True)
        for name in ("slo_ttft", "slo_itl"):
            _check_positive(self, name, optional=True)
        self._check_combinations()

    def _check_combinations(self) -> None:
        if (self.slo_ttft is None) != (self.slo_itl is None):
            raise ValueError("WorkloadConfig.slo_ttft and slo_itl must be given together")
        if self.trace_path is None and (self.arrival == "trace" or self.source == "azure"):
            why = "arrival='trace'" if self.arrival == "trace" else "source='azure'"
            raise ValueError(f"WorkloadConfig.trace_path is required with {why}")
        if self.source == "azure" and self.mode != "first_turn":
            raise ValueError("WorkloadConfig.mode must be 'first_turn' with source='azure'")
        lo, hi = self.min_prompt_tokens, self.max_prompt_tokens
        if lo is not None and hi is not None and lo > hi:
            raise ValueError("WorkloadConfig.min_prompt_tokens exceeds max_prompt_tokens")
        if self.min_output_tokens is not None and self.min_output_tokens > self.max_output_tokens:
            raise ValueError("WorkloadConfig.min_output_tokens exceeds max_output_tokens")


def _check_int(cfg: WorkloadConfig, name: str, minimum: int, optional: bool = False) -> None:
    v = getattr(cfg, name)
    if optional and v is None:
        return
    if not isinstance(v, int) or isinstance(v, bool) or v < minimum:
        none = " or None" if optional else ""
        raise ValueError(f"WorkloadConfig.{name} must be an int >= {minimum}{none}, got {v!r}")


def _check_positive(cfg: WorkloadConfig, name: str, optional: bool = False) -> None:
    v = getattr(cfg, name)
    if optional and v is None:
        return
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0
    if not ok:
        none = " or None" if optional else ""
        raise ValueError(f"WorkloadConfig.{name} must be a finite number > 0{none}, got {v!r}")

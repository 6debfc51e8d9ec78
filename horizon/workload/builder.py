"""Config + loaded data -> a workload: requests numbered in arrival order, and what was dropped."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from horizon.request import SLO, Request
from horizon.workload import arrivals
from horizon.workload.azure_trace import AzureTrace
from horizon.workload.config import WorkloadConfig
from horizon.workload.filters import FilterTally, LengthFilter
from horizon.workload.multi_turn import TooFewRequests, interleave
from horizon.workload.split import held_out_conversations
from horizon.workload.tokenized import TokenizedCorpus
from horizon.workload.turns import RequestSpec, conversation_requests


@dataclass(frozen=True, eq=False)
class Workload:
    """Requests (``request_id == index``, arrival times non-decreasing) and build statistics.

    The requests are mutable (a run advances their counters): give every run its own copies with
    ``new_requests()``.
    """

    config: WorkloadConfig
    requests: tuple[Request, ...]
    stats: dict

    def new_requests(self) -> tuple[Request, ...]:
        """Fresh, unstarted copies of ``requests`` (same ids, arrivals, prompts, lengths)."""
        return tuple(fresh_copy(r) for r in self.requests)


def fresh_copy(r: Request, request_id: int | None = None) -> Request:
    """An unstarted copy of ``r`` (same arrival, prompt, lengths, SLO, ids), renumbered to
    ``request_id`` if given."""
    return Request(
        request_id=r.request_id if request_id is None else request_id,
        arrival_time=r.arrival_time,
        num_prompt_tokens=r.num_prompt_tokens,
        max_output_tokens=r.max_output_tokens,
        true_output_tokens=r.true_output_tokens,
        slo=r.slo,
        prompt_token_ids=r.prompt_token_ids,
        conversation_id=r.conversation_id,
        turn_index=r.turn_index,
        output_token_ids=r.output_token_ids,
    )


def build_workload(
    config: WorkloadConfig,
    tokenized: TokenizedCorpus | None = None,
    trace: AzureTrace | None = None,
) -> Workload:
    """Sample ``config.num_requests`` requests and give them arrival times.

    Args:
        config: the recipe. Its seed fixes everything random: the same config and data give
            identical requests.
        tokenized: the ShareGPT corpus (required for ``source="sharegpt"``; if
            ``config.sharegpt_path`` is set, the corpus must come from that file).
        trace: the Azure trace of ``config.trace_path`` (required for ``arrival="trace"`` and
            ``source="azure"``).

    Returns:
        The workload. ShareGPT: conversations are shuffled with the seed and taken in that order
        (without replacement); each kept one gives its first answered turn (``first_turn``) or
        its answered turns interleaved with ``multi_turn_concurrency`` others (``multi_turn``).
        Azure: kept rows in file order, lengths only. ``stats`` holds: source, mode,
        source_path, conversations_read, truncated, cache_path, trace_path, examined, kept,
        conversations_used, dropped (per reason), turns_cut, clamped.

    Raises:
        ValueError: missing or mismatched inputs, or too few requests survive the filters.
    """
    _check_inputs(config, tokenized, trace)
    sample_seed, arrival_seed = np.random.SeedSequence(config.seed).spawn(2)
    tally = FilterTally()
    specs, trace_times = _specs(config, tokenized, trace, tally, sample_seed)
    times = _arrival_times(config, trace_times, np.random.default_rng(arrival_seed))
    requests = _requests(config, tokenized, specs, times)
    stats = _stats(config, tokenized, trace, specs, tally)
    return Workload(config=config, requests=requests, stats=stats)


def _specs(
    config: WorkloadConfig,
    tokenized: TokenizedCorpus | None,
    trace: AzureTrace | None,
    tally: FilterTally,
    sample_seed: np.random.SeedSequence,
) -> tuple[list[RequestSpec], np.ndarray | None]:
    """The sampled requests' specs, and the trace times their arrivals replay (if any)."""
    limits = LengthFilter.from_config(config)
    trace_times: np.ndarray | None = None
    if config.source == "azure":
        assert trace is not None
        specs = _azure_specs(trace, config.num_requests, limits, tally)
        trace_times = trace.times[[s.row for s in specs]]
    else:
        assert tokenized is not None
        rng = np.random.default_rng(sample_seed)
        specs = _sharegpt_specs(config, tokenized, limits, tally, rng)
        if trace is not None:
            trace_times = trace.times
    return specs, trace_times


def _requests(
    config: WorkloadConfig,
    tokenized: TokenizedCorpus | None,
    specs: list[RequestSpec],
    times: np.ndarray,
) -> tuple[Request, ...]:
    """The specs as requests numbered in arrival order, with the config's SLO and limit."""
    slo = None
    if config.slo_ttft is not None and config.slo_itl is not None:
        slo = SLO(config.slo_ttft, config.slo_itl)
    return tuple(
        Request(
            request_id=i,
            arrival_time=float(t),
            num_prompt_tokens=s.num_prompt_tokens,
            max_output_tokens=config.max_output_tokens,
            true_output_tokens=s.output_tokens,
            slo=slo,
            prompt_token_ids=s.prompt_token_ids,
            conversation_id=s.conversation_id,
            turn_index=s.turn_index,
            output_token_ids=reply_token_ids(tokenized, s) if config.source == "sharegpt" else None,
        )
        for i, (s, t) in enumerate(zip(specs, times, strict=True))
    )


def reply_token_ids(tokenized: TokenizedCorpus | None, spec: RequestSpec) -> tuple[int, ...]:
    """The ids a ShareGPT request's engine replay generates: its reply turn's ids, cut to the
    spec's (capped) ``output_tokens``, so ``len == true_output_tokens``."""
    assert tokenized is not None and spec.conversation_id >= 0
    reply = tokenized.turn_ids(spec.conversation_id, 2 * spec.turn_index + 1)
    assert len(reply) >= spec.output_tokens
    return tuple(reply[: spec.output_tokens].tolist())


def _check_inputs(
    config: WorkloadConfig, tokenized: TokenizedCorpus | None, trace: AzureTrace | None
) -> None:
    if config.source == "sharegpt":
        if tokenized is None:
            raise ValueError("source='sharegpt' needs a TokenizedCorpus (tokenize_corpus)")
        if config.sharegpt_path is not None and not _same(config.sharegpt_path, tokenized.source):
            raise ValueError(
                f"WorkloadConfig.sharegpt_path {config.sharegpt_path} is not the tokenized "
                f"corpus's source {tokenized.source}"
            )
    if config.arrival == "trace" or config.source == "azure":
        if trace is None:
            raise ValueError("arrival='trace' and source='azure' need an AzureTrace")
        assert config.trace_path is not None  # WorkloadConfig checks it
        if not _same(config.trace_path, trace.source):
            raise ValueError(
                f"WorkloadConfig.trace_path {config.trace_path} is not the trace's source "
                f"{trace.source}"
            )


def _same(a: str, b: str) -> bool:
    return Path(a).resolve() == Path(b).resolve()


def _sharegpt_specs(
    config: WorkloadConfig,
    tokenized: TokenizedCorpus,
    limits: LengthFilter,
    tally: FilterTally,
    rng: np.random.Generator,
) -> list[RequestSpec]:
    order = rng.permutation(tokenized.num_conversations)
    if config.conversations != "all":
        held = held_out_conversations(
            tokenized.num_conversations, config.split_seed, config.split_test_fraction
        )
        keep = config.conversations == "held_out"
        order = np.array([c for c in order.tolist() if (c in held) == keep], dtype=np.int64)
    max_turns = 1 if config.mode == "first_turn" else None

    def candidates() -> Iterator[list[RequestSpec]]:
        for c in order.tolist():
            tally.examined += 1
            yield conversation_requests(tokenized, c, limits, tally, max_turns)

    concurrency = 1 if config.mode == "first_turn" else config.multi_turn_concurrency
    try:
        return interleave(candidates(), config.num_requests, concurrency)
    except TooFewRequests as e:
        which = "all" if config.conversations == "all" else (
            f"the {config.conversations} (split_test_fraction={config.split_test_fraction})"
        )
        raise ValueError(
            f"too few ShareGPT requests: num_requests={e.wanted}, but {which} conversations "
            f"give {e.available} after the filters (dropped {tally.dropped} of "
            f"{tally.examined}); set num_requests <= {e.available}"
        ) from None


def _azure_specs(
    trace: AzureTrace, n: int, limits: LengthFilter, tally: FilterTally
) -> list[RequestSpec]:
    specs: list[RequestSpec] = []
    for row, (ctx, gen) in enumerate(
        zip(trace.context_tokens.tolist(), trace.generated_tokens.tolist(), strict=True)
    ):
        if len(specs) == n:
            break
        tally.examined += 1
        reason = limits.drop_reason(ctx, ctx, gen)
        if reason is not None:
            tally.drop(reason)
            continue
        out = limits.capped(gen)
        specs.append(
            RequestSpec(num_prompt_tokens=ctx, output_tokens=out, clamped=out < gen, row=row)
        )
    if len(specs) < n:
        raise ValueError(
            f"too few Azure trace rows: {len(specs)} of {len(trace)} kept for {n} requests; "
            f"dropped {tally.dropped}"
        )
    return specs


def _arrival_times(
    config: WorkloadConfig, trace_times: np.ndarray | None, rng: np.random.Generator
) -> np.ndarray:
    n = config.num_requests
    if config.arrival == "poisson":
        return arrivals.poisson(config.rate, n, rng)
    if config.arrival == "gamma":
        return arrivals.gamma(config.rate, config.burstiness, n, rng)
    assert trace_times is not None
    return arrivals.replay(trace_times, n, config.trace_rate_scale)


def _stats(
    config: WorkloadConfig,
    tokenized: TokenizedCorpus | None,
    trace: AzureTrace | None,
    specs: list[RequestSpec],
    tally: FilterTally,
) -> dict:
    corpus = tokenized if config.source == "sharegpt" else None
    trace_path = trace.source if trace is not None else None
    return {
        "source": config.source,
        "mode": config.mode,
        "source_path": corpus.source if corpus is not None else trace_path,
        "conversations_read": corpus.num_read if corpus is not None else None,
        "truncated": corpus.truncated if corpus is not None else None,
        "cache_path": corpus.cache_path if corpus is not None else None,
        "trace_path": trace_path,
        "examined": tally.examined,
        "kept": len(specs),
        "conversations_used": len({s.conversation_id for s in specs})
        if corpus is not None
        else None,
        "dropped": dict(tally.dropped),
        "turns_cut": tally.turns_cut,
        "clamped": sum(s.clamped for s in specs),
    }

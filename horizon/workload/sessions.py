"""Multi-turn ShareGPT as closed-loop sessions: a turn arrives after the previous reply + a think.

This module builds data only; a runtime releases the turns. The contract between the two::

    session.start                 arrival time of turn 0 (== requests[0].arrival_time)
    finish(k)                     when the runtime sees turn k's last token
    arrival(k + 1)                finish(k) + think_times[k]      (set by the runtime)

Turns after the first carry ``arrival_time == 0.0`` as a placeholder: the runtime must overwrite
it (or build a copy) before handing the request to a scheduler; nothing may read it before.
Turn ``k``'s prompt is a token prefix of turn ``k + 1``'s (the chat history, with turn ``k``'s
full reply), which is what a prefix cache reuses across the turns of a session.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from horizon.request import SLO, Request
from horizon.workload import arrivals
from horizon.workload.builder import reply_token_ids
from horizon.workload.field_checks import check_int, check_number, check_slo, is_number
from horizon.workload.filters import FilterTally, LengthFilter
from horizon.workload.tokenized import TokenizedCorpus
from horizon.workload.turns import RequestSpec, conversation_requests


@dataclass(frozen=True, eq=False)
class Session:
    """One conversation's turns, released one at a time (see the module docstring).

    Fields:
        session_id: index of the session in start order.
        requests: the turns in order (``turn_index`` 0, 1, ...); request ids are unique across
            all sessions of a build. Mutable requests: give each run fresh copies.
        think_times: ``len(requests) - 1`` seconds >= 0; turn ``k + 1`` arrives
            ``think_times[k]`` after turn ``k`` finished.
        start: arrival time of turn 0 (``requests[0].arrival_time == start``); later turns'
            ``arrival_time`` is a placeholder 0.0 for the runtime to overwrite.
    """

    session_id: int
    requests: tuple[Request, ...]
    think_times: tuple[float, ...]
    start: float

    def __post_init__(self) -> None:
        if not self.requests:
            raise ValueError(f"Session.requests of session {self.session_id} is empty")
        if len(self.think_times) != len(self.requests) - 1:
            raise ValueError(
                f"Session.think_times has {len(self.think_times)} entries for "
                f"{len(self.requests)} requests (needs len(requests) - 1)"
            )
        if not all(is_number(t) and t >= 0 for t in self.think_times):
            raise ValueError(
                f"Session.think_times must be finite seconds >= 0, got {self.think_times}"
            )
        if not is_number(self.start) or self.requests[0].arrival_time != self.start:
            raise ValueError(
                f"Session.start ({self.start!r}) must be finite and equal requests[0].arrival_time "
                f"({self.requests[0].arrival_time})"
            )


@dataclass(frozen=True)
class SessionConfig:
    """Recipe of a closed-loop multi-turn workload; ``build_sessions`` turns it into sessions.

    Fields:
        num_sessions: how many sessions (conversations), >= 1.
        max_turns: use at most this many answered turns per conversation (None = all).
        min_turns: conversations with fewer usable turns (after the filters) are skipped.
        session_rate: Poisson session starts per second.
        think_time_mean: mean of the exponential think times, seconds (0 = next turn at once).
        max_output_tokens: every request's output cap; longer replies are clamped to it.
        min_prompt_tokens, min_output_tokens, max_prompt_tokens, max_total_tokens: the length
            filters of ``LengthFilter`` (None = off), applied turn by turn; the first turn they
            drop ends its conversation there. Prompts grow with the history, so the maxima
            default to those of the multi-turn workload (``configs/workload/
            sharegpt_multi_turn.yaml``: 4096 and 6144) rather than the first-turn 1024 / 2048.
        seed: fixes the sampled conversations, the starts and the think times.
        slo_ttft, slo_itl: per-request SLO in seconds (both or neither).
    """

    num_sessions: int = 100
    max_turns: int | None = None
    min_turns: int = 1
    session_rate: float = 1.0
    think_time_mean: float = 5.0
    max_output_tokens: int = 2048
    min_prompt_tokens: int | None = 4
    min_output_tokens: int | None = 4
    max_prompt_tokens: int | None = 4096
    max_total_tokens: int | None = 6144
    seed: int = 0
    slo_ttft: float | None = None
    slo_itl: float | None = None

    def __post_init__(self) -> None:
        for name in ("num_sessions", "min_turns", "max_output_tokens"):
            check_int(self, name, minimum=1)
        check_int(self, "max_turns", minimum=1, optional=True)
        check_int(self, "seed", minimum=0)
        check_number(self, "session_rate")
        check_number(self, "think_time_mean", allow_zero=True)
        for name in ("min_prompt_tokens", "min_output_tokens"):
            check_int(self, name, minimum=0, optional=True)
        for name in ("max_prompt_tokens", "max_total_tokens"):
            check_int(self, name, minimum=1, optional=True)
        check_slo(self)
        if self.max_turns is not None and self.max_turns < self.min_turns:
            raise ValueError("SessionConfig.max_turns is below min_turns")
        lo, hi = self.min_prompt_tokens, self.max_prompt_tokens
        if lo is not None and hi is not None and lo > hi:
            raise ValueError("SessionConfig.min_prompt_tokens exceeds max_prompt_tokens")
        if self.min_output_tokens is not None and self.min_output_tokens > self.max_output_tokens:
            raise ValueError("SessionConfig.min_output_tokens exceeds max_output_tokens")

    @property
    def limits(self) -> LengthFilter:
        return LengthFilter(
            max_output_tokens=self.max_output_tokens,
            min_prompt_tokens=self.min_prompt_tokens,
            min_output_tokens=self.min_output_tokens,
            max_prompt_tokens=self.max_prompt_tokens,
            max_total_tokens=self.max_total_tokens,
        )


def build_sessions(config: SessionConfig, tokenized: TokenizedCorpus) -> tuple[Session, ...]:
    """``config.num_sessions`` sessions from seeded-shuffled ShareGPT conversations.

    Conversations are taken in a seeded order, each with its usable answered turns
    (``conversation_requests``: turn ``k``'s prompt is a token prefix of turn ``k + 1``'s); those
    with fewer than ``min_turns`` are skipped. Starts are Poisson at ``session_rate`` (the first
    at 0), sessions are numbered in start order, and request ids run session by session
    (0 .. total - 1). Each request keeps its corpus ``conversation_id`` and ``turn_index`` and has
    ``output_token_ids`` = its reply cut to the capped length. Same config and corpus, same
    sessions.

    Raises:
        ValueError: fewer than ``num_sessions`` conversations are usable.
    """
    order_ss, start_ss, think_ss = np.random.SeedSequence(config.seed).spawn(3)
    convs = _conversations(config, tokenized, np.random.default_rng(order_ss))
    starts = arrivals.poisson(
        config.session_rate, config.num_sessions, np.random.default_rng(start_ss)
    )
    think_rng = np.random.default_rng(think_ss)
    slo = None
    if config.slo_ttft is not None and config.slo_itl is not None:
        slo = SLO(config.slo_ttft, config.slo_itl)
    sessions = []
    next_id = 0
    for s, (specs, start) in enumerate(zip(convs, starts.tolist(), strict=True)):
        requests = tuple(
            _request(config, tokenized, spec, next_id + k, start if k == 0 else 0.0, slo)
            for k, spec in enumerate(specs)
        )
        next_id += len(requests)
        thinks = _think_times(config.think_time_mean, len(requests) - 1, think_rng)
        sessions.append(Session(session_id=s, requests=requests, think_times=thinks, start=start))
    return tuple(sessions)


def session_requests(sessions: Iterable[Session]) -> list[Request]:
    """All sessions' requests, session by session, each session's turns in order."""
    return [r for s in sessions for r in s.requests]


def _conversations(
    config: SessionConfig, tokenized: TokenizedCorpus, rng: np.random.Generator
) -> list[list[RequestSpec]]:
    limits = config.limits
    tally = FilterTally()
    out: list[list[RequestSpec]] = []
    for c in rng.permutation(tokenized.num_conversations).tolist():
        specs = conversation_requests(tokenized, c, limits, tally, config.max_turns)
        if len(specs) >= config.min_turns:
            out.append(specs)
            if len(out) == config.num_sessions:
                return out
    raise ValueError(
        f"too few ShareGPT sessions: SessionConfig.num_sessions={config.num_sessions}, but only "
        f"{len(out)} of {tokenized.num_conversations} conversations have >= min_turns="
        f"{config.min_turns} usable turns after the filters (dropped {_nonzero(tally.dropped)})"
    )


def _request(
    config: SessionConfig,
    tokenized: TokenizedCorpus,
    spec: RequestSpec,
    request_id: int,
    arrival_time: float,
    slo: SLO | None,
) -> Request:
    return Request(
        request_id=request_id,
        arrival_time=arrival_time,
        num_prompt_tokens=spec.num_prompt_tokens,
        max_output_tokens=config.max_output_tokens,
        true_output_tokens=spec.output_tokens,
        slo=slo,
        prompt_token_ids=spec.prompt_token_ids,
        conversation_id=spec.conversation_id,
        turn_index=spec.turn_index,
        output_token_ids=reply_token_ids(tokenized, spec),
    )


def _think_times(mean: float, n: int, rng: np.random.Generator) -> tuple[float, ...]:
    if mean == 0:
        return (0.0,) * n
    return tuple(rng.exponential(mean, size=n).tolist())


def _nonzero(counts: dict[str, int]) -> dict[str, int]:
    return {k: v for k, v in counts.items() if v}

"""A serving request and its progress counters.

Progress is three counters, never a phase flag (DESIGN.md):

    num_prompt_tokens    P  tokens of the prompt
    num_output_tokens    G  tokens emitted so far
    num_computed_tokens  C  tokens whose KV is in the cache

A request holds ``P + G`` tokens. Scheduling ``n`` tokens advances ``C`` by ``n``; when ``C``
reaches ``P + G`` the step emits a token and ``G`` grows by one. Hence:

    prefill (first or recompute):  C < P + G - 1, or G == 0
    decode:                        G >= 1 and C == P + G - 1

After a preemption by recompute, ``C`` drops to 0 (or to a prefix-cache hit) while ``G`` stays,
so the recompute prefill covers ``P + G`` tokens and ends by emitting the next token. The
scheduler never leaves a recompute prefill with exactly one token to compute (it would read as
a decode that has not emitted): its chunks and prefix hits stop two short or reach the end.

Lazy decode counters: the fast scheduler does not touch a decoding request at every step. While
a request decodes, its counters are *anchored* at a step of the scheduler's ``StepClock``: both
``C`` and ``G`` grow by one per completed step since the anchor. Reads are always exact; writes
go through ``anchor``/``settle`` (scheduler only).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass


class RequestStatus(enum.Enum):
    """Where a request is in its life. Prefill vs decode is *not* a status: see the counters."""

    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    REJECTED = "rejected"
    TRANSFERRING = "transferring"  # prefilled on one replica, its KV on the way to another


@dataclass(frozen=True)
class SLO:
    """Latency targets of a request, in seconds. ``ttft``: first token; ``itl``: every gap."""

    ttft: float
    itl: float

    def __post_init__(self) -> None:
        for name in ("ttft", "itl"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise ValueError(f"SLO.{name} must be a finite number > 0 seconds, got {v!r}")


class StepClock:
    """Count of completed engine steps of one run. Owned by one scheduler; never global."""

    __slots__ = ("step",)

    def __init__(self) -> None:
        self.step = 0


class Request:
    """One request of a workload.

    Args:
        request_id: unique within a run (the workload numbers its requests 0..N-1).
        arrival_time: seconds from the start of the run, finite and >= 0.
        num_prompt_tokens: prompt length, >= 1; must equal ``len(prompt_token_ids)`` if given.
        max_output_tokens: the request's output limit, >= 1.
        true_output_tokens: the trace's output length, 1..max_output_tokens. Read only by a
            backend's stopping rule and by explicitly oracle policies/predictors.
        slo: latency targets (optional; metrics take a run-wide SLO when absent).
        prompt_token_ids: the prompt's ids when known (prefix caching hashes them).
        conversation_id / turn_index: for multi-turn workloads (a later turn's prompt carries the
            history).
        output_token_ids: the trace's reply ids when known, i.e. what the engine generates when
            replaying the trace; its length must equal ``true_output_tokens``. Like
            ``true_output_tokens``, all but the tokens generated so far are the future: a
            (non-oracle) predictor may read only ``output_token_ids[:num_output_tokens]``, the
            text a real engine has when it re-predicts, never beyond. Shared, not copied.

    Raises:
        ValueError: naming the field, for any value a workload file could get wrong.
    """

    __slots__ = (
        "request_id",
        "arrival_time",
        "num_prompt_tokens",
        "max_output_tokens",
        "true_output_tokens",
        "slo",
        "prompt_token_ids",
        "conversation_id",
        "turn_index",
        "output_token_ids",
        "status",
        "_computed",
        "_output",
        "_anchor",
        "_clock",
        "num_preemptions",
        "admit_seq",
        "sched",
        "handoff",
    )

    def __init__(
        self,
        request_id: int,
        arrival_time: float,
        num_prompt_tokens: int,
        max_output_tokens: int,
        true_output_tokens: int,
        slo: SLO | None = None,
        prompt_token_ids: tuple[int, ...] | None = None,
        conversation_id: int = -1,
        turn_index: int = 0,
        output_token_ids: tuple[int, ...] | None = None,
    ) -> None:
        _check_fields(
            request_id,
            arrival_time,
            num_prompt_tokens,
            max_output_tokens,
            true_output_tokens,
            prompt_token_ids,
            output_token_ids,
        )
        self.request_id = request_id
        self.arrival_time = float(arrival_time)
        self.num_prompt_tokens = num_prompt_tokens
        self.max_output_tokens = max_output_tokens
        self.true_output_tokens = true_output_tokens
        self.slo = slo
        self.prompt_token_ids = prompt_token_ids
        self.conversation_id = conversation_id
        self.turn_index = turn_index
        self.output_token_ids = output_token_ids
        self.status = RequestStatus.WAITING
        self._computed = 0
        self._output = 0
        self._anchor: int | None = None  # clock step at which lazy decode counters were anchored
        self._clock: StepClock | None = None
        self.num_preemptions = 0
        self.admit_seq = -1  # order of the latest admission, set by the scheduler
        self.sched: object = None  # scheduler-private bookkeeping slot
        # disaggregated serving: compute all but the prompt's last token here, then hand the
        # KV to a decode replica (set by the cluster when it routes to a prefill replica)
        self.handoff = False

    # -- counters (exact at every read) ------------------------------------------------------
    def _drift(self) -> int:
        if self._anchor is None:
            return 0
        assert self._clock is not None
        return self._clock.step - self._anchor

    # (the drift inlined: these two are read millions of times per simulated minute)
    @property
    def num_computed_tokens(self) -> int:
        a = self._anchor
        return self._computed if a is None else self._computed + self._clock.step - a

    @property
    def num_output_tokens(self) -> int:
        a = self._anchor
        return self._output if a is None else self._output + self._clock.step - a

    @property
    def num_tokens(self) -> int:
        """Prompt plus emitted tokens: what a recompute prefill must cover."""
        return self.num_prompt_tokens + self.num_output_tokens

    @property
    def num_tokens_to_compute(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_prefill(self) -> bool:
        return self.num_output_tokens == 0 or self.num_tokens_to_compute > 1

    @property
    def is_decode(self) -> bool:
        return not self.is_prefill

    @property
    def remaining_true_output(self) -> int:
        """Oracle only: true output tokens still to emit."""
        return self.true_output_tokens - self.num_output_tokens

    # -- scheduler-side mutation ---------------------------------------------------------------
    def advance(self, n: int) -> bool:
        """Account ``n`` computed tokens; returns True if the step emits a token."""
        assert self._anchor is None and 0 < n <= self.num_tokens_to_compute
        self._computed += n
        if self._computed == self.num_prompt_tokens + self._output:
            self._output += 1
            return True
        return False

    def anchor(self, clock: StepClock) -> None:
        """From now on, each completed step of ``clock`` adds one to C and G (lazy decode)."""
        assert self._anchor is None and self.is_decode
        self._clock = clock
        self._anchor = clock.step

    def settle(self) -> None:
        """Fold the lazy drift back into plain counters."""
        if self._anchor is not None:
            d = self._drift()
            self._computed += d
            self._output += d
            self._anchor = None

    def reset_for_recompute(self, num_cached_tokens: int = 0) -> None:
        """Preemption by recompute: KV is dropped, emitted tokens are kept."""
        self.settle()
        self._computed = num_cached_tokens
        self.num_preemptions += 1

    def set_computed(self, n: int) -> None:
        """Prefix-cache adoption on admission: ``n`` tokens need no compute."""
        assert self._anchor is None and 0 <= n < self.num_tokens
        self._computed = n

    def __repr__(self) -> str:
        return (
            f"Request(id={self.request_id}, t={self.arrival_time:.3f}, P={self.num_prompt_tokens}, "
            f"C={self.num_computed_tokens}, G={self.num_output_tokens}, {self.status.value})"
        )


def _check_fields(
    request_id: int,
    arrival_time: float,
    num_prompt_tokens: int,
    max_output_tokens: int,
    true_output_tokens: int,
    prompt_token_ids: tuple[int, ...] | None,
    output_token_ids: tuple[int, ...] | None,
) -> None:
    """Raise ValueError naming the first of ``Request``'s fields a workload got wrong."""
    if not isinstance(arrival_time, (int, float)) or not math.isfinite(arrival_time):
        raise ValueError(f"request {request_id}: arrival_time must be finite, got {arrival_time!r}")
    if arrival_time < 0:
        raise ValueError(f"request {request_id}: arrival_time must be >= 0, got {arrival_time!r}")
    if not isinstance(num_prompt_tokens, int) or num_prompt_tokens < 1:
        raise ValueError(
            f"request {request_id}: num_prompt_tokens must be an int >= 1, "
            f"got {num_prompt_tokens!r}"
        )
    if not isinstance(max_output_tokens, int) or max_output_tokens < 1:
        raise ValueError(
            f"request {request_id}: max_output_tokens must be an int >= 1, "
            f"got {max_output_tokens!r}"
        )
    if not isinstance(true_output_tokens, int) or not 1 <= true_output_tokens <= max_output_tokens:
        raise ValueError(
            f"request {request_id}: true_output_tokens must be an int in 1..max_output_tokens "
            f"({max_output_tokens}), got {true_output_tokens!r}"
        )
    if prompt_token_ids is not None and len(prompt_token_ids) != num_prompt_tokens:
        raise ValueError(
            f"request {request_id}: len(prompt_token_ids)={len(prompt_token_ids)} differs from "
            f"num_prompt_tokens={num_prompt_tokens}"
        )
    if output_token_ids is not None and len(output_token_ids) != true_output_tokens:
        raise ValueError(
            f"request {request_id}: len(output_token_ids)={len(output_token_ids)} differs "
            f"from true_output_tokens={true_output_tokens}"
        )

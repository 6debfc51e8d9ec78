"""What passes between the scheduler and a backend each step.

``schedule(now) -> StepPlan`` → backend ``execute(plan) -> StepResult`` →
``update(plan, result, now)``. Backends read the plan and the requests' counters (as they were
when the plan was made) and never touch scheduler state.

``new_plan`` and ``new_result`` build the same frozen objects as ``StepPlan(...)`` and
``StepResult(...)`` at a fraction of the cost (the simulator makes one of each per step): the
fields are stored through an unfrozen class of the same slot layout, whose instance then
becomes a ``StepPlan`` / ``StepResult`` (``__class__`` assignment between layout-compatible
classes), immutable as any other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from horizon.request import Request


@dataclass(frozen=True, eq=False, slots=True)
class StepPlan:
    """One engine step, explicit per request.

    Attributes:
        step: index of this step in the run (0, 1, 2, ...).
        time: the scheduler's clock when the plan was made (seconds).
        decodes: requests computing exactly one token (their last) and emitting one.
        prefills: ``(request, n)`` chunks: ``n`` prompt/recompute tokens starting at the
            request's ``num_computed_tokens``. A chunk that ends the prefill emits a token.
        preempted: requests preempted by recompute while making this plan (not in the step).
        rejected: ``(request, reason)`` for requests that can never run.
        num_prefill_tokens: sum of the chunks' ``n``.
        decode_context_tokens: sum of the decodes' context lengths (KV tokens read).
        prefill_attention_pairs: sum over chunks of query-key pairs attended (causal).
        prefill_context_tokens: sum over chunks of the KV length at the chunk's end.
        num_running / num_waiting: queue sizes after this plan's admissions.
        kv_used_blocks: blocks in use after this plan's allocations.
        token_budget: the step's token budget.
        num_refreshed: running requests whose estimates the policy refreshed while making this
            plan (0 on steps without a refresh): host work a step's measured time includes.
        verifies: ``(request, k)`` for decoding requests that speculate (``k >= 1`` draft
            tokens, ``horizon.speculation``): the step computes ``k + 1`` query tokens for each
            (its last token and the drafts) over its ``num_computed_tokens`` of context, and it
            emits ``1..k+1`` tokens (``StepResult.accepted``). Their blocks for all ``k + 1``
            are allocated; ``update`` trims what the rejected drafts used. Disjoint from
            ``decodes``; empty without speculation. Their shape: ``num_verify_tokens``,
            ``verify_context_tokens``, ``verify_attention_pairs`` (properties, computed from
            the requests' pre-update counters: read them before ``update``). A scheduler
            that draws acceptance ahead gives a ``horizon.drawn_verifies.DrawnVerifies``, a
            sequence of the same pairs whose shape is kept rather than summed.
        longest_decode_context: the largest context one of ``decodes`` reads (0 without
            decodes): the program a step with prefill chunks waits for
            (``simulator.engine_cost_model``).
    """

    step: int
    time: float
    decodes: tuple[Request, ...]
    prefills: tuple[tuple[Request, int], ...]
    preempted: tuple[Request, ...] = ()
    rejected: tuple[tuple[Request, str], ...] = ()
    num_prefill_tokens: int = 0
    decode_context_tokens: int = 0
    prefill_attention_pairs: int = 0
    prefill_context_tokens: int = 0
    num_running: int = 0
    num_waiting: int = 0
    kv_used_blocks: int = 0
    token_budget: int = 0
    num_refreshed: int = 0
    verifies: tuple[tuple[Request, int], ...] = ()
    longest_decode_context: int = 0

    @property
    def num_decode_tokens(self) -> int:
        return len(self.decodes)

    @property
    def num_tokens(self) -> int:
        return self.num_decode_tokens + self.num_prefill_tokens + self.num_verify_tokens

    @property
    def is_empty(self) -> bool:
        return not self.decodes and not self.prefills and not self.verifies

    @property
    def num_verify_tokens(self) -> int:
        """Sum over verifies of ``k + 1`` (query tokens)."""
        v = self.verifies
        if v.__class__ is not tuple:  # drawn ahead (horizon.drawn_verifies): kept totals
            return v.num_drafts + len(v)  # type: ignore[attr-defined]
        return sum(k for _, k in v) + len(v)

    @property
    def verify_context_tokens(self) -> int:
        """Sum over verifies of the KV length at the step's end (context + ``k + 1``), as
        ``prefill_context_tokens`` is for chunks."""
        v = self.verifies
        if v.__class__ is not tuple:
            return v.context_tokens + v.num_drafts + len(v)  # type: ignore[attr-defined]
        return sum(r.num_computed_tokens + k + 1 for r, k in v)

    @property
    def verify_attention_pairs(self) -> int:
        """Sum over verifies of query-key pairs attended (causal), as
        ``prefill_attention_pairs`` is for chunks."""
        v = self.verifies
        if v.__class__ is not tuple:
            return v.attention_pairs  # type: ignore[attr-defined]
        return sum((k + 1) * r.num_computed_tokens + (k + 1) * (k + 2) // 2 for r, k in v)


# What a step costs depends on: the fields a cost model reads and a calibration file records,
# in this order (``plan_shape`` gives their values).
PLAN_SHAPE_FIELDS = (
    "num_prefill_tokens",
    "num_decodes",
    "decode_context_tokens",
    "prefill_context_tokens",
    "prefill_attention_pairs",
    "num_prefills",
)


def plan_shape(plan: StepPlan) -> tuple[int, int, int, int, int, int]:
    """The values of ``PLAN_SHAPE_FIELDS`` for ``plan``."""
    return (
        plan.num_prefill_tokens,
        len(plan.decodes),
        plan.decode_context_tokens,
        plan.prefill_context_tokens,
        plan.prefill_attention_pairs,
        len(plan.prefills),
    )


@dataclass(frozen=True, eq=False, slots=True)
class StepResult:
    """What a backend returns for a plan.

    Attributes:
        duration: seconds the step took (measured on the serial engine, modelled in the
            simulator; NaN from the pipelined engine, which records a step's end once its
            tokens are read).
        finished: requests that stopped at this step (their stopping rule: true length, EOS,
            or ``max_output_tokens``); each emitted its last token in this step.
        token_ids: request id -> token emitted this step (the engine); empty in the simulator.
        accepted: draft tokens accepted for each of the plan's ``verifies``, in its order
            (``0..k`` each; the request emits that many plus one, fewer only if it finished
            with them). Empty when the plan verifies nothing. For a ``DrawnVerifies`` plan, a
            ``horizon.drawn_verifies.DrawnAccepted``: the drawn counts, and by request id
            those the backend accepted fewer of.
    """

    duration: float
    finished: tuple[Request, ...] = ()
    token_ids: dict[int, int] = field(default_factory=dict)
    accepted: Sequence[int] = ()


def _same_layout(cls: type) -> type:
    """A plain class with ``cls``'s slots (same names, same order): its instances store fields
    without the frozen ``__setattr__`` and may then take ``cls`` as their class."""
    return type(f"_{cls.__name__}Fields", (), {"__slots__": cls.__slots__})


_PlanFields = _same_layout(StepPlan)
_ResultFields = _same_layout(StepResult)
_new = object.__new__


def new_plan(
    step: int,
    time: float,
    decodes: tuple[Request, ...],
    prefills: tuple[tuple[Request, int], ...],
    preempted: tuple[Request, ...],
    rejected: tuple[tuple[Request, str], ...],
    num_prefill_tokens: int,
    decode_context_tokens: int,
    prefill_attention_pairs: int,
    prefill_context_tokens: int,
    num_running: int,
    num_waiting: int,
    kv_used_blocks: int,
    token_budget: int,
    num_refreshed: int,
    verifies: tuple[tuple[Request, int], ...] = (),
    longest_decode_context: int = 0,
) -> StepPlan:
    """``StepPlan(...)`` with every field given in its order (the last two may be left out),
    built without the frozen ``__init__``'s cost: the same frozen object."""
    p = _new(_PlanFields)
    p.step = step
    p.time = time
    p.decodes = decodes
    p.prefills = prefills
    p.preempted = preempted
    p.rejected = rejected
    p.num_prefill_tokens = num_prefill_tokens
    p.decode_context_tokens = decode_context_tokens
    p.prefill_attention_pairs = prefill_attention_pairs
    p.prefill_context_tokens = prefill_context_tokens
    p.num_running = num_running
    p.num_waiting = num_waiting
    p.kv_used_blocks = kv_used_blocks
    p.token_budget = token_budget
    p.num_refreshed = num_refreshed
    p.verifies = verifies
    p.longest_decode_context = longest_decode_context
    p.__class__ = StepPlan
    return p  # type: ignore[return-value]


def new_result(
    duration: float, finished: tuple[Request, ...] = (), accepted: Sequence[int] = ()
) -> StepResult:
    """``StepResult(duration, finished, accepted=accepted)`` (a fresh empty ``token_ids``),
    built without the frozen ``__init__``'s cost: the same frozen object."""
    r = _new(_ResultFields)
    r.duration = duration
    r.finished = finished
    r.token_ids = {}
    r.accepted = accepted
    r.__class__ = StepResult
    return r  # type: ignore[return-value]

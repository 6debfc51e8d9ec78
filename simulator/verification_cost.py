"""What a speculative step costs in the simulator: verification priced by any cost model, plus
the drafter's cost.

Verification. A verify of ``k`` drafts computes ``k + 1`` query tokens over the request's
context in one target forward, as a prefill chunk of ``k + 1`` tokens does (the engine runs both
through its ragged attention). Until the engine measures verification steps, every existing
cost model (roofline, fitted, engine_fitted) prices them exactly so: ``as_prefill_chunks``
turns each verify into a chunk of ``k + 1`` tokens at its context (prefill tokens, chunk count,
KV length at the chunk's end and causal attention pairs), and the wrapped model prices that
plan. A step of verifies alone is then priced as a mixed step, not as a decode graph.

Drafting. ``DraftCost``: model-free drafting (n-gram / prompt lookup) costs ~0 on the GPU;
a draft model costs ``per_position_s`` per draft position (its forwards over the batch run one
position after another: ``max k`` of them) plus ``per_token_s`` per draft token.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from horizon.plan import StepPlan
from simulator.cost_model import CostModel


@dataclass(frozen=True)
class DraftCost:
    """Seconds a step spends drafting. ``drafter``: "ngram" (model-free) or "model"."""

    drafter: str = "ngram"
    per_token_s: float = 0.0
    per_position_s: float = 0.0

    def __post_init__(self) -> None:
        if self.drafter not in ("ngram", "model"):
            raise ValueError(f"DraftCost.drafter must be 'ngram' or 'model', got {self.drafter!r}")
        for name in ("per_token_s", "per_position_s"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not v >= 0:
                raise ValueError(f"DraftCost.{name} must be a number >= 0 seconds, got {v!r}")

    def step_time(self, plan: StepPlan) -> float:
        if not plan.verifies or (self.per_token_s == 0 and self.per_position_s == 0):
            return 0.0
        drafts = plan.num_verify_tokens - len(plan.verifies)
        deepest = max(k for _, k in plan.verifies)
        return self.per_token_s * drafts + self.per_position_s * deepest


def as_prefill_chunks(plan: StepPlan) -> StepPlan:
    """``plan`` with each verify ``(request, k)`` as a prefill chunk of ``k + 1`` tokens over its
    context: the shape a cost model prices (see the module docstring)."""
    if not plan.verifies:
        return plan
    return replace(
        plan,
        prefills=plan.prefills + tuple((r, k + 1) for r, k in plan.verifies),
        num_prefill_tokens=plan.num_prefill_tokens + plan.num_verify_tokens,
        prefill_context_tokens=plan.prefill_context_tokens + plan.verify_context_tokens,
        prefill_attention_pairs=plan.prefill_attention_pairs + plan.verify_attention_pairs,
        verifies=(),
    )


class SpeculativeCostModel:
    """``base`` prices a plan with its verifies as prefill chunks; ``draft`` adds drafting.
    Pure when ``base`` is; a plan without verifies costs exactly what ``base`` says."""

    def __init__(self, base: CostModel, draft: DraftCost | None = None) -> None:
        self.base = base
        self.draft = draft or DraftCost()
        wake = getattr(base, "wake_delay", None)
        if wake is not None:  # the backend looks the method up by name
            self.wake_delay = wake

    def step_time(self, plan: StepPlan) -> float:
        if not plan.verifies:
            return self.base.step_time(plan)
        return self.base.step_time(as_prefill_chunks(plan)) + self.draft.step_time(plan)

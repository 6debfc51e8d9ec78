"""What a speculative step costs in the simulator: verification priced by any cost model in the
shape the engine runs it, plus fitted host terms, plus the drafter's cost.

Verification (``VerifyCost``). A verify of ``k`` drafts computes ``k + 1`` query tokens over the
request's context in one target forward. The engine runs it in one of two shapes, and the
simulator prices the plan the wrapped cost model sees in the same shape:

* ``decode_rows`` (the engine's default, ``EngineConfig.verify_as_decode``): a step of decodes
  and verifications without prefill chunks runs as an expanded decode step, ``k + 1`` decode
  rows per verifying request, row ``i`` reading the context up to position ``C + i``
  (``as_decode_rows``: the decodes grow by the rows, the decode context by their contexts).
  A step that carries chunks takes the mixed path, as on the engine. A step with more rows
  than the cost model's largest decode batch (``max_num_seqs``, where it has one) is priced
  as chunks too: the engine still runs it as decode rows (its row buckets go on up to the
  token budget), but the model has no decode price past its calibrated graphs;
* ``prefill_chunks`` (the mixed path, ``verify_as_decode`` off): each verify is a chunk of
  ``k + 1`` tokens at its context (``as_prefill_chunks``: prefill tokens, chunk count, KV
  length at the chunk's end, causal attention pairs).

``per_step_s`` and ``per_verify_s`` add the host work the plan's shape does not carry: a
verification step is serial on the engine (the pipelined loop's overlap is lost) and judges
every verifying request's drafts. They are fitted to measured verification steps
(``experiments.spec_verify_fit``); 0 by default.

Drafting. ``DraftCost``: model-free drafting (n-gram / prompt lookup) costs ~0 on the GPU;
a draft model costs ``per_position_s`` per draft position (its forwards over the batch run one
position after another: ``max k`` of them), plus ``per_token_s`` per draft token and
``per_step_s`` per step that drafts (on the H200 the paged drafter's position costs one decode
step of the draft model, and each proposal 0.45-1.04 ms more at batch 1-64).
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
    per_step_s: float = 0.0  # fixed per drafting step: the draft model's catch-up and hand-over

    def __post_init__(self) -> None:
        if self.drafter not in ("ngram", "model"):
            raise ValueError(f"DraftCost.drafter must be 'ngram' or 'model', got {self.drafter!r}")
        for name in ("per_token_s", "per_position_s", "per_step_s"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not v >= 0:
                raise ValueError(f"DraftCost.{name} must be a number >= 0 seconds, got {v!r}")

    def step_time(self, plan: StepPlan) -> float:
        """Seconds of drafting for ``plan`` (0 without verifies)."""
        if not plan.verifies or not (self.per_token_s or self.per_position_s or self.per_step_s):
            return 0.0
        drafts = plan.num_verify_tokens - len(plan.verifies)
        deepest = max(k for _, k in plan.verifies)
        return self.per_step_s + self.per_token_s * drafts + self.per_position_s * deepest


VERIFY_SHAPES = ("decode_rows", "prefill_chunks")


@dataclass(frozen=True)
class VerifyCost:
    """How a step that verifies is priced (module docstring). ``source``: where the two host
    terms were fitted (free text, for reports)."""

    shape: str = "decode_rows"
    per_step_s: float = 0.0
    per_verify_s: float = 0.0
    source: str = ""

    def __post_init__(self) -> None:
        if self.shape not in VERIFY_SHAPES:
            raise ValueError(f"VerifyCost.shape must be one of {VERIFY_SHAPES}, got {self.shape!r}")
        for name in ("per_step_s", "per_verify_s"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not v >= 0:
                raise ValueError(f"VerifyCost.{name} must be a number >= 0 seconds, got {v!r}")

    def host_time(self, plan: StepPlan) -> float:
        """The fitted host terms of a plan that verifies."""
        return self.per_step_s + self.per_verify_s * len(plan.verifies)


def as_decode_rows(plan: StepPlan) -> StepPlan:
    """``plan`` with each verify ``(request, k)`` as ``k + 1`` decode rows (the request repeated),
    row ``i`` over ``C + i`` context tokens (``C``: its computed tokens; a decode reads its
    computed tokens, ``Scheduler``'s convention): the expanded decode step's shape."""
    if not plan.verifies:
        return plan
    rows = tuple(r for r, k in plan.verifies for _ in range(k + 1))
    context = plan.verify_attention_pairs - plan.num_verify_tokens
    return replace(
        plan,
        decodes=plan.decodes + rows,
        decode_context_tokens=plan.decode_context_tokens + context,
        verifies=(),
    )


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
    """``base`` prices a plan with its verifies in ``verify``'s shape, plus ``verify``'s host
    terms and ``draft``'s drafting. Pure when ``base`` is; a plan without verifies costs exactly
    what ``base`` says."""

    def __init__(
        self, base: CostModel, draft: DraftCost | None = None, verify: VerifyCost | None = None
    ) -> None:
        self.base = base
        self.draft = draft or DraftCost()
        self.verify = verify or VerifyCost()
        self._max_rows = getattr(base, "max_num_seqs", None)
        wake = getattr(base, "wake_delay", None)
        if wake is not None:  # the backend looks the method up by name
            self.wake_delay = wake

    def shaped(self, plan: StepPlan) -> StepPlan:
        """The plan ``base`` prices for ``plan`` (its verifies as rows or as chunks)."""
        if self.verify.shape == "decode_rows" and not plan.prefills:
            rows = len(plan.decodes) + plan.num_verify_tokens
            if self._max_rows is None or rows <= self._max_rows:
                return as_decode_rows(plan)
        return as_prefill_chunks(plan)

    def step_time(self, plan: StepPlan) -> float:
        if not plan.verifies:
            return self.base.step_time(plan)
        shaped = self.base.step_time(self.shaped(plan))
        return shaped + self.verify.host_time(plan) + self.draft.step_time(plan)

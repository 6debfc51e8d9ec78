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

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from horizon.drawn_verifies import DrawnVerifies
from horizon.plan import StepPlan, new_plan
from horizon.request import Request
from simulator.cost_model import CostModel, fresh_cost_model


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
        v = plan.verifies
        deepest = 0  # adds 0.0 when per_position_s is 0, as max(k) * 0.0 would
        if self.per_position_s:
            deepest = v.max_drafts if isinstance(v, DrawnVerifies) else max(k for _, k in v)
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
    computed tokens, ``Scheduler``'s convention): the expanded decode step's shape. Drawn
    verifies (``DrawnVerifies``) become rows listed on demand (``_VerifyRows``); the context
    comes from the plan's totals either way."""
    v = plan.verifies
    if not v:
        return plan
    rows: Sequence[Request]
    if v.__class__ is DrawnVerifies:
        rows = _VerifyRows(plan.decodes, v, plan.num_verify_tokens)  # type: ignore[arg-type]
    else:
        rows = plan.decodes + tuple(r for r, k in v for _ in range(k + 1))
    context = plan.verify_attention_pairs - plan.num_verify_tokens
    return new_plan(  # dataclasses.replace, at a fraction of its cost (once per step)
        plan.step,
        plan.time,
        rows,  # type: ignore[arg-type]
        plan.prefills,
        plan.preempted,
        plan.rejected,
        plan.num_prefill_tokens,
        plan.decode_context_tokens + context,
        plan.prefill_attention_pairs,
        plan.prefill_context_tokens,
        plan.num_running,
        plan.num_waiting,
        plan.kv_used_blocks,
        plan.token_budget,
        plan.num_refreshed,
        (),
        # a verify's last row reads C + k tokens
        max(plan.longest_decode_context, max(r.num_computed_tokens + k for r, k in v)),
    )


class _VerifyRows(Sequence[Request]):
    """A plan's decodes followed by its drawn verifies as ``k + 1`` rows each: its length in
    O(1) (what cost models read), its items built when iterated."""

    def __init__(self, decodes: tuple[Request, ...], verifies: DrawnVerifies, tokens: int):
        self._decodes = decodes
        self._verifies = verifies
        self._len = len(decodes) + tokens

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, i):  # noqa: ANN001, ANN204
        return list(self)[i]

    def __iter__(self) -> Iterator[Request]:
        yield from self._decodes
        for r, k in self._verifies:
            for _ in range(k + 1):
                yield r


def as_prefill_chunks(plan: StepPlan) -> StepPlan:
    """``plan`` with each verify ``(request, k)`` as a prefill chunk of ``k + 1`` tokens over its
    context: the shape a cost model prices (see the module docstring). Drawn verifies
    (``DrawnVerifies``) become chunks listed on demand (``_VerifyChunks``)."""
    v = plan.verifies
    if not v:
        return plan
    chunks: Sequence[tuple[Request, int]]
    if v.__class__ is DrawnVerifies:  # its shape kept: drafts, context, attention pairs
        drafts, context, pairs = v.totals[0], v.totals[1], v.totals[2]  # type: ignore[attr-defined]
        n = len(v)
        chunks = _VerifyChunks(plan.prefills, v)  # type: ignore[arg-type]
        tokens, context = drafts + n, context + drafts + n
    else:
        chunks = plan.prefills + tuple((r, k + 1) for r, k in v)
        tokens, context, pairs = (
            plan.num_verify_tokens,
            plan.verify_context_tokens,
            plan.verify_attention_pairs,
        )
    return new_plan(  # dataclasses.replace, at a fraction of its cost (once per step)
        plan.step,
        plan.time,
        plan.decodes,
        chunks,  # type: ignore[arg-type]
        plan.preempted,
        plan.rejected,
        plan.num_prefill_tokens + tokens,
        plan.decode_context_tokens,
        plan.prefill_attention_pairs + pairs,
        plan.prefill_context_tokens + context,
        plan.num_running,
        plan.num_waiting,
        plan.kv_used_blocks,
        plan.token_budget,
        plan.num_refreshed,
        (),
        plan.longest_decode_context,
    )


class _VerifyChunks(Sequence[tuple[Request, int]]):
    """A plan's chunks followed by its drawn verifies as chunks of ``k + 1``: its length in
    O(1) (what cost models read), its items built when iterated."""

    def __init__(self, prefills: tuple[tuple[Request, int], ...], verifies: DrawnVerifies):
        self._prefills = prefills
        self._verifies = verifies

    def __len__(self) -> int:
        return len(self._prefills) + len(self._verifies)

    def __getitem__(self, i):  # noqa: ANN001, ANN204
        return list(self)[i]

    def __iter__(self) -> Iterator[tuple[Request, int]]:
        yield from self._prefills
        for r, k in self._verifies:
            yield r, k + 1


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

    def fresh(self) -> SpeculativeCostModel:
        """This model over ``fresh_cost_model(base)`` (a stateful base's start state)."""
        return SpeculativeCostModel(fresh_cost_model(self.base), self.draft, self.verify)

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

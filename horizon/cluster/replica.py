"""One replica of a cluster: its Scheduler (policy, block pool), and what the cluster knows of it.

The replica is told of every request routed to it (``accept``) and, when it has a predictor or
keeps history, of every step once the step's end is known (``observe_step``, called by
``horizon.cluster.observed_backend.ObservedBackend`` on either backend). With a predictor it
keeps, in O(1) per event, the output tokens its requests are predicted still to emit; with
``history`` on, timestamped snapshots and the pool's KV events, which a ``StaleView`` reads
late. Its recent step time is read from its scheduler's records (O(8) per read).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from typing import NamedTuple

from horizon.model_shape import ModelShape
from horizon.plan import StepPlan, StepResult
from horizon.request import Request
from horizon.scheduler import Scheduler


class Snapshot(NamedTuple):
    """A replica's reported state at ``time`` (what a stale view reads)."""

    time: float
    num_waiting: int
    num_running: int
    queued_prefill_tokens: int
    kv_used_blocks: int
    kv_free_blocks: int
    kv_reserved_blocks: int
    step_time: float
    predicted_pending_tokens: float
    predicted_kv_tokens: float


class Replica:
    """A replica: ``scheduler`` plus the cluster's bookkeeping of it.

    Args:
        index: its position in the cluster.
        scheduler: its own Scheduler (policy and BlockPool).
        shape: its model shape (what a router may weigh; None if unknown).
        predictor: anything with ``predict(request)`` returning a ``LengthDistribution``; its
            mean of each routed request's output feeds ``predicted_pending_tokens``.
        name: its label (default ``replica<index>``).
        clock: ``now()`` of the run (a live view's ``time``).
        role: ``mixed`` (serves requests end to end), ``prefill`` or ``decode``
            (disaggregated serving, ``horizon.cluster.handoffs``).
    """

    def __init__(
        self,
        index: int,
        scheduler: Scheduler,
        shape: ModelShape | None = None,
        predictor: object = None,
        name: str | None = None,
        clock: Callable[[], float] | None = None,
        role: str = "mixed",
    ) -> None:
        if role not in ("mixed", "prefill", "decode"):
            raise ValueError(f"Replica.role must be mixed, prefill or decode, got {role!r}")
        self.role = role
        self.index = index
        self.scheduler = scheduler
        self.shape = shape
        self.predictor = predictor
        self.name = name or f"replica{index}"
        self.now = clock or (lambda: 0.0)
        self.routed = 0
        self.imported = 0  # handed-off requests placed here for decoding
        self._pred: dict[int, tuple[float, int]] = {}  # unfinished rid -> (mean output, prompt)
        self._pred_sum = 0.0  # predicted outputs of unfinished requests
        self._prompt_sum = 0  # prompts of unfinished predicted requests
        self._done_tokens = 0  # tokens emitted by requests that finished or left
        self.history: deque[Snapshot] | None = None
        self.kv_events: deque[tuple[float, list[tuple[int, int]]]] | None = None

    def keep_history(self) -> None:
        """Keep snapshots and KV events from now on (for stale views)."""
        self.history = deque([self.snapshot(-math.inf)])
        self.kv_events = deque()
        self.scheduler.pool.events = []

    # -- events ----------------------------------------------------------------------------------
    def accept(self, request: Request, now: float) -> None:
        """``request`` was routed here at ``now`` (the caller hands it to the scheduler)."""
        self.routed += 1
        self._predict(request)

    def accept_import(self, request: Request) -> None:
        """A handed-off ``request`` will decode here (its blocks are reserved)."""
        self.imported += 1
        self._predict(request)

    def refuse_import(self, request: Request) -> None:
        """``request``, placed here, was refused after all (a placement on reported free
        blocks that did not fit when it came, ``horizon.cluster.reported_imports``)."""
        self.imported -= 1
        got = self._pred.pop(request.request_id, None)
        if got is not None:
            self._pred_sum -= got[0]
            self._prompt_sum -= got[1]

    def leave(self, request: Request) -> None:
        """``request`` was handed off to another replica."""
        self._leave(request)

    def _predict(self, request: Request) -> None:
        if self.predictor is not None:
            mean = float(self.predictor.predict(request).mean)
            self._pred[request.request_id] = (mean, request.num_prompt_tokens)
            self._pred_sum += mean
            self._prompt_sum += request.num_prompt_tokens

    def seed_hashes(self, request: Request, hashes: list[int]) -> None:
        """The prompt's block hashes a view computed, for the scheduler's KV manager."""
        self.scheduler.kv.seed_hashes(request, hashes)

    def observe_step(self, plan: StepPlan, result: StepResult, end: float) -> None:
        """A step whose end is ``end``: its finished and rejected requests leave the predicted
        sums; with history on, a snapshot at ``end`` and the step's KV events."""
        if self._pred:
            for r in result.finished:
                self._leave(r)
            for r, _ in plan.rejected:
                self._leave(r)
        if self.history is not None:
            self._record(end)

    def _leave(self, r: Request) -> None:
        got = self._pred.pop(r.request_id, None)
        if got is not None:
            self._pred_sum -= got[0]
            self._prompt_sum -= got[1]
            self._done_tokens += r.num_output_tokens

    def _record(self, end: float) -> None:
        assert self.history is not None and self.kv_events is not None
        self.history.append(self.snapshot(end))
        events = self.scheduler.pool.events
        if events:
            self.kv_events.append((end, events))
            self.scheduler.pool.events = []

    # -- static facts ----------------------------------------------------------------------------
    @property
    def num_blocks(self) -> int:
        return self.scheduler.pool.num_blocks

    @property
    def block_size(self) -> int:
        return self.scheduler.pool.block_size

    @property
    def token_budget(self) -> int:
        return self.scheduler.config.max_num_batched_tokens

    @property
    def prefix_caching(self) -> bool:
        return self.scheduler.config.enable_prefix_caching

    # -- derived state ---------------------------------------------------------------------------
    @property
    def step_time(self) -> float:
        """Mean duration of its last 8 steps (s; 0 before any)."""
        return self.scheduler.recorder.recent_step_time()

    @property
    def needs_steps(self) -> bool:
        """Whether ``observe_step`` has anything to do (a predictor, or history)."""
        return self.predictor is not None or self.history is not None

    @property
    def predicted_pending_tokens(self) -> float:
        if self.predictor is None:
            return math.nan
        emitted = self.scheduler.tokens_emitted - self._done_tokens
        return max(0.0, self._pred_sum - emitted)

    @property
    def predicted_kv_tokens(self) -> float:
        if self.predictor is None:
            return math.nan
        return self._prompt_sum + self._pred_sum

    def snapshot(self, time: float) -> Snapshot:
        s, pool = self.scheduler, self.scheduler.pool
        return Snapshot(
            time,
            s.num_waiting,
            len(s.running),
            s.queued_prefill_tokens,
            pool.num_used,
            pool.num_free,
            s.ledger.outstanding,
            self.step_time,
            self.predicted_pending_tokens,
            self.predicted_kv_tokens,
        )

    def check_integrity(self) -> None:
        """The scheduler's invariants, and the predicted sums match their entries."""
        self.scheduler.check_integrity()
        want = sum(m for m, _ in self._pred.values())
        assert math.isclose(self._pred_sum, want, rel_tol=1e-9, abs_tol=1e-6), "predicted sum"
        assert self._prompt_sum == sum(p for _, p in self._pred.values()), "predicted prompts"
        assert self.routed + self.imported >= len(self._pred)

"""What a router may read about a replica: a read-only ``ReplicaView``.

A view answers in O(1), except ``prefix_hit_tokens``, which walks the request's prompt blocks
(O(prompt blocks), no side effect). Two kinds, one interface:

* ``LiveView`` reads the replica's scheduler as it is now (the simulator with no delay);
* ``StaleView`` (``horizon.cluster.stale_view``) reads what the replica last reported at least
  ``delay`` seconds ago, and a prefix index rebuilt from its KV events as late (production
  routers see metrics and KV events late; on the engine every view is one of these).

Nothing a router can do through a view changes the replica: views hold no public reference to
the scheduler, have no settable attributes, and every method is a query.
"""

from __future__ import annotations

from horizon.kv_cache import chained_block_hashes
from horizon.model_shape import ModelShape
from horizon.request import Request


class PromptHashes:
    """The chained block hashes of the request being routed, computed once per block size and
    shared by every view of a cluster (and handed to the chosen replica's KV manager)."""

    __slots__ = ("_rid", "_by_size")

    def __init__(self) -> None:
        self._rid = -1
        self._by_size: dict[int, list[int]] = {}

    def of(self, request: Request, block_size: int) -> list[int]:
        if request.request_id != self._rid:
            self._rid, self._by_size = request.request_id, {}
        hs = self._by_size.get(block_size)
        if hs is None:
            ids = request.prompt_token_ids
            hs = chained_block_hashes(ids, block_size) if ids is not None else []
            self._by_size[block_size] = hs
        return hs

    def known(self, request: Request, block_size: int) -> list[int] | None:
        """The hashes if a view computed them for ``request``, else None."""
        if request.request_id != self._rid:
            return None
        return self._by_size.get(block_size)


def usable_hit(blocks: int, request: Request, block_size: int) -> int:
    """Cached prompt tokens a hit of ``blocks`` whole blocks gives a fresh request: never its
    last token (the scheduler's rule), so at most ``(P - 1) // block_size`` blocks."""
    return min(blocks, (request.num_prompt_tokens - 1) // block_size) * block_size


class ReplicaView:
    """Read-only state of one replica, as a router sees it (see the module docstring).

    Attributes (all read-only):
        index: the replica's position in the cluster (what ``route`` returns).
        name: its label; shape: its model shape (None if not given).
        num_waiting, num_running: requests queued and running.
        queued_prefill_tokens: prompt (and recompute) tokens still to compute, queued or running.
        num_blocks, block_size: its KV pool.
        kv_used_blocks, kv_free_blocks, kv_reserved_blocks: blocks held, allocatable (plain plus
            evictable cached) and promised to running requests by a reserving policy.
        token_budget: its scheduler's tokens per step.
        step_time: a moving average of its recent step durations (s; 0 before any step).
        predicted_pending_tokens: output tokens its requests are predicted still to emit (sum of
            the attached predictor's means less what they emitted); NaN without a predictor.
        predicted_kv_tokens: tokens its unfinished requests are predicted to hold at their end
            (prompts plus predicted outputs); NaN without a predictor.
        routed: requests routed to it so far (the router's own count: never stale).
        time: when the state read was current (``now`` for a live view).
    """

    __slots__ = ()

    @property
    def load(self) -> int:
        """Waiting plus running requests."""
        return self.num_waiting + self.num_running

    @property
    def load_key(self) -> tuple[int, int]:
        """``(load, routed)``: what ``least_loaded`` compares (a view may read it faster)."""
        return (self.load, self.routed)

    @property
    def kv_utilization(self) -> float:
        """Share of the pool held or promised: (used + reserved) / blocks, in [0, 1]."""
        return min(1.0, (self.kv_used_blocks + self.kv_reserved_blocks) / self.num_blocks)

    def prefix_hit_tokens(self, request: Request) -> int:
        """Prompt tokens of ``request`` this replica's prefix cache would serve (whole blocks,
        never the last token; 0 without prefix caching). Changes nothing."""
        raise NotImplementedError


class LiveView(ReplicaView):
    """A replica's state now (see the module docstring)."""

    __slots__ = ("_r", "_sched", "_pool", "_hashes", "_caching")

    def __init__(self, replica, hashes: PromptHashes) -> None:  # noqa: ANN001 - a Replica
        object.__setattr__(self, "_r", replica)
        object.__setattr__(self, "_sched", replica.scheduler)
        object.__setattr__(self, "_pool", replica.scheduler.pool)
        object.__setattr__(self, "_hashes", hashes)
        object.__setattr__(self, "_caching", replica.scheduler.config.enable_prefix_caching)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"a ReplicaView is read-only (tried to set {name!r})")

    index = property(lambda self: self._r.index)
    name = property(lambda self: self._r.name)
    shape: ModelShape | None = property(lambda self: self._r.shape)  # type: ignore[assignment]
    num_waiting = property(lambda self: self._sched.num_waiting)
    num_running = property(lambda self: len(self._sched.running))
    queued_prefill_tokens = property(lambda self: self._sched.queued_prefill_tokens)
    num_blocks = property(lambda self: self._pool.num_blocks)
    block_size = property(lambda self: self._pool.block_size)
    kv_used_blocks = property(lambda self: self._pool.num_used)
    kv_free_blocks = property(lambda self: self._pool.num_free)
    kv_reserved_blocks = property(lambda self: self._sched.ledger.outstanding)
    token_budget = property(lambda self: self._sched.config.max_num_batched_tokens)
    step_time = property(lambda self: self._r.step_time)
    predicted_pending_tokens = property(lambda self: self._r.predicted_pending_tokens)
    predicted_kv_tokens = property(lambda self: self._r.predicted_kv_tokens)
    routed = property(lambda self: self._r.routed)
    time = property(lambda self: self._r.now())

    @property
    def load(self) -> int:
        s = self._sched  # Scheduler.num_unfinished, read here in one frame (every routing)
        return len(s._waiting) + len(s._ready) + len(s.running)

    @property
    def load_key(self) -> tuple[int, int]:
        s = self._sched  # (load, routed) in one frame: least_loaded reads it for every view
        return (len(s._waiting) + len(s._ready) + len(s.running), self._r.routed)

    def prefix_hit_tokens(self, request: Request) -> int:
        if not self._caching:
            return 0
        pool = self._pool
        bs = pool.block_size
        n = pool.num_matched(self._hashes.of(request, bs))
        return usable_hit(n, request, bs) if n else 0

"""A replica as a router sees it ``delay`` seconds late: reported snapshots and KV events.

Production routers read replica metrics from a scrape and prefix-cache state from KV events
published by the engines, both late. A ``StaleView`` reads the newest ``Snapshot`` of the
replica that is at least ``delay`` old and a prefix index rebuilt from the replica's KV events
(``horizon.block_pool``: stored and removed hashes) up to that time. Reads advance the view's
cursor (time only moves forward); the replica is never touched.
"""

from __future__ import annotations

from collections.abc import Callable

from horizon.block_pool import STORED
from horizon.cluster.replica import Replica, Snapshot
from horizon.cluster.view import PromptHashes, ReplicaView, usable_hit
from horizon.request import Request


class StaleView(ReplicaView):
    """``replica`` as of ``now() - delay`` (see the module docstring). ``replica`` is a
    ``Replica`` or anything with its reporting attributes (``history``, ``kv_events``, ``index``,
    ``name``, ``shape``, ``routed``, ``num_blocks``, ``block_size``, ``token_budget``,
    ``prefix_caching``): the engine's driver keeps such a record of each remote replica. The view
    consumes the replica's history: one view per replica."""

    __slots__ = ("_r", "_delay", "_now", "_hashes", "_snap", "_index", "_caching")

    def __init__(
        self, replica: Replica, hashes: PromptHashes, delay: float, now: Callable[[], float]
    ) -> None:
        if replica.history is None:
            raise ValueError("StaleView needs a replica that keeps history (keep_history())")
        object.__setattr__(self, "_r", replica)
        object.__setattr__(self, "_delay", delay)
        object.__setattr__(self, "_now", now)
        object.__setattr__(self, "_hashes", hashes)
        object.__setattr__(self, "_snap", replica.history[0])
        object.__setattr__(self, "_index", set())
        object.__setattr__(self, "_caching", replica.prefix_caching)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"a ReplicaView is read-only (tried to set {name!r})")

    def _current(self) -> Snapshot:
        """Advance to the newest snapshot at least ``delay`` old, applying KV events as late."""
        cut = self._now() - self._delay
        history, events = self._r.history, self._r.kv_events
        snap = self._snap
        while len(history) > 1 and history[1].time <= cut:
            history.popleft()
            snap = history[0]
        object.__setattr__(self, "_snap", snap)
        index = self._index
        while events and events[0][0] <= cut:
            for kind, h in events.popleft()[1]:
                if kind == STORED:
                    index.add(h)
                else:
                    index.discard(h)
        return snap

    index = property(lambda self: self._r.index)
    name = property(lambda self: self._r.name)
    shape = property(lambda self: self._r.shape)
    num_waiting = property(lambda self: self._current().num_waiting)
    num_running = property(lambda self: self._current().num_running)
    queued_prefill_tokens = property(lambda self: self._current().queued_prefill_tokens)
    num_blocks = property(lambda self: self._r.num_blocks)
    block_size = property(lambda self: self._r.block_size)
    kv_used_blocks = property(lambda self: self._current().kv_used_blocks)
    kv_free_blocks = property(lambda self: self._current().kv_free_blocks)
    kv_reserved_blocks = property(lambda self: self._current().kv_reserved_blocks)
    token_budget = property(lambda self: self._r.token_budget)
    step_time = property(lambda self: self._current().step_time)
    predicted_pending_tokens = property(lambda self: self._current().predicted_pending_tokens)
    predicted_kv_tokens = property(lambda self: self._current().predicted_kv_tokens)
    routed = property(lambda self: self._r.routed)
    time = property(lambda self: self._current().time)

    @property
    def load(self) -> int:
        s = self._current()
        return s.num_waiting + s.num_running

    def prefix_hit_tokens(self, request: Request) -> int:
        if not self._caching:
            return 0
        self._current()
        bs = self._r.block_size
        n, index = 0, self._index
        for h in self._hashes.of(request, bs):
            if h not in index:
                break
            n += 1
        return usable_hit(n, request, bs) if n else 0

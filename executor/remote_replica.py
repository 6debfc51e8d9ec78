"""A replica that runs in another process, as the cluster's driver knows it.

``horizon.cluster.StaleView`` reads a replica through a few attributes: its static facts
(``index``, ``name``, ``shape``, ``num_blocks``, ``block_size``, ``token_budget``,
``prefix_caching``), the router's own count ``routed``, and what the replica reported:
``history`` (a deque of ``horizon.cluster.Snapshot``, oldest first, the first one standing for
"before any report") and ``kv_events`` (a deque of ``(time, [(kind, hash), ...])``). A
``RemoteReplica`` holds exactly those, filled from the worker's step reports
(``executor.cluster_worker``); ``horizon.cluster.Cluster`` uses it in place of a ``Replica``
(``live=False``). One per run: a view consumes its history.
"""

from __future__ import annotations

import math
from collections import deque

from horizon.cluster import Snapshot
from horizon.model_shape import ModelShape
from horizon.request import Request


class RemoteReplica:
    """What the driver knows of one worker's replica (see the module docstring).

    Args:
        index: its position in the cluster; name: its label.
        shape: its model shape (None if unknown).
        num_blocks, block_size, token_budget, prefix_caching: its engine's pool and scheduler.
        role: ``mixed``, ``prefill`` or ``decode``.
        scheduler: a disaggregated run's ``RemoteScheduler`` of the worker (None otherwise).
    """

    def __init__(
        self,
        index: int,
        name: str,
        shape: ModelShape | None,
        num_blocks: int,
        block_size: int,
        token_budget: int,
        prefix_caching: bool,
        role: str = "mixed",
        scheduler: object = None,
    ) -> None:
        if not isinstance(num_blocks, int) or num_blocks < 1:
            raise ValueError(f"RemoteReplica.num_blocks must be an int >= 1, got {num_blocks!r}")
        self.index = index
        self.name = name
        self.shape = shape
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.token_budget = token_budget
        self.prefix_caching = prefix_caching
        self.role = role
        self.scheduler = scheduler
        self.routed = 0
        self.imported = 0  # handed-off requests placed here for decoding
        self.reports = 0
        self.history: deque[Snapshot] | None = None
        self.kv_events: deque[tuple[float, list[tuple[int, int]]]] | None = None
        self.keep_history()

    def keep_history(self) -> None:
        """Start from an empty replica's state (every block free), before any report."""
        idle = Snapshot(-math.inf, 0, 0, 0, 0, self.num_blocks, 0, 0.0, math.nan, math.nan)
        self.history = deque([idle])
        self.kv_events = deque()
        self._last = -math.inf

    def accept(self, request: Request, now: float) -> None:
        """``request`` was routed here (the driver sends it to the worker)."""
        self.routed += 1

    def accept_import(self, request: Request) -> None:
        """A handed-off ``request`` was placed here (the driver sends it to the worker)."""
        self.imported += 1

    def refuse_import(self, request: Request) -> None:
        """The worker refused ``request`` after all (its blocks did not fit when it came)."""
        self.imported -= 1

    def leave(self, request: Request) -> None:
        """``request`` was handed off to another replica."""

    def latest(self) -> Snapshot:
        """The latest report (an empty replica's state before any)."""
        assert self.history is not None
        return self.history[-1]

    def seed_hashes(self, request: Request, hashes: list[int]) -> None:
        """No-op: the worker's scheduler hashes the prompt itself."""

    def report(self, snapshot: Snapshot, events: list[tuple[int, int]] | None) -> None:
        """A step's report: the state at its end, and the pool's KV events since the last one.

        Raises:
            ValueError: a report older than the previous one (reports come in step order).
        """
        if snapshot.time < self._last:
            raise ValueError(
                f"replica {self.index}: report at {snapshot.time} after one at {self._last}"
            )
        assert self.history is not None and self.kv_events is not None
        self._last = snapshot.time
        self.history.append(snapshot)
        if events:
            self.kv_events.append((snapshot.time, events))
        self.reports += 1

    def check_integrity(self) -> None:
        """Reports in time order; the routed count is a count."""
        assert self.history is not None and self.kv_events is not None
        times = [s.time for s in self.history]
        assert all(a <= b for a, b in zip(times, times[1:])), "reports out of time order"
        kv = [t for t, _ in self.kv_events]
        assert all(a <= b for a, b in zip(kv, kv[1:])), "KV events out of time order"
        assert self.routed >= 0 and self.imported >= 0
        if self.scheduler is not None:
            self.scheduler.check_integrity()

"""The policy interface: decisions only. A policy never allocates or mutates a request.

The scheduler owns the mechanics (token budget, chunked prefill, block allocation, preemption by
recompute, rejection). It asks the policy four questions:

* ``waiting_key(req, now)``: the waiting queue's order (smallest first), computed when the
  request enters the queue. Linear aging needs no ``now``: ordering by
  ``size - rate * (now - arrival)`` is ordering by ``size + rate * arrival``. A policy whose
  order does depend on ``now`` sets ``dynamic_order``; the queue is then re-keyed at every
  refresh (see below).
* ``admit(req, view)``: may the head of the queue start now? (budget and block checks are the
  scheduler's; this is the policy's extra gate). Returning False stops admission this step.
* ``reserve_tokens(req)``: tokens whose blocks stay promised to ``req`` while it runs (0: none).
  The scheduler keeps the ledger; ``view.num_reserved_blocks`` reads it.
* ``choose_victim(running, needing, now)``: the request to preempt when ``needing`` lacks a
  block. May return ``needing`` itself (it then waits). ``running`` is in admission order.

A policy whose estimates change while requests run (online predictions) sets ``refresh_every``
to a number of steps: every that many steps the scheduler calls ``refresh(view, now)``, then
re-reads ``reserve_tokens`` for each running request and, with ``dynamic_order``, re-keys the
waiting queue through ``rank_waiting(waiting, view, now)``: one key per waiting request, seen
together (a policy may key a request by what is ahead of it; the default is ``waiting_key`` of
each). A request that arrives between refreshes is keyed by ``waiting_key`` alone until the next.
``None`` (default): never.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from horizon.kv_cache import KVView
from horizon.request import Request


class Policy:
    """Base policy: FCFS order, no extra gate, no reservation, preempt the lowest priority."""

    name = "base"
    reads_true_length = False  # only oracle policies may set this
    refresh_every: int | None = None
    dynamic_order = False

    def waiting_key(self, req: Request, now: float) -> Any:
        return (req.arrival_time, req.request_id)

    def admit(self, req: Request, view: KVView) -> bool:
        return True

    def reserve_tokens(self, req: Request) -> int:
        return 0

    def rank_waiting(self, waiting: Sequence[Request], view: KVView, now: float) -> list[Any]:
        """Keys of ``waiting`` (any order in, one key each, same order out) at a refresh."""
        return [self.waiting_key(r, now) for r in waiting]

    def refresh(self, view: KVView, now: float) -> None:
        """Update per-request estimates of ``view.running`` (see ``refresh_every``)."""

    def check_integrity(self) -> None:
        """Raise AssertionError if the policy's own state is inconsistent (stateless: nothing)."""

    def choose_victim(self, running: Sequence[Request], needing: Request, now: float) -> Request:
        """Lowest priority = largest waiting key, later admission breaking ties."""
        return max(running, key=lambda r: (self.waiting_key(r, now), r.admit_seq))

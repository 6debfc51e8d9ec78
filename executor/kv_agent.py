"""A worker's side of prefill/decode disaggregation on the engine (``horizon.cluster.handoffs``).

The driver (``executor.cluster_handoffs``) places handoffs; the workers move the KV. A
``KVAgent`` lives in every worker of a disaggregated run, beside its scheduler:

* **prefill replica:** after every step's update, ``collect`` takes the scheduler's new handoffs;
  each is reported to the driver (request id, tokens computed, its block ids, the time its KV
  was ready) once the step that computed it is over (``step_over``, the step observer's call): a
  pipelined loop updates a step when it submits it, and a decode worker must not copy KV that
  the GPU is still writing. ``release`` (the driver's word that the KV has been copied) frees
  the blocks.
* **decode replica:** ``take_import`` (at a step boundary, the scheduler's thread) reserves the
  request's blocks if they fit (``Scheduler.can_import``; otherwise it answers "refused" and
  the driver places the request again), copies the prefill replica's blocks into them with
  ``executor.kv_copy.copy_blocks`` from the prefill replica's KV tensor opened through CUDA IPC
  (or shared memory on the CPU), waits for the copy, and tells the scheduler
  (``finish_import``): the request is admitted at this very boundary. The report carries the
  reservation time (the transfer's start), the copy's end and the copy's own seconds.

Time base: the serving loop reads its clock once per step boundary, before it admits; a step
that computes an import's first token is recorded as starting at that reading, i.e. before the
copy that the same boundary ran. A transfer's recorded end can therefore lie a little after
its first decode step's recorded start (by that boundary's admission work).

So a request's blocks are held on its prefill replica until "release" has been handled there,
on both while the copy runs, and on its decode replica afterwards; the scheduler's and the
cluster's ``check_integrity`` see exactly that.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from executor.kv_copy import copy_blocks
from horizon.cluster import Replica
from horizon.plan import StepPlan
from horizon.request import Request, RequestStatus
from horizon.scheduler import Scheduler

Send = Callable[[tuple], None]


class KVAgent:
    """One worker's handoff bookkeeping (see the module docstring).

    Args:
        index: the worker's replica index; role: ``prefill`` or ``decode``.
        replica: the worker's ``horizon.cluster.Replica`` (its scheduler).
        kv: the worker's own KV tensor (a decode replica copies into it).
        peers: replica index -> each prefill replica's KV tensor, opened (``open_kv``) once
            per worker process (decode replicas only).
        forget: the runner's ``release`` (a handed-off request leaves the runner too).
        send: puts a message on the driver's queue (never blocks the serving loop).
        now: the run's clock.
    """

    def __init__(
        self,
        index: int,
        role: str,
        replica: Replica,
        kv: Any,
        peers: dict[int, Any],
        forget: Callable[[Request], object],
        send: Send,
        now: Callable[[], float],
    ) -> None:
        if role not in ("prefill", "decode"):
            raise ValueError(f"KVAgent.role must be prefill or decode, got {role!r}")
        self.index, self.role, self.replica = index, role, replica
        self.sched: Scheduler = replica.scheduler
        self.kv = kv
        self.peers = peers
        self.forget, self.send, self.now = forget, send, now
        self.handed: dict[int, Request] = {}  # prefill: handed off, blocks held until release
        self.unready: list[tuple[int, Request, float]] = []  # (step, request, update time)
        self.last_over = -1  # the latest step known to be over
        self.copy_s = 0.0

    # -- prefill replica -------------------------------------------------------------------------
    def collect(self) -> None:
        """After a step's update: take the requests the scheduler handed off (they leave the
        replica and the runner; their blocks stay held), reported once their step is over."""
        got = self.sched.take_handoffs()
        if not got:
            return
        step = self.sched.clock.step - 1  # the step whose update handed them off
        for r, ready in got:
            self.handed[r.request_id] = r
            self.replica.leave(r)
            self.forget(r)
            self.unready.append((step, r, ready))
        self._report(-math.inf)

    def step_over(self, plan: StepPlan, end: float) -> None:
        """Step ``plan`` is over at ``end`` (the step observer): report its handoffs."""
        self.last_over = max(self.last_over, plan.step)
        if self.unready:
            self._report(end)

    def _report(self, end: float) -> None:
        """Report the handoffs whose step is over (ready: their update's time, or ``end``
        where the step ended after it)."""
        over = self.last_over
        rows = [(r.request_id, r.num_computed_tokens, tuple(self.sched.kv.blocks_of(r)),
                 max(ready, end) if step == over else ready)
                for step, r, ready in self.unready if step <= over]  # fmt: skip
        if rows:
            self.unready = [u for u in self.unready if u[0] > over]
            self.send(("handoffs", self.index, rows))

    def release(self, rid: int) -> None:
        """The request's KV was copied to its decode replica: free its blocks here."""
        self.sched.release_handoff(self.handed.pop(rid))

    # -- decode replica --------------------------------------------------------------------------
    def take_import(self, r: Request, n: int, src: int, src_blocks: tuple[int, ...]) -> bool:
        """Reserve, copy and admit handed-off ``r`` (``n`` tokens computed on replica ``src``
        in ``src_blocks``), or refuse it if its blocks do not fit now; reported either way."""
        r.set_computed(n)
        r.status = RequestStatus.TRANSFERRING
        r.handoff = False  # decoded here
        sched = self.sched
        if not sched.can_import(r):
            self.send(("refused", self.index, r.request_id, self.now()))
            return False
        start = self.now()
        sched.reserve_import(r)
        self.replica.accept_import(r)
        dst_blocks = sched.kv.blocks_of(r)[: len(src_blocks)]
        t0 = time.perf_counter()
        event = copy_blocks(self.peers[src], self.kv, src_blocks, dst_blocks)
        if event is not None:
            event.synchronize()
        copy_s = time.perf_counter() - t0
        self.copy_s += copy_s
        end = self.now()
        sched.finish_import(r)
        self.send(("imported", self.index, r.request_id, start, end, copy_s))
        return True

    def refuse(self, r: Request) -> None:
        """Refuse handed-off ``r`` without looking (this replica's loop has stopped)."""
        self.send(("refused", self.index, r.request_id, self.now()))

    def check_integrity(self) -> None:
        """Every request handed off and not released still holds its blocks here."""
        for rid, r in self.handed.items():
            assert self.sched.kv.blocks_of(r), f"handed-off request {rid} holds no blocks"
        assert all(u[1].request_id in self.handed for u in self.unready), "unready not held"

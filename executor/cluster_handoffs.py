"""The engine cluster driver's side of prefill/decode disaggregation.

The placement is the cluster's own (``horizon.cluster.handoffs.Handoffs``, the code the
simulator runs), over ``RemoteReplica``s whose ``scheduler`` is a ``RemoteScheduler``. Here the
driver turns the workers' messages into that protocol's calls and its decisions into messages
(``executor.kv_agent`` is the workers' side)::

    prefill worker: ("handoffs", i, rows)  -> collect, then place
    placement                              -> ("import", wire, n, src, blocks) to the decode worker
    decode worker: ("imported", i, id, start, end, copy_s)
                                           -> complete: ("release", id) to the prefill worker
    decode worker: ("refused", i, id, now) -> pending again; that replica is skipped until its
                                              next step report
    any step report                        -> finished requests leave; decode: place again

A transfer's ``start`` is when the decode worker reserved the blocks (at its step boundary),
its ``end`` when the copy was done there; ``copy_s`` is the copy's own seconds.

A run cut at ``max_time`` (``end``) places nothing from then on: what is pending stays on its
prefill replica (the records count it unfinished), what is in flight completes or is refused
by a decode worker whose loop has stopped (``settled`` says when none is left).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from executor.cluster_worker import request_to_wire
from executor.remote_replica import RemoteReplica
from executor.remote_scheduler import RemoteScheduler
from horizon.cluster import Cluster
from horizon.request import Request


class EngineHandoffs:
    """Handoffs of one engine cluster run (see the module docstring).

    Args:
        cluster: the run's disaggregated Cluster (its ``handoffs`` set) over ``remotes``.
        remotes: its replicas, each with a ``RemoteScheduler``.
        inboxes: each worker's inbox (``put``).
        requests: request id -> the driver's Request, for every request of the run.
        now: the run's clock.
        end: the run's ``max_time`` (inf: none).
    """

    def __init__(
        self,
        cluster: Cluster,
        remotes: Sequence[RemoteReplica],
        inboxes: Sequence[Any],
        requests: dict[int, Request],
        now: Callable[[], float],
        end: float = math.inf,
    ) -> None:
        assert cluster.handoffs is not None
        self.h = cluster.handoffs
        self.remotes = tuple(remotes)
        self.scheds: tuple[RemoteScheduler, ...] = tuple(r.scheduler for r in remotes)
        self.inboxes = inboxes
        self.requests = requests
        self.now, self.end = now, end
        self.copy_s: dict[int, float] = {}
        self.refusals = 0

    @property
    def idle(self) -> bool:
        return self.h.idle

    @property
    def settled(self) -> bool:
        """Nothing more will move: idle, or past ``end`` with no transfer in flight."""
        return self.h.idle or (self.now() >= self.end and not self.h.in_flight)

    def on_handoffs(self, i: int, rows: list[tuple]) -> None:
        """Prefill replica ``i`` handed these requests off; place what fits."""
        sched = self.scheds[i]
        for rid, n, blocks, ready in rows:
            sched.handed_off(self.requests[rid], n, blocks, ready)
        self.h.collect(i)
        self.place()

    def on_step(self, i: int, finished: Sequence[int], rejected: Sequence[int]) -> None:
        """A step report of replica ``i``: its finished and rejected requests hold no blocks."""
        sched = self.scheds[i]
        for rid in finished:
            sched.finished(rid)
        for rid in rejected:
            sched.finished(rid)
        if self.remotes[i].role == "decode":
            sched.reported()  # a fresh report: offered imports again
            if self.h.pending:
                self.place()

    def place(self) -> None:
        """Start every pending handoff a decode replica can take (by its latest report); none
        from ``end`` on."""
        if not self.h.pending or self.now() >= self.end:
            return
        for t in self.h.place(self.now()):
            r = t.request
            src_blocks = tuple(self.scheds[t.src].kv.blocks_of(r))
            self.inboxes[t.dst].put(("import", request_to_wire(r), t.num_tokens, t.src,
                                     src_blocks))  # fmt: skip

    def on_imported(self, i: int, rid: int, start: float, end: float, copy_s: float) -> None:
        """Decode replica ``i`` holds ``rid``'s KV: free it on its prefill replica."""
        t = self.h.in_flight[rid]
        assert t.dst == i
        t.start = start
        self.scheds[i].answered(t.request, True)
        self.h.complete(t, end)
        self.copy_s[rid] = copy_s

    def on_refused(self, i: int, rid: int) -> None:
        """Decode replica ``i`` could not reserve ``rid``'s blocks: pending again."""
        t = self.h.in_flight[rid]
        assert t.dst == i
        self.scheds[i].answered(t.request, False)  # offered nothing until its next report
        self.remotes[i].refuse_import(t.request)
        self.h.refused(t)
        self.refusals += 1
        self.place()

    def table(self) -> dict[str, np.ndarray]:
        """``Handoffs.table()`` plus ``copy_s`` (the copy's own seconds; NaN in flight)."""
        out = self.h.table()
        out["copy_s"] = np.array([self.copy_s.get(rid, np.nan) for rid in out["request_id"]])
        return out

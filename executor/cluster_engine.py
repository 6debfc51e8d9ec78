"""The engine's cluster: one Router over N real engine replicas, each in its own process.

``EngineCluster`` starts one worker per ``WorkerSpec`` (``executor.cluster_worker``, spawned:
each has its own CUDA context and Engine; on one GPU they share it) and runs cases on them, the
workers built once. ``run`` mirrors ``simulator.cluster_simulation.ClusterSimulation`` on the
wall clock: one driver thread routes each request at its arrival time through a
``horizon.cluster.Cluster`` of ``RemoteReplica``s (views read the workers' reports, as late as
``view_delay``: ``live=False``) and sends it to the chosen worker; between arrivals it drains the
workers' step reports (snapshots and KV events into the ``RemoteReplica``s; finished and
rejected ids into a ``SessionRelease``, which schedules a session's next turn at the finishing
step's end plus the think time). Once every arrival is routed and every session done (or the
clock passed ``max_time``) it ends the run and gathers each worker's ``RunRecords``. With
``max_time``, a session turn released by a report that comes after the driver stopped routing
is not part of the run (assignment -1), as one released later than ``max_time``.

Driver and workers share one time base: ``WallClock(start)`` over ``time.perf_counter``, which
on Linux is the machine-wide ``CLOCK_MONOTONIC`` (``start`` checks it with a ping per worker).
A request's records keep its trace arrival time; the routing's lag (route time minus arrival)
is in ``last_run``.
"""

from __future__ import annotations

import contextlib
import heapq
import math
import multiprocessing as mp
import queue
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from executor.cluster_handoffs import EngineHandoffs
from executor.cluster_worker import PolicySpec, RunCommand, WorkerSpec, request_to_wire, worker_main
from executor.remote_replica import RemoteReplica
from executor.remote_scheduler import RemoteScheduler
from horizon.cluster import Cluster, ClusterRecords, SessionRelease, Snapshot
from horizon.cluster.router import Router
from horizon.policies.base import Policy
from horizon.request import Request
from horizon.scheduler import never_fits_reason
from horizon.wall_clock import WallClock

PolicyLike = str | PolicySpec | Policy


@dataclass(frozen=True, eq=False)
class RunInfo:
    """What a run measured besides its records.

    Attributes:
        route_lag: request id -> seconds from its arrival time to its routing.
        wall_s: the run's wall time, start to the last worker's records.
        reports: step reports received from each replica.
        workers: each worker's end-of-run facts (steps, stalled requests, end time).
    """

    route_lag: dict[int, float]
    wall_s: float
    reports: tuple[int, ...]
    workers: tuple[dict, ...]

    def lag_summary(self) -> dict[str, float]:
        """Count, mean, median, p99 and max of the routing lag (s; NaN when nothing routed)."""
        lag = np.array(list(self.route_lag.values()), dtype=np.float64)
        if not len(lag):
            return {"count": 0, "mean": math.nan, "p50": math.nan, "p99": math.nan,
                    "max": math.nan}  # fmt: skip
        return {"count": int(len(lag)), "mean": float(lag.mean()),
                "p50": float(np.percentile(lag, 50)), "p99": float(np.percentile(lag, 99)),
                "max": float(lag.max())}  # fmt: skip


class EngineCluster:
    """N engine replicas in worker processes, and the driver that routes to them.

    Args:
        workers: one ``WorkerSpec`` per replica, in index order.
        start_timeout: seconds a worker may take to build its engine (weights, graphs).
        poll_s: the longest the driver or a worker blocks on its queue before checking again.

    ``start()`` (or ``with EngineCluster(...) as c``; ``run`` starts it too) spawns the workers
    and waits until each is ready; ``close()`` stops them. A run that fails closes the cluster.
    """

    def __init__(
        self, workers: Sequence[WorkerSpec], start_timeout: float = 900.0, poll_s: float = 0.05
    ) -> None:
        if not workers:
            raise ValueError("EngineCluster.workers must hold at least one WorkerSpec")
        if not all(isinstance(w, WorkerSpec) for w in workers):
            raise ValueError("EngineCluster.workers must be WorkerSpec objects")
        if not poll_s > 0:
            raise ValueError(f"EngineCluster.poll_s must be > 0, got {poll_s!r}")
        self.specs = tuple(workers)
        self.start_timeout = start_timeout
        self.poll_s = poll_s
        self.infos: tuple[dict, ...] = ()
        self.clock_checks: tuple[tuple[float, float, float], ...] = ()
        self.last_run: RunInfo | None = None
        self._procs: list[Any] = []
        self._inboxes: list[Any] = []
        self._outbox: Any = None

    def __enter__(self) -> EngineCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def num_replicas(self) -> int:
        return len(self.specs)

    # -- workers ---------------------------------------------------------------------------------
    def start(self) -> None:
        """Spawn every worker and wait until each is ready; then check the shared clock.
        Workers sizing their KV pool from free memory (``num_blocks`` None) start one by one.

        Raises:
            RuntimeError: a worker failed (its traceback) or the clocks disagree.
        """
        if self._procs:
            return
        ctx = mp.get_context("spawn")
        self._outbox = ctx.Queue()
        infos: dict[int, dict] = {}
        for i, spec in enumerate(self.specs):
            inbox = ctx.Queue()
            p = ctx.Process(target=worker_main, args=(i, spec, inbox, self._outbox),
                            name=f"horizon-replica{i}", daemon=True)  # fmt: skip
            p.start()
            self._procs.append(p)
            self._inboxes.append(inbox)
            if spec.engine.num_blocks is None:
                infos.update(self._await("ready", [i], self.start_timeout))
        rest = [i for i in range(self.num_replicas) if i not in infos]
        infos.update(self._await("ready", rest, self.start_timeout))
        self.infos = tuple(infos[i][0] for i in range(self.num_replicas))
        self.clock_checks = tuple(self._ping(i) for i in range(self.num_replicas))
        if self.disaggregated:
            self._connect_kv()

    @property
    def disaggregated(self) -> bool:
        return any(s.role == "prefill" for s in self.specs)

    def _connect_kv(self) -> None:
        """Every decode worker opens every prefill worker's KV tensor (``executor.kv_copy``)."""
        prefill = [i for i, s in enumerate(self.specs) if s.role == "prefill"]
        decode = [i for i, s in enumerate(self.specs) if s.role == "decode"]
        if not decode:
            raise ValueError("EngineCluster: prefill workers need at least one decode worker")
        for i in prefill:
            self._inboxes[i].put(("share", len(decode)))
        blobs = self._await("kv", prefill, 120.0)
        for k, j in enumerate(decode):
            self._inboxes[j].put(("peers", {i: blobs[i][0][k] for i in prefill}))
        self._await("peered", decode, 120.0)

    def _ping(self, i: int) -> tuple[float, float, float]:
        """``(sent, worker's perf_counter, received)``; the worker's reading must lie between."""
        t0 = time.perf_counter()
        self._inboxes[i].put(("ping",))
        tw = self._await("pong", [i], 60.0)[i][0]
        t1 = time.perf_counter()
        if not t0 <= tw <= t1:
            raise RuntimeError(
                f"worker {i}'s perf_counter ({tw}) is not the driver's clock ({t0}..{t1}): "
                "replicas must run on the driver's machine"
            )
        return t0, tw, t1

    def _await(self, kind: str, indices: Sequence[int], timeout: float) -> dict[int, tuple]:
        """Each of ``indices``' next ``kind`` message (its payload), within ``timeout`` s."""
        got: dict[int, tuple] = {}
        deadline = time.perf_counter() + timeout
        while len(got) < len(indices):
            left = deadline - time.perf_counter()
            if left <= 0:
                missing = [i for i in indices if i not in got]
                raise TimeoutError(f"workers {missing} sent no {kind!r} within {timeout} s")
            try:
                msg = self._outbox.get(timeout=min(left, 1.0))
            except queue.Empty:
                self._check_alive()
                continue
            if msg[0] == "error":
                raise RuntimeError(f"worker {msg[1]} failed:\n{msg[2]}")
            if msg[0] != kind:
                raise RuntimeError(f"worker {msg[1]} sent {msg[0]!r} while {kind!r} was due")
            got[msg[1]] = msg[2:]
        return got

    def _check_alive(self) -> None:
        """Raise if a worker process has ended (with its error message if it sent one)."""
        dead = [i for i, p in enumerate(self._procs) if p.exitcode is not None]
        if not dead:
            return
        try:
            msg = self._outbox.get(timeout=1.0)
            if msg[0] == "error":
                raise RuntimeError(f"worker {msg[1]} failed:\n{msg[2]}")
        except queue.Empty:
            pass
        codes = {i: self._procs[i].exitcode for i in dead}
        raise RuntimeError(f"worker processes ended unexpectedly (exit codes {codes})")

    def close(self) -> None:
        """Stop every worker (terminated if it does not stop within 10 s): decode workers
        first, which hold the prefill workers' KV tensors open."""
        n = len(self._procs)
        for group in ([i for i in range(n) if self.specs[i].role == "decode"],
                      [i for i in range(n) if self.specs[i].role != "decode"]):  # fmt: skip
            for i in group:
                with contextlib.suppress(OSError, ValueError):  # a queue already closed
                    self._inboxes[i].put(("stop",))
            for i in group:
                p = self._procs[i]
                p.join(timeout=10.0)
                if p.exitcode is None:
                    p.terminate()
                    p.join(timeout=5.0)
        for q in [*self._inboxes, self._outbox]:
            if q is not None:
                q.cancel_join_thread()
                q.close()
        self._procs, self._inboxes, self._outbox = [], [], None

    # -- runs ------------------------------------------------------------------------------------
    def run(
        self,
        requests: Sequence[Request],
        sessions: Sequence = (),
        router: Router | None = None,
        policy: PolicyLike | Sequence[PolicyLike] = "fcfs",
        view_delay: float = 0.0,
        max_time: float | None = None,
        predictor: object = None,
        check_every: int = 0,
        decode_router: Router | None = None,
    ) -> ClusterRecords:
        """One cluster run on the wall clock; returns every replica's records and the routing.

        Args:
            requests: open-loop requests (fresh; the driver keeps them, workers get copies),
                routed at their arrival times.
            sessions: closed-loop sessions (``horizon.workload.sessions.Session``-like).
            router: the routing policy (a fresh one per run; required).
            policy: each replica's scheduling policy: a name, a ``PolicySpec`` or a fresh Policy
                (each worker gets its own copy), or a sequence of those, one per replica.
            view_delay: seconds by which the router's views lag the reports (0: the latest).
            max_time: stop routing at it; replicas stop at their first step boundary at or
                after it (later arrivals are not part of the run). Disaggregated: no handoff
                is placed from then on, and one still pending counts unfinished.
            predictor: each replica's predictor for its predicted-load figures (copied).
            check_every: each replica's ``scheduler.check_integrity()`` every that many steps.
            decode_router: a disaggregated cluster's choice of decode replica for a handed-off
                request (required iff some worker's role is ``prefill``; a fresh one per run).

        Raises:
            ValueError: a bad argument (named); RuntimeError: a worker failed.
        """
        if router is None:
            raise ValueError("EngineCluster.run needs a router")
        if max_time is not None and not (math.isfinite(max_time) and max_time > 0):
            raise ValueError(f"max_time must be a finite number > 0, got {max_time!r}")
        policies = self._policies(policy)
        self.start()
        try:
            return self._run(requests, sessions, router, policies, view_delay, max_time,
                             predictor, check_every, decode_router)  # fmt: skip
        except BaseException:
            self.close()
            raise

    def _policies(self, policy: PolicyLike | Sequence[PolicyLike]) -> list[PolicyLike]:
        if isinstance(policy, (list, tuple)):
            if len(policy) != self.num_replicas:
                raise ValueError(
                    f"EngineCluster.run policy: {len(policy)} policies for "
                    f"{self.num_replicas} replicas"
                )
            return list(policy)
        return [policy] * self.num_replicas

    def _run(  # noqa: ANN001 - run's arguments
        self,
        requests,
        sessions,
        router,
        policies,
        view_delay,
        max_time,
        predictor,
        check_every,
        decode_router,
    ) -> ClusterRecords:
        for inbox, p in zip(self._inboxes, policies):
            cmd = RunCommand(p, predictor, max_time, check_every, self.poll_s)
            inbox.put(("run", cmd))
        self._await("armed", range(self.num_replicas), 120.0)
        drive = _Drive(self, requests, sessions, (router, decode_router), view_delay, max_time)
        records = drive.run()
        self.last_run = drive.info()
        return records

    def _remote_replicas(self) -> list[RemoteReplica]:
        out = []
        for i, (spec, info) in enumerate(zip(self.specs, self.infos)):
            r = RemoteReplica(i, spec.name or f"replica{i}", info["shape"], info["num_blocks"],
                              info["block_size"], info["token_budget"], info["prefix_caching"],
                              spec.role)  # fmt: skip
            if self.disaggregated:
                free = lambda r=r: r.latest().kv_free_blocks  # noqa: E731
                r.scheduler = RemoteScheduler(i, info["num_blocks"], info["block_size"],
                                              info["max_model_len"], self._inboxes[i].put,
                                              free)  # fmt: skip
            out.append(r)
        return out


class _Drive:
    """One run's driver loop (see the module docstring); single use."""

    def __init__(self, ec: EngineCluster, requests, sessions, routers, view_delay, max_time):  # noqa: ANN001
        self.ec = ec
        self.clock = WallClock()  # its start is set when the run starts
        self.end = math.inf if max_time is None else max_time
        self.remotes = ec._remote_replicas()
        router, decode_router = routers
        self.cluster = Cluster(self.remotes, router, view_delay, self.clock.now, live=False,
                               decode_router=decode_router)  # fmt: skip
        self.release = SessionRelease(sessions)
        self.turns = {r.request_id: r for s in sessions for r in s.requests}
        self.handoffs = None
        if self.cluster.handoffs is not None:
            every = {r.request_id: r for r in requests} | self.turns
            self.handoffs = EngineHandoffs(self.cluster, self.remotes, ec._inboxes, every,
                                           self.clock.now, self.end)  # fmt: skip
        self.all_ids = [r.request_id for r in requests] + list(self.turns)
        self.heap = [(r.arrival_time, r.request_id, r) for r in requests]
        self.heap = [e for e in self.heap if e[0] <= self.end]  # later ones never arrive
        heapq.heapify(self.heap)
        for r in self.release.first_turns():
            self._later(r)
        self.lag: dict[int, float] = {}
        self.done: dict[int, tuple] = {}
        self.stopped: set[int] = set()  # prefill workers whose loop has ended
        self.wall_s = 0.0

    def run(self) -> ClusterRecords:
        """Start the workers' clocks, route until nothing more arrives, collect the records."""
        self.clock.start = start = time.perf_counter()
        for inbox in self.ec._inboxes:
            inbox.put(("start", start))
        self._serve()
        self._end_workers()
        while len(self.done) < len(self.remotes):
            self._wait(self.ec.poll_s)
        self.wall_s = time.perf_counter() - start
        self.cluster.check_integrity()
        return self._records()

    def _end_workers(self) -> None:
        """Tell the workers no more arrivals come ("end"), prefill and mixed workers first. A
        prefill worker whose loop has ended says "stopped": it hands off nothing more, but a
        transfer of its KV may still be in flight (a run cut at ``max_time``). Once every one
        has stopped and the handoffs are settled (each transfer copied, or refused by a decode
        worker that has stopped), no more "release" can come: prefill workers are told "close",
        and decode workers "end" once every other worker is done."""
        decode = [i for i, r in enumerate(self.remotes) if r.role == "decode"]
        prefill = [i for i, r in enumerate(self.remotes) if r.role == "prefill"]
        for i, inbox in enumerate(self.ec._inboxes):
            if i not in decode:
                inbox.put(("end",))
        if self.handoffs is None:
            return
        while len(self.stopped) < len(prefill) or not self.handoffs.settled:
            self._wait(self.ec.poll_s)
        for i in prefill:
            self.ec._inboxes[i].put(("close",))
        others = len(self.remotes) - len(decode)
        while len(self.done) < others:
            self._wait(self.ec.poll_s)
        for i in decode:
            self.ec._inboxes[i].put(("end",))

    def _serve(self) -> None:
        clock, heap, end = self.clock, self.heap, self.end
        while True:
            self._route_due(min(clock.now(), end))
            self._drain()
            now = clock.now()
            if heap and heap[0][0] <= min(now, end):
                continue  # a report released a turn that is due
            if (not heap and self.release.done) or now >= end:
                return
            self._wait(min(heap[0][0] if heap else math.inf, end) - now)

    def _route_due(self, t: float) -> None:
        heap, inboxes, clock = self.heap, self.ec._inboxes, self.clock
        while heap and heap[0][0] <= t:
            _, rid, r = heapq.heappop(heap)
            now = clock.now()
            i = self.cluster.route(r, now)
            self.lag[rid] = now - r.arrival_time
            inboxes[i].put(("request", request_to_wire(r)))
            if self.release.open and self._never_fits(i, r):
                # The worker rejects it (``add``) and says so in its next step's report, which
                # never comes if it has nothing else to run: the session ends now, not never.
                self.release.dropped(r)

    def _never_fits(self, i: int, r: Request) -> bool:
        """Worker ``i``'s scheduler rejects ``r`` on arrival (its rule over the pool and
        model length the worker reported)."""
        info = self.ec.infos[i]
        return bool(
            never_fits_reason(r, info["block_size"], info["num_blocks"], info["max_model_len"])
        )

    def _later(self, r: Request) -> None:
        if r.arrival_time > self.end:
            self.release.dropped(r)
        else:
            heapq.heappush(self.heap, (r.arrival_time, r.request_id, r))

    def _wait(self, dt: float) -> None:
        """Until ``dt`` s from now or the next report, whichever is first (handled)."""
        if dt <= 0:
            return
        if dt < 0.002:  # a queue's timeout has millisecond grain: sleep the last bit
            time.sleep(dt)
            return
        try:
            msg = self.ec._outbox.get(timeout=min(dt - 0.001, self.ec.poll_s))
        except queue.Empty:
            self.ec._check_alive()
            return
        self._on_message(msg)

    def _drain(self) -> None:
        outbox = self.ec._outbox
        while True:
            try:
                msg = outbox.get_nowait()
            except queue.Empty:
                return
            self._on_message(msg)

    def _on_message(self, msg: tuple) -> None:
        kind, i = msg[0], msg[1]
        if kind == "step":
            _, _, snap, events, finished, rejected, end = msg
            self.remotes[i].report(Snapshot(*snap), events)
            if self.handoffs is not None:
                self.handoffs.on_step(i, finished, rejected)
            release = self.release
            if release.open:
                turns = self.turns
                for rid in finished:
                    if rid in turns:
                        nxt = release.finished(turns[rid], end)
                        if nxt is not None:
                            self._later(nxt)
                for rid in rejected:
                    if rid in turns:
                        release.dropped(turns[rid])
        elif kind == "done":
            self.done[i] = msg[2:]
        elif kind == "stopped":
            self.stopped.add(i)
        elif kind == "handoffs" and self.handoffs is not None:
            self.handoffs.on_handoffs(i, msg[2])
        elif kind == "imported" and self.handoffs is not None:
            self.handoffs.on_imported(i, *msg[2:])
        elif kind == "refused" and self.handoffs is not None:
            self.handoffs.on_refused(i, msg[2])
        elif kind == "error":
            raise RuntimeError(f"worker {i} failed:\n{msg[2]}")
        else:
            raise RuntimeError(f"worker {i} sent {kind!r} during a run")

    def _records(self) -> ClusterRecords:
        parts = tuple(self.done[i][0] for i in range(len(self.remotes)))
        size = max(self.all_ids, default=-1) + 1
        assignment = np.full(size, -1, dtype=np.int64)
        routed = self.cluster.assignment
        assignment[np.fromiter(routed.keys(), np.int64, len(routed))] = np.fromiter(
            routed.values(), np.int64, len(routed)
        )
        names = tuple(r.name for r in self.remotes)
        transfers = self.handoffs.table() if self.handoffs is not None else None
        return ClusterRecords(parts, assignment, self.cluster.route_wall_s, names, transfers)

    def info(self) -> RunInfo:
        workers = tuple(self.done[i][1] for i in range(len(self.remotes)))
        reports = tuple(r.reports for r in self.remotes)
        return RunInfo(dict(self.lag), self.wall_s, reports, workers)

"""One replica of an engine cluster: a worker process with its own CUDA context and Engine.

The driver (``executor.cluster_engine``) starts ``worker_main`` in a spawned process. The worker
builds its Engine once (a model preset's shape with seeded random weights, bf16 on CUDA and fp32
on the CPU, a KV tensor of ``EngineConfig.num_blocks``, graphs captured), then serves *runs* on
command. Messages, in its inbox (the driver's) and its outbox (shared by every worker)::

    inbox                                     outbox
    ("ping",)                                 ("pong", index, perf_counter())
    ("run", RunCommand)  -> fresh Scheduler   ("armed", index)
    ("start", start)     -> serving begins    ("step", index, snapshot, kv_events, finished_ids,
    ("request", wire)    -> an arrival                  rejected_ids, end)      once per step
    ("end",)             -> no more arrivals  ("done", index, RunRecords, info)  once idle
    ("stop",)            -> the process ends  ("ready", index, info) / ("error", index, text)

Disaggregated runs (``WorkerSpec.role`` prefill or decode; ``executor.kv_agent``)::

    ("share", n)         -> n KV handles      ("kv", index, [share_kv bytes] * n)
    ("peers", {i: blob}) -> opened, kept      ("peered", index)
    ("import", wire, n, src, blocks)          ("imported", index, id, start, end, copy_s)
                         -> decode            / ("refused", index, id, now)
    ("release", id)      -> prefill frees     ("handoffs", index, [(id, n, blocks, ready)])
    ("close",)           -> prefill: no more  ("stopped", index)  prefill: its loop has ended
                            releases come

Time base: ``start`` is a ``time.perf_counter()`` reading of the driver. On Linux perf_counter
is ``CLOCK_MONOTONIC``, one clock for every process of the machine, so ``WallClock(start)``
here and in the driver read the same seconds (the driver checks it with pings at start-up).
A request's ``arrival_time`` is the driver's (the trace's): a request reaches the worker a
little after it, and that lag counts in its latency, as a router's would.

Each step is reported through a ``horizon.cluster.Replica`` kept around the run's scheduler
(its ``snapshot(end)``; the block pool's KV events since the previous report), sent with
``put_nowait``: the serving loop never waits on the driver.
"""

from __future__ import annotations

import contextlib
import gc
import math
import queue
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from executor.engine import Engine, EngineConfig
from executor.engine_backend import EngineBackend
from executor.kv_agent import KVAgent
from executor.kv_copy import open_kv, share_kv
from executor.model import CausalLM, ModelConfig
from horizon.cluster import ObservedBackend, Replica
from horizon.cluster.handoffs import ROLES
from horizon.plan import StepPlan, StepResult
from horizon.policies.base import Policy
from horizon.policies.registry import make_policy
from horizon.request import SLO, Request
from horizon.scheduler import Scheduler
from horizon.serving_loop import serve
from horizon.wall_clock import WallClock, run_wall_clock

Wire = tuple  # a request as plain values (``request_to_wire``)


@dataclass(frozen=True)
class WorkerSpec:
    """One replica's process: what it builds once.

    Attributes:
        model: a preset name (``executor.model.config.preset_names``) or a ``ModelConfig``.
        engine: the Engine's config; give ``num_blocks`` when replicas share a GPU.
        device: "cpu", "cuda" or "cuda:<n>"; replicas on one GPU share it.
        name: the replica's label (default ``replica<index>``).
        role: ``mixed``, ``prefill`` or ``decode`` (``horizon.cluster.handoffs``).
        weights_seed, weight_std: the seeded random weights (``executor.bench``'s).
        threads: torch's CPU threads in the process.
        warmup: capture the CUDA graphs before the first run.
    """

    model: str | ModelConfig = "qwen2.5-0.5b"
    engine: EngineConfig = field(default_factory=EngineConfig)
    device: str = "cuda"
    name: str | None = None
    role: str = "mixed"
    weights_seed: int = 0
    weight_std: float = 0.02
    threads: int = 1
    warmup: bool = True

    def __post_init__(self) -> None:
        d = self.device
        if not (d in ("cpu", "cuda") or (d.startswith("cuda:") and d[5:].isdigit())):
            raise ValueError(f"WorkerSpec.device must be 'cpu', 'cuda' or 'cuda:<n>', got {d!r}")
        if not isinstance(self.threads, int) or self.threads < 1:
            raise ValueError(f"WorkerSpec.threads must be an int >= 1, got {self.threads!r}")
        if self.role not in ROLES:
            raise ValueError(f"WorkerSpec.role must be one of {ROLES}, got {self.role!r}")
        if not isinstance(self.engine, EngineConfig):
            raise ValueError(f"WorkerSpec.engine must be an EngineConfig, got {self.engine!r}")


@dataclass(frozen=True)
class PolicySpec:
    """A policy by registry name or ``package.module:Class``, with its constructor options."""

    name: str = "fcfs"
    options: dict = field(default_factory=dict)

    def build(self) -> Policy:
        return make_policy(self.name, **self.options)


@dataclass(frozen=True)
class RunCommand:
    """One run on one replica. ``policy``: a name, a ``PolicySpec`` or a fresh Policy object
    (the worker's own unpickled copy); ``predictor``: for the replica's predicted load figures
    (None: NaN); ``max_time``: stop at the first step boundary at or after it."""

    policy: str | PolicySpec | Policy = "fcfs"
    predictor: object = None
    max_time: float | None = None
    check_every: int = 0
    poll_s: float = 0.05


def request_to_wire(r: Request) -> Wire:
    """A fresh copy's fields as plain values (what crosses to a worker)."""
    slo = (r.slo.ttft, r.slo.itl) if r.slo is not None else None
    return (r.request_id, r.arrival_time, r.num_prompt_tokens, r.max_output_tokens,
            r.true_output_tokens, r.prompt_token_ids, r.conversation_id, r.turn_index, slo,
            r.output_token_ids, r.handoff)  # fmt: skip


def request_from_wire(w: Wire) -> Request:
    """A fresh Request from ``request_to_wire``'s values."""
    rid, arrival, prompt, max_out, true_out, ids, conv, turn, slo, out_ids, handoff = w
    r = Request(rid, arrival, prompt, max_out, true_out,
                slo=SLO(*slo) if slo is not None else None, prompt_token_ids=ids,
                conversation_id=conv, turn_index=turn, output_token_ids=out_ids)  # fmt: skip
    r.handoff = handoff
    return r


class StopWorker(Exception):
    """The driver said stop (in the middle of a run: the run is abandoned)."""


def worker_main(index: int, spec: WorkerSpec, inbox: Any, outbox: Any) -> None:
    """The process's body: build the engine, report ready, then obey commands until "stop".
    Any failure is reported as ``("error", index, traceback)`` and ends the process."""
    try:
        engine, info = build_engine(spec)
        outbox.put(("ready", index, info))
        peers: dict[int, Any] = {}  # decode: the prefill replicas' KV tensors, opened once
        while True:
            msg = inbox.get()
            if msg[0] == "ping":
                outbox.put(("pong", index, time.perf_counter()))
            elif msg[0] == "share":
                outbox.put(("kv", index, [share_kv(engine.kv_cache) for _ in range(msg[1])]))
            elif msg[0] == "peers":
                peers.update({i: open_kv(blob) for i, blob in msg[1].items()})
                outbox.put(("peered", index))
            elif msg[0] == "run":
                serve_run(engine, index, spec, msg[1], inbox, outbox, peers)
            elif msg[0] == "stop":
                return
            else:
                raise ValueError(f"worker {index}: unexpected command {msg[0]!r}")
    except StopWorker:
        return
    except BaseException:  # noqa: BLE001 - the driver must hear of any failure
        outbox.put(("error", index, traceback.format_exc()))


def build_engine(spec: WorkerSpec) -> tuple[Engine, dict]:
    """The replica's Engine (random weights, warmed up) and what the driver needs of it."""
    import torch

    from executor.bench import device_random_weights

    t0 = time.perf_counter()
    torch.set_num_threads(spec.threads)
    cuda = spec.device.startswith("cuda")
    if ":" in spec.device:  # "cuda" alone: the process's current device
        torch.cuda.set_device(torch.device(spec.device))
    cfg = ModelConfig.for_preset(spec.model) if isinstance(spec.model, str) else spec.model
    model = CausalLM(cfg, device=spec.device, dtype=torch.bfloat16 if cuda else torch.float32)
    device_random_weights(model, spec.weights_seed, spec.weight_std)
    engine = Engine(model, spec.engine)
    if spec.warmup:
        engine.warmup()
    info = {
        "num_blocks": engine.num_blocks,
        "block_size": spec.engine.block_size,
        "token_budget": spec.engine.max_num_batched_tokens,
        "prefix_caching": spec.engine.enable_prefix_caching,
        "max_model_len": spec.engine.max_model_len,
        "shape": cfg.shape,
        "device": spec.device,
        "gpu": torch.cuda.get_device_name(engine.device) if cuda else "cpu",
        "torch": torch.__version__,
        "build_s": time.perf_counter() - t0,
    }
    return engine, info


def serve_run(
    engine: Engine,
    index: int,
    spec: WorkerSpec,
    cmd: RunCommand,
    inbox: Any,
    outbox: Any,
    peers: dict[int, Any] | None = None,
) -> None:
    """One run: arm (fresh scheduler), wait for "start", serve the inbox's arrivals on the
    shared clock until "end" and idle (or ``max_time``), then send the run's records."""
    policy = cmd.policy
    if isinstance(policy, str):
        policy = make_policy(policy)
    elif isinstance(policy, PolicySpec):
        policy = policy.build()
    engine.runner.reset()
    sched = Scheduler(engine.config.scheduler_config(engine.num_blocks), policy)
    shape = engine.model.config.shape
    replica = Replica(index, sched, shape, cmd.predictor, spec.name)
    sched.pool.events = []
    outbox.put(("armed", index))
    msg = inbox.get()
    if msg[0] == "stop":
        raise StopWorker
    if msg[0] != "start":
        raise ValueError(f"worker {index}: expected 'start' after 'run', got {msg[0]!r}")
    clock = WallClock(start=msg[1])
    replica.now = clock.now
    agent = None
    if spec.role != "mixed":
        agent = KVAgent(index, spec.role, replica, engine.kv_cache, peers or {},
                        engine.runner.release, outbox.put_nowait, clock.now)  # fmt: skip
    arrivals = InboxArrivals(inbox, replica, cmd.poll_s, agent)
    cfg = engine.config
    eos = frozenset(engine.model.config.eos_token_ids)
    inner = EngineBackend(engine.runner, sched, clock, cfg.pipelined, eos, cfg.stop)
    over = agent.step_over if agent is not None and spec.role == "prefill" else None
    backend = ObservedBackend(inner, clock, step_reporter(index, replica, outbox.put_nowait, over))
    end = math.inf if cmd.max_time is None else cmd.max_time
    gc_was_enabled = gc.isenabled()
    gc.disable()  # a collection pause would land in some step's measured time
    try:
        collect = agent.collect if agent is not None and spec.role == "prefill" else None
        loop = serve(sched, backend, arrivals, clock, end, cmd.check_every, check_on_idle=True,
                     after_update=collect)  # fmt: skip
        stalled = run_wall_clock(loop, clock)
    finally:
        if gc_was_enabled:
            gc.enable()
    _finish(index, spec, engine, replica, arrivals, agent, clock, outbox, stalled, inner.outputs)


def _finish(index, spec, engine, replica, arrivals, agent, clock, outbox, stalled, outputs) -> None:  # noqa: ANN001
    """After the serving loop: the messages still due (arrivals until "end"; a prefill
    replica's releases until "close"), the integrity checks, then "done" with the records."""
    sched = replica.scheduler
    arrivals.until_end(sched, clock.now())  # routed after a max_time cut: recorded unfinished
    if spec.role == "prefill":
        outbox.put(("stopped", index))
        arrivals.until_close()  # a handoff in flight at a max_time cut is released meanwhile
    sched.finish_run()
    replica.check_integrity()
    engine.runner.check_integrity()
    records = sched.recorder.build()
    info = {"steps": len(records.step_end), "stalled": stalled, "end": clock.now(),
            "outputs": outputs}  # fmt: skip
    if agent is not None:
        agent.check_integrity()
        info["copy_s"], info["handed"] = agent.copy_s, len(agent.handed)
    outbox.put(("done", index, records, info))


def step_reporter(
    index: int,
    replica: Replica,
    send: Callable[[tuple], None],
    over: Callable[[StepPlan, float], None] | None = None,
) -> Callable[[StepPlan, StepResult, float], None]:
    """The ``ObservedBackend`` observer: the replica's bookkeeping, then one report a step,
    then ``over(plan, end)`` (a prefill replica's agent reports the step's handoffs)."""
    pool = replica.scheduler.pool

    def on_step(plan: StepPlan, result: StepResult, end: float) -> None:
        replica.observe_step(plan, result, end)
        events = pool.events
        if events:
            pool.events = []
        finished = [r.request_id for r in result.finished]
        rejected = [r.request_id for r, _ in plan.rejected]
        send(("step", index, tuple(replica.snapshot(end)), events, finished, rejected, end))
        if over is not None:
            over(plan, end)

    return on_step


class InboxArrivals:
    """The serving loop's ``Arrivals`` over the worker's inbox (``horizon.serving_loop``).

    ``admit`` drains the inbox without blocking and adds the requests due at the boundary's
    ``now`` (each was routed at or after its arrival on the shared clock, but the loop read
    ``now`` before the drain: one that came after is left for the next boundary, so no request
    is admitted at a time before its arrival); ``wait`` blocks on the inbox for at most
    ``poll_s`` (or until ``end``, or the next pending arrival) and returns a deadline already
    past, so the loop wakes as soon as a message arrives. Exhausted once "end" was read and
    nothing waits.
    """

    def __init__(
        self, inbox: Any, replica: Replica, poll_s: float = 0.05, agent: KVAgent | None = None
    ) -> None:
        if not poll_s > 0:
            raise ValueError(f"RunCommand.poll_s must be > 0, got {poll_s!r}")
        self._inbox = inbox
        self._replica = replica
        self._poll = poll_s
        self._agent = agent
        self._pending: deque[Request] = deque()
        self._transfers: deque[tuple] = deque()  # "import" and "release" messages, in order
        self._ended = False
        self._closed = False

    def _take(self, msg: tuple) -> None:
        kind = msg[0]
        if kind == "request":
            self._pending.append(request_from_wire(msg[1]))
        elif kind in ("import", "release") and self._agent is not None:
            self._transfers.append(msg)
        elif kind == "end":
            self._ended = True
        elif kind == "close":
            self._closed = True
        elif kind == "stop":
            raise StopWorker
        else:
            raise ValueError(f"worker: unexpected message {kind!r} during a run")

    def _drain(self) -> None:
        inbox = self._inbox
        while True:
            try:
                msg = inbox.get_nowait()
            except queue.Empty:
                return
            self._take(msg)

    def admit(self, sched: Scheduler, now: float) -> None:
        self._drain()
        self._handle_transfers(stopped=False)
        pending, accept = self._pending, self._replica.accept
        while pending and pending[0].arrival_time <= now:
            r = pending.popleft()
            accept(r, now)
            sched.add(r)

    def due(self, now: float) -> bool:
        self._drain()
        return bool(self._transfers) or bool(self._pending and self._pending[0].arrival_time <= now)

    @property
    def exhausted(self) -> bool:
        held = self._agent is not None and self._agent.handed  # a prefill replica's, unreleased
        return self._ended and not self._pending and not self._transfers and not held

    def wait(self, now: float, end: float) -> float:
        timeout = min(self._poll, end - now)
        if self._pending:
            timeout = min(timeout, self._pending[0].arrival_time - now)
        if timeout > 0:
            with contextlib.suppress(queue.Empty):
                self._take(self._inbox.get(timeout=timeout))
        return now  # past: the loop goes on at once (and admits what came)

    def until_end(self, sched: Scheduler, now: float) -> None:
        """Block until "end" once the loop has stopped (at ``max_time``), taking what comes
        meanwhile: requests are added (recorded unfinished), a release frees its handoff's
        blocks, an import is refused (this replica runs no more steps)."""
        while not self._ended:
            self._take(self._inbox.get())
            self._handle_transfers(stopped=True)
        self._handle_transfers(stopped=True)
        self.admit(sched, math.inf)

    def until_close(self) -> None:
        """A prefill replica's last wait, after "stopped": releases of its handoffs still in
        flight (a run cut at ``max_time``) come until the driver's "close", after the last."""
        while not self._closed:
            self._take(self._inbox.get())
            self._handle_transfers(stopped=True)

    def _handle_transfers(self, stopped: bool) -> None:
        """The queued "import" and "release" messages, in order: a release frees its
        handoff's blocks; an import is taken (reserved, copied, admitted), or refused once the
        loop has ``stopped``."""
        transfers, agent = self._transfers, self._agent
        while transfers:
            msg = transfers.popleft()
            assert agent is not None
            if msg[0] == "release":
                agent.release(msg[1])
                continue
            _, wire, n, src, blocks = msg
            r = request_from_wire(wire)
            if stopped:
                agent.refuse(r)
            else:
                agent.take_import(r, n, src, blocks)

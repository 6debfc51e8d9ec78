"""The engine: horizon's Scheduler and block pool driving the paged model on a wall clock.

The loop mirrors the simulator's (``simulator/simulation.py``) with the wall clock as ``now``
(seconds since the run started)::

    plan = scheduler.schedule(now) -> execute(plan) -> scheduler.update(plan, result, now)

so the records are the simulator's, from measured instead of modelled step times. By default
(``EngineConfig.async_steps``) the loop is pipelined: step N+1 is planned and queued on the GPU
before step N's tokens are read, which ``simulator.Simulation(pipelined=True)`` models.
Offline, every request is queued at the start; online, a request is queued once
``perf_counter() - start`` reaches its ``arrival_time`` (the loop sleeps until the next arrival
when idle).

Stopping rule (the backend's, DESIGN.md): ``stop="trace"`` forces each request to emit exactly
``true_output_tokens`` (end-of-sequence ignored, as when replaying a trace); ``stop="eos"`` stops at
an end-of-sequence token or ``max_output_tokens`` (records of such a run keep the trace's
``true_output_tokens``, so ``RunRecords.check`` holds only for requests that ran to it).
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from executor.kernels import allocate_kv_cache
from executor.model import CausalLM
from executor.runner import GRAPH_BATCH_SIZES, ModelRunner
from executor.sampling import SamplingParams
from horizon.metrics.records import RunRecords
from horizon.plan import StepPlan, StepResult
from horizon.policies.base import Policy
from horizon.policies.registry import make_policy
from horizon.request import Request
from horizon.scheduler import Scheduler
from horizon.scheduler_config import SchedulerConfig
from horizon.trace_stop import TraceStop

STOP_RULES = ("trace", "eos")


@dataclass(frozen=True)
class EngineConfig:
    """How the engine runs (the scheduler's mechanics plus the executor's choices).

    Attributes:
        num_blocks: KV blocks; None sizes the pool from free GPU memory (see ``kv_blocks_for``).
        gpu_memory_utilization: share of the GPU's memory the engine may fill (weights, KV,
            activations) when ``num_blocks`` is None.
        block_size, max_num_batched_tokens, max_num_seqs, max_model_len, enable_prefix_caching,
            step_mode: as in ``horizon.SchedulerConfig``. Both step modes give the same plans
            and tokens; "event" costs the host about a quarter of "reference"'s time per step
            at 256 decodes (0.21 vs 0.86 ms measured on a CPU here), which a small model's
            decode step feels.
        stop: "trace" (forced to ``true_output_tokens``) or "eos" (see the module docstring).
        attention_backend: "triton" or "torch"; None: triton on CUDA, torch on CPU.
        cuda_graphs: replay decode-only steps from CUDA graphs; None: on CUDA with Triton.
        mixed_graphs: replay steps with prefill chunks from CUDA graphs too (padded to
            ``horizon.step_buckets.mixed_token_buckets``); None: with ``cuda_graphs``.
        graph_batch_sizes: decode batch buckets of the graphs.
        async_steps: submit each step before reading the previous step's tokens, so the host's
            work (scheduler, input staging) overlaps the GPU's; only with ``stop="trace"``,
            whose stopping needs no token values. None: on with it. A step's recorded start is
            when it was planned (possibly before the previous step's end), its end when the
            host has its tokens; ``RunRecords.step_durations`` gives each step's own time.
        seed: run seed of sampling (request ``r`` draws with ``seed * 1_000_003 + r + 1`` when its
            params leave the seed at 0) and of
            synthetic prompt ids for requests that carry none.
    """

    num_blocks: int | None = None
    gpu_memory_utilization: float = 0.9
    block_size: int = 16
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 256
    max_model_len: int = 4096
    enable_prefix_caching: bool = True
    step_mode: str = "event"
    stop: str = "trace"
    attention_backend: str | None = None
    cuda_graphs: bool | None = None
    mixed_graphs: bool | None = None
    graph_batch_sizes: tuple[int, ...] = GRAPH_BATCH_SIZES
    async_steps: bool | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.num_blocks is not None and (
            not isinstance(self.num_blocks, int) or self.num_blocks < 1
        ):
            raise ValueError(
                f"EngineConfig.num_blocks must be None or an int >= 1, got {self.num_blocks!r}"
            )
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(
                "EngineConfig.gpu_memory_utilization must be in (0, 1], got "
                f"{self.gpu_memory_utilization!r}"
            )
        if self.stop not in STOP_RULES:
            raise ValueError(f"EngineConfig.stop must be one of {STOP_RULES}, got {self.stop!r}")
        if self.async_steps and self.stop != "trace":
            raise ValueError(
                'EngineConfig.async_steps needs stop="trace": with "eos" the next step depends on '
                "the tokens of this one"
            )
        self.scheduler_config(1)  # checks the scheduler's fields

    @property
    def pipelined(self) -> bool:
        """Whether runs submit a step before reading the previous one's tokens."""
        return self.stop == "trace" if self.async_steps is None else self.async_steps

    def scheduler_config(self, num_blocks: int) -> SchedulerConfig:
        return SchedulerConfig(
            num_blocks=num_blocks,
            block_size=self.block_size,
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_num_seqs=self.max_num_seqs,
            max_model_len=self.max_model_len,
            enable_prefix_caching=self.enable_prefix_caching,
            step_mode=self.step_mode,
        )


def kv_block_bytes(model: CausalLM, block_size: int) -> int:
    c = model.config
    itemsize = torch.empty((), dtype=model.embed_tokens.weight.dtype).element_size()
    return 2 * c.num_layers * block_size * c.num_kv_heads * c.head_dim * itemsize


def activation_bytes(model: CausalLM, config: EngineConfig) -> int:
    """A bound on a step's activations: a layer's widest intermediates for the token budget,
    fp32 + model-dtype logits of ``max_num_seqs`` rows, and 512 MiB for graphs and workspaces."""
    c = model.config
    itemsize = torch.empty((), dtype=model.embed_tokens.weight.dtype).element_size()
    per_token = 6 * c.hidden_size + 2 * (c.q_size + 2 * c.kv_size) + 4 * c.intermediate_size
    logits = config.max_num_seqs * c.vocab_size * (2 * itemsize + 8)
    return config.max_num_batched_tokens * per_token * itemsize + logits + (512 << 20)


def kv_blocks_for(model: CausalLM, config: EngineConfig) -> int:
    """KV blocks that fit in ``gpu_memory_utilization`` of the GPU's memory after what is already
    allocated (the weights) and ``activation_bytes``."""
    device = model.embed_tokens.weight.device
    if device.type != "cuda":
        raise ValueError("EngineConfig.num_blocks must be given off the GPU")
    free, total = torch.cuda.mem_get_info(device)
    budget = (
        total * config.gpu_memory_utilization - (total - free) - activation_bytes(model, config)
    )
    blocks = int(budget // kv_block_bytes(model, config.block_size))
    if blocks < 1:
        raise ValueError(f"no GPU memory left for the KV cache ({budget / 2**30:.1f} GiB)")
    return blocks


class Engine:
    """A model, its paged KV tensor and a runner; each ``run_*`` call is one run with a fresh
    Scheduler (any horizon policy) and returns that run's ``RunRecords``.

    Args:
        model: the decoder, weights loaded, on its device.
        config: see ``EngineConfig``.
        sampling: one ``SamplingParams`` for every request, or a function of the request
            (default: greedy). A params' seed of 0 is replaced by the request's own seed.

    After a run, ``outputs[request_id]`` holds each request's generated tokens (finished ones,
    and the partial output of requests cut off by ``max_time``).
    """

    def __init__(
        self,
        model: CausalLM,
        config: EngineConfig | None = None,
        sampling: SamplingParams | Callable[[Request], SamplingParams] | None = None,
    ) -> None:
        self.model = model
        self.config = config = config or EngineConfig()
        c = model.config
        if config.max_model_len > c.max_position_embeddings:
            raise ValueError(
                f"EngineConfig.max_model_len={config.max_model_len} exceeds the model's "
                f"max_position_embeddings={c.max_position_embeddings}"
            )
        self.device = model.embed_tokens.weight.device
        self.num_blocks = config.num_blocks or kv_blocks_for(model, config)
        self.kv_cache = allocate_kv_cache(
            c.num_layers,
            self.num_blocks,
            config.block_size,
            c.num_kv_heads,
            c.head_dim,
            model.embed_tokens.weight.dtype,
            self.device,
        )
        self._sampling = sampling
        self.runner = ModelRunner(
            model,
            self.kv_cache,
            config.max_num_seqs,
            config.max_num_batched_tokens,
            config.max_model_len,
            backend=config.attention_backend,
            cuda_graphs=config.cuda_graphs,
            mixed_graphs=config.mixed_graphs,
            graph_batch_sizes=config.graph_batch_sizes,
            prompt_of=self._prompt_of,
            sampling_of=self._sampling_of,
        )
        self._eos = frozenset(c.eos_token_ids)
        self._trace_stop = TraceStop()
        self.outputs: dict[int, list[int]] = {}
        self.scheduler: Scheduler | None = None  # the latest run's

    # -- per-request inputs ----------------------------------------------------------------------
    def _prompt_of(self, r: Request) -> Sequence[int]:
        if r.prompt_token_ids is not None:
            return r.prompt_token_ids
        return synthetic_prompt(r, self.model.config.vocab_size, self.config.seed)

    def _sampling_of(self, r: Request) -> SamplingParams:
        s = self._sampling
        params = s(r) if callable(s) else (s or SamplingParams())
        if params.seed == 0 and not params.greedy:
            seed = self.config.seed * 1_000_003 + r.request_id + 1
            params = SamplingParams(
                params.temperature, params.top_k, params.top_p, params.min_p, seed
            )
        return params

    def warmup(self) -> None:
        """Capture every decode and mixed-step graph now rather than on first use (no-op off CUDA
        graphs)."""
        self.runner.capture_graphs()

    # -- runs ------------------------------------------------------------------------------------
    def run_offline(self, requests: Sequence[Request], policy: Policy | str = "fcfs") -> RunRecords:
        """Queue every request at the start and run until all are done.

        ``requests`` must be fresh (never scheduled); their ``arrival_time`` is what the records
        show (give 0 for a plain batch)."""
        sched = self._new_run(policy)
        start = time.perf_counter()
        for r in sorted(requests, key=lambda r: (r.arrival_time, r.request_id)):
            sched.add(r)
        return self._loop(sched, [], start, None)

    def run_online(
        self,
        requests: Sequence[Request],
        policy: Policy | str = "fcfs",
        max_time: float | None = None,
    ) -> RunRecords:
        """Replay arrivals on the wall clock: request ``r`` is queued once ``r.arrival_time``
        seconds have passed since the start. ``max_time``: stop at the first step boundary at or
        after it (later arrivals are not part of the run; unfinished requests are recorded so)."""
        if max_time is not None and not (math.isfinite(max_time) and max_time > 0):
            raise ValueError(f"max_time must be a finite number > 0, got {max_time!r}")
        sched = self._new_run(policy)
        pending = sorted(requests, key=lambda r: (r.arrival_time, r.request_id))
        pending.reverse()  # pop() takes the earliest
        return self._loop(sched, pending, time.perf_counter(), max_time)

    def _new_run(self, policy: Policy | str) -> Scheduler:
        self.runner.reset()
        self.outputs = {}
        self._trace_stop = TraceStop()
        policy = make_policy(policy) if isinstance(policy, str) else policy
        self.scheduler = Scheduler(self.config.scheduler_config(self.num_blocks), policy)
        return self.scheduler

    def _loop(
        self, sched: Scheduler, pending: list[Request], start: float, max_time: float | None
    ) -> RunRecords:
        end = math.inf if max_time is None else max_time
        gc_was_enabled = gc.isenabled()
        gc.disable()  # a collection pause would land in some step's measured time
        try:
            if self.config.pipelined:
                self._run_pipelined(sched, pending, start, end)
            else:
                self._run_serial(sched, pending, start, end)
        finally:
            if gc_was_enabled:
                gc.enable()
        sched.finish_run()
        sched.check_integrity()
        self.runner.check_integrity()
        self.outputs.update(self.runner.unfinished())  # cut off by max_time
        return sched.recorder.build()

    def _run_serial(
        self, sched: Scheduler, pending: list[Request], start: float, end: float
    ) -> None:
        """schedule -> execute (tokens read back) -> update, one step at a time."""
        clock = time.perf_counter
        now = clock() - start
        while now < end:
            while pending and pending[-1].arrival_time <= now:
                sched.add(pending.pop())
            if not sched.has_work:
                if not pending:
                    break
                now = self._idle(sched, pending, start, end)
                continue
            plan = sched.schedule(now)
            result = self._execute(plan)
            now = clock() - start
            sched.update(plan, result, now)
            if plan.is_empty and not sched.running:  # the policy admits nothing until more arrive
                if not pending:
                    break
                now = self._idle(sched, pending, start, end)

    def _run_pipelined(
        self, sched: Scheduler, pending: list[Request], start: float, end: float
    ) -> None:
        """schedule N+1 -> submit N+1 -> read N's tokens -> update N+1: the host prepares a step
        while the GPU runs the one before it.

        With ``stop="trace"`` the scheduler needs no token values, so ``update`` runs right after
        ``submit`` with the step's finished requests; the step's end is recorded when its
        tokens are read (``_retire``). A plan that preempts, or an empty one, waits for the step in
        flight first (the runner may not move a row with a token in flight)."""
        clock = time.perf_counter
        runner, blocks_of = self.runner, sched.kv.blocks_of
        flight: tuple | None = None  # (plan, pending step, its finished requests)
        now = clock() - start
        while now < end:
            while pending and pending[-1].arrival_time <= now:
                sched.add(pending.pop())
            if not sched.has_work:
                if flight is not None:
                    self._retire(sched, flight, start)
                    flight = None
                    now = clock() - start
                    continue
                if not pending:
                    break
                now = self._idle(sched, pending, start, end)
                continue
            plan = sched.schedule(now)
            if flight is not None and (plan.preempted or plan.is_empty):
                self._retire(sched, flight, start)
                flight = None
            step = runner.submit(plan, blocks_of)
            finished = self._trace_stop.finished(plan)
            if flight is not None:
                self._retire(sched, flight, start)
            sched.update(plan, StepResult(math.nan, tuple(finished)), clock() - start)
            flight = (plan, step, finished)
            if plan.is_empty:
                self._retire(sched, flight, start)
                flight = None
                if not sched.running:  # the policy admits nothing until more arrive
                    if not pending:
                        break
                    now = self._idle(sched, pending, start, end)
                    continue
            now = clock() - start
        if flight is not None:
            self._retire(sched, flight, start)

    def _retire(self, sched: Scheduler, flight: tuple, start: float) -> None:
        """Read a submitted step's tokens, release its finished requests, record its end."""
        plan, step, finished = flight
        self.runner.wait(step)
        t_end = time.perf_counter() - start
        for r in finished:
            self.outputs[r.request_id] = self.runner.release(r)
        sched.recorder.set_step_end(plan.step, t_end)

    def _idle(self, sched: Scheduler, pending: list[Request], start: float, end: float) -> float:
        """Nothing to run: check the scheduler and the runner, then sleep until the next arrival
        (or ``end``)."""
        sched.check_integrity()
        self.runner.check_integrity()
        wake = min(pending[-1].arrival_time, end)
        delay = wake - (time.perf_counter() - start)
        if delay > 0:
            time.sleep(delay)
        return time.perf_counter() - start

    def _execute(self, plan: StepPlan) -> StepResult:
        """Run the plan; apply the stopping rule; measure the step."""
        t0 = time.perf_counter()
        out = self.runner.execute(plan, self.scheduler.kv.blocks_of)
        if self.config.stop == "trace":
            finished = self._trace_stop.finished(plan)
        else:
            finished = self._finish_eos(out.requests, out.tokens)
        for r in finished:
            self.outputs[r.request_id] = self.runner.release(r)
        token_ids = dict(zip(out.request_ids, out.tokens))
        return StepResult(time.perf_counter() - t0, tuple(finished), token_ids)

    def _finish_eos(self, emitted: Sequence[Request], tokens: Sequence[int]) -> list[Request]:
        eos = self._eos
        return [
            r
            for r, t in zip(emitted, tokens)
            if t in eos or r.num_output_tokens + 1 == r.max_output_tokens
        ]


def synthetic_prompt(request: Request, vocab_size: int, seed: int = 0) -> list[int]:
    """Seeded random prompt ids for a request that carries only a prompt length."""
    rng = np.random.default_rng((seed, request.request_id))
    return rng.integers(0, vocab_size, request.num_prompt_tokens).tolist()

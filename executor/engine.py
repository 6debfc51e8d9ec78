"""The engine: horizon's Scheduler and block pool driving the paged model on a wall clock.

The loop is the simulator's (``horizon.serving_loop.serve``), with this engine as its backend
(``executor.engine_backend``) and the wall clock as ``now`` (seconds since the run started)::

    plan = scheduler.schedule(now) -> execute(plan) -> scheduler.update(plan, result, now)

so the records are the simulator's, from measured instead of modelled step times. By default
(``EngineConfig.async_steps``) the loop is pipelined: step N+1 is planned and queued on the GPU
before step N's tokens are read, which ``simulator.Simulation(pipelined=True)`` models.
Offline, every request is queued at the start; online, a request is queued once
``perf_counter() - start`` reaches its ``arrival_time`` (the loop sleeps until the next arrival
when idle).

Stopping rule (the backend's, docs/design.md): ``stop="trace"`` forces each request to emit exactly
``true_output_tokens`` (end-of-sequence ignored, as when replaying a trace); ``stop="eos"`` stops at
an end-of-sequence token or ``max_output_tokens`` (records of such a run keep the trace's
``true_output_tokens``, so ``RunRecords.check`` holds only for requests that ran to it).

Speculative decoding (``EngineConfig.speculation``, off by default): the scheduler decides each
decoding request's draft count (``horizon.speculation``), the engine's drafter
(``executor.drafter``, n-gram prompt lookup by default) proposes that many or fewer when the
step is staged, and the runner verifies them in the step's forward (``executor.verify``:
greedy acceptance, rejection sampling at temperature > 0; or, for random-weight targets, a
stated acceptance model: ``EngineConfig.acceptance``). Such runs are serial: a plan depends on
the drafts accepted in the one before.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from executor.drafter import make_drafter
from executor.engine_backend import EngineBackend
from executor.kernels import allocate_kv_cache
from executor.model import CausalLM
from executor.runner import GRAPH_BATCH_SIZES, ModelRunner
from executor.sampling import SamplingParams
from horizon.acceptance import AcceptanceModel
from horizon.metrics.records import RunRecords
from horizon.policies.base import Policy
from horizon.policies.registry import make_policy
from horizon.request import Request
from horizon.scheduler import Scheduler
from horizon.scheduler_config import SchedulerConfig
from horizon.serving_loop import serve
from horizon.speculation import SpeculationConfig
from horizon.wall_clock import ListArrivals, WallClock, run_wall_clock

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
        speculation: speculative decoding (``horizon.speculation.SpeculationConfig``, the
            scheduler's: which policy decides each request's draft count); None: off. A mapping
            is read as one. Runs serially (``async_steps`` must not be True; None means off).
        drafter: who proposes the drafts (``executor.drafter``: ``ngram``, or
            ``package.module:Class``), built once per engine with ``drafter_options``.
        acceptance: None (default): drafts are accepted by the target's judgement (greedy, or
            rejection sampling). Else a stated acceptance model (``horizon.acceptance``, the
            simulator's): ``("geometric", alpha)``, ``("rates", (r1, ...))`` (seeded with
            ``seed``, or a third item) or an ``AcceptanceModel``; each verification accepts as
            many drafts as it draws and emits the target's token after them, for targets with
            random weights, whose own acceptance means nothing (``ModelRunner``'s
            ``acceptance``). Needs ``speculation``. Read as an ``AcceptanceModel``.
        verify_as_decode: run a verification step without prefill chunks (only decodes and
            verifications: the steady state) as an expanded decode step, each verifying
            request's ``k + 1`` query tokens as ``k + 1`` decode rows of causal context
            lengths, through the split-K decode kernel and CUDA graphs keyed by the padded row
            count (``ModelRunner``'s ``verify_as_decode``; default). False: every verification
            step takes the mixed path (ragged prefill kernel, mixed-step graphs), as steps with
            prefill chunks always do. Same tokens either way; an A/B switch.
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
    speculation: SpeculationConfig | None = None
    drafter: str = "ngram"
    drafter_options: tuple[tuple[str, object], ...] = ()
    acceptance: AcceptanceModel | tuple | None = None
    verify_as_decode: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.speculation, dict):
            object.__setattr__(self, "speculation", SpeculationConfig(**self.speculation))
        if self.acceptance is not None:
            try:
                model = AcceptanceModel.from_spec(self.acceptance, self.seed)
            except ValueError as e:
                raise ValueError(f"EngineConfig.{e}") from None
            object.__setattr__(self, "acceptance", model)
            if self.speculation is None:
                raise ValueError("EngineConfig.acceptance needs speculation (it has no drafts)")
        if self.speculation is not None and self.async_steps:
            raise ValueError(
                "EngineConfig.async_steps must be off with speculation: the next plan depends on "
                "the drafts accepted in this one"
            )
        if not isinstance(self.verify_as_decode, bool):
            v = self.verify_as_decode
            raise ValueError(f"EngineConfig.verify_as_decode must be True or False, got {v!r}")
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
        if self.speculation is not None:
            return False
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
            speculation=self.speculation,
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
            prompt_of=self.prompt_of,
            sampling_of=self.sampling_of,
            drafter=None
            if config.speculation is None
            else make_drafter(config.drafter, **dict(config.drafter_options)),
            acceptance=config.acceptance,
            verify_as_decode=config.verify_as_decode,
        )
        self._eos = frozenset(c.eos_token_ids)
        self.outputs: dict[int, list[int]] = {}
        self.scheduler: Scheduler | None = None  # the latest run's

    # -- per-request inputs ----------------------------------------------------------------------
    def prompt_of(self, r: Request) -> Sequence[int]:
        """``r``'s prompt ids: its own, else seeded synthetic ones of its length."""
        if r.prompt_token_ids is not None:
            return r.prompt_token_ids
        return synthetic_prompt(r, self.model.config.vocab_size, self.config.seed)

    def sampling_of(self, r: Request) -> SamplingParams:
        """``r``'s sampling parameters (a seed of its own where sampling asks for one)."""
        s = self._sampling
        params = s(r) if callable(s) else (s or SamplingParams())
        if params.seed == 0 and not params.greedy:
            seed = self.config.seed * 1_000_003 + r.request_id + 1
            params = SamplingParams(
                params.temperature, params.top_k, params.top_p, params.min_p, seed
            )
        return params

    def warmup(self, max_drafts: int | None = None) -> None:
        """Capture every decode and mixed-step graph now rather than on first use (no-op off CUDA
        graphs), and (``verify_as_decode``) the expanded verification graphs of steps of up to
        ``max_num_seqs`` requests verifying ``max_drafts`` drafts each (default: the config's
        ``speculation.num_draft_tokens``, none without speculation; give it for an engine whose
        later runs will speculate)."""
        c = self.config
        if max_drafts is None:
            max_drafts = 0 if c.speculation is None else c.speculation.num_draft_tokens
        rows = c.max_num_seqs * (max_drafts + 1) if max_drafts > 0 else 0
        self.runner.capture_graphs(verify_rows=rows)

    # -- runs ------------------------------------------------------------------------------------
    def run_offline(self, requests: Sequence[Request], policy: Policy | str = "fcfs") -> RunRecords:
        """Queue every request at the start and run until all are done.

        ``requests`` must be fresh (never scheduled); their ``arrival_time`` is what the records
        show (give 0 for a plain batch)."""
        sched = self._new_run(policy)
        clock = WallClock()
        for r in sorted(requests, key=lambda r: (r.arrival_time, r.request_id)):
            sched.add(r)
        return self._loop(sched, ListArrivals(()), clock, None)

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
        return self._loop(sched, ListArrivals(requests), WallClock(), max_time)

    def _new_run(self, policy: Policy | str) -> Scheduler:
        self.runner.reset()
        self.runner.acceptance = self.config.acceptance  # a config swapped between runs
        self.runner.verify_as_decode = self.config.verify_as_decode
        self.outputs = {}
        policy = make_policy(policy) if isinstance(policy, str) else policy
        self.scheduler = Scheduler(self.config.scheduler_config(self.num_blocks), policy)
        return self.scheduler

    def _loop(
        self, sched: Scheduler, arrivals: ListArrivals, clock: WallClock, max_time: float | None
    ) -> RunRecords:
        """The serving loop (``horizon.serving_loop``) with this engine as its backend."""
        backend = EngineBackend(
            self.runner, sched, clock, self.config.pipelined, self._eos, self.config.stop
        )
        end = math.inf if max_time is None else max_time
        gc_was_enabled = gc.isenabled()
        gc.disable()  # a collection pause would land in some step's measured time
        try:
            run_wall_clock(serve(sched, backend, arrivals, clock, end, check_on_idle=True), clock)
        finally:
            if gc_was_enabled:
                gc.enable()
        sched.finish_run()
        sched.check_integrity()
        self.runner.check_integrity()
        self.outputs = backend.outputs
        self.outputs.update(self.runner.unfinished())  # cut off by max_time
        return sched.recorder.build()


def synthetic_prompt(request: Request, vocab_size: int, seed: int = 0) -> list[int]:
    """Seeded random prompt ids for a request that carries only a prompt length."""
    rng = np.random.default_rng((seed, request.request_id))
    return rng.integers(0, vocab_size, request.num_prompt_tokens).tolist()

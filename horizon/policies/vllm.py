"""vLLM v1's scheduling decisions as a preset (its defaults: ``configs/scheduler/vllm.yaml``).

What vLLM decides, restated for this interface (``mode`` = vLLM's ``--scheduling-policy``):

* ``fcfs`` (vLLM's default): the waiting queue is a deque; arrivals join its tail and a
  preempted request is put back at its head, the latest preempted first. Admission takes the
  head while the token budget, ``max_num_seqs`` and blocks last, and stops at the first request
  that does not fit (the shared scheduler's mechanics). The victim when a running request lacks
  a block is the tail of the running list: the most recently admitted request (possibly the
  one that needs the block, which then waits).
* ``priority``: the queue is ordered by (priority, arrival time, request id), preempted
  requests included, and the victim is the running request with the largest (priority,
  arrival time). Horizon's requests carry no client priority, so every request has vLLM's
  default, 0: arrival order, and the victim is the latest arrival (not the latest admission).
* Both: vLLM admits no waiting request in a step that preempted. ``choose_victim`` does not
  see the step, but the scheduler preempts (decodes, then prefills) before it admits, so the
  first admission pass after a preemption is held: the same step's, unless that step had no
  admission pass (its token budget or seats were used up), when the next step's is held.

Not reproduced (the shared scheduler's mechanics, the same for every policy): vLLM stops
scheduling the remaining running requests of a step once one of them preempted itself.

Sources (vllm-project/vllm; the facts, not the code):

* ``vllm/v1/core/sched/scheduler.py`` at 00024d314514900f361ad072af6931e403b7f589, in
  ``schedule()``: the FCFS victim is ``self.running.pop()``, the priority one
  ``max(self.running, key=lambda r: (r.priority, r.arrival_time))``; waiting requests are
  scheduled only ``if not preempted_reqs``; ``_preempt_request`` calls
  ``self.waiting.prepend_request(request)``.
* ``vllm/v1/core/sched/request_queue.py`` at 9feb38cacfe75c77aa5f45f99d135c02702db7e0:
  ``FCFSRequestQueue.prepend_request`` is ``appendleft``; ``PriorityRequestQueue`` is a heap
  ordered by ``Request.__lt__``, whose ``prepend_request`` is a plain ``add_request``.
* ``vllm/v1/request.py`` at dba83d52c06471eabafba4310718ac7a100cbfa4: ``priority: int = 0``;
  ``__lt__`` compares priority, then arrival_time, then request_id.

The scheduler values (``configs/scheduler/vllm.yaml``), for the OpenAI API server on one GPU of
>= 70 GiB that is not an A100 (an H100 or H200):

* ``vllm/engine/arg_utils.py`` at 99d7eb5d6a512cfcc5a2b104f24ebf2d6cda772b (it announces a
  removal "in v0.12.0": a v0.11-era file), ``EngineArgs._set_default_args``:
  ``max_num_batched_tokens`` 8192 and ``max_num_seqs`` ``min(1024, max_num_batched_tokens)``
  (16384 and 1024 for the offline ``LLM`` class; 2048 and 256 on other GPUs); chunked prefill
  on and prefix caching on by default for generative, non-hybrid models.
* ``vllm/config/scheduler.py`` at 1f8758d584e8f599219d75adf658e182ed809a43: the class
  defaults 2048 and 128 are "mainly for convenience when testing"; ``policy = "fcfs"``;
  ``long_prefill_token_threshold = 0`` and ``max_num_partial_prefills = 1`` (no cap on long
  prefills, as here).
* ``vllm/platforms/cuda.py`` at 1c0d9ecf5bad600df3e001bf642dd48c5ed25cc6: an unset
  ``block_size`` becomes 16 on CUDA (non-MLA models). ``max_model_len`` is the model's own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from horizon.kv_cache import KVView
from horizon.policies.base import Policy
from horizon.request import Request

MODES = ("fcfs", "priority")


class VLLM(Policy):
    name = "vllm"

    def __init__(self, mode: str = "fcfs") -> None:
        if mode not in MODES:
            raise ValueError(f"vllm.mode must be one of {', '.join(MODES)}, got {mode!r}")
        self.mode = mode
        self._num_requeued = 0  # fcfs: preempted requests put back at the head so far
        self._preempted = False  # a preemption since the last admission pass
        self._held_step = -1  # the step whose admission pass is held

    def waiting_key(self, req: Request, now: float) -> Any:
        """A preempted request goes ahead of every request in the queue (fcfs mode)."""
        if self.mode == "fcfs" and req.num_preemptions:
            self._num_requeued += 1
            return (0, -self._num_requeued, req.request_id)
        return (1, req.arrival_time, req.request_id)

    def choose_victim(self, running: Sequence[Request], needing: Request, now: float) -> Request:
        self._preempted = True
        if self.mode == "priority":
            return max(running, key=lambda r: (r.arrival_time, r.request_id))
        return max(running, key=lambda r: r.admit_seq)

    def admit(self, req: Request, view: KVView) -> bool:
        if self._preempted:
            self._preempted = False
            self._held_step = view.step
        return view.step != self._held_step

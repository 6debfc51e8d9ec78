"""Rank 0's plans to the other ranks of a tensor-parallel group (``executor.tensor_parallel``).

Only rank 0 runs a ``Scheduler``: online, the plans depend on when requests arrive and on
measured step times, which only one clock may decide. ``PlanBroadcast`` wraps rank 0's
``ModelRunner`` (the engine's backend calls it as it calls the runner): before each step it
broadcasts the step to the group as a ``WireStep`` (the requests in it with their counters as
of the plan, a new request's prompt and sampling parameters once, each block table as what was
appended since the last step it was sent, the requests released since), then runs it. Every
other rank runs ``follow``: it rebuilds each step over ``WireRequest`` stand-ins and runs it on
its own runner (its heads' part of the model and of the KV cache), so every rank's forward
does the same all-reduces in the same order. A rank's tokens are its own: the all-reduced hidden
states and the replicated LM head give every rank the same logits, hence the same greedy or
seeded samples (``tests/test_plan_broadcast.py`` checks the histories agree).

Transport: ``torch.distributed.broadcast_object_list`` over the group given (gloo on the CPU; on
GPUs a gloo group beside the NCCL one, as vLLM sends its scheduler output on a CPU channel).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from executor.runner import ModelRunner
from executor.sampling import SamplingParams
from horizon.plan import StepPlan
from horizon.request import Request


@dataclass(slots=True)
class WireRequest:
    """What a runner reads of a request, as of the plan (a stand-in for ``Request`` on the
    ranks without a scheduler)."""

    request_id: int
    num_prompt_tokens: int
    num_computed_tokens: int = 0
    num_tokens: int = 0
    prompt_token_ids: tuple[int, ...] | None = None
    sampling: SamplingParams | None = None


@dataclass(frozen=True, slots=True)
class WireStep:
    """One ``submit``: ``released`` first (``(request_id, finished)``: released, or dropped
    as aborted), then the plan over ``requests``
    (``(request_id, computed, tokens)``, plus ``(prompt, sampling)`` the first time a request is
    sent), with ``tables`` (``(request_id, start, blocks)``: the table is its first ``start``
    blocks then ``blocks``) and ``kwargs`` for ``ModelRunner.submit``."""

    released: tuple[tuple[int, bool], ...]
    requests: tuple[tuple, ...]
    decodes: tuple[int, ...]
    prefills: tuple[tuple[int, int], ...]
    verifies: tuple[tuple[int, int], ...]
    preempted: tuple[int, ...]
    tables: tuple[tuple[int, int, tuple[int, ...]], ...]
    kwargs: dict


def _broadcast(obj: Any, group, src: int = 0) -> Any:  # noqa: ANN001
    box = [obj]
    dist.broadcast_object_list(box, src=src, group=group)
    return box[0]


class PlanBroadcast:
    """Rank 0's runner: ``ModelRunner``'s interface; ``submit``/``execute``, ``release``,
    ``drop`` and ``reset`` reach every rank (``close`` ends the followers); the rest is the
    wrapped runner's.

    Args:
        runner: rank 0's own runner.
        prompt_of / sampling_of: a request's prompt ids and sampling parameters, as the
            engine resolves them (``Engine.prompt_of``, ``Engine.sampling_of``).
        group: the tensor-parallel group (rank 0 is the source).
        send: how a message reaches the followers (default: ``broadcast_object_list`` over
            ``group``; a test passes a list's ``append``).
    """

    def __init__(
        self,
        runner: ModelRunner,
        prompt_of: Callable[[Request], Sequence[int]],
        sampling_of: Callable[[Request], SamplingParams],
        group=None,  # noqa: ANN001
        send: Callable[[tuple], Any] | None = None,
    ) -> None:
        self.runner = runner
        self._send = send or (lambda message: _broadcast(message, group))
        self._prompt_of, self._sampling_of = prompt_of, sampling_of
        self._known: set[int] = set()  # requests the followers have been sent
        self._sent: dict[int, list[int]] = {}  # request id -> block table as last sent
        self._released: list[tuple[int, bool]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.runner, name)

    def submit(self, plan: StepPlan, blocks_of, *args: Any, **kwargs: Any):  # noqa: ANN001, ANN201
        kwargs.update(zip(("commit", "all_logits", "emit_limits", "stop_ids"), args))
        self._send(("step", self._wire(plan, blocks_of, kwargs)))
        return self.runner.submit(plan, blocks_of, **kwargs)

    def execute(self, plan: StepPlan, blocks_of, *args: Any, **kwargs: Any):  # noqa: ANN001, ANN201
        return self.runner.wait(self.submit(plan, blocks_of, *args, **kwargs))

    def release(self, request: Request) -> list[int]:
        self._forget(request.request_id, True)
        return self.runner.release(request)

    def drop(self, request: Request) -> None:
        self._forget(request.request_id, False)
        self.runner.drop(request)

    def _forget(self, rid: int, finished: bool) -> None:
        if rid in self._known:
            self._known.discard(rid)
            self._sent.pop(rid, None)
            self._released.append((rid, finished))

    def reset(self) -> None:
        self._known.clear()
        self._sent.clear()
        self._released.clear()
        self._send(("reset",))
        self.runner.reset()

    def close(self) -> None:
        """End every follower's ``follow`` (after the releases since the last step)."""
        released, self._released = tuple(self._released), []
        self._send(("end", released))

    def _wire(self, plan: StepPlan, blocks_of, kwargs: dict) -> WireStep:  # noqa: ANN001
        for r in plan.preempted:  # their blocks are freed: the next table is sent whole
            self._sent.pop(r.request_id, None)
        stepped = [*plan.decodes, *(r for r, _ in plan.prefills), *(r for r, _ in plan.verifies)]
        requests, tables = [], []
        for r in stepped:
            rid = r.request_id
            row: tuple = (rid, r.num_computed_tokens, r.num_tokens)
            if rid not in self._known:
                row += (tuple(self._prompt_of(r)), self._sampling_of(r))
                self._known.add(rid)
            requests.append(row)
            sent = self._sent.get(rid, [])
            start, new = _table_delta(sent, blocks_of(r))
            if start < len(sent) or new or rid not in self._sent:
                tables.append((rid, start, new))
                self._sent[rid] = sent[:start] + list(new)
        released, self._released = tuple(self._released), []
        ids = _ids
        return WireStep(
            released, tuple(requests), ids(plan.decodes),
            tuple((r.request_id, n) for r, n in plan.prefills),
            tuple((r.request_id, k) for r, k in plan.verifies),
            ids(plan.preempted), tuple(tables), kwargs,
        )  # fmt: skip


def _ids(requests: Sequence[Request]) -> tuple[int, ...]:
    return tuple(r.request_id for r in requests)


def _table_delta(sent: list[int], table: Sequence[int]) -> tuple[int, tuple[int, ...]]:
    """``(start, new)`` with ``table == sent[:start] + new``: a running request's table only
    grows at its end or loses drafts' blocks there (preemption resets ``sent``); anything else
    is sent whole."""
    n, m = len(sent), len(table)
    if m >= n and (n == 0 or table[n - 1] == sent[n - 1]):
        return n, tuple(table[n:])
    if m < n and (m == 0 or table[m - 1] == sent[m - 1]):
        return m, ()
    return 0, tuple(table)


def follow(
    runner: ModelRunner,
    group=None,  # noqa: ANN001
    recv: Callable[[], tuple] | None = None,
    check: bool = False,
) -> tuple[dict[int, list[int]], int, int]:
    """Run rank 0's steps on this rank's ``runner`` until rank 0's ``close``: the tokens each
    finished request generated here (``release``), the steps run and the preemptions in them.
    ``runner`` must
    resolve a request's prompt and sampling parameters from
    ``WireRequest.prompt_token_ids`` / ``.sampling`` (an ``Engine`` built with
    ``sampling=follower_sampling`` does)."""
    requests: dict[int, WireRequest] = {}
    tables: dict[int, list[int]] = {}
    outputs: dict[int, list[int]] = {}
    steps = preemptions = 0
    recv = recv or (lambda: _broadcast(None, group))
    while True:
        message = recv()
        if message[0] == "reset":
            requests.clear()
            tables.clear()
            runner.reset()
            continue
        released = message[1] if message[0] == "end" else message[1].released
        for rid, finished in released:
            req = requests.pop(rid)
            tables.pop(rid, None)
            if finished:
                outputs[rid] = runner.release(req)
            else:
                runner.drop(req)
        if message[0] == "end":
            return outputs, steps, preemptions
        w = message[1]
        plan = _rebuild(w, requests, tables)
        if check:
            runner.check_against([r for r in requests.values() if r.request_id in tables],
                                 _blocks_in(tables))  # fmt: skip
        runner.execute(plan, _blocks_in(tables), **w.kwargs)
        steps += 1
        preemptions += len(w.preempted)


def _blocks_in(tables: dict[int, list[int]]) -> Callable[[WireRequest], list[int]]:
    return lambda r: tables[r.request_id]


def follower_sampling(request: WireRequest) -> SamplingParams:
    """A follower's ``Engine(sampling=...)``: the parameters rank 0 resolved and sent."""
    assert request.sampling is not None, f"request {request.request_id} came without sampling"
    return request.sampling


def _rebuild(
    w: WireStep, requests: dict[int, WireRequest], tables: dict[int, list[int]]
) -> StepPlan:
    """Apply ``w``'s counters and table deltas; the step's plan over the stand-ins."""
    for row in w.requests:
        rid, computed, tokens = row[:3]
        req = requests.get(rid)
        if req is None:
            prompt, sampling = row[3:]
            req = requests[rid] = WireRequest(rid, len(prompt), prompt_token_ids=prompt,
                                              sampling=sampling)  # fmt: skip
        req.num_computed_tokens, req.num_tokens = computed, tokens
    for rid in w.preempted:
        tables.pop(rid, None)
    for rid, start, new in w.tables:
        tables[rid] = tables.get(rid, [])[:start] + list(new)
    get = requests.__getitem__
    return StepPlan(
        0, 0.0, tuple(map(get, w.decodes)), tuple((get(i), n) for i, n in w.prefills),
        preempted=tuple(map(get, w.preempted)),
        verifies=tuple((get(i), k) for i, k in w.verifies),
    )  # fmt: skip

"""Collects what happens to each request during a run; ``build()`` turns it into RunRecords.

The recorder stores *runs* of tokens rather than every token: while a request decodes it emits
one token per step, so a run ``(first_step, count)`` says it emitted at steps
``first_step .. first_step + count - 1``. Token times are derived from the step clock at
``build()``. The event-driven scheduler opens and closes runs; the reference scheduler emits
token by token (``emit``), which extends the same runs — so both give identical records.
A speculating request whose acceptance was drawn ahead (``horizon.draft_track``) emits several
tokens at some steps; its track's tokens are kept as one entry (``_Drawn``: the track's first
step, steps and cumulative tokens), expanded at ``build``.
"""

from __future__ import annotations

import math
from itertools import chain
from operator import attrgetter

import numpy as np

from horizon.metrics.records import (
    STATUS_FINISHED,
    STATUS_HANDED_OFF,
    STATUS_REJECTED,
    STATUS_UNFINISHED,
    RunRecords,
)
from horizon.request import Request


class _Rec:
    __slots__ = (
        "req",
        "status",
        "reason",
        "admit_time",
        "computed",
        "recomputed",
        "high_water",
        "cached",
        "runs",
        "preempted",
    )

    def __init__(self, req: Request) -> None:
        self.req = req
        self.status = STATUS_UNFINISHED
        self.reason = ""
        self.admit_time = math.nan
        self.computed = 0
        self.recomputed = 0
        self.high_water = 0  # most tokens ever computed: recompute below this is waste
        self.cached = 0
        self.runs: list[list[int]] = []
        self.preempted = -1  # handed off: its preemptions here (the request goes on counting)


class _Drawn:
    """Tokens of a drawn track: ``cum[j + 1] - cum[j]`` at step ``t0 + j``, ``j < m``."""

    __slots__ = ("t0", "m", "cum")

    def __init__(self, t0: int, m: int, cum: list[int]) -> None:
        self.t0, self.m, self.cum = t0, m, cum

    def steps(self) -> list[int]:
        """The step of each token, in order."""
        cum = self.cum
        return [self.t0 + j for j in range(self.m) for _ in range(cum[j + 1] - cum[j])]


class Recorder:
    """One run's records. Every method is O(1) except ``build``."""

    def __init__(self, num_kv_blocks: int, block_size: int) -> None:
        self.num_kv_blocks = num_kv_blocks
        self.block_size = block_size
        self._recs: dict[int, _Rec] = {}
        self._steps: list[tuple] = []
        self._drawn = False  # some request's runs hold a drawn track's tokens (``_Drawn``)

    def arrive(self, req: Request) -> None:
        if req.request_id in self._recs:
            raise ValueError(f"duplicate request_id {req.request_id}")
        self._recs[req.request_id] = _Rec(req)

    def reject(self, req: Request, reason: str) -> None:
        r = self._recs[req.request_id]
        r.status, r.reason = STATUS_REJECTED, reason

    def admit(self, req: Request, now: float, cached_tokens: int) -> None:
        """Admission at ``now`` with ``cached_tokens`` adopted from the prefix cache."""
        r = self._recs[req.request_id]
        if math.isnan(r.admit_time):
            r.admit_time = now
        r.cached += cached_tokens
        r.high_water = max(r.high_water, cached_tokens)

    def admit_import(self, req: Request, now: float) -> None:
        """Admission at ``now`` of a request whose KV was transferred here (disaggregation):
        its transferred tokens were computed elsewhere, so recomputing them here is waste."""
        r = self._recs[req.request_id]
        if math.isnan(r.admit_time):
            r.admit_time = now
        r.high_water = max(r.high_water, req.num_computed_tokens)

    def hand_off(self, req: Request) -> None:
        """Prefilled here, handed to a decode replica."""
        r = self._recs[req.request_id]
        r.status = STATUS_HANDED_OFF
        r.preempted = req.num_preemptions

    def compute(self, req: Request, start: int, n: int) -> None:
        """``n`` tokens computed from position ``start`` (a prefill chunk)."""
        r = self._recs[req.request_id]
        r.computed += n
        end = start + n
        if start < r.high_water:
            r.recomputed += min(end, r.high_water) - start
        if end > r.high_water:
            r.high_water = end

    def emit(self, req: Request, step: int) -> None:
        """One token emitted at ``step`` (reference mode, and every run's first token)."""
        runs = self._recs[req.request_id].runs
        if runs and runs[-1][0] + runs[-1][1] == step:
            runs[-1][1] += 1
        else:
            runs.append([step, 1])

    def close_run(self, req: Request, last_step: int) -> None:
        """The request emitted at every step through ``last_step`` since its run opened; each
        step after the first also computed one decode token."""
        r = self._recs[req.request_id]
        run = r.runs[-1]
        extra = last_step - (run[0] + run[1] - 1)
        assert extra >= 0
        run[1] += extra
        r.computed += extra
        r.high_water = max(r.high_water, req.num_computed_tokens)

    def decode(self, req: Request, step: int) -> None:
        """Reference mode: one decode token computed and emitted at ``step``."""
        r = self._recs[req.request_id]
        r.computed += 1
        r.high_water = max(r.high_water, req.num_computed_tokens)
        self.emit(req, step)

    def emit_steps(self, req: Request, first_step: int, cum: list[int], m: int) -> None:
        """``cum[j + 1] - cum[j]`` (>= 1) tokens computed and emitted at step ``first_step + j``
        for ``j < m`` (``cum[0] == 0``): the records ``decode`` one token at a time would make
        (a drawn track's, written when it ends; ``req``'s counters are those after them). O(1):
        ``cum`` is kept, unchanged from here on, and expanded at ``build``."""
        r = self._recs[req.request_id]
        r.runs.append(_Drawn(first_step, m, cum))  # type: ignore[arg-type]
        r.runs.append([first_step + m, 0])  # the run a later token opens or extends
        r.computed += cum[m]
        r.high_water = max(r.high_water, req.num_computed_tokens)
        self._drawn = True

    def finish(self, req: Request) -> None:
        self._recs[req.request_id].status = STATUS_FINISHED

    @property
    def last_preempted(self) -> int:
        """Requests the latest recorded step's plan preempted (0 before any step)."""
        return self._steps[-1][13] if self._steps else 0

    def step(
        self,
        start: float,
        end: float,
        prefill: int,
        decode: int,
        running: int,
        waiting: int,
        kv_used: int,
        budget: int,
        num_prefills: int = -1,
        decode_context: int = -1,
        prefill_context: int = -1,
        attention_pairs: int = -1,
        refreshed: int = -1,
        preempted: int = -1,
    ) -> None:
        """One step; the last six are the rest of its plan (-1: not known)."""
        self._steps.append(
            (
                start,
                end,
                prefill,
                decode,
                running,
                waiting,
                kv_used,
                budget,
                num_prefills,
                decode_context,
                prefill_context,
                attention_pairs,
                refreshed,
                preempted,
            )
        )

    def set_step_end(self, step: int, end: float) -> None:
        """Set recorded step ``step``'s end (an engine that reads a step's tokens after the
        scheduler moved on records the step first and its end once known). Token times follow,
        as they come from the step clock at ``build``."""
        if not 0 <= step < len(self._steps):
            raise IndexError(f"step {step} not recorded ({len(self._steps)} steps)")
        row = self._steps[step]
        if not row[0] <= end:
            raise ValueError(f"step {step}: end {end} before its start {row[0]}")
        self._steps[step] = (row[0], end, *row[2:])

    def recent_step_time(self, k: int = 8) -> float:
        """Mean own duration of the last ``k`` recorded steps (each from the later of its start
        and the previous step's end, to its end; 0 before any step). O(k)."""
        rows = self._steps[-(k + 1) :]
        if not rows:
            return 0.0
        if len(rows) == 1:
            return max(0.0, rows[0][1] - rows[0][0])
        own = [b[1] - max(b[0], a[1]) for a, b in zip(rows, rows[1:])]
        return max(0.0, sum(own) / len(own))

    @property
    def num_steps(self) -> int:
        """Steps recorded so far."""
        return len(self._steps)

    def slo_met(self, req: Request, ttft: float, itl: float) -> bool:
        """Whether ``req``'s first token came within ``ttft`` of its arrival and every gap
        between its tokens within ``itl``, over the step ends recorded so far (call it when
        the request has finished here: its last step is recorded). A request with no token
        here missed. O(its tokens)."""
        runs, steps = self._recs[req.request_id].runs, self._steps
        if not runs:
            return False
        first = runs[0]
        prev = steps[first.t0 if first.__class__ is _Drawn else first[0]][1]
        if prev - req.arrival_time > ttft:
            return False
        for run in runs:
            ks = run.steps() if run.__class__ is _Drawn else range(run[0], run[0] + run[1])
            for k in ks:
                end = steps[k][1]
                if end - prev > itl:
                    return False
                prev = end
        return True

    # -- output --------------------------------------------------------------------------------
    def build(self) -> RunRecords:
        recs = sorted(self._recs.values(), key=_by_request_id)
        # a flat pass (np.fromiter) over the step rows: np.array on a list of tuples costs
        # several times more for the same float64 values
        flat = chain.from_iterable(self._steps)
        steps = np.fromiter(flat, np.float64, 14 * len(self._steps)).reshape(-1, 14)
        step_end = steps[:, 1].copy()
        idx, counts_a = _token_steps(recs, self._drawn)
        token_times = step_end[idx] if len(idx) else np.zeros(0)
        # tokens per request: the sum of its runs' counts (a difference of the running total)
        ends = np.cumsum(np.fromiter(map(len, map(_runs, recs)), np.int64, len(recs)))
        total = np.concatenate(([0], np.cumsum(counts_a)))
        per_req = total[ends] - total[np.concatenate(([0], ends[:-1]))]
        cols = _request_columns(recs)
        i64 = np.int64
        return RunRecords(
            request_id=cols[0].astype(i64),
            arrival_time=cols[1],
            num_prompt_tokens=cols[2].astype(i64),
            true_output_tokens=cols[3].astype(i64),
            max_output_tokens=cols[4].astype(i64),
            num_output_tokens=per_req,
            status=cols[5].astype(np.int8),
            reject_reason=[r.reason for r in recs],
            ttft_slo=cols[6],
            itl_slo=cols[7],
            first_admit_time=cols[8],
            num_preemptions=cols[9].astype(i64),
            computed_tokens=cols[10].astype(i64),
            recomputed_tokens=cols[11].astype(i64),
            cached_tokens=cols[12].astype(i64),
            token_times=token_times,
            token_offsets=np.concatenate(([0], np.cumsum(per_req))).astype(i64),
            step_start=steps[:, 0].copy(),
            step_end=step_end,
            prefill_tokens=steps[:, 2].astype(i64),
            decode_tokens=steps[:, 3].astype(i64),
            num_running=steps[:, 4].astype(i64),
            num_waiting=steps[:, 5].astype(i64),
            kv_used_blocks=steps[:, 6].astype(i64),
            token_budget=steps[:, 7].astype(i64),
            num_prefills=steps[:, 8].astype(i64),
            decode_context_tokens=steps[:, 9].astype(i64),
            prefill_context_tokens=steps[:, 10].astype(i64),
            prefill_attention_pairs=steps[:, 11].astype(i64),
            num_refreshed=steps[:, 12].astype(i64),
            num_preempted=steps[:, 13].astype(i64),
            num_kv_blocks=self.num_kv_blocks,
            block_size=self.block_size,
        )


_by_request_id = attrgetter("req.request_id")
_runs = attrgetter("runs")


def _token_steps(recs: list[_Rec], drawn: bool) -> tuple[np.ndarray, np.ndarray]:
    """The step of every token, in request order, and every run's token count."""
    # every run's (start, count), flat in request order
    if drawn:
        runs, tracks = _flat_runs(recs)
    else:
        runs = np.fromiter(chain.from_iterable(chain.from_iterable(r.runs for r in recs)), np.int64)
    starts_a, counts_a = runs[0::2].copy(), runs[1::2].copy()
    # token k of a run starting at s is at step s + k: a vectorised arange per run
    first = np.repeat(starts_a - np.concatenate(([0], np.cumsum(counts_a)[:-1])), counts_a)
    idx = first + np.arange(int(counts_a.sum()), dtype=np.int64)
    if drawn:
        _drawn_steps(idx, starts_a, counts_a, tracks)
    return idx, counts_a


def _flat_runs(recs: list[_Rec]) -> tuple[np.ndarray, list[_Drawn]]:
    """Every run's (start, count) flat, a drawn track's as (-1, its tokens); and the tracks."""
    flat: list[int] = []
    drawn: list[_Drawn] = []
    add = flat.extend
    for rec in recs:
        for run in rec.runs:
            if run.__class__ is _Drawn:
                add((-1, run.cum[run.m]))  # type: ignore[attr-defined]
                drawn.append(run)  # type: ignore[arg-type]
            else:
                add(run)
    return np.array(flat, dtype=np.int64), drawn


def _drawn_steps(idx: np.ndarray, starts: np.ndarray, counts: np.ndarray, drawn: list[_Drawn]):  # noqa: ANN202
    """Write the drawn tracks' tokens' steps into ``idx`` (their runs start at -1)."""
    if not drawn:
        return
    m = np.fromiter((d.m for d in drawn), np.int64, len(drawn))
    t0 = np.fromiter((d.t0 for d in drawn), np.int64, len(drawn))
    cum = np.fromiter(chain.from_iterable(d.cum[: d.m + 1] for d in drawn), np.int64)
    per_step = np.diff(cum)
    keep = np.ones(len(per_step), dtype=bool)
    keep[(np.cumsum(m + 1) - 1)[:-1]] = False  # the differences across two tracks
    per_step = per_step[keep]
    # step j of track p is t0[p] + j: a vectorised arange per track
    steps = np.repeat(t0 - np.concatenate(([0], np.cumsum(m)[:-1])), m) + np.arange(int(m.sum()))
    idx[np.repeat(starts < 0, counts)] = np.repeat(steps, per_step)


def _request_columns(recs: list[_Rec]) -> np.ndarray:
    """The per-request columns of ``build`` as rows of one float64 array (every integer here
    is far below 2**53, so the casts back are exact), in one pass over the requests."""
    nan = math.nan
    rows = (
        (
            q.request_id,
            q.arrival_time,
            q.num_prompt_tokens,
            q.true_output_tokens,
            q.max_output_tokens,
            r.status,
            nan if q.slo is None else q.slo.ttft,
            nan if q.slo is None else q.slo.itl,
            r.admit_time,
            q.num_preemptions if r.preempted < 0 else r.preempted,
            r.computed,
            r.recomputed,
            r.cached,
        )
        for r in recs
        for q in (r.req,)
    )
    flat = np.fromiter(chain.from_iterable(rows), np.float64, 13 * len(recs))
    return flat.reshape(-1, 13).T

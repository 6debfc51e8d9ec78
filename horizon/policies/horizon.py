"""Horizon: admit, order and evict for goodput using online output-length predictions.

Serving under KV pressure is a memory-management problem; once blocks are managed, what decides
goodput is which requests hold them. FCFS admits whatever fits *now* and preempts when decodes
grow: each preemption throws away KV that must be recomputed and leaves an inter-token gap that
can break the request's ITL target. Memory-first reserves every request's worst case and idles
most of the pool. Horizon projects the pool's *expected* future from predicted lengths:

* **Admission** (``admit``): running request ``i`` holds ``n_i`` tokens, grows one token per step
  and frees its blocks when done; its predicted remaining length ``R_i`` (from the predictor,
  conditioned on the tokens it has generated) gives the expected pool use ``tau`` steps ahead,
  ``U(tau) = sum_i (n_i + tau) * P(R_i > tau)``. A waiting request starts only if the peak over
  ``tau`` of ``U`` plus its own expected use stays within ``1 - headroom`` of the pool: admitting
  it should not push the pool into preemption. With exact predictions this never preempts; with
  a spread-out prediction it uses the whole distribution, not a pessimistic quantile, since the
  sum over many requests concentrates around its mean (``headroom`` absorbs the rest).
* **Order** (``waiting_key``, re-keyed at every refresh), in tiers: (0) requests that must not
  wait longer: preempted ones (they hold progress) and any that waited ``max_wait_s`` (the
  starvation bound), oldest first; (1) requests that can still meet their TTFT target, earliest
  deadline first; (2) those triage set aside (below), earliest deadline first: they can still
  be good if capacity frees up before their deadline; (3) requests whose TTFT target has passed,
  oldest first. Serving tier 3 before tiers 1-2 cannot raise goodput; serving those can.
* **Triage** (``rank_waiting``, at each refresh, ``triage=True``): earliest deadline first starts
  every request of an overload just late (each waits behind all older ones). Which requests can
  still start in time is estimated from the same curve: the pool's free token-steps ahead,
  ``A(tau) = sum over tau' < tau of (limit - U(tau'))``, absorb the waiting requests' expected
  token-steps (``sum_tau`` of each one's expected use) in deadline order, and steps are turned
  into seconds by the recent step time. Where a request would start after its deadline, the
  largest request in the deadline-ordered prefix moves to tier 2 (Moore-Hodgson's rule, which
  maximises the number of jobs on time on one machine). Under load nothing is moved and the
  order is earliest deadline first; in an overload the fewest, largest requests give way. The
  starvation bound (tier 0) still holds for them.
* **Refresh** (every ``refresh_every`` steps): running requests' predictions are recomputed
  from the tokens generated so far (``predictor.update``) and ``U`` is rebuilt.
* **Eviction** (``choose_victim``): when a block cannot be had anyway, evict first a running
  request that can no longer meet its SLO, whose preemption costs no goodput: one admitted
  after its TTFT deadline, or one already preempted after its first token (its inter-token gap
  is broken); among those, and otherwise, the one with the most predicted remaining work per
  token already computed (least lost, most freed).

The predictor is injected (built in predictors/); this module reads only the
``LengthPredictor`` protocol, so the core stays free of scikit-learn.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

from horizon.kv_cache import KVView
from horizon.policies.base import Policy
from horizon.policies.expected_use import expected_use
from horizon.prediction import LengthDistribution, LengthPredictor
from horizon.request import Request, RequestStatus


class HorizonPolicy(Policy):
    name = "horizon"
    dynamic_order = True

    def __init__(
        self,
        predictor: LengthPredictor,
        headroom: float = 0.05,
        refresh_every: int = 16,
        max_wait_s: float = 60.0,
        ttft_slo: float | None = None,
        horizon_steps: int = 4096,
        grid_step: int = 1,
        triage: bool = True,
    ) -> None:
        if not 0 <= headroom < 1:
            raise ValueError(f"horizon.headroom must be in [0, 1), got {headroom!r}")
        if not (isinstance(refresh_every, int) and refresh_every >= 1):
            raise ValueError(f"horizon.refresh_every must be an int >= 1, got {refresh_every!r}")
        if not (math.isfinite(max_wait_s) and max_wait_s > 0):
            raise ValueError(f"horizon.max_wait_s must be finite and > 0, got {max_wait_s!r}")
        if ttft_slo is not None and not (math.isfinite(ttft_slo) and ttft_slo > 0):
            raise ValueError(f"horizon.ttft_slo must be finite and > 0, got {ttft_slo!r}")
        if not (isinstance(grid_step, int) and 1 <= grid_step <= horizon_steps):
            raise ValueError(
                f"horizon.grid_step must be an int in 1..horizon_steps, got {grid_step!r}"
            )
        if not isinstance(triage, bool):
            raise ValueError(f"horizon.triage must be true or false, got {triage!r}")
        self.predictor = predictor
        self.triage = triage
        self.headroom = headroom
        self.refresh_every = refresh_every
        self.max_wait_s = max_wait_s
        self.ttft_slo = ttft_slo
        self.reads_true_length = predictor.reads_true_length
        self._tau = np.arange(0, horizon_steps + 1, grid_step, dtype=np.float64)
        self._grid = grid_step
        self._use = np.zeros_like(self._tau)  # expected tokens held, running requests, by tau
        self._use_step = 0  # the step at which tau = 0 for _use
        self._dist: dict[int, LengthDistribution] = {}  # request id -> latest prediction
        self._waiting_curve: tuple[int, int, np.ndarray] | None = None  # (id, tokens, curve)
        self.num_refreshes = 0
        self._last_refresh: tuple[int, float] | None = None  # (step, time) of the last refresh
        # seconds per step between recent refreshes
        self._step_times: deque[float] = deque(maxlen=self._STEP_TIME_WINDOW)
        self._footprint: dict[int, tuple[int, float]] = {}  # waiting id -> (tokens, token-steps)
        self.num_triaged = 0  # requests moved to tier 2 by triage, summed over refreshes
        # requests that can no longer meet their SLO (late first token, or a broken gap)
        self._lost: dict[int, Request] = {}

    # -- predictions ---------------------------------------------------------------------------
    def _curve(self, r: Request) -> np.ndarray:
        """Expected tokens ``r`` holds ``tau`` steps ahead (with half a block of rounding)."""
        dist = self.predictor.update(r, r.num_output_tokens)
        xs, fs = dist.knots()
        self._dist[r.request_id] = dist
        # P(remaining > tau) is 0 past the support's end: compute the curve up to there only
        # (the values are the same as over the whole grid; most requests end far before it)
        tau = self._tau
        n = min(len(tau), int(np.searchsorted(tau, xs[-1], side="right")))
        out = np.zeros(len(tau))
        head = tau[:n]
        alive = 1.0 - np.interp(head, xs, fs)
        out[:n] = (r.num_tokens + head + self._half_block) * alive
        return out

    _half_block = 8.0

    def refresh(self, view: KVView, now: float) -> None:
        self.num_refreshes += 1
        self._half_block = view.block_size / 2
        self._waiting_curve = None
        running = view.running
        dists = [self.predictor.update(r, r.num_output_tokens) for r in running]
        # rebuilt for the running requests (others are recomputed on demand)
        self._dist = {r.request_id: d for r, d in zip(running, dists)}
        self._use = expected_use(
            self._tau, dists, [r.num_tokens for r in running], self._half_block
        )
        self._use_step = view.step
        self._observe_step_time(view.step, now)
        self._lost = {i: r for i, r in self._lost.items() if r.status is not RequestStatus.FINISHED}

    _STEP_TIME_WINDOW = 8

    def _observe_step_time(self, step: int, now: float) -> None:
        """Seconds per step between this refresh and the last; the median of the recent ones
        is the step time (robust to an idle gap between two refreshes)."""
        last = self._last_refresh
        self._last_refresh = (step, now)
        if last is None or step <= last[0] or now <= last[1]:
            return
        self._step_times.append((now - last[1]) / (step - last[0]))

    def check_integrity(self) -> None:
        """The expected-use curve is finite and non-negative, the step times positive, the
        footprint cache non-negative."""
        assert self._use.shape == self._tau.shape and np.all(np.isfinite(self._use))
        assert float(self._use.min(initial=0.0)) >= -1e-6, "expected pool use below 0"
        assert all(t > 0 for t in self._step_times)
        assert all(f >= 0 for _, f in self._footprint.values())
        assert all(i == r.request_id for i, r in self._lost.items())

    def step_time(self) -> float | None:
        """The recent seconds per step (None before two refreshes)."""
        return float(np.median(self._step_times)) if self._step_times else None

    def _shift(self, step: int) -> int:
        """Grid points from ``_use``'s origin to ``step``, rounded up: reading the curve a
        little later than now over-counts growth rather than missing it."""
        return -(-(step - self._use_step) // self._grid)

    def _aligned_use(self, shift: int) -> np.ndarray:
        """``_use`` seen ``shift`` grid points later (the tail holds its last value)."""
        if shift <= 0:
            return self._use
        n = len(self._use)
        out = np.full(n, self._use[-1])
        if shift < n:
            out[: n - shift] = self._use[shift:]
        return out

    def _ttft(self, r: Request) -> float:
        if self.ttft_slo is not None:
            return self.ttft_slo
        return r.slo.ttft if r.slo is not None else math.inf

    def _now(self, step: int) -> float | None:
        """The clock at ``step``, from the last refresh and the recent step time (None before a
        refresh): admission sees the step, not the time."""
        if self._last_refresh is None:
            return None
        at_step, at = self._last_refresh
        return at + max(step - at_step, 0) * (self.step_time() or 0.0)

    def _remaining(self, r: Request) -> float:
        """Expected remaining tokens at the latest prediction (its mean, computed on demand:
        only eviction reads it)."""
        dist = self._dist.get(r.request_id)
        if dist is None:
            dist = self._dist[r.request_id] = self.predictor.update(r, r.num_output_tokens)
        return dist.mean

    # -- the decisions -------------------------------------------------------------------------
    def waiting_key(self, req: Request, now: float) -> Any:
        waited = now - req.arrival_time
        if req.num_output_tokens or waited >= self.max_wait_s:
            return (0, req.arrival_time, req.request_id)
        ttft = self._ttft(req)
        if waited < ttft:
            return (1, req.arrival_time + ttft, req.request_id)
        return (3, req.arrival_time, req.request_id)

    def rank_waiting(self, waiting: Sequence[Request], view: KVView, now: float) -> list[Any]:
        keys = [self.waiting_key(r, now) for r in waiting]
        step_s = self.step_time()
        if not self.triage or step_s is None or len(waiting) < 2:
            return keys
        footprint = self._footprints(waiting)
        limit = (1.0 - self.headroom) * view.num_blocks * view.block_size
        free = np.maximum(limit - self._aligned_use(self._shift(view.step)), 0.0) * self._grid
        absorbed = np.cumsum(free)  # token-steps free before the end of each grid step
        tail_rate = max(float(free[-1]) / self._grid, 1.0)  # tokens per step past the grid

        def start_step(tokens_ahead: float) -> float:
            i = int(np.searchsorted(absorbed, tokens_ahead, side="left"))
            if i < len(absorbed):
                return float(self._tau[i])
            return float(self._tau[-1]) + (tokens_ahead - float(absorbed[-1])) / tail_rate

        ahead = sum(footprint[i] for i, k in enumerate(keys) if k[0] == 0)
        kept: list[tuple[float, int]] = []  # max-heap of footprints (negated)
        for i in sorted((i for i, k in enumerate(keys) if k[0] == 1), key=lambda i: keys[i]):
            deadline_steps = (keys[i][1] - now) / step_s - 1.0
            late = start_step(ahead) > deadline_steps
            ahead += footprint[i]
            heapq.heappush(kept, (-footprint[i], i))
            if late:
                neg, j = heapq.heappop(kept)
                ahead += neg
                r = waiting[j]
                keys[j] = (2, keys[j][1], r.request_id)  # set aside, still by deadline
                self.num_triaged += 1
        return keys

    def _footprints(self, waiting: Sequence[Request]) -> list[float]:
        """Each waiting request's expected token-steps held (the sum of its use curve), cached
        while its token count is unchanged."""
        cache = self._footprint
        fresh: dict[int, tuple[int, float]] = {}
        out = []
        for r in waiting:
            hit = cache.get(r.request_id)
            if hit is None or hit[0] != r.num_tokens:
                hit = (r.num_tokens, float(self._curve(r).sum()) * self._grid)
            fresh[r.request_id] = hit
            out.append(hit[1])
        self._footprint = fresh
        return out

    def admit(self, req: Request, view: KVView) -> bool:
        self._half_block = view.block_size / 2
        # the head of the queue is asked again every step until it fits: reuse its curve
        cached = self._waiting_curve
        if cached is not None and cached[0] == req.request_id and cached[1] == req.num_tokens:
            curve = cached[2]
        else:
            curve = self._curve(req)
            self._waiting_curve = (req.request_id, req.num_tokens, curve)
        limit = (1.0 - self.headroom) * view.num_blocks * view.block_size
        # an empty pool admits anyway: the scheduler already rejected what can never fit, and
        # refusing here would stall the engine
        shift = self._shift(view.step)
        if view.num_running and float(np.max(self._aligned_use(shift) + curve)) > limit:
            return False
        now = self._now(view.step)
        if (
            req.num_output_tokens == 0
            and now is not None
            and now - req.arrival_time > self._ttft(req)
        ):
            self._lost[req.request_id] = req  # its first token comes too late
        # counted until the next refresh rebuilds the sum, aligned to _use's origin
        if shift <= 0:
            self._use += curve
        elif shift < len(curve):
            self._use[shift:] += curve[: len(curve) - shift]
        return True

    def choose_victim(self, running: Sequence[Request], needing: Request, now: float) -> Request:
        lost = self._lost

        def cost(r: Request) -> tuple[bool, float, int]:
            return (
                r.request_id in lost,
                self._remaining(r) / (r.num_computed_tokens + 1),
                r.admit_seq,
            )

        victim = max(running, key=cost)
        if victim.num_output_tokens:  # its next token comes after a recompute: the gap is broken
            lost[victim.request_id] = victim
        return victim

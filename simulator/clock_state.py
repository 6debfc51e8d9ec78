"""A step's time on a GPU whose clock drops under its power cap: a cost model times a slowdown
read from the share of the recent busy time spent in compute-bound steps.

``executor.duty_cycle`` measured it (``results/duty_cycle/``): on an H200 the 7B's 2,048-token
steps back to back hold the GPU at its 700 W cap, the SM clock falls from 1,980 to 1,605 MHz
and such a step takes 9.9% longer than one after 128 decode steps; a decode step right after
one takes 7.5% longer. The 0.5B never reaches the cap and its clock never moves. A
``ClockTable`` is that measurement as a curve: for each gap of the duty cycle, the share of a
round's time spent in its full step (``hot share``) and the full and decode steps' slowdown
over the most isolated gap's. A gap whose full steps ran at the maximum clock measured has no
slowdown (the cause modelled is the clock; a time that moves at full clock is noise), and each
column is made non-decreasing in the share (a running maximum). No coefficient is fitted.

``ClockStateCost`` prices a step as ``base(plan) * (1 + slowdown(share))``, where ``share`` is
the part of the last ``window_s`` busy seconds (the steps it priced, idle time left out; before
the first step the GPU counts as cold) spent in steps of >= ``hot_tokens`` tokens, and the
slowdown is the table's mixed column for steps with prefill chunks, its decode column for
decode-only steps. ``heat`` is the same share computed over a run's measured steps; ``fit``
divides every measured step by its slowdown (and the profiler grid's back-to-back steps by the
slowdown at share 1) before fitting the physical model, so that the base prices a cold GPU.
"""

from __future__ import annotations

import json
from bisect import bisect_right
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from horizon.plan import StepPlan
from simulator.physical_cost_model import PhysicalCostModel

HOT_TOKENS = 1024  # a step of this many tokens (prefill + decode) or more is compute-bound
WINDOW_S = 0.2  # busy seconds the share looks back over (the duty cycle: 8-32 decode steps)


@dataclass(frozen=True)
class ClockTable:
    """Slowdown (fraction, >= 0) at each hot share, for mixed and decode-only steps.

    ``shares`` ascending in [0, 1]; ``mixed`` and ``decode`` non-decreasing, one per share;
    between shares the slowdown is interpolated, beyond them held."""

    shares: tuple[float, ...]
    mixed: tuple[float, ...]
    decode: tuple[float, ...]
    window_s: float = WINDOW_S
    hot_tokens: int = HOT_TOKENS
    source: str | None = None

    def __post_init__(self) -> None:
        n = len(self.shares)
        if n == 0 or len(self.mixed) != n or len(self.decode) != n:
            raise ValueError("ClockTable.shares, mixed and decode need one value each per share")
        s = np.array(self.shares)
        if np.any(np.diff(s) < 0) or s.min() < 0 or s.max() > 1:
            raise ValueError("ClockTable.shares must ascend within [0, 1]")
        for name in ("mixed", "decode"):
            v = np.array(getattr(self, name))
            if v.min() < 0 or np.any(np.diff(v) < 0):
                raise ValueError(f"ClockTable.{name} must be >= 0 and non-decreasing")
        if not self.window_s > 0 or not self.hot_tokens >= 1:
            raise ValueError("ClockTable.window_s must be > 0 and hot_tokens >= 1")

    @classmethod
    def from_duty_cycle(cls, path: str | Path) -> ClockTable:
        """The curve of an ``executor.duty_cycle`` result file (rows per gap: ``full_ms``,
        ``decode_ms``, ``full_sm_mhz``). Raises ValueError for a file without those rows."""
        rows = json.loads(Path(path).read_text()).get("rows") or []
        rows = [r for r in rows if r.get("full_ms")]
        if len(rows) < 2 or any(r.get("full_sm_mhz") is None for r in rows):
            raise ValueError(f"{path}: needs >= 2 duty-cycle rows with full_ms and full_sm_mhz")
        rows = sorted(rows, key=lambda r: r["gap"])
        cold = rows[-1]  # the most isolated full steps
        top = max(r["full_sm_mhz"] for r in rows)
        dec = [r for r in rows if r.get("decode_ms")]
        cold_dec = dec[-1]["decode_ms"] if dec else None
        pts = []
        for r in rows:
            round_s = r["full_ms"] + r["gap"] * (r.get("decode_ms") or 0.0)
            share = r["full_ms"] / round_s
            throttled = r["full_sm_mhz"] < top
            m = r["full_ms"] / cold["full_ms"] - 1 if throttled else 0.0
            d_ms = r.get("decode_ms") or (dec[0]["decode_ms"] if dec else None)
            d = d_ms / cold_dec - 1 if throttled and cold_dec else 0.0
            pts.append((share, max(m, 0.0), max(d, 0.0)))
        pts.sort()
        shares = tuple(float(p[0]) for p in pts)
        mixed = tuple(float(v) for v in np.maximum.accumulate([p[1] for p in pts]))
        decode = tuple(float(v) for v in np.maximum.accumulate([p[2] for p in pts]))
        return cls(shares, mixed, decode, source=str(path))

    def slowdown(self, share: np.ndarray | float, mixed: np.ndarray | bool) -> np.ndarray:
        """The fraction a step at ``share`` takes longer (mixed or decode-only column)."""
        m = np.interp(share, self.shares, self.mixed)
        d = np.interp(share, self.shares, self.decode)
        return np.where(mixed, m, d)

    def deflate(self, rows: np.ndarray) -> np.ndarray:
        """One run's ``STEP_COLUMNS`` rows (in the order measured; steps without a token
        dropped) with each duration divided by its slowdown (``heat``): a cold GPU's times."""
        rows = rows[(rows[:, 0] + rows[:, 1]) > 0].copy()
        rows[:, -1] /= 1.0 + self.slowdown(heat(rows, self), rows[:, 0] > 0)
        return rows

    def deflate_grid(self, grid: np.ndarray) -> np.ndarray:
        """The profiler grid's back-to-back steps divided by the slowdown at share 1."""
        grid = grid.copy()
        grid[:, -1] /= 1.0 + self.slowdown(1.0, grid[:, 0] > 0)
        return grid

    @property
    def is_flat(self) -> bool:
        """No slowdown at any share (a GPU that never throttled)."""
        return max(self.mixed) == 0 and max(self.decode) == 0


def heat(rows: np.ndarray, table: ClockTable) -> np.ndarray:
    """The hot share before each of one run's measured steps (``STEP_COLUMNS`` rows in the
    order measured, steps with a token only): the part of the previous ``window_s`` busy
    seconds (measured durations) spent in steps of >= ``hot_tokens`` tokens."""
    t = rows[:, -1]
    hot = (rows[:, 0] + rows[:, 1]) >= table.hot_tokens
    ends = np.concatenate([[0.0], np.cumsum(t)])
    hots = np.concatenate([[0.0], np.cumsum(t * hot)])
    start = ends[:-1]
    before = np.interp(start - table.window_s, ends, hots, left=0.0)
    return (hots[:-1] - before) / table.window_s


def _interp(x: float, xs: tuple[float, ...], ys: tuple[float, ...]) -> float:
    """``np.interp(x, xs, ys)`` for one float (held beyond the ends), without numpy's
    per-call cost."""
    i = bisect_right(xs, x)
    if i == 0:
        return ys[0]
    if i == len(xs):
        return ys[-1]
    x0, x1 = xs[i - 1], xs[i]  # x0 <= x < x1
    return ys[i - 1] + (ys[i] - ys[i - 1]) * (x - x0) / (x1 - x0)


class ClockStateCost:
    """``base.step_time(plan) * (1 + table.slowdown(share))`` with ``share`` over the steps
    this object priced (``ClockTable``). Stateful: one per simulated run; ``scaled`` and
    ``with_noise`` return fresh ones. ``predict_rows`` is pure: it takes one run's measured
    rows in order and their measured history (``heat``)."""

    def __init__(self, base, table: ClockTable) -> None:  # noqa: ANN001 - a cost model
        self.base, self.table = base, table
        self.provenance = getattr(base, "provenance", None)
        self.max_num_seqs = base.max_num_seqs
        self.residuals = getattr(base, "residuals", None)
        self._steps: deque[tuple[float, bool]] = deque()
        self._busy = self._hot = 0.0
        self._flat = table.is_flat
        self._shares, self._mixed, self._decode = table.shares, table.mixed, table.decode

    def share(self) -> float:
        """The hot share of the last ``window_s`` busy seconds priced (0 before any step)."""
        w, excess = self.table.window_s, self._busy - self.table.window_s
        hot = self._hot
        if excess > 0 and self._steps[0][1]:
            hot -= excess  # only the window's part of the oldest step counts
        return max(hot, 0.0) / w

    def step_time(self, plan: StepPlan) -> float:
        t = self.base.step_time(plan)
        if plan.is_empty:
            return t
        if not self._flat:
            col = self._mixed if plan.num_prefill_tokens > 0 else self._decode
            t *= 1.0 + _interp(self.share(), self._shares, col)
        hot = plan.num_prefill_tokens + len(plan.decodes) >= self.table.hot_tokens
        self._steps.append((t, hot))
        self._busy += t
        self._hot += t * hot
        while self._steps and self._busy - self._steps[0][0] >= self.table.window_s:
            old, was_hot = self._steps.popleft()
            self._busy -= old
            self._hot -= old * was_hot
        return t

    def check_integrity(self) -> None:
        """The running sums are the sums of the kept steps, which cover at most one step more
        than the window."""
        busy = sum(t for t, _ in self._steps)
        hot = sum(t for t, h in self._steps if h)
        if abs(busy - self._busy) > 1e-9 or abs(hot - self._hot) > 1e-9:
            raise AssertionError("ClockStateCost: running sums drifted from the kept steps")
        if self._steps and busy - self._steps[0][0] >= self.table.window_s:
            raise AssertionError("ClockStateCost: keeps a step older than its window")

    def predict_rows(self, rows: np.ndarray) -> np.ndarray:
        rows = rows[(rows[:, 0] + rows[:, 1]) > 0]
        slow = self.table.slowdown(heat(rows, self.table), rows[:, 0] > 0)
        return self.base.predict_rows(rows) * (1.0 + slow)

    def fresh(self) -> ClockStateCost:
        """This model at its start state (a cold GPU): one per simulated replica and run."""
        return ClockStateCost(self.base, self.table)

    def scaled(self, factor: float) -> ClockStateCost:
        return ClockStateCost(self.base.scaled(factor), self.table)

    def with_noise(self, seed: int, block_steps: int = 2000) -> ClockStateCost:
        return ClockStateCost(self.base.with_noise(seed, block_steps), self.table)

    def report(self) -> dict:
        return {**self.base.report(), "clock_table": self.table.source}


def fit(
    runs: list[np.ndarray],
    table: ClockTable,
    model: str,
    grid: np.ndarray | None = None,
    kv_floor: float = 0.0,
    bucket_min_steps: int = 0,
) -> ClockStateCost:
    """The physical model fitted to ``runs`` (each one run's ``STEP_COLUMNS`` rows in the order
    measured) with every step divided by its slowdown, and ``grid`` (the profiler's
    back-to-back steps) by the slowdown at share 1 (``kv_floor``, ``bucket_min_steps``: as
    ``PhysicalCostModel.fit``'s); wrapped in ``ClockStateCost``."""
    parts = [table.deflate(rows) for rows in runs]
    grid = None if grid is None else table.deflate_grid(grid)
    base = PhysicalCostModel.fit(
        np.concatenate(parts), model, grid=grid, kv_floor=kv_floor,
        bucket_min_steps=bucket_min_steps,
    )  # fmt: skip
    return ClockStateCost(base, table)

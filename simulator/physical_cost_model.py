"""A step cost priced by physics: what a step reads and computes, with coefficients fitted
(non-negative, minimising relative error) to measured engine steps and to the profiler's grid.

A step is bound by memory or by compute, whichever takes longer, plus the host's work::

    memory  = a_graph * [decode-only] + a_mixed * [mixed] + w * padded_tokens
              + k * kv_gb + q * attention_pairs + l * longest_walk
    compute = f * linear_tflop + g * attention_tflop
    t       = max(memory, compute) + h * requests + r * refreshed + s * preempting + o

* ``a_graph`` / ``a_mixed``: the weights read once per step and the launch of the captured graph
  (decode-only graphs and mixed graphs are captured apart, so each has its own constant);
* ``padded_tokens``: tokens of the step padded to its captured bucket (what the bucket's rows
  cost while the step is bound by the weight read);
* ``kv_gb``: KV bytes read, (decode context + prefill context) x the model shape's KV bytes per
  token, in GB: the one term that grows with context, priced per byte so longer contexts than
  calibrated cost what the bytes cost;
* ``attention_pairs``: the prefill chunks' query x key pairs;
* ``longest_walk``: mixed steps only, ``max(longest decode context, prefill context /
  chunks) / 1,000``, in thousands of tokens. The mixed graph's attention runs one program per
  query tile and KV head over a sequence's whole context, with no split along the keys, so a
  mixed step of few rows over long contexts waits on its longest walk (latency, not bytes: a
  0.5B's 16-token chunk over 3,088 tokens of prefix costs ~180x its KV bytes at the GPU's
  bandwidth). The decodes' walk is their longest (``STEP_COLUMNS``'
  ``longest_decode_context``, ``StepPlan.longest_decode_context``), where it was their mean
  context before that column existed; rows without it (-1) are refused;
* ``linear_tflop``: the linear layers' FLOPs, 2 x the shape's matmul parameters x padded
  tokens; ``attention_tflop``: 4 x layers x query heads x head dim per attention pair (QK^T
  and PV). ``1 / f`` and ``1 / g`` are the effective throughputs (TFLOP/s) once a step is
  compute-bound: a 2,048-token chunk costs its FLOPs whatever the small steps' slope is, so the
  knee (where ``compute`` overtakes ``memory``) cannot be traded away by a fit dominated by
  small steps;
* ``decode_offsets`` (``fit(..., bucket_min_steps=N)``): a decode-only step's captured graph
  of each batch bucket costs a constant of its own beside the line ``a_graph + w *
  padded_tokens`` (signed: the graphs are captured apart, and one slope does not follow a
  small shape's buckets); fitted only for buckets with >= N decode-only steps in the fit, 0
  elsewhere (a bucket the fit never saw costs what the line says);
* ``requests`` (decodes + chunks), ``refreshed``, ``preempting``: host work per request;
* ``o``: host work of an online engine step that the profiler's offline steps
  (``executor.profiler``: ``ModelRunner.execute`` alone) do not do; every predicted step is an
  online one and pays it.

Every coefficient is >= 0: each term is work. ``fit`` alternates between assigning each step to
the side that is larger and one non-negative relative-error fit of both sides (a max-affine
fit), until no step changes side. Calibration: ``fit(rows, grid=...)`` adds offline steps of
the profiler's grid (``grid_rows``; only chunks of >= ``GRID_MIN_PREFILL`` tokens, the
compute-bound corner online steps rarely reach) weighted as ``GRID_WEIGHT`` of the online
steps; they pay no ``o``. Built with ``fit`` (rows are
``simulator.engine_cost_model.STEP_COLUMNS``) or ``from_file`` (a calibration file of
``write_steps``, and the grid beside it where there is one: ``grid_path``); the simulator's
``physical`` cost model loads it fitted once per file (``simulator.cost_model_artifact``).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from horizon.model_shape import ModelShape, model_shape
from horizon.plan import StepPlan
from horizon.step_buckets import bucket_of
from simulator.engine_cost_model import STEP_COLUMNS, Buckets, NoisyStepCost, read_steps

DEFAULT_BUCKETS = Buckets()
MEMORY = (
    "decode_graph",
    "mixed_graph",
    "padded_tokens",
    "kv_gb",
    "attention_pairs",
    "longest_walk",
)
COMPUTE = ("linear_tflop", "attention_tflop")
HOST = ("requests", "refreshed", "preempting", "online_host")
TERMS = (*MEMORY, *COMPUTE, *HOST)
GRID_MIN_PREFILL = 1024  # grid steps with chunks this long calibrate the compute-bound corner
GRID_WEIGHT = 0.01  # the grid's steps together weigh this fraction of the online steps
GRID_COLUMNS = STEP_COLUMNS[:6]  # the profiler CSV's plan fields, as the online files'
BUCKET_MIN_STEPS = 200  # decode-only steps a bucket needs in the fit for an offset of its own


def decode_bucket_index(rows: np.ndarray, buckets: Buckets) -> np.ndarray:
    """Per row, the index of its decode-only step's batch bucket in ``buckets.decode``
    (``len(buckets.decode)`` for a mixed step or one past the largest bucket)."""
    db = np.asarray(buckets.decode)
    idx = np.searchsorted(db, rows[:, 1], "left")
    idx[rows[:, 0] > 0] = len(db)
    return idx


def _offset_columns(idx: np.ndarray, chosen: list[int]) -> np.ndarray:
    """A +1 and a -1 indicator column per chosen bucket (non-negative least squares fits a
    signed offset as the difference of the two)."""
    cols = []
    for j in chosen:
        c = (idx == j).astype(np.float64)
        cols += [c, -c]
    return np.stack(cols, axis=1) if cols else np.zeros((len(idx), 0))


def tflop_per(shape: ModelShape) -> tuple[float, float]:
    """(TFLOP per padded token of the linear layers, TFLOP per attention pair) of ``shape``."""
    pair = 4 * shape.num_layers * shape.num_heads * shape.head_dim
    return 2 * shape.matmul_params / 1e12, pair / 1e12


def physical_features(
    rows: np.ndarray, buckets: Buckets, kv_bytes_per_token: int, tflops: tuple[float, float]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(memory, compute, host) feature matrices of ``STEP_COLUMNS`` rows, columns as
    ``MEMORY``, ``COMPUTE`` and ``HOST``; the host's ``online_host`` column is 1."""
    p, d, dctx, pctx, pairs, n, ref, pre, longest = (rows[:, i] for i in range(9))
    if (longest[p > 0] < 0).any():
        raise ValueError(
            "steps without longest_decode_context (written before it): write them again "
            "from their records (simulator.engine_cost_model.rows_of)"
        )
    mixed = (p > 0).astype(np.float64)
    db, mb = buckets.decode, buckets.mixed
    padded = np.array(
        [bucket_of(int(pi + di), mb) if pi > 0 else bucket_of(int(di), db) for pi, di in zip(p, d)],
        dtype=np.float64,
    )
    kv_gb = (dctx + pctx) * kv_bytes_per_token / 1e9
    walk = mixed * np.maximum(longest, pctx / np.maximum(n, 1)) / 1e3
    memory = np.stack([1.0 - mixed, mixed, padded, kv_gb, pairs, walk], axis=1)
    compute = np.stack([padded * tflops[0], pairs * tflops[1]], axis=1)
    host = np.stack([d + n, ref, (pre > 0).astype(np.float64), np.ones(len(rows))], axis=1)
    return memory, compute, host


def grid_rows(path: str | Path, min_prefill: int = GRID_MIN_PREFILL) -> np.ndarray:
    """``STEP_COLUMNS`` rows of a profiler grid CSV (``executor.profiler``; none refreshed or
    preempting), its steps with >= ``min_prefill`` prefill tokens. Raises ValueError for a
    file without the profiler's columns."""
    lines = Path(path).read_text().splitlines()
    head = lines[0].split(",")
    missing = [c for c in (*GRID_COLUMNS, "step_s") if c not in head]
    if missing:
        raise ValueError(f"{path}: not a profiler grid (no {', '.join(missing)})")
    idx = [head.index(c) for c in (*GRID_COLUMNS, "step_s")]
    vals = np.array([[float(ln.split(",")[i]) for i in idx] for ln in lines[1:] if ln])
    rows = np.zeros((len(vals), len(STEP_COLUMNS)))
    rows[:, :6], rows[:, -1] = vals[:, :6], vals[:, 6]
    return rows[rows[:, 0] >= min_prefill]


def grid_path(calibration: str | Path) -> Path:
    """The profiler grid of an online-steps file's shape: ``h200_<model>_online.csv.gz`` ->
    ``h200_<model>.csv`` beside it (it may not exist)."""
    p = Path(calibration)
    return p.with_name(
        p.name.removesuffix(".gz").removesuffix(".csv").removesuffix("_online") + ".csv"
    )


def _nnls(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Non-negative least squares of ``w * (x @ c - y)``, through the QR factor of the
    weighted ``[x | y]`` (a problem of ``x``'s column count, whatever its length)."""
    from scipy.optimize import nnls  # only when fitting

    k = x.shape[1]
    r = np.linalg.qr(np.c_[x, y] * w[:, None], mode="r")
    return nnls(r[:k, :k], r[:k, k])[0]


def _irls(x: np.ndarray, y: np.ndarray, base: np.ndarray, iterations: int) -> np.ndarray:
    """Non-negative coefficients minimising ``sum(base * |x @ c - y| / y)`` (as
    ``engine_cost_model._fit_mape``, with a weight ``base`` per step)."""
    coef = _nnls(x, y, base / y)
    for _ in range(iterations):
        r = np.abs(x @ coef - y) / y
        coef = _nnls(x, y, base / (y * np.sqrt(np.maximum(r, 1e-4))))
    return coef


def _fit_max(
    feats: tuple[np.ndarray, np.ndarray, np.ndarray], y: np.ndarray, base: np.ndarray
) -> np.ndarray:
    """Coefficients of ``max(memory, compute) + host``: each step on the side that is larger
    (at first: the steps of >= 1,024 padded tokens on the compute side), one fit of all three
    with those sides, repeated until no step changes side (at most 12 rounds)."""
    memory, compute, host = feats
    nm, nc = memory.shape[1], compute.shape[1]
    side = memory[:, 2] >= 1024
    for _ in range(12):
        x = np.concatenate([memory * ~side[:, None], compute * side[:, None], host], axis=1)
        coef = np.maximum(_irls(x, y, base, 15), 0.0)
        new = compute @ coef[nm : nm + nc] > memory @ coef[:nm]
        if np.array_equal(new, side):
            break
        side = new
    return coef


@dataclass(frozen=True)
class PhysicalCostModel:
    """``step_time(plan)`` from physical features; build with ``fit`` or ``from_file``.

    ``coef``: seconds per unit of each of ``TERMS`` (all >= 0); ``kv_bytes_per_token``: the
    model shape's, which turns context tokens into bytes read; ``tflops``: the shape's TFLOP
    per padded token and per attention pair (``tflop_per``; zero: no compute side).
    """

    coef: tuple[float, ...]
    kv_bytes_per_token: int
    buckets: Buckets = DEFAULT_BUCKETS
    tflops: tuple[float, float] = (0.0, 0.0)
    # seconds per GB of KV read that no fit lowers (1e9 / the GPU's bandwidth; 0: none)
    kv_floor: float = 0.0
    meta: dict = field(default_factory=dict, compare=False)
    # where it came from (``simulator.cost_model_artifact``): files and their SHA-256
    provenance: dict | None = field(default=None, compare=False)
    # measured / modelled time of every fitted online step, per regime (decode-only, mixed),
    # in the order measured: the empirical step-time noise ``with_noise`` resamples
    residuals: tuple[np.ndarray, np.ndarray] | None = field(default=None, compare=False, repr=False)
    # seconds a decode-only step of each decode bucket adds to its memory side (empty: none)
    decode_offsets: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if len(self.coef) != len(TERMS):
            raise ValueError(
                f"PhysicalCostModel.coef needs {len(TERMS)} values, got {len(self.coef)}"
            )
        if min(self.coef) < 0 or min(self.tflops) < 0 or not self.kv_floor >= 0:
            raise ValueError("PhysicalCostModel.coef, tflops and kv_floor must be >= 0")
        if self.decode_offsets and len(self.decode_offsets) != len(self.buckets.decode):
            raise ValueError(
                f"PhysicalCostModel.decode_offsets needs one value per decode bucket "
                f"({len(self.buckets.decode)}), got {len(self.decode_offsets)}"
            )

    @classmethod
    def fit(  # noqa: ANN206
        cls,
        rows: np.ndarray,
        model: str = "qwen2.5-7b",
        buckets: Buckets = DEFAULT_BUCKETS,
        meta: dict | None = None,
        grid: np.ndarray | None = None,
        kv_floor: float = 0.0,
        bucket_min_steps: int = 0,
    ):
        """Fit to ``STEP_COLUMNS`` rows of online steps (steps without a token ignored) of the
        shape ``model`` and the offline ``grid`` rows (``grid_rows``), if any, weighted as
        ``GRID_WEIGHT`` of the online steps; ``bucket_min_steps`` > 0: a ``decode_offsets``
        entry for every decode bucket with that many decode-only online steps (0: none).
        Raises ValueError for fewer than 20 online steps."""
        rows = rows[(rows[:, 0] + rows[:, 1]) > 0]
        if len(rows) < 20:
            raise ValueError(f"PhysicalCostModel.fit needs >= 20 steps, got {len(rows)}")
        shape = model_shape(model)
        kvb, tf = shape.kv_bytes_per_token(), tflop_per(shape)
        grid = np.zeros((0, rows.shape[1])) if grid is None else grid
        both = np.concatenate([rows, grid])
        memory, compute, host = physical_features(both, buckets, kvb, tf)
        host[len(rows) :, -1] = 0.0  # offline steps: no online host work
        base = np.ones(len(both))
        base[len(rows) :] = GRID_WEIGHT * len(rows) / max(len(grid), 1)
        y = both[:, -1]
        rest = np.maximum(y - kv_floor * memory[:, 3], 1e-3 * y)  # the time above the floor
        chosen: list[int] = []
        idx = decode_bucket_index(both, buckets)
        if bucket_min_steps > 0:
            counts = np.bincount(idx[: len(rows)], minlength=len(buckets.decode) + 1)
            chosen = [j for j in range(len(buckets.decode)) if counts[j] >= bucket_min_steps]
        nm = memory.shape[1]
        extra = _offset_columns(idx, chosen)
        feats = (np.concatenate([memory, extra], axis=1), compute, host)
        coef = _fit_max(feats, rest, base * rest / y)  # error relative to y
        offsets = ()
        if chosen:
            off = np.zeros(len(buckets.decode))
            end = nm + extra.shape[1]
            off[chosen] = coef[nm:end:2] - coef[nm + 1 : end : 2]
            offsets = tuple(float(v) for v in off)
            coef = np.concatenate([coef[:nm], coef[end:]])
        fitted = cls(tuple(float(c) for c in coef), kvb, buckets, tf, kv_floor, dict(meta or {}),
                     decode_offsets=offsets)  # fmt: skip
        return fitted.with_residuals(rows)

    def with_residuals(self, rows: np.ndarray) -> PhysicalCostModel:
        """This model keeping the measured/modelled ratio of every step of ``rows`` (online
        steps, in the order measured; the grid's offline steps are not noise), split into
        decode-only and mixed steps: what ``with_noise`` resamples."""
        rows = rows[(rows[:, 0] + rows[:, 1]) > 0]
        ratio = rows[:, -1] / self.predict_rows(rows)
        mixed = rows[:, 0] > 0
        return replace(self, residuals=(ratio[~mixed], ratio[mixed]))

    def with_noise(self, seed: int, block_steps: int = 2000) -> NoisyStepCost:
        """This model times a seeded block resampling of its fitted steps' measured/modelled
        ratios (``simulator.engine_cost_model.NoisyStepCost``). Raises ValueError for a model
        without residuals, or with fewer than one step of a regime."""
        if self.residuals is None or min(len(r) for r in self.residuals) == 0:
            raise ValueError("with_noise needs residuals of both regimes (fit, with_residuals)")
        return NoisyStepCost(self, seed, block_steps)

    @classmethod
    def from_file(
        cls,
        path: str | Path,
        model: str,
        kv_floor: float = 0.0,
        clock=None,  # noqa: ANN001 - a simulator.clock_state.ClockTable
        bucket_min_steps: int = 0,
    ) -> PhysicalCostModel:
        """Fit to a calibration file of ``write_steps`` (its sidecar JSON gives the buckets)
        measured on the shape ``model``, and to the profiler grid beside it (``grid_path``)
        where there is one (``kv_floor``, ``bucket_min_steps``: as ``fit``'s). ``clock``: a
        ``ClockTable`` whose slowdown is taken out of every step first (``ClockTable.deflate``;
        the file's steps as one run, so the first 0.2 s of each later run sees the end of the
        one before), the base a ``ClockStateCost`` wraps. Raises ValueError for a missing or
        malformed file."""
        rows, meta = read_steps(path)
        b = meta.get("buckets", {})
        g = grid_path(path)
        grid = grid_rows(g) if g.exists() else None
        meta = {**meta, "grid": g.name if grid is not None else None}
        if clock is not None:
            rows = clock.deflate(rows)
            grid = None if grid is None else clock.deflate_grid(grid)
        buckets = Buckets(**b) if b else DEFAULT_BUCKETS
        return cls.fit(rows, model, buckets, meta, grid, kv_floor, bucket_min_steps)

    @property
    def max_num_seqs(self) -> int:
        return self.buckets.max_num_seqs

    def scaled(self, factor: float) -> PhysicalCostModel:
        """This model with every step ``factor`` times as long (a uniform bias); the residuals
        are kept (relative: the scaled model times the same scatter)."""
        if not (math.isfinite(factor) and factor > 0):
            raise ValueError(f"scale factor must be finite and > 0, got {factor!r}")
        return replace(
            self,
            coef=tuple(c * factor for c in self.coef),
            kv_floor=self.kv_floor * factor,
            decode_offsets=tuple(v * factor for v in self.decode_offsets),
        )

    def predict_rows(self, rows: np.ndarray) -> np.ndarray:
        memory, compute, host = physical_features(
            rows, self.buckets, self.kv_bytes_per_token, self.tflops
        )
        c, nm, nc = np.array(self.coef), len(MEMORY), len(COMPUTE)
        mem = memory @ c[:nm]
        if self.decode_offsets:
            mem = mem + np.append(self.decode_offsets, 0.0)[decode_bucket_index(rows, self.buckets)]
        t = np.maximum(mem, compute @ c[nm : nm + nc]) + host @ c[nm + nc :]
        return np.maximum(t + self.kv_floor * memory[:, 3], 1e-6)

    def step_time(self, plan: StepPlan) -> float:
        """The step's seconds: ``predict_rows`` of its row, in scalar arithmetic (the
        simulator calls this once per step)."""
        d, p = len(plan.decodes), plan.num_prefill_tokens
        if p == 0 and d == 0:
            return 0.0
        c = self.coef
        padded = bucket_of(p + d, self._mixed) if p > 0 else bucket_of(d, self._decode)
        pairs = plan.prefill_attention_pairs
        ctx = plan.decode_context_tokens + plan.prefill_context_tokens
        memory = (c[1] if p > 0 else c[0] + self._offset_of.get(padded, 0.0)) + c[2] * padded
        memory += c[3] * (ctx * self.kv_bytes_per_token / 1e9) + c[4] * pairs
        if p > 0:
            n = len(plan.prefills)
            walk = max(plan.longest_decode_context, plan.prefill_context_tokens / max(n, 1))
            memory += c[5] * walk / 1e3
        compute = c[6] * (padded * self.tflops[0]) + c[7] * (pairs * self.tflops[1])
        t = max(memory, compute) + c[8] * (d + len(plan.prefills)) + c[9] * plan.num_refreshed
        t += (c[10] if plan.preempted else 0.0) + c[11]
        t += self.kv_floor * (ctx * self.kv_bytes_per_token / 1e9)
        return max(t, 1e-6)

    @functools.cached_property
    def _decode(self) -> tuple[int, ...]:
        return self.buckets.decode

    @functools.cached_property
    def _mixed(self) -> tuple[int, ...]:
        return self.buckets.mixed

    @functools.cached_property
    def _offset_of(self) -> dict[int, float]:  # decode bucket -> its offset
        return dict(zip(self._decode, self.decode_offsets))

    def report(self) -> dict:
        out = dict(zip(TERMS, self.coef))
        if self.decode_offsets:
            out["decode_offsets"] = dict(zip(self._decode, self.decode_offsets))
        return out

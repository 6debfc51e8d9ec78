"""A step cost model fitted to the engine's own online steps: what a step costs in the engine's
loop, from its plan.

Where ``FittedCostModel`` is fitted to ``executor.profiler``'s offline grid
(``ModelRunner.execute`` timed alone), this one is fitted to the steps of real online runs
(``experiments.engine_replay``): each record's step row holds the plan's shape and the
measured period from one plan to the next, so the scheduler's and the policy's host time,
the padding of CUDA graphs and the loop's overhead are all in it. Two linear regimes, each
fitted to minimise the mean absolute relative error
(the MAPE it is judged by; iteratively reweighted least squares):

* decode-only steps (a decode graph padded to ``horizon.step_buckets.decode_buckets``)::

      t = a[bucket(decodes)] + c * decodes + e * decode_context + f * refreshed + g * preempting

  one intercept per graph (each bucket is its own captured graph, whose kernels were chosen for
  its row count); a bucket without calibration steps takes the intercept interpolated between
  its neighbours (or the line through the measured ones, beyond them).

* steps with prefill chunks (a mixed graph padded to ``mixed_token_buckets``)::

      t = a + b * bucket(tokens) + c * tokens + e * attention_pairs + f * prefill_context
            + g * decode_context + h * decodes + i * chunks + j * decode_context / decodes
            + k * refreshed + l * preempting + m * max(bucket(tokens) - knee, 0)
            + n * longest_decode_context

  ``decode_context / decodes`` (the mean context a decode reads; 0 without decodes) is the
  critical path of a mixed step's decode attention: there the decodes run as one-query chunks
  of the prefill kernel, one program per sequence and KV head walking its whole context, with
  no split-K (the decode-only graphs split long contexts). With few decodes the GPU is not
  full and the step waits for its longest sequences, so the time follows the context *per*
  decode, not only the sum ``decode_context``.

  ``longest_decode_context`` (the most keys one decode of the step reads,
  ``RunRecords.longest_decode_contexts``) is that critical path itself: the program of the
  longest decode walks its context while the others are done. The mean is a proxy for it that
  holds where contexts spread as in the calibration runs (ShareGPT first turns: the longest
  3x the mean at the median) and overprices batches of even contexts (shared 1,024-token
  prefixes: 1.3x). Calibration files written before the column have it at -1 (unknown); a
  model fitted to them leaves the term out (its coefficient is 0).

  ``max(bucket(tokens) - knee, 0)`` is the roofline's corner: a step reads the weights once,
  and a few hundred tokens' matmuls take no longer than that read (memory-bound: the fixed part
  and the gentle per-token slope); past the knee each further token costs its FLOPs
  (compute-bound). ``fit`` picks the knee among the mixed token buckets by calibration error,
  and keeps one only where it lowers that error by ``KNEE_MIN_GAIN`` (a 7B's steps turn
  compute-bound at a few hundred tokens; a 0.5B's launch-bound steps show no corner, and its
  model has no knee: ``knee`` is None and the term 0).

  ``refreshed`` is ``StepPlan.num_refreshed``: requests whose predictions the policy recomputed
  while planning (Horizon: every running request every ``refresh_every`` steps). Its coefficient
  is the host time per refreshed request; the rest is GPU time plus the loop's fixed cost.

  ``preempting`` (both regimes) is 1 when the plan preempted a request
  (``StepPlan.preempted``): the pipelined engine then waits for the step in flight before it
  submits this one (a row with a token in flight cannot move), so the host's submit work, hidden
  behind the GPU otherwise, lands in this step's time (0.17-0.31 ms fitted on H200 runs).

  Every coefficient of this regime is fitted non-negative: each term is work, which cannot make
  a step shorter. Its terms are correlated in the calibration runs (longer chunks, longer
  prefixes, more pairs), and an unconstrained fit pays for one term with a negative other,
  which holds inside the calibration runs but not beyond them (multi-turn prefixes under
  preemption); the constraint drops such terms instead (its coefficient is then 0). The
  decode-only regime stays unconstrained: within a bucket the graph's work is fixed, and its
  small per-decode terms only correct the intercepts.

Calibration file: a CSV (optionally gzipped) of ``STEP_COLUMNS`` rows, one per measured step,
with a sidecar JSON (GPU, model, versions, date, the runs it came from): ``write_steps`` makes
it from engine records.
"""

from __future__ import annotations

import functools
import gzip
import io
import json
import lzma
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from horizon.metrics.records import RunRecords
from horizon.plan import PLAN_SHAPE_FIELDS, StepPlan
from horizon.step_buckets import bucket_of, decode_buckets, mixed_token_buckets

STEP_COLUMNS = (
    *PLAN_SHAPE_FIELDS,
    "num_refreshed",
    "num_preempted",
    "longest_decode_context",
    "step_s",
)
# files written before the longest decode's column: read with it at -1 (unknown)
_STEP_COLUMNS_V1 = tuple(c for c in STEP_COLUMNS if c != "longest_decode_context")
# after one intercept per bucket
DECODE_TERMS = ("decodes", "decode_context", "refreshed", "preempting")
MIXED_TERMS = (
    "fixed",
    "token_bucket",
    "tokens",
    "attention_pairs",
    "prefill_context",
    "decode_context",
    "decodes",
    "chunks",
    "context_per_decode",
    "refreshed",
    "preempting",
    "tokens_past_knee",
    "longest_decode_context",
)
KNEE_MIN_GAIN = 0.05  # a knee is kept when it lowers the mixed calibration MAPE by 5% (relative)


def step_rows(rec: RunRecords) -> np.ndarray:
    """``[steps, len(STEP_COLUMNS)]`` of a run's records (float64). Raises ValueError for
    records without every plan column (written before records v4)."""
    for name in ("num_refreshed", "num_preempted"):
        col = getattr(rec, name)
        if len(col) and col.min() < 0:
            raise ValueError(f"records without plan columns ({name} = -1): re-run them")
    return np.stack(
        [
            rec.prefill_tokens,
            rec.decode_tokens,
            rec.decode_context_tokens,
            rec.prefill_context_tokens,
            rec.prefill_attention_pairs,
            rec.num_prefills,
            rec.num_refreshed,
            rec.num_preempted,
            rec.longest_decode_contexts(),
            rec.step_durations(),
        ],
        axis=1,
    ).astype(np.float64)


@dataclass(frozen=True)
class Buckets:
    """The engine's padding rules for a scheduler configuration."""

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048

    @property
    def decode(self) -> tuple[int, ...]:
        return decode_buckets(self.max_num_seqs)

    @property
    def mixed(self) -> tuple[int, ...]:
        return mixed_token_buckets(self.max_num_batched_tokens)


def features(
    rows: np.ndarray, buckets: Buckets, knee: int | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(is_mixed, decode features, mixed features)`` of ``STEP_COLUMNS`` rows (the
    features of the other regime's rows are computed too, and ignored). ``knee``: the mixed
    regime's compute-bound corner in padded tokens (None: no corner, the column is 0)."""
    p, d, dctx, pctx, pairs, n, ref, pre = (rows[:, i] for i in range(8))
    drains = (pre > 0).astype(np.float64)
    db, mb = buckets.decode, buckets.mixed
    one = np.ones(len(rows))
    bd = np.array([bucket_of(int(x), db) for x in d], dtype=np.float64)
    t = p + d
    bt = np.array([bucket_of(int(x), mb) for x in t], dtype=np.float64)
    graphs = (bd[:, None] == np.array(db, dtype=np.float64)[None, :]).astype(np.float64)
    dec = np.concatenate([graphs, np.stack([d, dctx, ref, drains], axis=1)], axis=1)
    per_decode = dctx / np.maximum(d, 1.0)
    past = np.maximum(bt - knee, 0.0) if knee is not None else np.zeros(len(rows))
    longest = np.maximum(rows[:, 8], 0.0)  # -1: unknown (older files), no term
    mix = np.stack(
        [one, bt, t, pairs, pctx, dctx, d, n, per_decode, ref, drains, past, longest], axis=1
    )
    return p > 0, dec, mix


def _weighted_lstsq(x: np.ndarray, y: np.ndarray, w: np.ndarray, nonneg: bool) -> np.ndarray:
    xw, yw = x * w[:, None], y * w
    if not nonneg:
        coef, *_ = np.linalg.lstsq(xw, yw, rcond=None)
        return coef
    from sklearn.linear_model import LinearRegression  # only when fitting (a heavy import)

    return LinearRegression(fit_intercept=False, positive=True).fit(xw, yw).coef_


def _fit_mape(
    x: np.ndarray, y: np.ndarray, iterations: int = 30, nonneg: bool = False
) -> np.ndarray:
    """Coefficients minimising ``mean(|x @ c - y| / y)``: least squares on relative error,
    then reweighted by ``1 / sqrt(|relative residual|)`` (IRLS for the L1 loss; residuals below
    1e-4 are clipped so an exact fit stays exact). ``nonneg``: every coefficient >= 0 (non-
    negative least squares at each step)."""
    coef = _weighted_lstsq(x, y, 1.0 / y, nonneg)
    for _ in range(iterations):
        r = np.abs(x @ coef - y) / y
        w = 1.0 / (y * np.sqrt(np.maximum(r, 1e-4)))
        coef = _weighted_lstsq(x, y, w, nonneg)
    return coef


def _choose_knee(rows: np.ndarray, buckets: Buckets) -> int | None:
    """The mixed regime's knee: the mixed token bucket (all but the largest) whose hinge term
    fits the mixed ``rows`` best, if it lowers their MAPE by ``KNEE_MIN_GAIN`` against no knee;
    else None. ``rows``: steps with a token."""
    sel = rows[:, 0] > 0
    if sel.sum() < 20:
        return None  # fit() raises for this
    y = rows[sel, -1]
    base = features(rows[sel], buckets)[2][:, :-1]  # without the knee column
    padded = base[:, 1]  # bucket(tokens)

    def err(x: np.ndarray) -> float:
        return float(np.mean(np.abs(x @ _fit_mape(x, y, nonneg=True) - y) / y))

    none = err(base)
    best, at = min((err(np.c_[base, np.maximum(padded - k, 0.0)]), k) for k in buckets.mixed[:-1])
    return at if best < (1 - KNEE_MIN_GAIN) * none - 1e-6 else None  # (exact fits: no knee)


def _fill_intercepts(coef: np.ndarray, seen: np.ndarray, buckets: Sequence[int]) -> np.ndarray:
    """Intercepts of buckets without steps: interpolated between measured neighbours, or on
    the least-squares line through the measured ones beyond them."""
    k = len(buckets)
    b = np.asarray(buckets, dtype=np.float64)
    out = coef.copy()
    if seen.all():
        return out
    xs, ys = b[seen], coef[:k][seen]
    slope, icpt = np.polyfit(xs, ys, 1) if len(xs) > 1 else (0.0, float(ys[0]))
    for i in np.flatnonzero(~seen):
        inside = xs[0] < b[i] < xs[-1]
        out[i] = np.interp(b[i], xs, ys) if inside else icpt + slope * b[i]
    return out


@dataclass(frozen=True)
class EngineCostModel:
    """``step_time(plan)`` fitted to online engine steps. Build with ``fit`` or ``from_file``."""

    decode_coef: tuple[float, ...]
    mixed_coef: tuple[float, ...]
    buckets: Buckets = Buckets()
    knee: int | None = None  # the mixed regime's compute-bound corner (padded tokens)
    meta: dict = field(default_factory=dict, compare=False)
    # measured / modelled time of every fitted step, per regime (decode-only, mixed), in the
    # order measured: the empirical step-time noise ``with_noise`` resamples
    residuals: tuple[np.ndarray, np.ndarray] | None = field(default=None, compare=False, repr=False)
    # where it came from (``simulator.cost_model_artifact``): files and their SHA-256
    provenance: dict | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        n = len(self.mixed_coef)
        if n == len(MIXED_TERMS) - 1:  # stored before the longest decode's term: without it
            object.__setattr__(self, "mixed_coef", (*self.mixed_coef, 0.0))
        elif n != len(MIXED_TERMS):
            raise ValueError(f"mixed_coef has {n} terms, expected {len(MIXED_TERMS)}")

    @classmethod
    def fit(  # noqa: ANN206
        cls,
        rows: np.ndarray,
        buckets: Buckets = Buckets(),
        meta: dict | None = None,
        knee: int | None | str = "search",
    ):
        """Fit to ``STEP_COLUMNS`` rows (steps with no token are ignored). ``knee``: the mixed
        regime's corner in padded tokens, None for none, or ``"search"`` (``_choose_knee``).

        Raises:
            ValueError: fewer than 20 rows of a regime.
        """
        rows = rows[(rows[:, 0] + rows[:, 1]) > 0]
        if knee == "search":
            knee = _choose_knee(rows, buckets)
        elif knee is not None and not (isinstance(knee, int) and knee > 0):
            raise ValueError(f"knee must be a positive int, None or 'search', got {knee!r}")
        mixed, dec, mix = features(rows, buckets, knee)
        y = rows[:, -1]
        coefs = []
        k = len(buckets.decode)
        for sel, x, name in ((~mixed, dec, "decode-only"), (mixed, mix, "mixed")):
            if sel.sum() < 20:
                raise ValueError(f"{int(sel.sum())} {name} steps to fit; need >= 20")
            if name == "mixed":
                if (rows[sel, 8] < 0).any():  # a step of unknown longest decode: no such term
                    x = x.copy()
                    x[:, -1] = 0.0
                c = _fit_mape(x[sel], y[sel], nonneg=True)
            else:  # buckets without steps: no column in the fit, an interpolated intercept
                used = x[sel].any(axis=0)
                c = np.zeros(x.shape[1])
                c[used] = _fit_mape(x[sel][:, used], y[sel])
                c = _fill_intercepts(c, used[:k], buckets.decode)
            coefs.append(tuple(float(v) for v in c))
        return cls(coefs[0], coefs[1], buckets, knee, dict(meta or {})).with_residuals(rows)

    def with_residuals(self, rows: np.ndarray) -> EngineCostModel:
        """This model keeping the measured/modelled ratio of every step of ``rows`` (its
        calibration steps, in the order measured): what ``with_noise`` resamples. A model
        loaded from its fit artifact (``simulator.cost_model_artifact``) has none until this is
        called with its calibration file's rows."""
        rows = rows[(rows[:, 0] + rows[:, 1]) > 0]
        mixed, dec, mix = features(rows, self.buckets, self.knee)
        y = rows[:, -1]
        dec_r, mix_r = (
            y[sel] / np.maximum(x[sel] @ np.asarray(c, dtype=np.float64), 1e-6)
            for sel, x, c in ((~mixed, dec, self.decode_coef), (mixed, mix, self.mixed_coef))
        )
        return replace(self, residuals=(dec_r, mix_r))

    def scaled(self, factor: float) -> EngineCostModel:
        """This model with every step ``factor`` times as long (a uniform bias: how far a
        simulated metric moves when the cost model is off by a given share)."""
        if not (math.isfinite(factor) and factor > 0):
            raise ValueError(f"scale factor must be finite and > 0, got {factor!r}")
        return replace(
            self,
            decode_coef=tuple(c * factor for c in self.decode_coef),
            mixed_coef=tuple(c * factor for c in self.mixed_coef),
            residuals=None,
        )

    def with_noise(self, seed: int, block_steps: int = 2000) -> NoisyStepCost:
        """This model times a seeded block resampling of its own fitted steps'
        measured/modelled ratios: steps scatter, and drift, as the engine's did (see
        ``NoisyStepCost``)."""
        if self.residuals is None:
            raise ValueError("with_noise needs a model built by fit (it keeps the residuals)")
        return NoisyStepCost(self, seed, block_steps)

    @classmethod
    def from_file(cls, path: str | Path) -> EngineCostModel:
        """Fit to a calibration file of ``write_steps`` (its sidecar JSON gives the buckets)."""
        rows, meta = read_steps(path)
        b = meta.get("buckets", {})
        # the knee the file's writer chose (fitting again finds the same; searching costs ~2 s)
        knee = meta.get("knee_tokens", "search")
        return cls.fit(rows, Buckets(**b) if b else Buckets(), meta, knee)

    @property
    def max_num_seqs(self) -> int:
        """The largest decode batch its calibration's graphs covered: steps beyond it are not
        modelled (a scheduler allowing more is refused where the run is built)."""
        return self.buckets.max_num_seqs

    def predict_rows(self, rows: np.ndarray) -> np.ndarray:
        """Seconds of each ``STEP_COLUMNS`` row. Raises ValueError for steps with prefill
        chunks whose longest decode is unknown (-1: older files) when the model has that term."""
        mixed, dec, mix = features(rows, self.buckets, self.knee)
        if self.mixed_coef[-1] and (mixed & (rows[:, 8] < 0)).any():
            raise ValueError(
                "steps without longest_decode_context (written before it): write them again "
                "from their records (simulator.engine_cost_model.rows_of)"
            )
        out = np.where(mixed, mix @ np.array(self.mixed_coef), dec @ np.array(self.decode_coef))
        return np.maximum(out, 1e-6)

    def step_time(self, plan: StepPlan) -> float:
        d = len(plan.decodes)
        p = plan.num_prefill_tokens
        if p == 0 and d == 0:
            return 0.0
        drains = 1.0 if plan.preempted else 0.0
        if p == 0:
            c = self.decode_coef
            s = self._graph_fixed[d] + c[-4] * d + c[-3] * plan.decode_context_tokens
            return max(s + c[-2] * plan.num_refreshed + c[-1] * drains, 1e-6)
        c = self.mixed_coef
        t = p + d
        bt = bucket_of(t, self._mixed_buckets)
        x = (
            1.0,
            bt,
            t,
            plan.prefill_attention_pairs,
            plan.prefill_context_tokens,
            plan.decode_context_tokens,
            d,
            len(plan.prefills),
            plan.decode_context_tokens / max(d, 1),
            plan.num_refreshed,
            drains,
            max(bt - self.knee, 0) if self.knee is not None else 0,
            plan.longest_decode_context,
        )
        s = sum(a * b for a, b in zip(c, x))
        return max(s, 1e-6)

    @functools.cached_property
    def _mixed_buckets(self) -> tuple[int, ...]:
        return self.buckets.mixed

    @functools.cached_property
    def _graph_fixed(self) -> tuple[float, ...]:
        """The decode intercept of each batch size ``0..max_num_seqs`` (its bucket's)."""
        db = self.buckets.decode
        index = [db.index(bucket_of(max(d, 1), db)) for d in range(db[-1] + 1)]
        return tuple(self.decode_coef[i] for i in index)

    def report(self) -> dict:
        """The coefficients by name, in microseconds (per unit of each term)."""
        names = [f"graph[{b}]" for b in self.buckets.decode] + list(DECODE_TERMS)
        return {
            "decode_only_us": dict(zip(names, (1e6 * c for c in self.decode_coef))),
            "mixed_us": dict(zip(MIXED_TERMS, (1e6 * c for c in self.mixed_coef))),
            "knee_tokens": self.knee,
        }


class NoisyStepCost:
    """A fitted cost model (``EngineCostModel``, ``PhysicalCostModel``: anything with
    ``step_time``, ``max_num_seqs``, ``provenance`` and ``residuals``, the decode-only and mixed
    steps' measured/modelled ratios) times a multiplicative noise resampled from those ratios.

    The calibration steps' measured/modelled ratios, in the order they were measured, are
    resampled in blocks (a moving-block bootstrap): a block of ``block_steps`` consecutive
    decode-only ratios (mixed steps: a block of proportionally fewer consecutive ones), then
    another block from a random place, and so on. Blocks keep what made the engine's runs
    differ from each other: stretches of seconds in which every step ran slower (a shared
    machine), besides the per-step jitter. ``block_steps=1`` draws each step independently.

    Unlike a plain cost model it is not a pure function of the plan: it is reproducible for a
    given seed and sequence of plans. Run a few seeds to see the spread a result has on the
    engine; the deterministic model gives its centre.
    """

    def __init__(self, model, seed: int, block_steps: int = 2000) -> None:  # noqa: ANN001
        if not (isinstance(block_steps, int) and block_steps >= 1):
            raise ValueError(f"block_steps must be an int >= 1, got {block_steps!r}")
        self.model = model
        self.provenance = model.provenance
        self.max_num_seqs = model.max_num_seqs
        self.seed = seed
        self.block_steps = block_steps
        self._rng = np.random.default_rng(seed)
        dec, mix = model.residuals
        self._ratios = (dec, mix)
        share = len(mix) / max(len(dec), 1)
        mixed_block = max(1, min(round(block_steps * share), len(mix)))
        self._block = (min(block_steps, len(dec)), mixed_block)
        self._pos = [0, 0]
        self._left = [0, 0]

    def step_time(self, plan: StepPlan) -> float:
        t = self.model.step_time(plan)
        if plan.is_empty:
            return t
        i = 1 if plan.num_prefill_tokens else 0
        r = self._ratios[i]
        if self._left[i] == 0:
            b = self._block[i]
            self._pos[i] = int(self._rng.integers(0, len(r) - b + 1))
            self._left[i] = b
        ratio = r[self._pos[i]]
        self._pos[i] += 1
        self._left[i] -= 1
        return t * float(ratio)


def mape(model, rows: np.ndarray) -> dict:  # noqa: ANN001 - anything with predict_rows
    """Mean absolute percentage error of ``model`` on measured ``rows``, overall and by regime."""
    rows = rows[(rows[:, 0] + rows[:, 1]) > 0]
    err = np.abs(model.predict_rows(rows) - rows[:, -1]) / rows[:, -1]
    mixed = rows[:, 0] > 0
    return {
        "all": 100 * float(err.mean()),
        "decode_only": 100 * float(err[~mixed].mean()),
        "mixed": 100 * float(err[mixed].mean()),
        "steps": int(len(rows)),
    }


def write_steps(rows: np.ndarray, path: str | Path, meta: dict) -> None:
    """A calibration file: ``STEP_COLUMNS`` rows as CSV (gzipped if ``path`` ends in .gz,
    xz-compressed if in .xz: about a third smaller) and ``meta`` as the sidecar JSON (``path``
    without .gz/.xz/.csv, + .json)."""
    p = Path(path)
    buf = io.StringIO()
    buf.write(",".join(STEP_COLUMNS) + "\n")
    for r in rows:
        buf.write(",".join(f"{int(v)}" for v in r[:-1]) + f",{r[-1]:.9g}\n")
    data = buf.getvalue().encode()
    if p.suffix == ".gz":
        out = io.BytesIO()
        with gzip.GzipFile("", "wb", fileobj=out, mtime=0) as f:
            f.write(data)  # no name, mtime 0: the same rows give the same bytes
        data = out.getvalue()
    elif p.suffix == ".xz":  # no timestamps in the format: the same rows give the same bytes
        data = lzma.compress(data, preset=9 | lzma.PRESET_EXTREME)
    p.parent.mkdir(parents=True, exist_ok=True)
    # written whole, then renamed: a simulation reading the file never sees half of it
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(p)
    _sidecar(p).write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")


def read_steps(path: str | Path) -> tuple[np.ndarray, dict]:
    p = Path(path)
    if not p.exists():
        raise ValueError(
            f"calibration file {path} does not exist: measure this shape's steps on the engine "
            "(python -m experiments.fidelity), or use the roofline cost model (backend=sim)"
        )
    raw = p.read_bytes()
    if p.suffix == ".gz":
        raw = gzip.decompress(raw)
    elif p.suffix == ".xz":
        raw = lzma.decompress(raw)
    lines = raw.decode().splitlines()
    header = tuple(lines[0].split(","))
    if header not in (STEP_COLUMNS, _STEP_COLUMNS_V1):
        raise ValueError(f"{path}: columns {header}, expected {STEP_COLUMNS}")
    rows = np.array([[float(v) for v in ln.split(",")] for ln in lines[1:] if ln], dtype=np.float64)
    rows = rows.reshape(-1, len(header))
    if header == _STEP_COLUMNS_V1:
        rows = np.insert(rows, len(header) - 1, -1.0, axis=1)
    side = _sidecar(p)
    meta = json.loads(side.read_text()) if side.exists() else {}
    return rows, meta


def _sidecar(p: Path) -> Path:
    name = p.name.removesuffix(".gz").removesuffix(".xz").removesuffix(".csv")
    return p.with_name(name + ".json")


def rows_of(records: Iterable[RunRecords]) -> np.ndarray:
    parts: Sequence[np.ndarray] = [step_rows(r) for r in records]
    return np.concatenate(parts) if parts else np.zeros((0, len(STEP_COLUMNS)))

"""``learned``: prompt features -> quantiles of total output length, and a model of its own for
the online remaining length given the prompt and the tokens generated so far.

Life cycle (each step an explicit call; the constructor only stores settings)::

    p = LearnedPredictor(seed=0)           # or make_predictor("learned", seed=0)
    p.fit(train_requests)                  # ~3 min on 2 cores (packaged ShareGPT train split)
    p.save("runs/x/learned.joblib")        # p.artifact_path is now that file
    q = LearnedPredictor.load("runs/x/learned.joblib")
    q.prepare(run_requests)                # per-run memo: batched model calls, tables over g
    q.predict(r); q.update(r, g)           # microseconds each for prepared requests

``fit`` splits its requests by conversation into a fitting part and a calibration part
(``calibration_fraction``). The models (``length_model``: total length, and remaining length
given progress) are fitted on the first; on the second, the standardised residual quantiles
that calibrate (1) the total-length quantiles and (2) the remaining-length quantiles per band of
progress (``calibration``) are measured.

``update(r, g)`` reads a per-request table of the remaining model's location and scale over a
grid of ``g`` (``length_model.remaining_grid``), filled by ``prepare`` in one batched call,
and interpolates linearly between grid points: no model call on the online path.

Requests that carry the reply's ids (``Request.output_token_ids``: what the engine generates
when replaying a trace) get a second remaining-length model that also reads the text generated
so far (``predictors.progress``: code fences, list items, paragraphs, concluding phrases, ...,
as counts over ``output_token_ids[:g]``; ``predictors.reply_text``: stacked ridges and nearest
neighbours over the bag of its token ids). Its table has a point every ``reply_grid_step``
tokens and ``update`` reads the last point at or before ``g``, never interpolating towards a
point that saw later tokens. Requests without reply ids use the prompt-only model.

The models read prompt ids, turn index, ``max_output_tokens`` and the reply's first ``g`` ids
only; ``true_output_tokens`` (and the rest of the reply) is read in ``fit`` as the training
label, never to predict.
"""

from __future__ import annotations

import json
import os
import time
import warnings
from array import array
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import joblib
import numpy as np
import sklearn

from horizon.prediction import LengthDistribution
from horizon.request import Request
from horizon.workload.chat_template import ChatTemplate
from horizon.workload.tokenized import load_tokenizer
from predictors.base import LEVELS, BasePredictor, check_generated, load_versioned
from predictors.calibration import ResidualQuantiles, progress_points
from predictors.dataset import fingerprint, split_by_conversation
from predictors.features import Extracted, extract
from predictors.length_model import (
    PROGRESS_FEATURES,
    REPLY_TEXT_FEATURES,
    LearnedSettings,
    LengthModel,
    ReplyFeatures,
    remaining_grid,
)
from predictors.prepared import Entry, check_entry, remaining_from_entry, save_entries
from predictors.progress import TEXT_PROGRESS_FEATURES, TokenClasses, progress_rows

ARTIFACT_FORMAT = "horizon-learned-length-predictor"
ARTIFACT_VERSION = 4  # 2: the remaining-length model and its per-band residual quantiles
# 3: a second remaining-length model that reads the reply generated so far
# 4: ... also through stacked models of the reply's tokens (predictors.reply_text), and
# structure ratios (tokens per item / paragraph)
# memo entry: predictors.prepared.Entry (what save_prepared writes)
_Entry = Entry


class LearnedPredictor(BasePredictor):
    """Quantile regression of output length from prompt features (module docstring).

    Args: the fields of ``LearnedSettings`` (all optional), plus ``threads``: cap on the
    OpenMP/BLAS threads used by ``fit`` and ``predict_batch`` (None = the libraries' default;
    1 is much faster than 2 on a busy 2-core machine).

    Attributes:
        artifact_path: the file this predictor was saved to or loaded from (None before).
        header: JSON-able description of the fitted model (None before ``fit``/``load``).
    """

    name = "learned"
    reads_true_length = False
    learns = True

    def __init__(self, threads: int | None = None, **settings: object) -> None:
        self.settings = LearnedSettings(**settings)  # type: ignore[arg-type]
        if threads is not None and (not isinstance(threads, int) or threads < 1):
            raise ValueError(f"learned: threads must be an int >= 1 or None, got {threads!r}")
        self.threads = threads
        self.artifact_path: str | None = None
        self.header: dict | None = None
        self._model: LengthModel | None = None
        self._z: tuple[float, ...] | None = None  # standardised residual quantile per level
        self._remaining_z: ResidualQuantiles | None = None  # the same for remaining, per band
        self._remaining_text_z: ResidualQuantiles | None = None  # ... of the reply-reading one
        self._classes: TokenClasses | None = None
        self._memo: dict[int, _Entry] = {}
        self._memo_key: tuple | None = None  # what the memo was prepared from (``_content``)
        self._grids: dict[int, tuple[int, ...]] = {}  # max_output_tokens -> remaining grid
        self._tokenizer = None
        self._template: ChatTemplate | None = None

    # -- training ---------------------------------------------------------------------------
    def fit(self, requests: Sequence[Request], data: dict | None = None) -> LearnedPredictor:
        """Train on labelled requests (their ``true_output_tokens``). Replaces any fitted model
        and clears the memo. ``data`` (JSON-able, e.g. ``RequestSplit.info``) is recorded in the
        header next to the requests' fingerprint.

        Raises:
            ValueError: fewer than 2 conversations or 50 requests.
        """
        s = self.settings
        if len(requests) < 50:
            raise ValueError(f"learned: fit needs >= 50 requests, got {len(requests)}")
        t0 = time.perf_counter()
        fit_part, calib = split_by_conversation(requests, s.calibration_fraction, s.seed)
        if not fit_part or not calib:
            raise ValueError("learned: fit needs requests from at least 2 conversations")
        with self._thread_limit():
            model = self._model = self._fit_model(fit_part)
            design = model.design(self._extract(calib))
            mu, sc = model.total_location_scale(design)
            yc = _lengths(calib)
            z = (np.log(yc) - mu) / sc
            self._z = tuple(float(v) for v in np.quantile(z, LEVELS, method="higher"))
            rows, g = self._calibrate_remaining(design, calib, yc)
            n_text = self._calibrate_remaining_text(design, calib, yc, rows, g)
        self._memo, self._grids, self._memo_key = {}, {}, None
        self.artifact_path = None
        counts = {
            "fit_requests": len(fit_part),
            "calibration_requests": len(calib),
            "remaining_calibration_points": len(rows),
            "remaining_text_calibration_points": n_text,
        }
        self.header = self._header(requests, data, counts, t0)
        return self

    def _fit_model(self, fit_part: Sequence[Request]) -> LengthModel:
        """The length models fitted on ``fit_part`` (with the reply-reading one if any reply
        ids are known)."""
        ex = self._extract(fit_part)
        y = _lengths(fit_part)
        groups = np.asarray([_group(r) for r in fit_part])
        outs = [r.output_token_ids for r in fit_part]
        reply = self._reply_features(outs) if any(o is not None for o in outs) else None
        return LengthModel(self.settings).fit(ex, y, groups, reply)

    def _calibrate_remaining(
        self, design: np.ndarray, calib: Sequence[Request], yc: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Set the remaining model's residual quantiles, measured with the same tables and
        interpolation as ``update``; returns the calibration points ``(rows, g)``."""
        rows, g = progress_points(yc, self.settings.calibration_step)
        keep = g >= 1
        rows, g = rows[keep], g[keep]
        grid, m_tab, s_tab = self._tables(design, int(max(r.max_output_tokens for r in calib)))
        m, sr = _interpolate(grid, m_tab, rows, g), _interpolate(grid, s_tab, rows, g)
        zr = (np.log(yc[rows] - g) - m) / sr
        self._remaining_z = ResidualQuantiles.fit(LEVELS, zr, g)
        return rows, g

    def _calibrate_remaining_text(
        self,
        design: np.ndarray,
        calib: Sequence[Request],
        yc: np.ndarray,
        rows: np.ndarray,
        g: np.ndarray,
    ) -> int:
        """Set the reply-reading model's residual quantiles at the points of ``(rows, g)`` whose
        request carries reply ids (dropping that model if none does); returns their count."""
        assert self._model is not None
        model = self._model
        self._remaining_text_z = None
        outs = [r.output_token_ids for r in calib]
        has = np.asarray([o is not None for o in outs])
        if model.remaining_text is None:
            return 0
        if not has.any():
            model.remaining_text = None  # nothing to calibrate it on
            return 0
        # calibrated at the points update reads: g on the reply grid (floor)
        sel = has[rows]
        rt, gt = rows[sel], g[sel]
        gg = _floor_to_grid(gt, self.settings.reply_grid_step)
        m, sr = model.remaining_text.location_scale(design[rt], gg, self._reply_features(outs), rt)
        zt = (np.log(yc[rt] - gt) - m) / sr
        self._remaining_text_z = ResidualQuantiles.fit(LEVELS, zt, gt)
        return len(zt)

    def _header(
        self, requests: Sequence[Request], data: dict | None, counts: dict[str, int], t0: float
    ) -> dict:
        """The JSON-able description of the model just fitted (``header``)."""
        assert self._model is not None
        s = self.settings
        return {
            "format": ARTIFACT_FORMAT,
            "version": ARTIFACT_VERSION,
            "settings": asdict(s),
            "feature_names": list(s.feature_names),
            "remaining_feature_names": [*s.feature_names, *PROGRESS_FEATURES],
            "remaining_text_feature_names": (
                [
                    *s.feature_names,
                    *PROGRESS_FEATURES,
                    *TEXT_PROGRESS_FEATURES,
                    *REPLY_TEXT_FEATURES,
                ]
                if self._model.remaining_text is not None
                else None
            ),
            "levels": list(LEVELS),
            "train_fingerprint": fingerprint(requests),
            "data": data,
            **counts,
            "train_seed": s.seed,
            "sklearn_version": sklearn.__version__,
            "numpy_version": np.__version__,
            "fit_seconds": round(time.perf_counter() - t0, 2),
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }

    # -- artifact ---------------------------------------------------------------------------
    def save(self, path: str | os.PathLike[str]) -> str:
        """Write the fitted model to ``path`` (joblib; parents created) and a copy of the header
        to ``path + ".json"``. Sets and returns ``artifact_path``."""
        self._check_fitted()
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "header": self.header,
            "model": self._model,
            "z": self._z,
            "remaining_z": self._remaining_z,
            "remaining_text_z": self._remaining_text_z,
        }
        tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
        try:
            joblib.dump(payload, tmp, compress=3)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        Path(f"{path}.json").write_text(json.dumps(self.header, indent=2) + "\n")
        self.artifact_path = str(path.resolve())
        return self.artifact_path

    @classmethod
    def load(cls, path: str | os.PathLike[str], threads: int | None = None) -> LearnedPredictor:
        """A predictor from an artifact written by ``save``.

        Raises:
            FileNotFoundError: no such file.
            ValueError: not an artifact of this format/version.
        Warns (UserWarning) when the artifact was written by another scikit-learn version.
        """
        path = Path(path)
        payload = load_versioned(
            path, joblib.load, ARTIFACT_FORMAT, ARTIFACT_VERSION, "learned",
            "learned-predictor artifact",
        )  # fmt: skip
        header = payload["header"]
        if header.get("sklearn_version") != sklearn.__version__:
            warnings.warn(
                f"learned: {path} was fitted with scikit-learn {header.get('sklearn_version')}, "
                f"running {sklearn.__version__}",
                stacklevel=2,
            )
        p = cls(threads=threads, **header["settings"])
        p._model, p._z = payload["model"], tuple(payload["z"])
        p._remaining_z = payload["remaining_z"]
        p._remaining_text_z = payload["remaining_text_z"]
        p.header = header
        p.artifact_path = str(path.resolve())
        return p

    # -- prediction -------------------------------------------------------------------------
    def predict_batch(self, requests: Sequence[Request]) -> list[LengthDistribution]:
        """Total-length distributions of ``requests`` in one vectorised model call (under 1 ms
        per request, most of it decoding and text features). Does not touch the memo."""
        self._check_fitted()
        if not requests:
            return []
        assert self._model is not None
        with self._thread_limit():
            design = self._model.design(self._extract(requests))
        return self._totals(requests, design)

    def prepare(self, requests: Sequence[Request]) -> None:
        """Fill this instance's memo for one run: ``request_id ->`` the total distribution and
        the table of the remaining model over ``g`` (module docstring).

        This is an explicit, per-run memo, not a hidden cache: it holds exactly the requests
        of the last ``prepare`` call (it is replaced, not merged), and ``predict``/``update``
        check that a memoised entry belongs to a request with the same prompt length and output
        limit (else ValueError: prepare this run's requests). Prepared requests cost
        microseconds in ``predict``/``update``; unprepared ones are predicted one at a time
        (milliseconds, nothing stored). Preparing the very requests the memo already holds
        (the same ids, prompts, replies and limits: a sweep's runs of one seed at another
        load) keeps it as it is: the entries do not depend on arrival times.
        """
        key = _content(requests)
        if key == self._memo_key:
            return
        entries = self._entries(requests)
        self._memo = {r.request_id: e for r, e in zip(requests, entries, strict=True)}
        self._memo_key = key

    def predict(self, request: Request) -> LengthDistribution:
        return self._entry(request)[2]

    def update(self, request: Request, tokens_so_far: int) -> LengthDistribution:
        """Remaining length after ``tokens_so_far`` tokens: the remaining model's location and
        scale, interpolated in the request's table over ``g``, with the residual quantiles of
        that band of ``g`` (module ``calibration``); capped at ``max_output_tokens - g``.
        ``tokens_so_far = 0`` gives ``predict``."""
        check_generated(request, tokens_so_far)
        return remaining_from_entry(self._entry(request), tokens_so_far)

    def save_prepared(self, requests: Sequence[Request], path: str | os.PathLike[str]) -> str:
        """Write what ``prepare(requests)`` computes to ``path``, for ``PreparedPredictor``
        (``predictors.prepared``) to replay where this model cannot run. Returns the path."""
        entries = self._entries(requests)
        header = {
            "predictor": self.name,
            "artifact": self.artifact_path,
            "train_fingerprint": (self.header or {}).get("train_fingerprint"),
            "requests_fingerprint": fingerprint(requests),
        }
        return save_entries(
            {r.request_id: e for r, e in zip(requests, entries, strict=True)}, header, path
        )

    # -- internals --------------------------------------------------------------------------
    def _entry(self, request: Request) -> _Entry:
        e = self._memo.get(request.request_id)
        if e is None:
            return self._entries([request])[0]
        return check_entry(e, request, "learned (call prepare() with this run's requests)")

    def _entries(self, requests: Sequence[Request]) -> list[_Entry]:
        """Memo entries (see ``_Entry``): one design, the totals and the remaining tables."""
        self._check_fitted()
        if not requests:
            return []
        assert self._model is not None
        model = self._model
        text = model.remaining_text is not None and self._remaining_text_z is not None
        outs = [r.output_token_ids if text else None for r in requests]
        plain = [i for i, o in enumerate(outs) if o is None]
        assert self._remaining_z is not None
        out: list = [None] * len(requests)
        with self._thread_limit():
            design = self._model.design(self._extract(requests))
            totals = self._totals(requests, design)
            if plain:
                hi = max(requests[i].max_output_tokens for i in plain)
                grid, m_tab, s_tab = self._tables(design[plain], hi)
                for j, i in enumerate(plain):
                    r = requests[i]
                    g = self._grid(r.max_output_tokens)
                    m = array("d", m_tab[j, : len(g)].tolist())
                    s = array("d", s_tab[j, : len(g)].tolist())
                    out[i] = (r.num_prompt_tokens, r.max_output_tokens, totals[i], g, m, s,
                              self._remaining_z, False)  # fmt: skip
            texts = [i for i, o in enumerate(outs) if o is not None]
            if texts:
                assert model.remaining_text is not None and self._remaining_text_z is not None
                step = self.settings.reply_grid_step
                grids = [
                    _reply_grid(len(outs[i]), requests[i].max_output_tokens, step) for i in texts
                ]
                counts = np.asarray([len(g) for g in grids])
                rows = np.repeat(np.asarray(texts), counts)
                gs = np.concatenate([np.asarray(g, dtype=np.float64) for g in grids])
                m_all, s_all = model.remaining_text.location_scale(
                    design[rows], gs, self._reply_features(outs), rows
                )
                ends = np.cumsum(counts)
                for i, g, b in zip(texts, grids, ends.tolist(), strict=True):
                    r, a = requests[i], b - len(g)
                    m, s = array("d", m_all[a:b].tolist()), array("d", s_all[a:b].tolist())
                    out[i] = (r.num_prompt_tokens, r.max_output_tokens, totals[i], g, m, s,
                              self._remaining_text_z, True)  # fmt: skip
        return out

    def _reply_features(self, outs: Sequence) -> ReplyFeatures:
        """The replies ``outs`` (ids or None per request) and ``(request index, g) ->
        TEXT_PROGRESS_FEATURES`` of ``outs[index][:g]``."""
        if self._classes is None:
            if self._tokenizer is None:
                self._tokenizer = load_tokenizer(self.settings.tokenizer)
                self._template = ChatTemplate.from_tokenizer(self._tokenizer)
            self._classes = TokenClasses.for_tokenizer(self._tokenizer)
        classes = self._classes
        return ReplyFeatures(outs, lambda rows, g: progress_rows(classes, outs, rows, g))

    def _grid(self, hi: int) -> tuple[int, ...]:
        g = self._grids.get(hi)
        if g is None:
            g = self._grids[hi] = remaining_grid(hi)
        return g

    def _tables(
        self, design: np.ndarray, hi: int
    ) -> tuple[tuple[int, ...], np.ndarray, np.ndarray]:
        """The remaining model's location and scale at every point of ``remaining_grid(hi)``
        for each design row: ``(grid, m, s)`` with ``m``, ``s`` of shape (rows x grid). The grid
        for a smaller ``hi`` is a prefix of this one."""
        assert self._model is not None and self._model.remaining is not None
        grid = self._grid(hi)
        n, k = len(design), len(grid)
        g = np.tile(np.asarray(grid, dtype=np.float64), n)
        m, s = self._model.remaining.location_scale(np.repeat(design, k, axis=0), g)
        return grid, m.reshape(n, k), s.reshape(n, k)

    def _totals(self, requests: Sequence[Request], design: np.ndarray) -> list[LengthDistribution]:
        assert self._model is not None
        mu, sc = self._model.total_location_scale(design)
        hi = np.asarray([r.max_output_tokens for r in requests], dtype=np.float64)
        q = self._quantiles(mu, sc, hi)
        return [
            LengthDistribution(LEVELS, tuple(row), 1.0, h)
            for row, h in zip(q.tolist(), hi.tolist(), strict=True)
        ]

    def _quantiles(self, mu: np.ndarray, sc: np.ndarray, hi: np.ndarray) -> np.ndarray:
        assert self._z is not None
        q = np.exp(mu[:, None] + sc[:, None] * np.asarray(self._z)[None, :])
        q = np.clip(q, 1.0, hi[:, None])
        return np.maximum.accumulate(q, axis=1)

    def _extract(self, requests: Sequence[Request]) -> Extracted:
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self.settings.tokenizer)
            self._template = ChatTemplate.from_tokenizer(self._tokenizer)
        assert self._template is not None
        s = self.settings
        return extract(
            requests, self._tokenizer, self._template, s.head_chars, s.tail_chars, s.prev_chars
        )

    def _thread_limit(self):  # noqa: ANN202
        from threadpoolctl import threadpool_limits

        return threadpool_limits(self.threads)

    def _check_fitted(self) -> None:
        if self._model is None:
            raise ValueError("learned: call fit(requests) or LearnedPredictor.load(path) first")

    def __getstate__(self) -> dict:
        # Picklable (e.g. to hand to a worker process) without the tokenizer, rebuilt lazily.
        # To keep a model, use save(path): an explicit artifact with a header.
        state = dict(self.__dict__)
        state["_tokenizer"] = state["_template"] = state["_classes"] = None
        return state


def _interpolate(
    grid: Sequence[int], tab: np.ndarray, rows: np.ndarray, g: np.ndarray
) -> np.ndarray:
    """``tab[rows]`` linearly interpolated at ``g`` along ``grid`` (flat past its end), as
    ``update`` does one point at a time."""
    gr = np.asarray(grid, dtype=np.float64)
    k = np.clip(np.searchsorted(gr, g, side="right") - 1, 0, len(gr) - 1)
    k1 = np.minimum(k + 1, len(gr) - 1)
    span = gr[k1] - gr[k]
    w = np.where(span > 0, (g - gr[k]) / np.where(span > 0, span, 1.0), 0.0)
    return tab[rows, k] + w * (tab[rows, k1] - tab[rows, k])


def _reply_grid(n: int, hi: int, step: int) -> tuple[int, ...]:
    """Where ``prepare`` tabulates the reply-reading model for a reply of ``n`` tokens: 1, then
    every ``step`` tokens below ``min(n, hi)`` (past the reply's end the request is done)."""
    return (1, *range(step, min(n, hi), step))


def _floor_to_grid(g: np.ndarray, step: int) -> np.ndarray:
    """The point of ``_reply_grid`` that ``update`` reads at each ``g`` (>= 1, inside it)."""
    return np.maximum((np.asarray(g) // step) * step, 1.0)


def _lengths(requests: Sequence[Request]) -> np.ndarray:
    return np.asarray([r.true_output_tokens for r in requests], dtype=np.float64)


def _group(r: Request) -> int:
    return r.conversation_id if r.conversation_id >= 0 else -1 - r.request_id


def _content(requests: Sequence[Request]) -> tuple:
    """What a request's memo entry depends on: id, prompt, reply ids and output limit."""
    return tuple(
        (
            r.request_id,
            r.num_prompt_tokens,
            r.max_output_tokens,
            None if r.prompt_token_ids is None else hash(tuple(r.prompt_token_ids)),
            None if r.output_token_ids is None else hash(tuple(r.output_token_ids)),
        )
        for r in requests
    )

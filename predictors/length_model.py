"""The learned predictor's model: prompt features -> a location-scale distribution of log length.

Pipeline (all scikit-learn, fitted by ``LengthModel.fit``)::

    last user turn --hashed word 1..n-grams, TF-IDF--> ridge on log(length) ----------+
    previous reply  --hashed word 1..n-grams, TF-IDF--> ridge on log(length) ----------+
    last user turn --TF-IDF without common terms--> k nearest training prompts:       |
                     top similarity, their log lengths (weighted, top-1, top-3) -------+
    numeric features (lengths, turn index, previous reply length, task cues, script) --+
                                                                                       v
        HistGradientBoosting (squared error on log length)  -> location  mu(x)
        HistGradientBoosting (squared error on |residual|)  -> scale     s(x)

The text models and the neighbour index enter the boosted trees as out-of-fold predictions
(folds by conversation), so the trees learn how far to trust them on unseen prompts.
Quantiles are ``exp(mu + s * z_q)`` with ``z_q`` the empirical quantiles of standardised
residuals on a held-out calibration split (see ``LearnedPredictor.fit``): split-conformal in
spirit, so the total-length coverage is right by construction on data like the calibration
split. Why location-scale rather than one quantile model per level: 2 boosted fits instead of
20 at the same measured accuracy, and quantiles that never cross.

The online remaining length has a model of its own (``RemainingModel``), fitted directly on what
it is asked: at every ``remaining_step``-th generated token ``g`` of every fitting request, the
same design row plus ``g`` -> ``log(total - g)``::

        [design, g, log1p(g)]  --HistGradientBoosting, quantile loss at 0.5--> m(x, g)
        [design, g, log1p(g)]  --HistGradientBoosting, squared error on |residual|--> s(x, g)

``exp(m)`` estimates the conditional *median* of the remaining length given the prompt and the
progress, the point that minimises absolute error (what the evaluation scores); conditioning
the total-length distribution on ``total > g`` gets there only as far as its fitted tail is
right. Its quantiles, ``exp(m + s * z_q(g))``, are calibrated per band of ``g`` on the held-out
calibration split (``calibration.ResidualQuantiles``).

When the fitting requests carry their replies' ids, a second ``RemainingModel(text=True)`` adds
``predictors.progress``'s features of the reply's first ``g`` tokens to the same row, sampled at
every ``text_remaining_step``-th token: the text generated so far is what a real engine has when
it re-predicts (an open code block, a numbered list at item k, a concluding phrase); and
``predictors.reply_text``'s stacked models of which tokens the reply holds (ridges on the bag of
its first tokens and of its last ``reply_window`` tokens, its nearest training replies). This
model has trees of its own size (``text_remaining_max_iter``, ``text_remaining_max_leaf_nodes``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from sklearn.ensemble import HistGradientBoostingRegressor
from sklearn.feature_extraction.text import HashingVectorizer, TfidfTransformer
from sklearn.linear_model import Ridge
from sklearn.model_selection import GroupKFold

from horizon.workload.tokenized import DEFAULT_TOKENIZER
from predictors.calibration import progress_points
from predictors.features import NUMERIC_FEATURES, Extracted

MIN_SCALE = 0.05  # floor of s(x), in log units
NEIGHBOUR_FEATURES = ("nn_top_sim", "nn_top_len", "nn_weighted_len", "nn_top3_len", "nn_top3_sim")
PROGRESS_FEATURES = ("generated", "log_generated")  # appended to the design for RemainingModel
# the reply-text model's columns (``predictors.reply_text``, which imports this module)
REPLY_TEXT_FEATURES: tuple[str, ...] = (
    "reply_prefix_ridge",
    *(f"reply_{name}" for name in NEIGHBOUR_FEATURES),
    "reply_window_ridge",
)


@dataclass(frozen=True)
class LearnedSettings:
    """Everything that defines a learned model (stored in the artifact's header).

    Fields:
        seed: the calibration split and the boosted trees' randomness.
        calibration_fraction: share of the training conversations held out to calibrate.
        hash_bits: 2**hash_bits hashed n-gram columns.
        ngram_max: word n-grams 1..ngram_max.
        head_chars, tail_chars: text kept from the start and the end of the last user turn.
        prev_chars: text kept from the start of the previous reply.
        ridge_alpha: the text ridge models' regularisation.
        folds: out-of-fold folds for the stacked text and neighbour features.
        neighbors: k of the nearest-prompt features (0 = off).
        knn_max_df: terms in more than this share of prompts are ignored for similarity.
        max_iter, learning_rate, min_samples_leaf, max_leaf_nodes: the location model's trees
            (the scale model uses a third of the iterations and twice the leaf size).
        calibration_step: remaining-length calibration looks every this many tokens.
        remaining_step: the remaining-length model trains on every this many generated tokens
            of each fitting request.
        remaining_max_iter, remaining_learning_rate, remaining_min_samples_leaf: its location
            trees (its scale trees: a third of the iterations, twice the leaf size).
        text_remaining_step: the same for the model that also reads the reply so far.
        text_remaining_max_iter, text_remaining_max_leaf_nodes: that model's location trees
            (its scale trees: a third of the iterations; leaves as ``remaining_*``).
        reply_window: its window ridge reads the last this many tokens of the reply so far.
        reply_neighbors: k of its nearest-reply-prefix features (0 = off).
        reply_grid_step: ``prepare`` tabulates that model every this many tokens of a request
            that carries its reply ids (``update`` reads the last point at or before ``g``).
        tokenizer: the ``qwen_tokenizer`` name that decodes prompt ids.
    """

    seed: int = 0
    calibration_fraction: float = 0.2
    hash_bits: int = 18
    ngram_max: int = 2
    head_chars: int = 3000
    tail_chars: int = 1000
    prev_chars: int = 1500
    ridge_alpha: float = 3.0
    folds: int = 5
    neighbors: int = 10
    knn_max_df: float = 0.2
    max_iter: int = 300
    learning_rate: float = 0.05
    min_samples_leaf: int = 40
    max_leaf_nodes: int = 31
    calibration_step: int = 16
    remaining_step: int = 48
    remaining_max_iter: int = 200
    remaining_learning_rate: float = 0.1
    remaining_min_samples_leaf: int = 100
    text_remaining_step: int = 32
    text_remaining_max_iter: int = 200
    text_remaining_max_leaf_nodes: int = 63
    reply_window: int = 128
    reply_neighbors: int = 10
    reply_grid_step: int = 16
    tokenizer: str = DEFAULT_TOKENIZER

    def __post_init__(self) -> None:
        ints = {
            "seed": 0, "hash_bits": 10, "ngram_max": 1, "head_chars": 1, "tail_chars": 0,
            "prev_chars": 1, "folds": 2, "neighbors": 0, "max_iter": 1, "min_samples_leaf": 1,
            "max_leaf_nodes": 2, "calibration_step": 1, "remaining_step": 1,
            "remaining_max_iter": 1, "remaining_min_samples_leaf": 1, "text_remaining_step": 1,
            "text_remaining_max_iter": 1, "text_remaining_max_leaf_nodes": 2, "reply_window": 1,
            "reply_neighbors": 0, "reply_grid_step": 1,
        }  # fmt: skip
        for name, lo in ints.items():
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < lo:
                raise ValueError(f"learned: {name} must be an int >= {lo}, got {v!r}")
        for name in (
            "calibration_fraction", "knn_max_df", "learning_rate", "remaining_learning_rate"
        ):  # fmt: skip
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not 0 < v < 1:
                raise ValueError(f"learned: {name} must be in (0, 1), got {v!r}")
        if not isinstance(self.ridge_alpha, (int, float)) or self.ridge_alpha <= 0:
            raise ValueError(f"learned: ridge_alpha must be > 0, got {self.ridge_alpha!r}")

    @property
    def feature_names(self) -> tuple[str, ...]:
        nn = NEIGHBOUR_FEATURES if self.neighbors else ()
        return (*NUMERIC_FEATURES, "ridge_user_text", "ridge_prev_reply", *nn)


def remaining_grid(hi: int) -> tuple[int, ...]:
    """Where ``prepare`` tabulates the remaining model, below ``hi``: 1, every 16 tokens to 64,
    every 32 to 256, every 64 to 512, every 128 to 1024, every 256 beyond (23 points below
    2048; measured on the test split, no coarser in MAE than a table every 16 tokens, and 4x
    cheaper). The grid for a smaller ``hi`` is a prefix of the grid for a larger one."""
    out = [1]
    g = 16
    while g < hi:
        out.append(g)
        g += 16 if g < 64 else 32 if g < 256 else 64 if g < 512 else 128 if g < 1024 else 256
    return tuple(out)


class TextRidge:
    """Hashed word n-grams -> TF-IDF -> ridge regression of log length."""

    def __init__(self, settings: LearnedSettings) -> None:
        self.hasher = HashingVectorizer(
            n_features=2**settings.hash_bits,
            ngram_range=(1, settings.ngram_max),
            alternate_sign=False,
            norm=None,
            dtype=np.float32,
        )
        self.tfidf = TfidfTransformer(sublinear_tf=True)
        self.alpha = settings.ridge_alpha
        self.ridge: Ridge | None = None

    def fit_transform(self, texts: list[str]) -> sp.csr_matrix:
        return self.tfidf.fit_transform(self.hasher.transform(texts)).tocsr()

    def transform(self, texts: list[str]) -> sp.csr_matrix:
        return self.tfidf.transform(self.hasher.transform(texts)).tocsr()

    def fit_oof(
        self, x: sp.csr_matrix, ly: np.ndarray, folds: list[tuple[np.ndarray, np.ndarray]]
    ) -> np.ndarray:
        """Out-of-fold predictions on ``x``; then the final ridge on all of it."""
        oof = np.empty(len(ly))
        for a, b in folds:
            oof[b] = Ridge(alpha=self.alpha).fit(x[a], ly[a]).predict(x[b])
        self.ridge = Ridge(alpha=self.alpha).fit(x, ly)
        return oof

    def predict(self, x: sp.csr_matrix) -> np.ndarray:
        assert self.ridge is not None
        return self.ridge.predict(x)


class NeighbourIndex:
    """Nearest training prompts by cosine similarity over TF-IDF without common terms."""

    def __init__(self, k: int, max_df: float) -> None:
        self.k, self.max_df = k, max_df
        self.keep: np.ndarray | None = None  # column ids used for similarity
        self.ref: sp.csr_matrix | None = None  # (terms x training prompts), rows normalised
        self.ref_ly: np.ndarray | None = None

    def fit_oof(
        self, x: sp.csr_matrix, ly: np.ndarray, folds: list[tuple[np.ndarray, np.ndarray]]
    ) -> np.ndarray:
        df = np.bincount(x.indices, minlength=x.shape[1])
        self.keep = np.flatnonzero((df > 0) & (df <= self.max_df * x.shape[0])).astype(np.int32)
        xn = self._normalised(x)
        oof = np.empty((len(ly), len(NEIGHBOUR_FEATURES)))
        for a, b in folds:
            oof[b] = self._features(xn[b], xn[a].T.tocsr(), ly[a])
        self.ref, self.ref_ly = xn.T.tocsr().astype(np.float32), ly.astype(np.float32)
        return oof

    def features(self, x: sp.csr_matrix) -> np.ndarray:
        assert self.ref is not None and self.ref_ly is not None
        return self._features(self._normalised(x), self.ref, self.ref_ly)

    def _normalised(self, x: sp.csr_matrix) -> sp.csr_matrix:
        xk = x[:, self.keep].tocsr().astype(np.float32)  # float32: top-k is memory-bound
        norms = np.sqrt(np.asarray(xk.multiply(xk).sum(1)).ravel())
        return (sp.diags((1.0 / np.maximum(norms, 1e-12)).astype(np.float32)) @ xk).tocsr()

    def _features(self, q: sp.csr_matrix, ref_t: sp.csr_matrix, ly: np.ndarray) -> np.ndarray:
        k = min(self.k, ref_t.shape[1])
        n = q.shape[0]
        sims = np.zeros((n, k))  # top-k similarities, best first; missing neighbours: 0
        lens = np.full((n, k), float(ly.mean()))  # ... whose lengths count as the mean
        for s in range(0, n, 512):
            block = (q[s : s + 512] @ ref_t).tocsr()  # sparse: top-k over non-zeros only
            for i in range(block.shape[0]):
                a, b = block.indptr[i], block.indptr[i + 1]
                d, cols = block.data[a:b], block.indices[a:b]
                if b - a > k:
                    pick = np.argpartition(-d, k - 1)[:k]
                    d, cols = d[pick], cols[pick]
                order = np.argsort(-d, kind="stable")
                sims[s + i, : len(d)] = d[order]
                lens[s + i, : len(d)] = ly[cols[order]]
        w = sims**2 + 1e-6
        k3 = min(3, k)
        return np.c_[
            sims[:, 0], lens[:, 0], (lens * w).sum(1) / w.sum(1), lens[:, :k3].mean(1),
            sims[:, :k3].mean(1),
        ]  # fmt: skip


class LengthModel:
    """Fitted text models, neighbour index and the two boosted models (module docstring)."""

    def __init__(self, settings: LearnedSettings) -> None:
        self.settings = settings
        self.user_text = TextRidge(settings)
        self.prev_text = TextRidge(settings)
        self.neighbours = NeighbourIndex(settings.neighbors, settings.knn_max_df)
        self.location: HistGradientBoostingRegressor | None = None
        self.scale: HistGradientBoostingRegressor | None = None
        self.remaining: RemainingModel | None = None
        self.remaining_text: RemainingModel | None = None

    def fit(
        self,
        ex: Extracted,
        lengths: np.ndarray,
        groups: np.ndarray,
        reply_features: ReplyFeatures | None = None,
    ) -> LengthModel:
        """Fit on features ``ex`` of requests with true ``lengths``; ``groups``: conversations.

        The remaining-length model is fitted on the same (out-of-fold) design; when
        ``reply_features`` is given (the requests carry their reply ids), a second one that
        also reads the reply generated so far (``remaining_text``)."""
        s = self.settings
        ly = np.log(np.asarray(lengths, dtype=np.float64))
        n_folds = min(s.folds, len(np.unique(groups)))
        folds = list(GroupKFold(n_splits=n_folds).split(ex.numeric, groups=groups))
        xu = self.user_text.fit_transform(ex.user_text)
        xp = self.prev_text.fit_transform(ex.prev_text)
        cols = [ex.numeric, self.user_text.fit_oof(xu, ly, folds)[:, None]]
        cols.append(self.prev_text.fit_oof(xp, ly, folds)[:, None])
        if s.neighbors:
            cols.append(self.neighbours.fit_oof(xu, ly, folds))
        design = np.hstack(cols)
        self.location = self._trees(s.max_iter, s.min_samples_leaf).fit(design, ly)
        resid = np.abs(ly - self.location.predict(design))
        self.scale = self._trees(max(s.max_iter // 3, 1), 2 * s.min_samples_leaf)
        self.scale.fit(design, resid)
        self.remaining = RemainingModel(s).fit(design, lengths)
        self.remaining_text = None
        if reply_features is not None:
            self.remaining_text = RemainingModel(s, text=True).fit(
                design, lengths, reply_features, groups
            )
        return self

    def _trees(self, iters: int, leaf: int) -> HistGradientBoostingRegressor:
        return _trees(self.settings, iters, leaf, self.settings.learning_rate)

    def design(self, ex: Extracted) -> np.ndarray:
        xu = self.user_text.transform(ex.user_text)
        cols = [ex.numeric, self.user_text.predict(xu)[:, None]]
        cols.append(self.prev_text.predict(self.prev_text.transform(ex.prev_text))[:, None])
        if self.settings.neighbors:
            cols.append(self.neighbours.features(xu))
        return np.hstack(cols)

    def location_scale(self, ex: Extracted) -> tuple[np.ndarray, np.ndarray]:
        """``(mu, s)`` of log length per request."""
        return self.total_location_scale(self.design(ex))

    def total_location_scale(self, design: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(mu, s)`` of log total length per design row."""
        assert self.location is not None and self.scale is not None
        return self.location.predict(design), np.maximum(self.scale.predict(design), MIN_SCALE)


@dataclass(frozen=True, eq=False)
class ReplyFeatures:
    """What the reply-reading model sees of a batch of requests' replies: ``outs[i]`` is
    request ``i``'s reply ids (None: none), ``progress(rows, g)`` the ``TEXT_PROGRESS_FEATURES``
    of ``outs[rows[j]][:g[j]]`` per point (NaN rows for None)."""

    outs: Sequence
    progress: Callable[[np.ndarray, np.ndarray], np.ndarray]


class RemainingModel:
    """(design row, tokens generated g[, features of the reply's first g tokens]) -> location
    and scale of log remaining length (module docstring). Trained on every
    ``remaining_step``-th token ``g < total`` (``text_remaining_step`` with ``text``); a
    ``text`` model also owns the ``reply_text.ReplyTextModel`` whose predictions it reads."""

    def __init__(self, settings: LearnedSettings, text: bool = False) -> None:
        self.settings = settings
        self.text = text
        self.location: HistGradientBoostingRegressor | None = None
        self.scale: HistGradientBoostingRegressor | None = None
        self.reply_text = None  # reply_text.ReplyTextModel of a text model, once fitted

    def fit(
        self,
        design: np.ndarray,
        lengths: np.ndarray,
        reply: ReplyFeatures | None = None,
        groups: np.ndarray | None = None,
    ) -> RemainingModel:
        """Fit on design rows of requests with true ``lengths``; a ``text`` model needs the
        requests' ``reply`` and conversation ``groups`` (the reply-text folds)."""
        from predictors.reply_text import ReplyTextModel  # imports this module

        s = self.settings
        lengths = np.asarray(lengths, dtype=np.float64)
        step = s.text_remaining_step if self.text else s.remaining_step
        rows, g = progress_points(lengths, step)
        x = with_progress(design[rows], g)
        it, leaf, nodes = s.remaining_max_iter, s.remaining_min_samples_leaf, s.max_leaf_nodes
        if self.text:
            assert reply is not None and groups is not None
            has = np.asarray([o is not None for o in reply.outs])
            text = np.full((len(rows), len(REPLY_TEXT_FEATURES)), np.nan)
            sel = has[rows]
            idx = np.flatnonzero(has)
            local = np.cumsum(has) - 1  # request index -> index among those with replies
            self.reply_text = ReplyTextModel(
                s.reply_window, s.ridge_alpha, s.reply_neighbors, s.knn_max_df, s.folds
            )
            text[sel] = self.reply_text.fit_oof(
                [reply.outs[i] for i in idx], lengths[idx], np.asarray(groups)[idx],
                local[rows[sel]], g[sel],
            )  # fmt: skip
            x = np.c_[x, reply.progress(rows, g), text]
            it, nodes = s.text_remaining_max_iter, s.text_remaining_max_leaf_nodes
        lr = np.log(lengths[rows] - g)
        rate = s.remaining_learning_rate
        self.location = _trees(s, it, leaf, rate, nodes, loss="quantile", quantile=0.5)
        self.location.fit(x, lr)
        resid = np.abs(lr - self.location.predict(x))
        self.scale = _trees(s, max(it // 3, 1), 2 * leaf, rate, nodes).fit(x, resid)
        return self

    def location_scale(
        self,
        design: np.ndarray,
        g: np.ndarray,
        reply: ReplyFeatures | None = None,
        rows: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(m, s)`` of log remaining length for design rows after ``g`` tokens (aligned);
        ``text`` models also need the ``reply`` and, per design row, the index of its request
        in it (``rows``: ``reply.outs[rows[j]][:g[j]]`` is what row ``j`` reads)."""
        assert self.location is not None and self.scale is not None
        g = np.asarray(g, dtype=np.float64)
        x = with_progress(design, g)
        if self.text:
            assert reply is not None and rows is not None and self.reply_text is not None
            rows = np.asarray(rows)
            has = np.asarray([reply.outs[i] is not None for i in rows.tolist()], dtype=bool)
            text = np.full((len(rows), len(REPLY_TEXT_FEATURES)), np.nan)
            if has.any():
                text[has] = self.reply_text.features(reply.outs, rows[has], g[has])
            x = np.c_[x, reply.progress(rows, g), text]
        return self.location.predict(x), np.maximum(self.scale.predict(x), MIN_SCALE)


def with_progress(design: np.ndarray, g: np.ndarray) -> np.ndarray:
    """Design rows with the ``PROGRESS_FEATURES`` columns of ``g`` appended."""
    return np.c_[design, g, np.log1p(g)]


def _trees(
    s: LearnedSettings,
    iters: int,
    leaf: int,
    rate: float,
    nodes: int | None = None,
    **loss: object,
) -> HistGradientBoostingRegressor:
    return HistGradientBoostingRegressor(
        max_iter=iters,
        learning_rate=rate,
        max_leaf_nodes=s.max_leaf_nodes if nodes is None else nodes,
        min_samples_leaf=leaf,
        early_stopping=False,
        random_state=s.seed,
        **loss,  # type: ignore[arg-type]
    )

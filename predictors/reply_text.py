"""Stacked text features of the reply generated so far, for the remaining-length model.

``progress`` counts structure (lines, items, fences, ...); this module reads *which* tokens the
reply has produced, as bags of hashed token ids and id bigrams (no decoding), through three
fitted models whose predictions become columns of ``RemainingModel(text=True)``::

    first c tokens of the reply (c = 16, 32, 64, 128, 256: the largest c <= g)
        --TF-IDF--> ridge on log(total length)                      -> "reply_prefix_ridge"
        --TF-IDF, no common terms--> k nearest training replies' prefixes:
              top similarity, their log lengths (top-1, weighted, top-3), top-3 similarity
                                                                      -> "reply_nn_*"
    last ``window`` tokens before g (ids), last ``TAIL`` tokens (ids and id bigrams)
        --TF-IDF--> ridge on log(remaining length)                  -> "reply_window_ridge"

The prefix models of checkpoint ``c`` are fitted on the training replies longer than ``c`` (the
ones that reach it) and give NaN while ``g < 16``; the window ridge is fitted on the same
``(request, g)`` points as the remaining model. As for the prompt's text models, the training
points get out-of-fold predictions (folds by conversation), so the boosted trees learn how far
to trust them on unseen replies.

No leakage by construction: the row for ``(request, g)`` reads ``ids[:c]`` with ``c <= g`` and
``ids[g - window : g]`` only (tests perturb ``ids[g:]``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import scipy.sparse as sp
from sklearn.feature_extraction.text import TfidfTransformer
from sklearn.linear_model import Ridge
from sklearn.model_selection import GroupKFold

from predictors.length_model import REPLY_TEXT_FEATURES, NeighbourIndex

CHECKPOINTS: tuple[int, ...] = (16, 32, 64, 128, 256)
HASH_BITS = 18
TAIL = 12  # the window ridge also reads the id bigrams of the reply's last TAIL tokens
_BIGRAM_MUL = 1000003  # id bigram (a, b) -> a * _BIGRAM_MUL + b, then hashed like an id


def id_bag(
    outs: Sequence, rows: np.ndarray, lo: np.ndarray, hi: np.ndarray, bigrams: bool = True
) -> sp.csr_matrix:
    """Counts of hashed ids (and id bigrams) of ``outs[rows[i]][lo[i]:hi[i]]``, one row per
    point (``2**HASH_BITS`` columns; a bigram never spans the slice's ends)."""
    nb = 1 << HASH_BITS
    parts, ptr = [], [0]
    for r, a, b in zip(rows.tolist(), lo.tolist(), hi.tolist(), strict=True):
        ids = np.asarray(outs[r][a:b], dtype=np.int64)
        cols = ids % nb
        if bigrams and len(ids) > 1:
            cols = np.r_[cols, (ids[:-1] * _BIGRAM_MUL + ids[1:]) % nb]
        parts.append(cols)
        ptr.append(ptr[-1] + len(cols))
    idx = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    x = sp.csr_matrix(
        (np.ones(len(idx), np.float32), idx.astype(np.int32), np.asarray(ptr)),
        shape=(len(ptr) - 1, nb),
    )
    x.sum_duplicates()
    return x


def checkpoint_of(g: np.ndarray) -> np.ndarray:
    """The largest ``CHECKPOINTS`` entry ``<= g`` per point (0 where ``g < CHECKPOINTS[0]``)."""
    ck = np.asarray((0, *CHECKPOINTS))
    return ck[np.searchsorted(ck, np.asarray(g), side="right") - 1]


class _Ridge:
    """TF-IDF (sublinear tf) + ridge, with out-of-fold predictions for its training rows."""

    def __init__(self, alpha: float) -> None:
        self.alpha = alpha
        self.tfidf = TfidfTransformer(sublinear_tf=True)
        self.ridge: Ridge | None = None

    def fit_oof(self, x: sp.csr_matrix, t: np.ndarray, folds: list) -> np.ndarray:
        x = self.tfidf.fit_transform(x)
        oof = np.empty(len(t))
        for a, b in folds:
            oof[b] = Ridge(alpha=self.alpha, solver="sparse_cg").fit(x[a], t[a]).predict(x[b])
        self.ridge = Ridge(alpha=self.alpha, solver="sparse_cg").fit(x, t)
        return oof

    def predict(self, x: sp.csr_matrix) -> np.ndarray:
        assert self.ridge is not None
        return self.ridge.predict(self.tfidf.transform(x))


class ReplyTextModel:
    """The prefix ridges and neighbour indexes per checkpoint, and the window ridge (module
    docstring). ``fit_oof`` on training points, then ``features`` on any points."""

    def __init__(
        self, window: int, alpha: float, neighbors: int, max_df: float, folds: int
    ) -> None:
        self.window, self.alpha, self.neighbors, self.max_df = window, alpha, neighbors, max_df
        self.folds = folds
        self.prefix: dict[int, _Ridge] = {}
        self.nn: dict[int, NeighbourIndex] = {}
        self.window_ridge = _Ridge(alpha)

    def fit_oof(
        self,
        outs: Sequence,
        lengths: np.ndarray,
        groups: np.ndarray,
        rows: np.ndarray,
        g: np.ndarray,
    ) -> np.ndarray:
        """Out-of-fold ``REPLY_TEXT_FEATURES`` at the training points ``(rows, g)`` of requests
        with reply ids ``outs`` (all present), true ``lengths`` and conversation ``groups``."""
        lengths = np.asarray(lengths, dtype=np.float64)
        out = np.full((len(rows), len(REPLY_TEXT_FEATURES)), np.nan)
        ck = checkpoint_of(g)
        for c in CHECKPOINTS:
            reach = np.flatnonzero(lengths > c)
            n_folds = min(self.folds, len(np.unique(groups[reach])))
            if n_folds < 2:
                continue
            x = id_bag(outs, reach, np.zeros(len(reach), np.int64), np.full(len(reach), c))
            folds = list(GroupKFold(n_splits=n_folds).split(x, groups=groups[reach]))
            ly = np.log(lengths[reach])
            per_request = np.full((len(lengths), len(REPLY_TEXT_FEATURES) - 1), np.nan)
            self.prefix[c] = _Ridge(self.alpha)
            per_request[reach, 0] = self.prefix[c].fit_oof(x, ly, folds)
            if self.neighbors:
                self.nn[c] = NeighbourIndex(self.neighbors, self.max_df)
                xt = self.prefix[c].tfidf.transform(x)
                per_request[reach, 1:] = self.nn[c].fit_oof(xt, ly, folds)
            sel = ck == c
            out[sel, :-1] = per_request[rows[sel]]
        x = self._window_bag(outs, rows, g)
        n_folds = min(self.folds, len(np.unique(groups[rows])))
        folds = list(GroupKFold(n_splits=n_folds).split(x, groups=groups[rows]))
        out[:, -1] = self.window_ridge.fit_oof(x, np.log(lengths[rows] - g), folds)
        return out

    def features(self, outs: Sequence, rows: np.ndarray, g: np.ndarray) -> np.ndarray:
        """``REPLY_TEXT_FEATURES`` at points ``(rows, g)``: ``outs[rows[i]]`` are the reply ids
        (only ``[:g]`` is read). One prefix bag per (request, checkpoint), not per point."""
        rows, g = np.asarray(rows), np.asarray(g)
        out = np.full((len(rows), len(REPLY_TEXT_FEATURES)), np.nan)
        ck = checkpoint_of(g)
        for c in CHECKPOINTS:
            sel = np.flatnonzero(ck == c)
            if not len(sel) or c not in self.prefix:
                continue
            uniq, inv = np.unique(rows[sel], return_inverse=True)
            x = id_bag(outs, uniq, np.zeros(len(uniq), np.int64), np.full(len(uniq), c))
            out[sel, 0] = self.prefix[c].predict(x)[inv]
            if c in self.nn:
                out[sel, 1:-1] = self.nn[c].features(self.prefix[c].tfidf.transform(x))[inv]
        if len(rows):
            out[:, -1] = self.window_ridge.predict(self._window_bag(outs, rows, g))
        return out

    def _window_bag(self, outs: Sequence, rows: np.ndarray, g: np.ndarray) -> sp.csr_matrix:
        """Ids of the last ``window`` tokens before ``g``, next to the ids and bigrams of the
        last ``TAIL`` (the line being written)."""
        hi = np.asarray(g, dtype=np.int64)
        wide = id_bag(outs, rows, np.maximum(hi - self.window, 0), hi, bigrams=False)
        return sp.hstack([wide, id_bag(outs, rows, np.maximum(hi - TAIL, 0), hi)]).tocsr()

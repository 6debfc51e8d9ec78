"""The co-located steps' own part as a cost model, and its slice counts: simulator variant (d).

A co-located step's measured time is its own part plus whole slices of its busy neighbours'
steps (``simulator.device_sharing``'s ``timeslice`` rule). Here the own part is fitted to the
engine's co-located steps themselves, with the engine cost model's physical terms (graph
intercepts, decodes and decode context; padded and real tokens, attention pairs and context
read including a cached prefix, chunks, context per decode), and the slice count of a step
with prefill chunks is drawn from the measured distribution of counts at its own part's
predicted time. Fitted by alternating (``fit_own``): with the current own-part model, each
step's slice count is ``round((measured - own) / neighbours' slices)`` (1 for decode-only
steps, 1-4 for mixed ones), its measured own part ``measured - count * neighbours' slices``,
and the model is fitted again to those own parts (every step with a busy neighbour in the
training cases); the neighbours' slices are their own parts (modelled) over their counts.

Folds (``FOLDS``), so that no case is judged by a model fitted to it unless labelled so:
``without_load<i>`` fitted to the cases at the other two loads of every (N, workload) grid
(judged on load ``i``: leave one load out), ``without_<workload>`` fitted to the other
workload's cases only (leave one workload out), ``all`` fitted to every case (in-sample).
"""

from __future__ import annotations

import numpy as np

from simulator.device_sharing import MAX_SLICES, SLICE_EDGES_S
from simulator.engine_cost_model import _fill_intercepts, _fit_mape

FOLDS = (
    "all",
    "without_load0",
    "without_load1",
    "without_load2",
    "without_sessions",
    "without_shared_prefix",
)
ROUNDS = 1  # label-and-fit rounds (more drift: a lower own part with more slices fits as well)
DECODE_SAMPLE = 40_000  # decode-only steps per fold in the fit (seeded; they are alike)


def fold_mask(x: dict, fold: str) -> np.ndarray:
    """The steps a fold is fitted to (``x``: ``experiments.cluster_fidelity.sharing_samples``)."""
    if fold == "all":
        return np.ones(len(x["dur"]), dtype=bool)
    if fold.startswith("without_load"):
        return x["load_index"] != int(fold[len("without_load") :])
    if fold == "without_sessions":
        return ~x["sessions"].astype(bool)
    if fold == "without_shared_prefix":
        return x["sessions"].astype(bool)
    raise ValueError(f"fold {fold!r}: known {FOLDS}")


def neighbour_slices(x: dict, own, counts):  # noqa: ANN001, ANN201 - ndarrays
    """Each step's sum over its busy neighbours of their own part per slice."""
    o = x["others"]
    per = own / counts
    return np.where(o >= 0, per[np.maximum(o, 0)], 0.0).sum(axis=1)


def label_counts(x: dict, own, counts):  # noqa: ANN001, ANN201
    """Slice counts measured against an own-part model: decode-only steps 1, mixed steps
    ``clip(round((measured - own) / neighbours' slices), 1, MAX_SLICES)`` (1 without a busy
    neighbour); and those neighbours' slices."""
    per = neighbour_slices(x, own, counts)
    mixed = x["rows"][:, 0] > 0
    raw = (x["dur"] - own) / np.where(per > 0, per, np.inf)
    lab = np.where(mixed, np.clip(np.round(raw), 1, MAX_SLICES), 1.0)
    return lab, per


def settle_counts(x: dict, own, counts, iterations: int = 8):  # noqa: ANN001, ANN201
    """``label_counts`` repeated: a step's count depends on its neighbours' (their slices are
    their own parts over their counts), so relabel until the counts stop changing (at most
    ``iterations`` times). Returns (counts, neighbours' slices)."""
    for _ in range(iterations):
        new, per = label_counts(x, own, counts)
        if np.array_equal(new, counts):
            break
        counts = new
    return new, per


def fit_own(x: dict, train, rounds: int = ROUNDS) -> tuple:  # noqa: ANN001
    """The own-part model (an ``EngineCostModel``) fitted to the ``train`` steps with a busy
    neighbour; returns (model, each step's modelled own part, each step's slice count).

    A step's time is ``f_i . c + n_i * sum_j f_j . c / n_j`` (``f``: the engine model's terms
    of its regime, ``j`` its busy neighbours), linear in the coefficients ``c`` of both regimes
    at once, so with the slice counts ``n`` fixed one least-MAPE fit (non-negative) gives every
    coefficient; fitting each step's own part alone instead (its time less the modelled
    neighbours') oscillates, as each replica's own part is every other's neighbour. The counts
    are then measured against the new model and the fit repeated (``rounds`` times).

    The split of a mixed step's time into own part and slices is anchored by the first
    counts, measured against the isolated model (``x["pred"]``): a start off by about a
    neighbour's slice can settle on counts one higher and own parts a slice lower, which fit
    the times as well (seen on the engine's steps with more rounds), hence ``ROUNDS = 1``."""
    from simulator.engine_cost_model import Buckets, EngineCostModel, features

    buckets = Buckets(256, 2048)
    mixed, dec, mix = features(x["rows"], buckets)
    f = np.concatenate([dec * ~mixed[:, None], mix * mixed[:, None]], axis=1)
    nd = dec.shape[1]
    busy = (x["others"] >= 0).any(axis=1)
    sel = np.flatnonzero(train & busy & ((x["rows"][:, 0] + x["rows"][:, 1]) > 0))
    dsel = sel[~mixed[sel]]
    if len(dsel) > DECODE_SAMPLE:
        keep = np.random.default_rng(0).choice(dsel, DECODE_SAMPLE, replace=False)
        sel = np.sort(np.concatenate([sel[mixed[sel]], keep]))
    own, counts = x["pred"].copy(), np.ones(len(x["pred"]))
    model = None
    for _ in range(rounds):
        counts, _ = settle_counts(x, own, counts)
        z = f[sel].copy()
        for c in range(x["others"].shape[1]):
            j = x["others"][sel, c]
            ok = j >= 0
            z[ok] += counts[sel][ok, None] * f[j[ok]] / counts[j[ok], None]
        coef = _fit_mape(z, x["dur"][sel], nonneg=True)
        seen = np.asarray(dec[sel][~mixed[sel]].any(axis=0))[: len(buckets.decode)]
        dcoef = _fill_intercepts(coef[:nd], seen, buckets.decode)
        model = EngineCostModel(tuple(map(float, dcoef)), tuple(map(float, coef[nd:])), buckets)
        own = model.predict_rows(x["rows"])
    counts, _ = settle_counts(x, own, counts)
    return model, own, counts


def fit_slice_counts(x: dict, train, own, counts) -> list[list[float]]:  # noqa: ANN001
    """Per own-time bin (``SLICE_EDGES_S``), the share of each slice count 1..MAX_SLICES among
    the ``train`` steps with prefill chunks and a busy neighbour (add-one smoothed)."""
    busy = (x["others"] >= 0).any(axis=1)
    sel = train & busy & (x["rows"][:, 0] > 0)
    b = np.digitize(own[sel], SLICE_EDGES_S)
    out = []
    for i in range(len(SLICE_EDGES_S) + 1):
        c = np.bincount(counts[sel][b == i].astype(int), minlength=MAX_SLICES + 1)[1:] + 1.0
        out.append([round(float(v), 5) for v in c / c.sum()])
    return out


def fit_fold(x: dict, fold: str) -> dict:
    """One fold's own-part coefficients and slice-count table, and how it fits its steps."""
    train = fold_mask(x, fold)
    model, own, counts = fit_own(x, train)
    probs = fit_slice_counts(x, train, own, counts)
    return {
        "fold": fold,
        "steps": int(train.sum()),
        "decode_coef": list(model.decode_coef),
        "mixed_coef": list(model.mixed_coef),
        "slice_probs": probs,
        "own_over_isolated_median": _own_ratios(x, own),
    }


def fit_colocated(engine_root, source: str) -> dict:  # noqa: ANN001 - Path
    """Every fold's fit over the co-located engine records under ``engine_root/n<N>/<case>/``
    (the file ``simulator.colocated_cost_model`` reads), with a replay of each fold on its
    held-out steps (``replay``)."""
    from experiments.cluster_fidelity import sharing_samples

    x = sharing_samples(engine_root)
    folds, replays = [], []
    for fold in FOLDS:
        doc = fit_fold(x, fold)
        folds.append(doc)
        held = ~fold_mask(x, fold) if fold != "all" else fold_mask(x, fold)
        replays.extend(replay_fold(x, doc, held))
    return {
        "rule": "a step ends at start + own + n * sum_j own_j / n_j over the other replicas' "
        "steps j in flight at submission; own: this fit's engine-model terms; n = 1 for "
        "decode-only steps, else drawn from slice_probs[bin of own in slice_edges_s]",
        "source": source,
        "buckets": {"max_num_seqs": 256, "max_num_batched_tokens": 2048},
        "slice_edges_s": list(SLICE_EDGES_S),
        "folds": folds,
        "replay": replays,
    }


def replay_fold(x: dict, doc: dict, held) -> list[dict]:  # noqa: ANN001
    """The fold's rule on the engine's own neighbours, over the ``held`` steps with a busy
    neighbour, per N, workload and step kind: step-time quantiles and the share over the ITL
    SLO, engine against model (slice counts drawn, seed 0)."""
    from experiments.cluster_fidelity import SLO_ITL
    from simulator.engine_cost_model import Buckets, EngineCostModel

    model = EngineCostModel(tuple(doc["decode_coef"]), tuple(doc["mixed_coef"]), Buckets(256, 2048))
    own = model.predict_rows(x["rows"])
    mixed = x["rows"][:, 0] > 0
    cum = np.cumsum(np.array(doc["slice_probs"]), axis=1)[np.digitize(own, SLICE_EDGES_S)]
    u = np.random.default_rng(0).random(len(own))
    n = np.where(mixed, np.minimum(1 + (u[:, None] > cum).sum(axis=1), MAX_SLICES), 1)
    t = own + n * neighbour_slices(x, own, n)
    busy = (x["others"] >= 0).any(axis=1)
    out = []
    for nn in sorted(set(x["n"].tolist())):
        for s, w in ((True, "sessions"), (False, "shared_prefix")):
            for kind, ks in (("decode", ~mixed), ("mixed", mixed)):
                m = held & busy & ks & (x["n"] == nn) & (x["sessions"] == s)
                if not m.any():
                    continue
                q = (0.5, 0.9, 0.99)
                out.append(
                    {
                        "fold": doc["fold"],
                        "n": nn,
                        "workload": w,
                        "kind": kind,
                        "steps": int(m.sum()),
                        "engine_ms": [round(1e3 * v, 2) for v in np.quantile(x["dur"][m], q)],
                        "model_ms": [round(1e3 * v, 2) for v in np.quantile(t[m], q)],
                        "engine_over_itl_slo": round(float((x["dur"][m] > SLO_ITL).mean()), 4),
                        "model_over_itl_slo": round(float((t[m] > SLO_ITL).mean()), 4),
                    }
                )
    return out


def _own_ratios(x: dict, own) -> dict:  # noqa: ANN001
    mixed = x["rows"][:, 0] > 0
    out = {}
    for n in sorted(set(x["n"].tolist())):
        for s, w in ((True, "sessions"), (False, "shared_prefix")):
            for kind, sel in (("decode", ~mixed), ("mixed", mixed)):
                m = sel & (x["n"] == n) & (x["sessions"] == s)
                out[f"n{n}_{w}_{kind}"] = round(float(np.median(own[m] / x["pred"][m])), 4)
    return out

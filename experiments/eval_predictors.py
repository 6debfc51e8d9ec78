"""Train the learned output-length predictor and evaluate every predictor on held-out ShareGPT.

    python -m experiments.eval_predictors [--quick] [--out DIR] [--seed 0] [--threads 1]
                                          [--train-fraction 1.0]

Requests are every answered turn of the packaged ShareGPT conversations (chat history as the
prompt), split 80/20 by conversation (``predictors.dataset``). The predictors are built from
``configs/predictor/*.yaml``; those that learn are fitted on the train split, and the learned
one's artifact is saved as ``OUT/learned.joblib`` (its path is in the output). On the test split:

- TOTAL length: MAE of the median, Spearman rank correlation, coverage per quantile level
  (share of requests whose truth is <= the predicted quantile);
- REMAINING length at every 16th generated token (g = 0, 16, ... < true) of every test request,
  through ``update(request, g)``: the same scores, and MAE per band of g.

``prompt_length`` (output quantiles per prompt-length bin, carried forward: max(q - g, 1)) is
the baseline. Writes into OUT (default ``results/runs/eval_predictors``): ``learned.joblib``
(+ ``.json`` header), ``eval_predictors.json`` (everything), ``calibration_total.png``,
``calibration_remaining.png``, ``mae_remaining_vs_g.png``. Prints a table and, as its LAST line,
one JSON object (keys in ``summary``). ``--quick`` uses 3,000 conversations (~30 s; full: ~5 min).
``--train-fraction F`` fits on a seeded share ``F`` of the training conversations and tests on the
same test split: a learning curve, i.e. what more data would buy.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import yaml
from tqdm import tqdm

from experiments import compact_json
from experiments.figure_style import save
from horizon.workload import load_sharegpt, tokenize_corpus
from predictors import make_predictor
from predictors.dataset import RequestSplit, SplitConfig, split_by_conversation, split_requests
from predictors.evaluation import mae_by_progress, remaining_cases, score

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs" / "predictor"
ORDER = ("prompt_length", "mean", "learned", "noisy_oracle", "oracle")
BASELINE, LEARNED = "prompt_length", "learned"


def load_configs(threads: int) -> dict[str, dict]:
    """``name -> options`` from ``configs/predictor/*.yaml`` (the learned one's threads set)."""
    out = {}
    for path in sorted(CONFIGS.glob("*.yaml")):
        cfg = yaml.safe_load(path.read_text())
        out[cfg["name"]] = dict(cfg.get("options") or {})
    if LEARNED in out:
        out[LEARNED]["threads"] = threads
    return out


def evaluate(name: str, predictor, split, step: int, out_dir: Path) -> dict:
    """Fit (timed), save the learned artifact, score totals and remaining lengths on ``test``."""
    test = split.test
    t0 = time.perf_counter()
    predictor.fit(split.train, data=split.info)
    fit_s = time.perf_counter() - t0
    row: dict = {"name": name, "fit_s": round(fit_s, 2)}
    if name == LEARNED:
        row["artifact"] = predictor.save(out_dir / "learned.joblib")
    t0 = time.perf_counter()
    predictor.prepare(test)
    row["prepare_s"] = round(time.perf_counter() - t0, 3)
    total = score([predictor.predict(r) for r in test], [r.true_output_tokens for r in test])
    t0 = time.perf_counter()
    dists, truth, g = remaining_cases(predictor, test, step)
    row["update_us"] = round((time.perf_counter() - t0) / len(truth) * 1e6, 2)
    remaining = score(dists, truth)
    row.update(total.as_dict("total"))
    row.update(remaining.as_dict("remaining"))
    row["remaining_mae_by_g"] = mae_by_progress(dists, truth, g)
    row["predict_us"] = _predict_us(predictor, test)
    return row


def _predict_us(predictor, requests) -> float:  # noqa: ANN001
    sample = requests[: min(len(requests), 2000)]
    t0 = time.perf_counter()
    for r in sample:
        predictor.predict(r)
    return round((time.perf_counter() - t0) / len(sample) * 1e6, 2)


def plot(rows: dict[str, dict], out_dir: Path) -> list[str]:
    """The three figures; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for kind in ("total", "remaining"):
        fig, ax = plt.subplots(figsize=(5, 5))
        ax.plot([0, 1], [0, 1], color="grey", lw=1, ls="--", label="calibrated")
        for name, row in rows.items():
            cov = row[f"{kind}_coverage"]
            ax.plot([float(q) for q in cov], list(cov.values()), marker=".", label=name)
        ax.set(xlabel="quantile level", ylabel="share of truths <= predicted quantile",
               title=f"Calibration, {kind} length", xlim=(0, 1), ylim=(0, 1))  # fmt: skip
        ax.legend(fontsize=8)
        path = out_dir / f"calibration_{kind}.png"
        save(fig, path, dpi=120, tight=True)
        plt.close(fig)
        written.append(str(path))
    fig, ax = plt.subplots(figsize=(6, 4))
    for name in (LEARNED, BASELINE, "mean"):
        if name in rows:
            bins = rows[name]["remaining_mae_by_g"]
            ax.plot([b["g_lo"] for b in bins], [b["mae"] for b in bins], marker="o", label=name)
    for b in rows[BASELINE]["remaining_mae_by_g"]:  # points per band: the tail bands are thin
        ax.annotate(f"n={b['n']}", (b["g_lo"], 0), xytext=(0, 4), textcoords="offset points",
                    fontsize=6, rotation=90, xycoords=("data", "axes fraction"))  # fmt: skip
    ax.set(xlabel="tokens generated g (bin start)", ylabel="MAE of remaining length (tokens)",
           title="Remaining-length error vs progress")  # fmt: skip
    ax.legend()
    path = out_dir / "mae_remaining_vs_g.png"
    save(fig, path, dpi=120, tight=True)
    plt.close(fig)
    written.append(str(path))
    return written


def summary(rows: dict[str, dict], split_info: dict, n_points: int) -> dict:
    learned, base = rows[LEARNED], rows[BASELINE]
    return {
        "mae_remaining": round(learned["remaining_mae"], 2),
        "mae_remaining_baseline": round(base["remaining_mae"], 2),
        "mae_ratio": round(base["remaining_mae"] / learned["remaining_mae"], 3),
        "spearman_total": round(learned["total_spearman"], 4),
        "coverage_q90_total": round(learned["total_coverage"]["0.9"], 4),
        "coverage_q90_remaining": round(learned["remaining_coverage"]["0.9"], 4),
        "coverage_q50_total": round(learned["total_coverage"]["0.5"], 4),
        "coverage_q50_remaining": round(learned["remaining_coverage"]["0.5"], 4),
        "mae_remaining_mean": round(rows["mean"]["remaining_mae"], 2) if "mean" in rows else None,
        "mae_total": round(learned["total_mae"], 2),
        "mae_total_baseline": round(base["total_mae"], 2),
        "spearman_total_baseline": round(base["total_spearman"], 4),
        "n_train_requests": split_info["train_requests"],
        "n_test_requests": split_info["test_requests"],
        "n_remaining_points": n_points,
        "artifact": learned["artifact"],
        "fit_s": learned["fit_s"],
        "prepare_s": learned["prepare_s"],
        "predict_us": learned["predict_us"],
        "update_us": learned["update_us"],
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="3,000 conversations")
    ap.add_argument("--out", default=str(REPO / "results" / "runs" / "eval_predictors"))
    ap.add_argument("--seed", type=int, default=0, help="train/test split and model seed")
    ap.add_argument("--threads", type=int, default=1, help="learned: OpenMP/BLAS threads")
    ap.add_argument("--step", type=int, default=16, help="remaining length every STEP tokens")
    ap.add_argument("--cache", default=str(REPO / "data" / "cache" / "sharegpt_qwen2.npz"))
    ap.add_argument(
        "--train-fraction",
        type=float,
        default=1.0,
        help="fit on this share of the training conversations (seeded by --seed): a learning curve",
    )
    args = ap.parse_args(argv)
    if not 0 < args.train_fraction <= 1:
        ap.error(f"--train-fraction must be in (0, 1], got {args.train_fraction}")
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)

    tokenized = tokenize_corpus(load_sharegpt(), args.cache)
    split_cfg = SplitConfig(seed=args.seed, max_conversations=3000 if args.quick else None)
    split = train_share(split_requests(tokenized, split_cfg), args.train_fraction, args.seed)
    configs = load_configs(args.threads)
    if LEARNED in configs:
        configs[LEARNED]["seed"] = args.seed
    rows: dict[str, dict] = {}
    names = sorted(configs, key=lambda n: ORDER.index(n) if n in ORDER else len(ORDER))
    for name in tqdm(names, desc="predictors (fit + score)", disable=None, file=sys.stderr):
        predictor = make_predictor(name, **configs[name])
        rows[name] = evaluate(name, predictor, split, args.step, out_dir)
        rows[name]["options"] = configs[name]
    n_points = rows[BASELINE]["remaining_n"]
    figures = plot(rows, out_dir)
    out = summary(rows, split.info, n_points)
    everything = {"summary": out, "split": split.info, "predictors": rows, "figures": figures}
    doc = compact_json.dumps(_no_nan(everything), sort_keys=False)
    (out_dir / "eval_predictors.json").write_text(doc)
    _print_table(rows)
    print(json.dumps(out))
    return out


def train_share(split: RequestSplit, fraction: float, seed: int) -> RequestSplit:
    """``split`` with its train part cut to a seeded ``fraction`` of its conversations (whole
    conversations; the test part unchanged). ``info`` records the share and the count."""
    if not 0 < fraction <= 1:
        raise ValueError(f"--train-fraction must be in (0, 1], got {fraction!r}")
    if fraction == 1:
        return split
    _, kept = split_by_conversation(split.train, fraction, seed)
    info = {**split.info, "train_fraction": fraction, "train_requests": len(kept)}
    return replace(split, train=tuple(kept), info=info)


def _no_nan(x):  # noqa: ANN001, ANN202 - strict JSON: NaN (e.g. a constant's rho) -> null
    if isinstance(x, float) and np.isnan(x):
        return None
    if isinstance(x, dict):
        return {k: _no_nan(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_no_nan(v) for v in x]
    return x


def _print_table(rows: dict[str, dict]) -> None:
    head = (
        f"{'predictor':>14} {'fit s':>6} | {'total MAE':>9} {'rho':>6} {'q50':>5} {'q90':>5} | "
        f"{'remain MAE':>10} {'q50':>5} {'q90':>5} | {'update us':>9}"
    )
    print(head)
    print("-" * len(head))
    for name, r in rows.items():
        tc, rc = r["total_coverage"], r["remaining_coverage"]
        rho = "nan" if np.isnan(r["total_spearman"]) else f"{r['total_spearman']:.3f}"
        print(
            f"{name:>14} {r['fit_s']:>6.1f} | {r['total_mae']:>9.1f} {rho:>6} {tc['0.5']:>5.3f} "
            f"{tc['0.9']:>5.3f} | {r['remaining_mae']:>10.1f} {rc['0.5']:>5.3f} {rc['0.9']:>5.3f} "
            f"| {r['update_us']:>9.1f}"
        )


if __name__ == "__main__":
    main()

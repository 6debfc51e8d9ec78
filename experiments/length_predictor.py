"""A run's output-length predictor: built, and trained where it learns, from its config.

Trained predictors are fitted on the *train* conversations of the workload's split (the rule in
``horizon.workload.split``); the run's workload draws from the held-out ones. A ``learned``
model is an explicit file (``predictor.artifact``): loaded if it exists, else trained once and
saved there. Nothing is cached under a hashed name.
"""

from __future__ import annotations

from pathlib import Path

from experiments.config import PredictorConfig, WorkloadSpec
from horizon.prediction import LengthPredictor
from horizon.workload import TokenizedCorpus
from predictors import make_predictor
from predictors.dataset import SplitConfig, split_requests


def split_config(workload: WorkloadSpec) -> SplitConfig:
    """The train/test split a predictor for ``workload`` trains on (same rule, seed, share)."""
    return SplitConfig(
        seed=workload.split_seed,
        test_fraction=workload.split_test_fraction,
        max_output_tokens=workload.max_output_tokens,
    )


def build_predictor(
    cfg: PredictorConfig, workload: WorkloadSpec, tokenized: TokenizedCorpus | None
) -> LengthPredictor:
    """The predictor ``cfg`` names, fitted if it learns (see the module docstring).

    Raises:
        ValueError: a learning predictor without a ShareGPT corpus to train on.
    """
    if cfg.name == "learned" and cfg.artifact is not None and Path(cfg.artifact).exists():
        threads = cfg.options.get("threads")
        return make_predictor("learned", artifact=cfg.artifact, threads=threads)
    predictor = make_predictor(cfg.name, **cfg.options)
    if not cfg.learns:
        return predictor
    if tokenized is None:
        raise ValueError(f"predictor {cfg.name!r} trains on ShareGPT: use a sharegpt workload")
    split = split_requests(tokenized, split_config(workload))
    predictor.fit(split.train, data=split.info)
    if cfg.name == "learned" and cfg.artifact is not None:
        Path(cfg.artifact).parent.mkdir(parents=True, exist_ok=True)
        predictor.save(cfg.artifact)
    return predictor


def predictor_identity(predictor: object, cfg: PredictorConfig | None) -> dict:
    """What summary.json records about the predictor (artifact path included)."""
    if cfg is None:
        return {}
    return {
        "predictor": cfg.name,
        "predictor_options": dict(cfg.options),
        "predictor_label": cfg.label,
        "predictor_artifact": getattr(predictor, "artifact_path", None),
        "predictor_reads_true_length": bool(getattr(predictor, "reads_true_length", False)),
    }

"""A run's output-length predictor: built, and trained where it learns, from its config.

Trained predictors are fitted on the *train* conversations of the workload's split (the rule in
``horizon.workload.split``); the run's workload draws from the held-out ones. A ``learned``
model is an explicit file (``predictor.artifact``): loaded if it exists, else trained once and
saved there. Nothing is cached under a hashed name.
"""

from __future__ import annotations

import logging
from pathlib import Path

from experiments.config import WorkloadSpec
from experiments.policy_config import PredictorConfig
from horizon.prediction import LengthPredictor
from horizon.registry import takes
from horizon.workload import TokenizedCorpus
from predictors import PREDICTORS, make_predictor
from predictors.dataset import SplitConfig, split_requests

log = logging.getLogger(__name__)


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
    options = dict(cfg.options)
    if takes(PREDICTORS.resolve(cfg.name), "threads"):
        # one thread: the boosted models' OpenMP threads fight the simulator on small machines
        options.setdefault("threads", 1)
    if cfg.artifact is not None and Path(cfg.artifact).exists():
        p = load_saved(cfg, options.get("threads"))
        _check_split(p, cfg.artifact, split_config(workload))
        return p
    predictor = make_predictor(cfg.name, **options)
    if not cfg.learns:
        return predictor
    if tokenized is None:
        raise ValueError(
            f"policy.predictor: {cfg.name!r} trains on ShareGPT: use a sharegpt workload"
        )
    split = split_requests(tokenized, split_config(workload))
    log.info(
        "training predictor %r on %d requests of the train split (the learned one: ~2 min on "
        "2 cores, once: then loaded from %s)",
        cfg.name,
        len(split.train),
        cfg.artifact,
    )
    predictor.fit(split.train, data=split.info)
    if cfg.artifact is not None:
        Path(cfg.artifact).parent.mkdir(parents=True, exist_ok=True)
        predictor.save(cfg.artifact)
    return predictor


def load_saved(cfg: PredictorConfig, threads: int | None = None) -> LengthPredictor:
    """``cfg``'s predictor loaded from its ``artifact`` (its settings are in the file; only
    the run option ``threads`` applies)."""
    extra = {} if threads is None else {"threads": threads}
    return make_predictor(cfg.name, artifact=cfg.artifact, **extra)


def _check_split(predictor: object, artifact: str, split: SplitConfig) -> None:
    """A saved model must come from the split the workload holds out, or it saw the replies."""
    trained = (getattr(predictor, "header", None) or {}).get("data", {}).get("config", {})
    want = {"seed": split.seed, "test_fraction": split.test_fraction}
    got = {k: trained.get(k) for k in want}
    if got != want:
        raise ValueError(
            f"predictor artifact {artifact} was trained on split {got}, but the workload holds "
            f"out split {want}: point policy.predictor.artifact at a model of that split"
        )


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

"""Output-length predictors (``horizon.prediction.LengthPredictor`` implementations).

    make_predictor("mean")                                  constant: training quantiles
    make_predictor("prompt_length", bins=10)                baseline: prompt-length bins,
                                                            carried forward while decoding
    make_predictor("oracle")                                true length (upper bound)
    make_predictor("noisy_oracle", sigma=0.5, margin=1.2)   true length x log-normal noise
    make_predictor("learned", seed=0)                       prompt features -> quantiles
    make_predictor("learned", artifact="path.joblib")       ... loaded from a saved artifact
    make_predictor("prepared", path="run.predictions")      a learned predictor's predictions
                                                            for one run's requests, replayed

Predictors that learn (``learns = True``: ``mean``, ``prompt_length``, ``learned``) need an
explicit ``fit(requests)``; see ``predictors.dataset.split_requests`` for a train/test split.
Any name may also be ``package.module:Class``: a predictor of one's own (``horizon.registry``).
"""

from __future__ import annotations

from horizon.registry import Registry
from predictors.base import LEVELS, BasePredictor
from predictors.baseline import PromptLengthBaseline
from predictors.constant import MeanPredictor
from predictors.oracle import NoisyOraclePredictor, OraclePredictor
from predictors.prepared import PreparedPredictor

PREDICTORS: Registry[BasePredictor] = Registry("predictor")


def _learned(
    artifact: str | None = None, threads: int | None = None, **settings: object
) -> BasePredictor:
    # Imported here: scikit-learn and the tokenizer load only when a learned predictor is made.
    from predictors.learned import LearnedPredictor

    if artifact is None:
        return LearnedPredictor(threads=threads, **settings)
    if settings:
        raise ValueError(
            f"learned: give either artifact or settings, not both (got {sorted(settings)})"
        )
    return LearnedPredictor.load(artifact, threads=threads)


_learned.learns = True  # type: ignore[attr-defined] - what PredictorConfig.learns reads


PREDICTORS.register("mean", MeanPredictor)
PREDICTORS.register("prompt_length", PromptLengthBaseline)
PREDICTORS.register("oracle", OraclePredictor)
PREDICTORS.register("noisy_oracle", NoisyOraclePredictor)
PREDICTORS.register("learned", _learned)
PREDICTORS.register("prepared", PreparedPredictor)


def make_predictor(name: str, **options: object) -> BasePredictor:
    """A predictor by registry name. Raises ValueError for an unknown name (listing the known
    ones) or bad options."""
    return PREDICTORS.make(name, **options)


def predictor_names() -> list[str]:
    return PREDICTORS.names()


__all__ = [
    "LEVELS",
    "PREDICTORS",
    "BasePredictor",
    "MeanPredictor",
    "NoisyOraclePredictor",
    "OraclePredictor",
    "PreparedPredictor",
    "PromptLengthBaseline",
    "make_predictor",
    "predictor_names",
]

"""The one factory of a run's policy: a ``PolicyConfig`` -> the policy, with what it takes.

Every path that runs a policy builds it here: simulator runs and sweeps
(``components.build_components``), the engine replay (``engine_replay``), the fidelity and
headline comparisons (``fidelity_manifest.PolicySpec``), and config validation. A policy's
constructor says what it takes from the run by naming the parameter:

* ``predictor``: a length predictor, built from ``policy.predictor`` by ``predictor_for``
  (which trains it where it learns); a policy that names it without a default needs one;
* ``ttft_slo``: the run's TTFT target in seconds (the ``slo`` preset's), unless the options set it.

Nothing else is special: a researcher's own class gets the same treatment as a built-in one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from experiments.policy_config import PolicyConfig, PredictorConfig
from horizon.policies import Policy
from horizon.policies.registry import POLICIES
from horizon.registry import requires, takes

PredictorSource = Callable[[PredictorConfig], object]


@dataclass(frozen=True)
class BuiltPolicy:
    """A fresh policy (for one run only) and its predictor, if it takes one."""

    policy: Policy
    predictor: object | None


def build_policy(
    cfg: PolicyConfig, ttft_slo: float, predictor_for: PredictorSource
) -> BuiltPolicy:
    """Build ``cfg``'s policy; ``predictor_for`` turns its ``policy.predictor`` into a predictor.

    Raises:
        ValueError: unknown name, bad options, a predictor given to a policy that takes none or
            missing for one that needs it, or an object that is not a ``Policy``.
    """
    assert cfg.name is not None  # PolicyConfig sets it
    factory = POLICIES.resolve(cfg.name)
    options = dict(cfg.options)
    pred_cfg = cfg.predictor_config
    predictor = None
    if pred_cfg is not None:
        if not takes(factory, "predictor"):
            raise ValueError(f"policy.predictor: policy {cfg.name!r} takes no predictor")
        predictor = predictor_for(pred_cfg)
        options["predictor"] = predictor
    elif requires(factory, "predictor") and "predictor" not in options:
        raise ValueError(
            f"policy.predictor: policy {cfg.name!r} needs a predictor "
            "(e.g. policy.predictor.name=oracle)"
        )
    if takes(factory, "ttft_slo"):
        options.setdefault("ttft_slo", ttft_slo)
    policy = POLICIES.make(cfg.name, **options)
    if not isinstance(policy, Policy):
        raise ValueError(
            f"policy {cfg.name!r} built a {type(policy).__name__}, not a horizon Policy subclass"
        )
    return BuiltPolicy(policy, predictor)


def check_policy(cfg: PolicyConfig) -> None:
    """Build ``cfg``'s policy once with a stand-in predictor (the oracle, untrained and cheap),
    so that a bad name or option fails when the config is read, not mid-sweep."""
    from predictors import make_predictor

    build_policy(cfg, ttft_slo=1.0, predictor_for=lambda _: make_predictor("oracle"))


def ready_predictor(cfg: PredictorConfig) -> object:
    """A predictor that needs no training here: built from its name and options (oracles,
    ``prepared`` predictions), or loaded from its ``artifact``. What the engine replay uses.

    Raises:
        ValueError: the predictor learns and has no artifact to load.
    """
    from predictors import make_predictor

    if cfg.artifact is not None:  # (the training side: needs the simulator's configs)
        from experiments.length_predictor import load_saved

        return load_saved(cfg, cfg.options.get("threads"))
    if cfg.learns:
        raise ValueError(
            f"policy.predictor: {cfg.name!r} must be trained first: give its artifact, or "
            "replay its predictions (predictor 'prepared')"
        )
    return make_predictor(cfg.name, **cfg.options)

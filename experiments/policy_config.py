"""What a run says about its policy and the policy's length predictor (``configs/policy/``).

A policy or predictor is named by a registered name (``fcfs``, ``learned``) or by an import path
to the researcher's own class, ``package.module:Class`` (hydra's ``_target_:
package.module.Class`` says the same). Its constructor's keyword arguments come from
``options``; what it takes from the run is filled in by ``experiments.policy_factory``.
A policy of one's own, in one's own config directory::

    # myconfigs/policy/mylab_lwf.yaml          python -m experiments.run --config-dir myconfigs \\
    _target_: mylab.policies.LongestWaitFirst      policy=mylab_lwf
    options: {weight: 2.0}

This module imports only the standard library at import time (the engine's machine reads it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class PredictorConfig:
    """An output-length predictor (``predictors/``) by name or import path, with its options.

    A predictor that learns (its class sets ``learns = True``) is fitted on the *train*
    conversations of the workload's split, and the run draws its requests from the held-out
    ones. ``artifact``, for a predictor whose factory takes one (``learned``): the model file,
    loaded if it exists, else trained once and saved there (its path is in every run's summary).
    """

    name: str
    options: dict[str, Any] = field(default_factory=dict)
    artifact: str | None = None

    def __post_init__(self) -> None:
        from horizon.registry import takes
        from predictors import PREDICTORS

        factory = PREDICTORS.resolve(self.name)  # ValueError listing the known names
        if self.artifact is not None and not takes(factory, "artifact"):
            raise ValueError(
                f"policy.predictor.artifact: predictor {self.name!r} is not saved to a file"
            )

    @property
    def learns(self) -> bool:
        from predictors import PREDICTORS

        return bool(getattr(PREDICTORS.resolve(self.name), "learns", False))

    @property
    def label(self) -> str:
        return labelled(self.name, self.options)


@dataclass(frozen=True)
class PolicyConfig:
    """A policy by registered name or import path (``name``, or hydra's ``_target_``), its
    keyword ``options``, and the length predictor of a policy that takes one (``predictor``:
    the ``PredictorConfig`` fields as a mapping, which hydra can merge into)."""

    name: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    predictor: dict[str, Any] | None = None
    _target_: str | None = None

    def __post_init__(self) -> None:
        from experiments.policy_factory import check_policy

        if self._target_ is not None:
            if self.name is not None and self.name != self._target_:
                raise ValueError(
                    f"policy: give name or _target_, not both ({self.name!r}, {self._target_!r})"
                )
            object.__setattr__(self, "name", self._target_)
        if not isinstance(self.name, str) or not self.name:
            raise ValueError("policy.name: give a registered policy or 'package.module:Class'")
        self.predictor_config  # noqa: B018 - PredictorConfig's own checks
        check_policy(self)

    @property
    def predictor_config(self) -> PredictorConfig | None:
        if self.predictor is None:
            return None
        try:
            return PredictorConfig(**self.predictor)
        except TypeError as e:
            raise ValueError(f"policy.predictor: {e}") from None

    @property
    def label(self) -> str:
        """``name``, or ``name(k=v, ...)`` when options are set, and ``[predictor]``."""
        label = labelled(self.name or "", self.options)
        pred = self.predictor_config
        return f"{label}[{pred.label}]" if pred is not None else label


def labelled(name: str, options: dict[str, Any]) -> str:
    """``name(k=v, ...)``; an import path is shortened to its last part (the class)."""
    short = name.replace(":", ".").rsplit(".", 1)[-1]
    if not options:
        return short
    opts = ", ".join(f"{k}={_short(v)}" for k, v in sorted(options.items()) if k != "threads")
    return f"{short}({opts})" if opts else short


def _short(v: object) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)

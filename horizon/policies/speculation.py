"""The built-in speculation policies, their registry and the one factory that builds them.

* ``fixed``: ``k`` drafts for every decoding request at every step.
* ``batch_limited``: ``k`` drafts while at most ``max_batch`` requests decode, none above
  (verification costs grow with the batch; speculation pays where decoding is memory-bound).
* ``adaptive``: ``k`` from the measured acceptance: a running estimate of the per-position
  acceptance rate ``alpha`` (accepted drafts over drafts judged, each step's measurement
  weighted by ``smoothing``), and ``k`` the largest number of drafts whose all-accepted
  probability ``alpha**k`` is still at least ``min_accept_prob``; optionally off above
  ``max_batch``. When that is 0 it still proposes one draft every ``probe_every`` steps, so the
  estimate can recover.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields
from typing import Any

from horizon.kv_cache import KVView
from horizon.registry import Registry, takes
from horizon.request import Request
from horizon.speculation import SpeculationConfig, SpeculationPolicy, drafts_worth_proposing


class FixedSpeculation(SpeculationPolicy):
    name = "fixed"
    steady = True

    def __init__(self, num_draft_tokens: int = 4) -> None:
        self.k = num_draft_tokens

    def draft_tokens(self, decodes: Sequence[Request], view: KVView) -> int:
        return self.k


class BatchLimitedSpeculation(SpeculationPolicy):
    name = "batch_limited"
    steady = True

    def __init__(self, num_draft_tokens: int = 4, max_batch: int | None = 32) -> None:
        self.k = num_draft_tokens
        self.max_batch = max_batch

    def draft_tokens(self, decodes: Sequence[Request], view: KVView) -> int:
        if self.max_batch is not None and len(decodes) > self.max_batch:
            return 0
        return self.k


class AdaptiveSpeculation(SpeculationPolicy):
    name = "adaptive"

    def __init__(
        self,
        num_draft_tokens: int = 4,
        min_accept_prob: float = 0.3,
        prior_acceptance: float = 0.7,
        smoothing: float = 0.05,
        max_batch: int | None = None,
        probe_every: int = 16,
    ) -> None:
        if not isinstance(probe_every, int) or probe_every < 1:
            raise ValueError(f"adaptive: probe_every must be an int >= 1, got {probe_every!r}")
        self.k_max = num_draft_tokens
        self.min_prob = min_accept_prob
        self.smoothing = smoothing
        self.max_batch = max_batch
        self.probe_every = probe_every
        self.alpha = prior_acceptance  # the running estimate
        self.num_observed = 0  # steps measured

    def draft_tokens(self, decodes: Sequence[Request], view: KVView) -> int:
        if self.max_batch is not None and len(decodes) > self.max_batch:
            return 0
        k = drafts_worth_proposing(self.alpha, self.k_max, self.min_prob)
        if k == 0 and view.step % self.probe_every == 0:
            return 1
        return k

    def observe(self, verifies: Sequence[tuple[Request, int]], accepted: Sequence[int]) -> None:
        judged = hits = 0
        for (_, k), a in zip(verifies, accepted):
            hits += a
            judged += a + (a < k)  # the drafts up to and including the first rejection
        if judged:
            w = self.smoothing
            self.alpha = (1 - w) * self.alpha + w * (hits / judged)
            self.num_observed += 1

    def check_integrity(self) -> None:
        assert 0.0 <= self.alpha <= 1.0, f"acceptance estimate {self.alpha} outside [0, 1]"


BUILTIN = (FixedSpeculation, BatchLimitedSpeculation, AdaptiveSpeculation)


def _builtin() -> Registry[SpeculationPolicy]:
    reg: Registry[SpeculationPolicy] = Registry("speculation policy")
    for cls in BUILTIN:
        reg.register(cls.name, cls)
    return reg


SPECULATION_POLICIES = _builtin()  # read-only after import: a table of constructors


def make_speculation_policy(config: SpeculationConfig) -> SpeculationPolicy:
    """The policy ``config.policy`` names, given the config's fields its constructor names."""
    factory = SPECULATION_POLICIES.resolve(config.policy)
    options: dict[str, Any] = {
        f.name: getattr(config, f.name)
        for f in fields(config)
        if f.name != "policy" and takes(factory, f.name)
    }
    return SPECULATION_POLICIES.make(config.policy, **options)

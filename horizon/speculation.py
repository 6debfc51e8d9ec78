"""Speculative decoding, the scheduler's side: its configuration and the policy interface.

A speculating request proposes ``k`` draft tokens and one target forward *verifies* them: the
step computes ``k + 1`` query tokens for it (its last emitted token and the drafts) over its
context, and it emits ``1..k+1`` tokens (the accepted drafts and one token of the target's
own). How many drafts each decoding request proposes at a step is a decision: a
``SpeculationPolicy`` makes it, the scheduler applies the mechanics (the token budget counts
``k + 1``; blocks for the drafts are allocated when the plan is made and trimmed back to the
accepted tokens by ``update``; see ``horizon.scheduler``). Acceptance itself is the backend's:
the engine verifies, the simulator samples a stated acceptance model.

Off by default (``SchedulerConfig.speculation is None``): plans, records and speed are then
what they were before speculation existed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from horizon.kv_cache import KVView
from horizon.request import Request


@dataclass(frozen=True)
class SpeculationConfig:
    """Which speculation policy decides the drafts, and the knobs the built-in ones read.

    A policy is a registered name (``fixed``, ``batch_limited``, ``adaptive``;
    ``horizon.policies.speculation``) or ``package.module:Class``; its constructor gets the
    fields below that it names as parameters (``make_speculation_policy``).

    Attributes:
        policy: the speculation policy.
        num_draft_tokens: ``k``, the most draft tokens a request proposes in a step (>= 1).
        max_batch: no speculation in a step with more decoding requests than this (None: no
            limit). Read by ``batch_limited`` and ``adaptive``.
        min_accept_prob: ``adaptive``: draft position ``i`` is proposed only while the estimated
            probability that drafts ``1..i`` are all accepted is at least this (in (0, 1)).
        prior_acceptance: ``adaptive``: the per-position acceptance rate assumed before any
            verification is measured (in (0, 1)).
        smoothing: ``adaptive``: weight of each step's measurement in the running estimate
            (in (0, 1]).
    """

    policy: str = "fixed"
    num_draft_tokens: int = 4
    max_batch: int | None = None
    min_accept_prob: float = 0.3
    prior_acceptance: float = 0.7
    smoothing: float = 0.05

    def __post_init__(self) -> None:
        k = self.num_draft_tokens
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise ValueError(f"SpeculationConfig.num_draft_tokens must be an int >= 1, got {k!r}")
        b = self.max_batch
        if b is not None and (not isinstance(b, int) or isinstance(b, bool) or b < 1):
            raise ValueError(f"SpeculationConfig.max_batch must be None or an int >= 1, got {b!r}")
        for name in ("min_accept_prob", "prior_acceptance"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not 0 < v < 1:
                raise ValueError(f"SpeculationConfig.{name} must be in (0, 1), got {v!r}")
        s = self.smoothing
        if not isinstance(s, (int, float)) or not 0 < s <= 1:
            raise ValueError(f"SpeculationConfig.smoothing must be in (0, 1], got {s!r}")
        from horizon.policies.speculation import SPECULATION_POLICIES

        try:
            SPECULATION_POLICIES.resolve(self.policy)
        except ValueError as e:  # listing the known names
            raise ValueError(f"SpeculationConfig.policy: {e}") from None


class SpeculationPolicy:
    """Decides, each step, how many draft tokens each decoding request proposes.

    Contracts:
        * ``draft_tokens`` is called once per planned step with every decoding request (in no
          particular order) and a read-only ``KVView``; it returns one int for all of them, or
          one int per request in the order given. Values <= 0 mean no speculation. The
          scheduler caps each value by the request's output limit, by the token budget (the
          step's decodes and drafts must fit ``max_num_batched_tokens``) and by the free
          blocks (drafts never preempt anyone), so a policy need not check them.
        * ``observe`` is called once per executed step that verified drafts, with the plan's
          ``(request, k)`` pairs and the accepted count of each (``0..k``).
        * A policy never allocates, and mutates nothing but its own state.
        * ``steady = True`` declares that ``draft_tokens`` returns one int for all requests
          and that ``observe`` ignores what it is given. A scheduler that knows the backend's
          acceptance ahead (the simulator's) may then draw each speculating request's
          accepted counts ahead (``horizon.draft_track``); ``draft_tokens`` is still called
          every step (a change of its value redraws the tracks), ``observe`` is not.
    """

    name = "base"
    steady = False

    def draft_tokens(self, decodes: Sequence[Request], view: KVView) -> int | Sequence[int]:
        return 0

    def observe(self, verifies: Sequence[tuple[Request, int]], accepted: Sequence[int]) -> None:
        """Measured acceptance of a step's verifications (default: ignored)."""

    def check_integrity(self) -> None:
        """Raise AssertionError if the policy's own state is inconsistent (stateless: nothing)."""


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens a request emits per verification of ``k`` drafts when each draft is accepted
    with probability ``alpha`` given the ones before it: ``1 + alpha + ... + alpha**k``."""
    if alpha >= 1:
        return float(k + 1)
    return (1 - alpha ** (k + 1)) / (1 - alpha)


def drafts_worth_proposing(alpha: float, k_max: int, min_prob: float) -> int:
    """The largest ``k <= k_max`` with ``alpha**k >= min_prob`` (0 if none)."""
    if alpha <= 0 or alpha < min_prob:
        return 0
    if alpha >= 1:
        return k_max
    return min(k_max, int(math.floor(math.log(min_prob) / math.log(alpha) + 1e-9)))

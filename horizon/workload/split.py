"""Which conversations are held out: one rule for predictor training and workload building.

A learned predictor is trained on the train conversations and a workload that evaluates a
policy driven by it must draw from the held-out ones, or the predictor has seen the replies it
predicts. The rule: shuffle conversation indices with ``seed``; the first
``round(n * test_fraction)`` (at least one) are held out.
"""

from __future__ import annotations

import numpy as np

CONVERSATION_SETS = ("all", "train", "held_out")


def held_out_conversations(num_conversations: int, seed: int, test_fraction: float) -> frozenset:
    """Indices of the held-out conversations (see the module docstring)."""
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
    order = np.random.default_rng(seed).permutation(num_conversations)
    n_test = max(1, round(num_conversations * test_fraction))
    return frozenset(order[:n_test].tolist())

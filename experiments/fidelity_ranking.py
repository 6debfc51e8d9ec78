"""The policy ranking by goodput on each side of the fidelity comparison, and whether two sides
rank alike.

A ranking is each pair of policies' goodput gap in percentage points (``rank_pairs``). Two
rankings of the same policies are the same when every pair is ordered alike on both sides; a
pair that both sides measure within ``TIE_PTS`` points is a tie and agrees whichever way it
leans (``same_ranking``). ``banded`` is the stricter reading, a tie band on each side alone.
"""

from __future__ import annotations

from itertools import combinations

import numpy as np

TIE_PTS = 1.0  # a pair both sides measure closer than this (percentage points) is a tie

Pairs = dict[tuple[str, str], float]


def rank_pairs(goodput: dict[str, float]) -> Pairs:
    """Each pair of policies (sorted names) -> the first's goodput minus the second's, points."""
    return {(a, b): 100 * (goodput[a] - goodput[b]) for a, b in combinations(sorted(goodput), 2)}


def same_ranking(x: Pairs, y: Pairs) -> bool:
    """Whether two ``rank_pairs`` of the same policies order every pair alike: the gaps have
    the same sign (an exact tie is its own sign), or both are within ``TIE_PTS`` (a tie on both
    sides, whichever way each leans). A band applied to each side alone would call two
    measurements of one gap different rankings whenever they straddle its edge (1.2 and 0.9
    points: ordered on one side, tied on the other), though both order the pair alike.

    Raises:
        ValueError: the two rankings are of different policies.
    """
    if x.keys() != y.keys():
        raise ValueError(f"rankings of different policies: {sorted(x)} vs {sorted(y)}")
    return all(
        np.sign(x[k]) == np.sign(y[k]) or (abs(x[k]) < TIE_PTS and abs(y[k]) < TIE_PTS) for k in x
    )


def banded(x: Pairs) -> dict[tuple[str, str], int]:
    """Each pair's order with a tie band on this side alone (the stricter reading)."""
    return {k: 0 if abs(d) < TIE_PTS else int(np.sign(d)) for k, d in x.items()}

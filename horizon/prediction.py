"""Output-length predictions as the Horizon policy consumes them (implementations: predictors/).

A ``LengthDistribution`` is a predictive distribution of a length in tokens, given by quantiles
at fixed levels and read through a piecewise-linear CDF between them (flat tails beyond the
outer levels are extended linearly to ``lo`` and ``hi``). ``remaining(g)`` conditions a *total*
length on "more than ``g`` tokens already generated" and subtracts ``g``: that is how a
predictor turns its prompt-time estimate into an online remaining-length estimate.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from horizon.request import Request


@dataclass(frozen=True)
class LengthDistribution:
    """Quantiles ``values[i]`` at ``levels[i]``; support ``[lo, hi]`` (tokens, lo >= 1).

    Invariants: levels strictly increasing in (0, 1); values non-decreasing within [lo, hi].
    """

    levels: tuple[float, ...]
    values: tuple[float, ...]
    lo: float = 1.0
    hi: float = math.inf

    def __post_init__(self) -> None:
        if len(self.levels) != len(self.values) or not self.levels:
            raise ValueError("LengthDistribution: levels and values must be non-empty, same size")
        if any(not 0 < q < 1 for q in self.levels) or any(
            b <= a for a, b in zip(self.levels, self.levels[1:])
        ):
            raise ValueError(
                f"LengthDistribution.levels must increase within (0, 1): {self.levels}"
            )
        if any(b < a for a, b in zip(self.values, self.values[1:])):
            raise ValueError(f"LengthDistribution.values must not decrease: {self.values}")
        if not (1 <= self.lo <= self.values[0] and self.values[-1] <= self.hi):
            raise ValueError("LengthDistribution: need 1 <= lo <= values[0] <= values[-1] <= hi")
        self._set_knots()

    def _set_knots(self) -> None:
        top = self.hi if math.isfinite(self.hi) else _tail_end(self.values, self.levels)
        xs = (self.lo, *self.values, max(top, self.values[-1]))
        fs = (0.0, *self.levels, 1.0)
        object.__setattr__(self, "_xs", xs)
        object.__setattr__(self, "_fs", fs)

    @classmethod
    def _trusted(
        cls, levels: tuple[float, ...], values: tuple[float, ...], lo: float, hi: float
    ) -> LengthDistribution:
        """Build without re-validating (inputs derived from a valid distribution)."""
        d = object.__new__(cls)
        object.__setattr__(d, "levels", levels)
        object.__setattr__(d, "values", values)
        object.__setattr__(d, "lo", lo)
        object.__setattr__(d, "hi", hi)
        d._set_knots()
        return d

    def knots(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """CDF knots ``(x, F(x))``, from ``(lo, 0)`` to ``(hi, 1)`` (an infinite ``hi`` is
        replaced by the last segment's slope extended to F = 1); linear in between."""
        return self._xs, self._fs  # type: ignore[attr-defined]

    def quantile(self, q: float) -> float:
        if not 0 <= q <= 1:
            raise ValueError(f"quantile level must be in [0, 1], got {q!r}")
        xs, fs = self._xs, self._fs  # type: ignore[attr-defined]
        i = bisect.bisect_left(fs, q)
        if i == 0:
            return xs[0]
        if i >= len(fs):
            return xs[-1]
        f0, f1, x0, x1 = fs[i - 1], fs[i], xs[i - 1], xs[i]
        return x1 if f1 == f0 else x0 + (x1 - x0) * (q - f0) / (f1 - f0)

    def cdf(self, x: float) -> float:
        """P(length <= x) (right-continuous: a point mass at ``x`` counts)."""
        xs, fs = self._xs, self._fs  # type: ignore[attr-defined]
        if x >= xs[-1]:
            return 1.0
        if x <= xs[0]:
            return 0.0
        i = bisect.bisect_right(xs, x)
        x0, x1, f0, f1 = xs[i - 1], xs[i], fs[i - 1], fs[i]
        return f1 if x1 == x0 else f0 + (f1 - f0) * (x - x0) / (x1 - x0)

    @property
    def median(self) -> float:
        return self.quantile(0.5)

    @property
    def mean(self) -> float:
        """Mean of the piecewise-linear-CDF distribution (uniform between knots)."""
        xs, fs = self._xs, self._fs  # type: ignore[attr-defined]
        return sum((f1 - f0) * (x0 + x1) / 2 for x0, x1, f0, f1 in zip(xs, xs[1:], fs, fs[1:]))

    def remaining_quantile(self, generated: int, q: float) -> float:
        """``remaining(generated).quantile(q)`` without building the distribution (hot path)."""
        if generated <= 0:
            return self.quantile(q)
        f = self.cdf(generated)
        if f >= 1.0:
            return 1.0
        return max(1.0, self.quantile(f + q * (1 - f)) - generated)

    def remaining(self, generated: int) -> LengthDistribution:
        """Distribution of ``total - generated`` given ``total > generated`` (at least 1)."""
        if generated <= 0:
            return self
        f = self.cdf(generated)
        if f >= 1.0:  # past everything predicted: one more token is the best guess left
            return LengthDistribution(self.levels, tuple(1.0 for _ in self.levels), 1.0, 1.0)
        vals = []
        prev = 1.0
        for q in self.levels:
            v = max(prev, self.quantile(f + q * (1 - f)) - generated)  # monotone despite rounding
            vals.append(v)
            prev = v
        lo = min(max(1.0, self.quantile(f) - generated), vals[0])
        hi = self.hi - generated if math.isfinite(self.hi) else math.inf
        return LengthDistribution._trusted(self.levels, tuple(vals), lo, max(hi, vals[-1]))


def _tail_end(values: Sequence[float], levels: Sequence[float]) -> float:
    """Where the CDF reaches 1 when no upper bound is given: the last segment's slope, extended."""
    if len(values) >= 2 and levels[-1] > levels[-2]:
        slope = (values[-1] - values[-2]) / (levels[-1] - levels[-2])
        return values[-1] + slope * (1 - levels[-1])
    return values[-1] * 2


class LengthPredictor(Protocol):
    """Predicts a request's output length. Built by name in predictors/; trained by an explicit
    ``fit`` call there, never in a constructor.

    Contract: ``predict`` reads only what a server knows at arrival (prompt ids, turn index, the
    request's ``max_output_tokens``) unless ``reads_true_length`` is True (oracles, stated as
    upper bounds). ``update`` returns the *remaining* length given ``tokens_so_far`` emitted.
    Neither mutates the request.
    """

    name: str
    reads_true_length: bool

    def predict(self, request: Request) -> LengthDistribution: ...

    def update(self, request: Request, tokens_so_far: int) -> LengthDistribution: ...

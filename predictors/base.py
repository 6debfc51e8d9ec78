"""What every predictor here shares: the quantile levels, batch helpers, and the carry-forward rule.

All predictors implement ``horizon.prediction.LengthPredictor`` plus four plain methods, so that
experiment code can treat them alike:

    fit(requests, data=None) -> self train on labelled requests (a no-op where nothing is learnt);
                                     ``data``: a JSON-able note of where they came from
    predict_batch(requests)          total-length distributions, one per request, in order
    prepare(requests)                fill a per-run memo if the predictor keeps one (else no-op)
    predict(request) / update(request, tokens_so_far)      the protocol

Distributions put ``hi = request.max_output_tokens`` (a request never generates more) and
``lo = 1``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from horizon.prediction import LengthDistribution
from horizon.request import Request

# 0.05, 0.10, ..., 0.95, then 0.99: the CDF is linear between levels, so they are dense.
LEVELS: tuple[float, ...] = (*(round(0.05 * i, 2) for i in range(1, 20)), 0.99)


class BasePredictor:
    """Default ``fit``/``prepare``/``predict_batch``; ``update`` conditions ``predict``."""

    name: str = ""
    reads_true_length: bool = False
    learns: bool = False  # True: ``fit`` trains it (a run fits it on the train split first)

    def fit(self, requests: Sequence[Request], data: dict | None = None) -> BasePredictor:
        return self

    def prepare(self, requests: Sequence[Request]) -> None:
        """Nothing to precompute: ``predict`` is already cheap."""

    def predict(self, request: Request) -> LengthDistribution:
        raise NotImplementedError

    def predict_batch(self, requests: Sequence[Request]) -> list[LengthDistribution]:
        return [self.predict(r) for r in requests]

    def update(self, request: Request, tokens_so_far: int) -> LengthDistribution:
        """Remaining length: the total distribution conditioned on ``total > tokens_so_far``."""
        check_generated(request, tokens_so_far)
        return self.predict(request).remaining(tokens_so_far)


def check_generated(request: Request, tokens_so_far: int) -> None:
    if not isinstance(tokens_so_far, int) or tokens_so_far < 0:
        raise ValueError(
            f"request {request.request_id}: tokens_so_far must be an int >= 0, "
            f"got {tokens_so_far!r}"
        )


def clipped(values: Sequence[float], hi: float) -> tuple[float, ...]:
    """Values clipped to ``[1, hi]`` and made non-decreasing."""
    out, top = [], 1.0
    for v in values:
        top = max(top, min(max(float(v), 1.0), hi))
        out.append(top)
    return tuple(out)


def carried_forward(total: LengthDistribution, generated: int) -> LengthDistribution:
    """The naive online estimate: every quantile minus what was generated, floored at 1.

    This is what a prompt-time estimate becomes when nothing conditions on progress (the
    baseline the learned predictor is measured against).
    """
    if generated <= 0:
        return total
    vals = tuple(max(v - generated, 1.0) for v in total.values)
    return LengthDistribution(total.levels, vals, 1.0, max(total.hi - generated, vals[-1]))


def point_mass(value: float, levels: Sequence[float] = LEVELS) -> LengthDistribution:
    """All quantiles at ``value`` (>= 1), support ``[value, value]``."""
    v = max(float(value), 1.0)
    if levels is LEVELS:  # valid by construction: skip re-validation (the oracle's hot path)
        return LengthDistribution._trusted(LEVELS, (v,) * len(LEVELS), v, v)
    return LengthDistribution(tuple(levels), tuple(v for _ in levels), v, v)


def load_versioned(
    path: Path, read: Callable[[Path], dict], fmt: str, version: int, who: str, what: str
) -> dict:
    """The payload ``read(path)`` of a file whose ``payload["header"]`` names ``format`` and
    ``version``. Raises FileNotFoundError (no file), ValueError (unreadable, another format or
    version), each message starting with ``who`` and naming the file as ``what``."""
    if not path.exists():
        raise FileNotFoundError(f"{who}: no {what} at {path}")
    try:
        payload = read(path)
        header = payload["header"]
        ok = header.get("format") == fmt
    except Exception as e:  # any decoding failure means "not ours"
        raise ValueError(f"{who}: {path} is not a {what} ({e})") from e
    if not ok or header.get("version") != version:
        raise ValueError(
            f"{who}: {path} is format {header.get('format')!r} version "
            f"{header.get('version')!r}; expected {fmt!r} {version}"
        )
    return payload

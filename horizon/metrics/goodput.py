"""Goodput: the share (and rate) of requests that met their latency targets.

Two kinds; always say which one a number is (docs/design.md, "Metrics"):

- **Lifetime goodput** (Horizon's): a request is good iff it finished, TTFT <= SLO.ttft and
  *every* ITL <= SLO.itl. A request with a single token has no ITL and is good on ITL.
- **TPOT goodput** (vLLM's ``--goodput ttft:X tpot:Y``): a request is good iff it finished,
  TTFT <= X and its mean TPOT <= Y. A single-token request has no TPOT and is good on TPOT
  (vLLM counts its TPOT as 0).

One long stall inside an otherwise fast stream breaks lifetime goodput but can hide inside a mean
TPOT: that is the difference the two numbers show.

The denominator is every arrived request: rejected and unfinished requests count as not good.
Comparisons are ``<=``, as in vLLM.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from horizon.metrics.latency import max_itl, tpot, ttft
from horizon.metrics.records import STATUS_FINISHED, RunRecords
from horizon.metrics.throughput import per_second


class SLOLike(Protocol):
    """Anything with ``ttft`` and ``itl`` in seconds, e.g. ``horizon.request.SLO``."""

    @property
    def ttft(self) -> float: ...

    @property
    def itl(self) -> float: ...


def slo_arrays(rec: RunRecords, slo: SLOLike | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per-request (ttft_slo, itl_slo): the request's own SLO, with ``slo`` filling its NaNs.

    Raises:
        ValueError: when some request has no SLO of its own and ``slo`` is not given.
    """
    t = np.array(rec.ttft_slo, dtype=np.float64)
    i = np.array(rec.itl_slo, dtype=np.float64)
    if slo is not None:
        t[np.isnan(t)] = slo.ttft
        i[np.isnan(i)] = slo.itl
    missing = int(np.count_nonzero(np.isnan(t) | np.isnan(i)))
    if missing:
        raise ValueError(
            f"{missing} of {rec.num_requests} requests have no SLO (ttft_slo/itl_slo is NaN) and "
            "no run-wide SLO was given: pass slo=SLO(ttft=..., itl=...)"
        )
    return t, i


def lifetime_good(rec: RunRecords, slo: SLOLike | None = None) -> np.ndarray:
    """Bool per request: finished, TTFT <= its ttft SLO and every ITL <= its itl SLO."""
    t_slo, i_slo = slo_arrays(rec, slo)
    worst = max_itl(rec)
    ok_itl = np.isnan(worst) | (worst <= i_slo)
    return (rec.status == STATUS_FINISHED) & (ttft(rec) <= t_slo) & ok_itl


def tpot_good(
    rec: RunRecords,
    ttft_max: float | None = None,
    tpot_max: float | None = None,
    slo: SLOLike | None = None,
) -> np.ndarray:
    """Bool per request: finished, TTFT <= ``ttft_max`` and TPOT <= ``tpot_max``.

    A threshold left as None is taken per request from its SLO (``ttft`` and ``itl``
    respectively, with ``slo`` filling NaNs); the SLO is only required for such a threshold.
    """
    t_max: float | np.ndarray
    p_max: float | np.ndarray
    if ttft_max is None or tpot_max is None:
        t_slo, i_slo = slo_arrays(rec, slo)
        t_max = t_slo if ttft_max is None else ttft_max
        p_max = i_slo if tpot_max is None else tpot_max
    else:
        t_max, p_max = ttft_max, tpot_max
    per_token = tpot(rec)
    ok_tpot = np.isnan(per_token) | (per_token <= p_max)
    return (rec.status == STATUS_FINISHED) & (ttft(rec) <= t_max) & ok_tpot


def _share(good: np.ndarray) -> float:
    return float(np.count_nonzero(good) / len(good)) if len(good) else np.nan


def goodput_lifetime(rec: RunRecords, slo: SLOLike | None = None) -> float:
    """Lifetime goodput: good requests / arrived requests (NaN for a run without requests)."""
    return _share(lifetime_good(rec, slo))


def goodput_lifetime_rps(rec: RunRecords, slo: SLOLike | None = None) -> float:
    """Lifetime-good requests per second over the run's span."""
    return per_second(int(np.count_nonzero(lifetime_good(rec, slo))), rec)


def goodput_tpot(
    rec: RunRecords,
    ttft_max: float | None = None,
    tpot_max: float | None = None,
    slo: SLOLike | None = None,
) -> float:
    """TPOT goodput: TPOT-good requests / arrived requests (see ``tpot_good``)."""
    return _share(tpot_good(rec, ttft_max, tpot_max, slo))


def goodput_tpot_rps(
    rec: RunRecords,
    ttft_max: float | None = None,
    tpot_max: float | None = None,
    slo: SLOLike | None = None,
) -> float:
    """TPOT-good requests per second over the run's span (vLLM's "request goodput")."""
    return per_second(int(np.count_nonzero(tpot_good(rec, ttft_max, tpot_max, slo))), rec)

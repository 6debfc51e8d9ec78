from __future__ import annotations

import numpy as np
import pytest
from test_metrics_build import REJ, UNF, Req, Step, make_records

from horizon.metrics import (
    goodput_lifetime,
    goodput_lifetime_rps,
    goodput_tpot,
    goodput_tpot_rps,
    lifetime_good,
    slo_arrays,
    tpot_good,
)
from horizon.request import SLO

RUN_SLO = SLO(ttft=1.0, itl=0.5)


def goodput_run(**slo_of_last):
    """Six requests, run span [0, 4]; with RUN_SLO: lifetime-good {0, 2}, TPOT-good {0, 1, 2}."""
    return make_records(
        [
            # steady stream: TTFT 0.5, every ITL 0.2
            Req(0.0, (0.5, 0.7, 0.9, 1.1)),
            # one stall of 1.0 s > ITL SLO, but mean TPOT (2.2 - 0.4) / 9 = 0.2 <= 0.5
            Req(0.0, (0.4, 0.5, 1.5, 1.6, 1.7, 1.8, 1.9, 2.0, 2.1, 2.2)),
            # a single token: no ITL, no TPOT; TTFT 0.5
            Req(1.0, (1.5,)),
            Req(1.0, (), REJ),
            # fast but unfinished: never good
            Req(1.0, (1.2, 1.3), UNF),
            # TTFT 1.5 > 1.0
            Req(2.0, (3.5, 3.6), **slo_of_last),
        ],
        [Step(0.0, 2.0), Step(2.0, 4.0)],
    )


def test_one_itl_over_slo_breaks_lifetime_goodput_but_not_tpot_goodput():
    rec = goodput_run()
    assert lifetime_good(rec, RUN_SLO).tolist() == [True, False, True, False, False, False]
    assert tpot_good(rec, slo=RUN_SLO).tolist() == [True, True, True, False, False, False]


def test_rejected_and_unfinished_count_in_the_denominator():
    rec = goodput_run()
    assert goodput_lifetime(rec, RUN_SLO) == pytest.approx(2 / 6)
    assert goodput_tpot(rec, slo=RUN_SLO) == pytest.approx(3 / 6)


def test_goodput_per_second_over_the_run_span():
    rec = goodput_run()
    assert goodput_lifetime_rps(rec, RUN_SLO) == pytest.approx(2 / 4.0)
    assert goodput_tpot_rps(rec, slo=RUN_SLO) == pytest.approx(3 / 4.0)


def test_request_slo_wins_over_run_wide_slo_which_only_fills_nan():
    rec = goodput_run(ttft_slo=2.0, itl_slo=0.05)
    t, i = slo_arrays(rec, RUN_SLO)
    assert t.tolist() == [1.0] * 5 + [2.0]
    assert i.tolist() == [0.5] * 5 + [0.05]
    # Request 5: TTFT 1.5 <= its own 2.0, but its ITL 0.1 > its own 0.05.
    assert not lifetime_good(rec, RUN_SLO)[5]
    rec = goodput_run(ttft_slo=2.0, itl_slo=0.15)
    assert lifetime_good(rec, RUN_SLO)[5]
    assert goodput_lifetime(rec, RUN_SLO) == pytest.approx(3 / 6)


def test_itl_exactly_at_slo_is_good():
    rec = make_records([Req(0.0, (0.5, 1.0, 1.5))], [Step(0.0, 2.0)])
    assert lifetime_good(rec, SLO(ttft=0.5, itl=0.5)).tolist() == [True]
    assert lifetime_good(rec, SLO(ttft=0.5, itl=0.49)).tolist() == [False]
    assert lifetime_good(rec, SLO(ttft=0.49, itl=0.5)).tolist() == [False]


def test_missing_slo_is_a_clear_error():
    rec = goodput_run()
    with pytest.raises(ValueError, match="6 of 6 requests have no SLO"):
        goodput_lifetime(rec)
    with pytest.raises(ValueError, match="1 of 6 requests have no SLO"):
        slo_arrays(make_records([Req(0.0, (1.0,), ttft_slo=1.0, itl_slo=1.0)] * 5 + [Req(0.0)]))
    with pytest.raises(ValueError, match="no SLO"):
        tpot_good(rec, ttft_max=1.0)  # the TPOT threshold would come from the SLO


def test_explicit_tpot_thresholds_need_no_slo():
    rec = goodput_run()
    # TTFT <= 0.45 leaves only request 1 (TTFT 0.4, TPOT 0.2).
    assert tpot_good(rec, ttft_max=0.45, tpot_max=0.2 + 1e-9).tolist() == [
        False,
        True,
        False,
        False,
        False,
        False,
    ]
    assert goodput_tpot(rec, ttft_max=2.0, tpot_max=0.15) == pytest.approx(2 / 6)  # 2 and 5


def test_empty_run_goodput_is_nan():
    rec = make_records([])
    assert np.isnan(goodput_lifetime(rec))
    assert np.isnan(goodput_tpot(rec, slo=RUN_SLO))
    assert np.isnan(goodput_lifetime_rps(rec, RUN_SLO))

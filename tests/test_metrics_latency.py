from __future__ import annotations

import numpy as np
import pytest
from test_metrics_build import FIN, NAN, REJ, UNF, Req, make_records, synthetic_records

from horizon.metrics import e2e, itl, max_itl, percentiles, queue_wait, tpot, ttft


def _csr_run():
    # Empty requests at the start, in the middle and at the end of the flat token array, and a
    # token time that goes *down* across a boundary (10.0 then 5.0): its gap must not appear.
    return make_records(
        [
            Req(0.0, (), UNF),
            Req(0.5, (1.0, 2.0, 4.0)),
            Req(0.6, (), REJ),
            Req(9.0, (10.0,)),
            Req(4.0, (5.0, 5.5), UNF),
            Req(6.0, (), UNF),
        ]
    )


def test_itl_masks_gaps_across_request_boundaries():
    rec = _csr_run()
    assert itl(rec).tolist() == [1.0, 2.0, 0.5]


def test_itl_select_keeps_only_chosen_requests():
    rec = _csr_run()
    assert itl(rec, select=rec.status == FIN).tolist() == [1.0, 2.0]
    assert itl(rec, select=np.zeros(6, dtype=bool)).size == 0
    with pytest.raises(ValueError, match="length 6"):
        itl(rec, select=np.ones(3, dtype=bool))


def test_max_itl_per_request_nan_below_two_tokens():
    got = max_itl(_csr_run())
    np.testing.assert_array_equal(got, [NAN, 2.0, NAN, NAN, 0.5, NAN])


def test_ttft_e2e_tpot_by_hand():
    rec = _csr_run()
    np.testing.assert_allclose(ttft(rec), [NAN, 0.5, NAN, 1.0, 1.0, NAN])
    # E2E only for finished requests (request 4 is unfinished although it has tokens).
    np.testing.assert_allclose(e2e(rec), [NAN, 3.5, NAN, 1.0, NAN, NAN])
    # TPOT = (E2E - TTFT) / (n - 1) = (3.5 - 0.5) / 2; single-token request 3 has none.
    np.testing.assert_allclose(tpot(rec), [NAN, 1.5, NAN, NAN, NAN, NAN])


def test_queue_wait_and_its_censored_lower_bound():
    rec = make_records(
        [
            Req(1.0, (3.0,), admit=2.5),
            Req(2.0, (), REJ),
            Req(4.0, (), UNF),  # never admitted, still waiting at the end
            Req(5.0, (6.0,), UNF, admit=5.25),
        ]
    )
    np.testing.assert_allclose(queue_wait(rec), [1.5, NAN, NAN, 0.25])
    np.testing.assert_allclose(queue_wait(rec, until=10.0), [1.5, NAN, 6.0, 0.25])


def test_latencies_match_a_per_request_loop_on_a_random_run():
    rec = synthetic_records(3_000, 15, seed=7)
    want_itl, want_max, want_ttft, want_tpot = [], [], [], []
    for i in range(rec.num_requests):
        t = rec.tokens_of(i)
        gaps = np.diff(t)
        fin = rec.status[i] == FIN
        if fin:
            want_itl.extend(gaps)
        want_max.append(gaps.max() if len(gaps) else NAN)
        want_ttft.append(t[0] - rec.arrival_time[i] if len(t) else NAN)
        want_tpot.append((t[-1] - t[0]) / (len(t) - 1) if fin and len(t) >= 2 else NAN)
    np.testing.assert_array_equal(itl(rec, select=rec.status == FIN), want_itl)
    np.testing.assert_array_equal(max_itl(rec), want_max)
    np.testing.assert_allclose(ttft(rec), want_ttft, rtol=0, atol=1e-12)
    np.testing.assert_allclose(tpot(rec), want_tpot, rtol=1e-12)
    assert len(itl(rec)) == int(np.maximum(rec.num_output_tokens - 1, 0).sum())


def test_percentiles_ignore_nan_and_interpolate_linearly():
    x = np.concatenate([np.arange(1.0, 101.0), [NAN, NAN]])
    np.testing.assert_allclose(percentiles(x), [50.5, 90.1, 99.01])
    np.testing.assert_allclose(percentiles(x, (0, 100)), [1.0, 100.0])
    assert np.isnan(percentiles(np.array([NAN, NAN]))).all()
    assert percentiles(np.array([]), (50,)).shape == (1,)
    assert np.isnan(percentiles(np.array([]), (50,))[0])


def test_empty_run_gives_empty_arrays():
    rec = make_records([])
    assert ttft(rec).size == 0 and itl(rec).size == 0 and max_itl(rec).size == 0
    assert tpot(rec).size == 0 and e2e(rec).size == 0

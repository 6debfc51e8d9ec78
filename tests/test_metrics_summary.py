from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest
from test_metrics_build import REJ, UNF, Req, Step, make_records, synthetic_records

from horizon.metrics import summarize
from horizon.request import SLO

RUN_SLO = SLO(ttft=1.0, itl=0.5)

KEYS = {
    "requests", "finished", "rejected", "unfinished", "duration_s",
    "goodput_lifetime", "goodput_lifetime_rps", "goodput_tpot", "goodput_tpot_rps",
    *(f"{m}_{s}" for m in ("ttft", "itl", "tpot", "e2e") for s in ("mean", "p50", "p90", "p99")),
    "itl_max", "queue_wait_mean", "queue_wait_p99", "queue_wait_max",
    "throughput_tok_s", "throughput_total_tok_s", "throughput_req_s", "output_tokens",
    "preemptions", "preempted_requests", "recompute_waste",
    "prefix_hit_rate", "prefill_chunk_waste",
    "kv_util_mean", "kv_util_max", "fairness_jain",
}  # fmt: skip


def _run():
    return make_records(
        [
            Req(0.0, (0.5, 0.7, 0.9, 1.1), prompt=10),
            Req(0.0, (0.4, 0.5, 1.5, 1.6, 1.7, 1.8, 1.9, 2.0, 2.1, 2.2), prompt=10),
            Req(1.0, (1.5,), prompt=10),
            Req(1.0, (), REJ, prompt=10),
            # unfinished, with a long gap that must not reach the ITL statistics
            Req(1.0, (1.2, 3.9), UNF, prompt=10, preemptions=1, recomputed=11),
            Req(2.0, (3.5, 3.75), prompt=10, admit=3.0),
            Req(2.5, (), UNF, prompt=10),  # never admitted: waits until the end (4.0)
        ],
        [
            Step(0.0, 2.0, prefill=40, decode=4, waiting=1, kv_used=5, budget=64),
            Step(2.0, 4.0, prefill=0, decode=2, waiting=0, kv_used=10, budget=64),
        ],
        num_kv_blocks=10,
    )


def test_summary_values_by_hand():
    s = summarize(_run(), RUN_SLO)
    assert set(s) == KEYS
    assert (s["requests"], s["finished"], s["rejected"], s["unfinished"]) == (7, 4, 1, 2)
    assert s["duration_s"] == 4.0
    assert s["goodput_lifetime"] == pytest.approx(2 / 7)  # requests 0 and 2
    assert s["goodput_tpot"] == pytest.approx(3 / 7)  # and request 1
    assert s["goodput_lifetime_rps"] == pytest.approx(2 / 4)
    # TTFT of finished requests: 0.5, 0.4, 0.5, 1.5
    assert s["ttft_mean"] == pytest.approx(0.725)
    assert s["ttft_p50"] == pytest.approx(0.5)
    assert s["itl_max"] == pytest.approx(1.0)
    assert s["itl_mean"] == pytest.approx((0.6 + 1.8 + 0.25) / (3 + 9 + 1))
    assert s["tpot_mean"] == pytest.approx((0.2 + 0.2 + 0.25) / 3)
    assert s["e2e_p50"] == pytest.approx(np.median([1.1, 2.2, 0.5, 1.75]))
    # waits: 0, 0, 0, (rejected), 0, 1.0, 1.5 (censored at the end)
    assert s["queue_wait_max"] == pytest.approx(1.5)
    assert s["queue_wait_mean"] == pytest.approx(2.5 / 6)
    assert s["output_tokens"] == 19
    assert s["throughput_tok_s"] == pytest.approx(19 / 4)
    assert s["throughput_total_tok_s"] == pytest.approx((5 * 10 + 19) / 4)
    assert s["throughput_req_s"] == pytest.approx(4 / 4)
    assert (s["preemptions"], s["preempted_requests"]) == (1, 1)
    assert s["recompute_waste"] == pytest.approx(11 / (7 * 10 + 19 + 11))
    assert s["prefill_chunk_waste"] == pytest.approx((64 - 44) / 64)
    assert s["kv_util_mean"] == pytest.approx(0.75)
    assert s["kv_util_max"] == 1.0
    assert 0 < s["fairness_jain"] < 1


def test_tpot_goodput_thresholds_override_the_slo():
    s = summarize(_run(), RUN_SLO, tpot_goodput=(0.45, 0.2 + 1e-9))
    assert s["goodput_tpot"] == pytest.approx(1 / 7)  # only request 1 (TTFT 0.4)
    assert s["goodput_lifetime"] == pytest.approx(2 / 7)


def test_summary_is_json_friendly():
    s = summarize(_run(), RUN_SLO)
    assert all(type(v) in (int, float) for v in s.values())
    assert json.loads(json.dumps(s)) == s


def test_empty_run_gives_nans_without_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        s = summarize(make_records([]))
    assert set(s) == KEYS
    assert s["requests"] == 0 and s["preemptions"] == 0 and s["output_tokens"] == 0
    for k in ("goodput_lifetime", "ttft_p99", "itl_max", "duration_s", "fairness_jain"):
        assert math.isnan(s[k]), k


def test_run_without_any_slo_raises():
    with pytest.raises(ValueError, match="no SLO"):
        summarize(_run())


def test_million_token_run_summarizes():
    rec = synthetic_records(10_000, 100, seed=1)
    assert len(rec.token_times) > 900_000
    s = summarize(rec)
    assert s == summarize(rec)  # a pure function of the records
    assert s["output_tokens"] == len(rec.token_times)
    assert 0 < s["goodput_lifetime"] < s["goodput_tpot"] <= 1
    assert not math.isnan(s["fairness_jain"])


def test_missing_token_reaches_nan_in_one_request_only():
    rec = make_records([Req(0.0, (0.5,)), Req(0.0, (), UNF)], [Step(0.0, 1.0)])
    s = summarize(rec, RUN_SLO)
    assert s["ttft_mean"] == 0.5 and math.isnan(s["itl_mean"]) and math.isnan(s["tpot_p50"])
    assert s["goodput_lifetime"] == 0.5

from __future__ import annotations

import numpy as np
import pytest
from test_metrics_build import UNF, Req, Step, make_records

from horizon.metrics import (
    duration,
    output_throughput,
    request_throughput,
    run_span,
    total_throughput,
)


def _run():
    # Span: first arrival 1.0 to last step end 6.0 -> 5 s.
    return make_records(
        [
            Req(1.0, (2.0, 3.0), prompt=10),
            Req(2.0, (4.0,), prompt=20),
            Req(3.0, (), UNF, prompt=30),  # its prompt never completed: not in total tokens
            Req(3.5, (5.0,), UNF, prompt=40),  # emitted a token: prompt and token count
        ],
        [Step(1.5, 2.0), Step(5.5, 6.0)],
    )


def test_span_is_first_arrival_to_last_step_end():
    rec = _run()
    assert run_span(rec) == (1.0, 6.0)
    assert duration(rec) == 5.0


def test_throughputs_by_hand():
    rec = _run()
    assert output_throughput(rec) == pytest.approx(4 / 5)
    assert total_throughput(rec) == pytest.approx((10 + 20 + 40 + 4) / 5)
    assert request_throughput(rec) == pytest.approx(2 / 5)


def test_empty_or_instant_run_has_nan_rates():
    assert np.isnan(duration(make_records([])))
    assert np.isnan(output_throughput(make_records([])))
    instant = make_records([Req(1.0, (1.0,))], [Step(1.0, 1.0)])
    assert np.isnan(request_throughput(instant))

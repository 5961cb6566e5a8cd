"""``analysis.timeline``: periods, busy and idle time of back-to-back calls' kernels."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from attnlab.analysis.timeline import call_spans


def test_two_kernels_a_call_with_gaps_between_calls():
    # Calls every 30 us: a 10 us kernel, then a 2 us one 1 us later; 18 us idle a call.
    kernels = [(t, t + 10.0) for t in (0.0, 30.0, 60.0)]
    kernels += [(t + 11.0, t + 13.0) for t in (0.0, 30.0, 60.0)]
    spans = call_spans(kernels, per_call=2)
    assert spans.calls == 2
    assert spans.period_us == 30.0
    assert spans.busy_us == 12.0
    assert spans.idle_us == 18.0


def test_overlapping_kernels_count_once_and_overlapping_calls_go_negative():
    # The second kernel starts before the first ends (PDL), the next call before this one ends.
    kernels = [(0.0, 10.0), (8.0, 12.0), (11.0, 21.0), (19.0, 23.0), (22.0, 32.0),
               (30.0, 34.0)]
    spans = call_spans(kernels, per_call=2)
    assert spans.busy_us == 12.0
    assert spans.period_us == 11.0
    assert spans.idle_us == -1.0


@pytest.mark.parametrize("kernels, per_call, message", [
    ([(0.0, 1.0)] * 3, 2, "whole calls"),
    ([(0.0, 1.0), (2.0, 3.0)], 2, "at least two calls"),
    ([(0.0, 1.0), (2.0, 1.5)], 1, "ends before"),
    ([(0.0, 1.0), (2.0, 3.0)], 0, "per_call"),
])
def test_refuses_what_is_not_a_span(kernels, per_call, message):
    with pytest.raises(ValueError, match=message):
        call_spans(kernels, per_call)


@given(period=st.floats(12.5, 100.0), durations=st.lists(st.floats(0.1, 4.0), min_size=1,
                                                           max_size=3),
       calls=st.integers(2, 20))
def test_regular_calls_give_their_period_and_disjoint_kernels_their_sum(period, durations,
                                                                        calls):
    kernels = []
    for c in range(calls):
        t = c * period
        for d in durations:  # back to back inside the call: at most 12 us of a period
            kernels.append((t, t + d))
            t += d
    spans = call_spans(kernels, len(durations))
    assert spans.calls == calls - 1
    assert spans.period_us == pytest.approx(period)
    assert spans.busy_us == pytest.approx(sum(durations))
    assert spans.idle_us == pytest.approx(period - sum(durations))

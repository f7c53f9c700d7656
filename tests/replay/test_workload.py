"""A trace as engine requests."""

from __future__ import annotations

from kvstored.replay.workload import Workload

from .conftest import trace_of


def test_requests_carry_their_blocks_tokens_and_arrival():
    trace = trace_of([[1, 2, 3], [1, 2], [7]], block=16, times=[10.0, 12.5, 20.0],
                     lengths=[40, 32, 5])
    workload = Workload(trace)
    assert len(workload) == 3 and workload.span == 10.0 and workload.longest == 3
    first = workload.request(0)
    assert first.arrival == 0.0 and first.ids.tolist() == [1, 2, 3]
    assert first.tokens.tolist() == [16, 16, 8]
    assert workload.request(1).arrival == 2.5
    assert workload.request(2).tokens.tolist() == [5]
    assert workload.request(0).keys("n")[:2] == workload.request(1).keys("n")

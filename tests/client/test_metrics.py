"""Client-side metrics: a known sequence of hits, misses and errors counts exactly the
same in the blocking, trio and asyncio clients (the core counts, once), and the
prometheus exposition carries those numbers."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import trio
from prometheus_client import CollectorRegistry, generate_latest

import kvstored
import kvstored.aio
import kvstored.asyncio
from kvstored.client.metrics import LATENCY_BOUNDS, CallKind, MetricsSnapshot
from kvstored.errors import BadRequestError
from tests.daemon.conftest import embedded, spawn  # noqa: F401 - fixtures


def sequence(p: str) -> list[tuple[str, tuple[Any, ...]]]:
    return [
        ("batch_put", ([f"{p}a", f"{p}b", f"{p}c"], [b"1", b"22", b"333"])),  # 3 stored
        ("put", (f"{p}a", b"x")),                                  # already there
        ("batch_get", ([f"{p}a", f"{p}b", f"{p}none"],)),          # 2 hits, 1 miss
        ("get_into", (f"{p}c", bytearray(10))),                    # a hit of 3 bytes
        ("get", (f"{p}none",)),                                    # a miss
        ("batch_get_into", ([f"{p}a"], [])),                       # an error
        ("batch_exists", ([f"{p}a", f"{p}none"],)),
        ("prefix_hits", ([f"{p}a", f"{p}b", f"{p}none", f"{p}c"],)),
        ("stat", (f"{p}a",)),
        ("stat", (f"{p}none",)),
        ("remove", (f"{p}a",)),
        ("call", ("status",)),
    ]


#: (calls, errors, keys, hits, misses, bytes) the sequence adds, per kind.
EXPECTED = {
    CallKind.PUT: (2, 0, 4, 3, 1, 6),
    CallKind.GET: (4, 1, 5, 3, 2, 6),
    CallKind.EXISTS: (1, 0, 2, 1, 1, 0),
    CallKind.PREFIX_HITS: (1, 0, 4, 2, 2, 0),
    CallKind.STAT: (2, 0, 2, 1, 1, 0),
    CallKind.REMOVE: (1, 0, 1, 1, 0, 0),
    CallKind.CALL: (1, 0, 1, 0, 0, 0),
}


def counts(snapshot: MetricsSnapshot) -> dict[CallKind, tuple[int, ...]]:
    out = {}
    for kind, m in snapshot.calls.items():
        assert m.latency.calls == m.calls and m.latency.bounds == LATENCY_BOUNDS
        assert (m.latency.total > 0) == (m.calls > 0)
        if m.calls:
            out[kind] = (m.calls, m.errors, m.keys, m.hits, m.misses, m.bytes)
    return out


def run_blocking(addr: str) -> MetricsSnapshot:
    with kvstored.connect(addr) as c:
        for method, args in sequence("m-sync/"):
            try:
                getattr(c, method)(*args)
            except BadRequestError:
                pass
        return c.metrics()


async def run_async(connect: Any, addr: str, prefix: str) -> MetricsSnapshot:
    async with connect(addr) as c:
        for method, args in sequence(prefix):
            try:
                await getattr(c, method)(*args)
            except BadRequestError:
                pass
        return c.metrics()


def test_the_three_clients_count_a_known_sequence_exactly(embedded):  # noqa: F811
    up = embedded()
    blocking = run_blocking(up.addr)
    trio_side = trio.run(run_async, kvstored.aio.connect, up.addr, "m-trio/")
    asyncio_side = asyncio.run(run_async(kvstored.asyncio.connect, up.addr, "m-asio/"))
    assert counts(blocking) == counts(trio_side) == counts(asyncio_side) == EXPECTED


@pytest.mark.parametrize("transport", ["tcp", "auto"])
def test_prometheus_exposition_carries_the_counts(embedded, transport):  # noqa: F811
    up = embedded()
    registry = CollectorRegistry()
    with kvstored.connect(up.addr, transport=transport) as c:
        collector = c.register_metrics(registry, {"engine": "test", "rank": "0"})
        c.batch_put(["p/1", "p/2"], [b"abc", b"defg"])
        assert c.batch_get(["p/1", "p/none", "p/2"]) == [b"abc", None, b"defg"]
        text = generate_latest(registry).decode()
        labels = 'call="get",engine="test",rank="0"'
        for line in (f"kvstored_client_calls_total{{{labels}}} 1.0",
                     f"kvstored_client_hits_total{{{labels}}} 2.0",
                     f"kvstored_client_misses_total{{{labels}}} 1.0",
                     f"kvstored_client_bytes_total{{{labels}}} 7.0",
                     f"kvstored_client_errors_total{{{labels}}} 0.0",
                     'kvstored_client_latency_seconds_bucket{call="get",engine="test",le="+Inf",'
                     'rank="0"} 1.0',
                     f"kvstored_client_latency_seconds_count{{{labels}}} 1.0",
                     'kvstored_client_bytes_total{call="put",engine="test",rank="0"} 7.0'):
            assert line in text.splitlines(), line
        c.get("p/1")  # read at each scrape, not at registration
        assert (f"kvstored_client_calls_total{{{labels}}} 2.0"
                in generate_latest(registry).decode().splitlines())
        registry.unregister(collector)

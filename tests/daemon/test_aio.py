"""The trio client offers the same calls as the blocking one."""

from __future__ import annotations

import os

import pytest
import trio

import kvstored.aio
from tests.daemon.harness import kvstore, kvstore_ok


@pytest.mark.parametrize("transport", ["tcp", "auto"])
def test_async_client_round_trip(embedded, transport):
    up = embedded()
    values = {f"a{i}": os.urandom(n) for i, n in enumerate([0, 10, 70_000, 1 << 20])}

    async def main() -> None:
        async with kvstored.aio.connect(up.addr, transport=transport) as c:
            assert await c.batch_put(list(values), list(values.values())) == [True] * 4
            assert await c.put("a1", b"again") is False
            assert await c.get("a2") == values["a2"]
            bufs = [bytearray(len(v)) for v in values.values()]
            assert await c.batch_get_into(list(values), bufs) == [len(v) for v in values.values()]
            assert [bytes(b) for b in bufs] == list(values.values())
            assert await c.batch_exists(["a0", "zz"]) == [True, False]
            assert await c.prefix_hits(["a0", "a1", "zz"]) == 2
            assert (await c.stat("a3")).size == 1 << 20
            assert await c.get("zz") is None
            assert await c.remove("a3") and await c.get("a3") is None

            async def reader(key: str) -> None:  # many tasks share one client
                assert await c.get(key) == values[key]

            async with trio.open_nursery() as nursery:
                for _ in range(5):
                    for key in ("a0", "a1", "a2"):
                        nursery.start_soon(reader, key)

    trio.run(main)


def test_offline_recover_on_a_stopped_store(embedded, tmp_path):
    up = embedded(backend="bucket")
    with kvstored.connect(up.addr) as c:
        c.batch_put([f"o{i}" for i in range(5)], [os.urandom(5000) for _ in range(5)])
    kvstore_ok("flush", "--wait", master=up.addr)
    up.stop()
    ssd = tmp_path / "data" / "ssd"
    out = kvstore_ok("recover", "--offline", str(ssd), "--json")
    assert '"objects": 5' in out and '"backend": "bucket"' in out
    wrong = kvstore("recover", "--offline", str(ssd), "--backend", "file-per-key")
    assert wrong.returncode == 2 and b"belongs to the 'bucket' backend" in wrong.stderr

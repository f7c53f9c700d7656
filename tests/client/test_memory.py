"""Registered host memory against a real `kvstored up`: a client's shared-memory pool (a
memfd, a /dev/shm file) registered with the node on this host, whose puts and gets of
pieces inside it the node moves itself (the client's own copies are never called); a
node that refuses (a disk file, another host) leaves the client copying, counted; and a
region is its registering process's alone, for as long as that process lives."""

from __future__ import annotations

import mmap
import os
import subprocess
import sys
import uuid

import numpy as np
import pytest
import trio

import kvstored
import kvstored.aio
from kvstored.client import core, read
from kvstored.client.connection import Connection
from kvstored.client.memory import HostMemory
from kvstored.errors import BadRequestError
from kvstored.hostid import host_id
from kvstored.protocol import ops
from kvstored.protocol.node_api import RegionRequest, RegisterMemoryRequest
from kvstored.wire import Parts
from tests.daemon.conftest import embedded, spawn  # noqa: F401 - fixtures

POOL = 4 << 20


class Pool:
    """An engine's host pool stand-in: a shared-memory file mapped here."""

    def __init__(self, path: str | None = None) -> None:
        if path is None:
            self.fd = os.memfd_create("kvstored-test-pool")
        else:
            self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        os.ftruncate(self.fd, POOL)
        self.map = mmap.mmap(self.fd, POOL)
        self.bytes = np.frombuffer(self.map, dtype=np.uint8)

    def close(self) -> None:
        os.close(self.fd)  # the mapping goes with the last view of it


@pytest.fixture
def pool():
    p = Pool()
    yield p
    p.close()


def _no_client_copies(monkeypatch) -> None:
    """Fail the test if the client copies an object through its segment mapping."""
    def refuse(*args):
        raise AssertionError("the client copied bytes the node should have moved")
    monkeypatch.setattr(core, "gather", refuse)
    monkeypatch.setattr(read, "scatter_checked", refuse)


@pytest.mark.parametrize("kind", ["memfd", "dev-shm"])
def test_the_node_moves_pieces_in_registered_memory_itself(embedded, monkeypatch, kind):  # noqa: F811
    up = embedded()
    path = f"/dev/shm/kvstored-test-pool-{uuid.uuid4().hex[:12]}"
    pool = Pool(None if kind == "memfd" else path)
    try:
        data = np.random.default_rng(1).integers(0, 256, 300_000, dtype=np.uint8)
        pool.bytes[:300_000] = data
        page = [pool.bytes[:1000], pool.bytes[4096:300_000]]   # two spans of the pool
        expected = page[0].tobytes() + page[1].tobytes()
        with kvstored.connect(up.addr) as c:
            c.register_memory(pool.map, pool.fd)
            _no_client_copies(monkeypatch)
            assert c.batch_put_parts(["page", "flat"], [page, [pool.bytes[:300_000]]]) \
                == [True, True]
            into = [pool.bytes[1_000_000:1_000_007], pool.bytes[2_000_000:2_296_897]]
            assert c.get_into_parts("page", into) == 296_904
            assert c.get_into("flat", pool.bytes[3_000_000:3_300_000]) == 300_000
            assert c.memory.stats.moved_objects == 4 and c.memory.stats.fallback_objects == 0
            monkeypatch.undo()
            assert c.get("page") == expected
            assert into[0].tobytes() + into[1].tobytes() == expected
            assert pool.bytes[3_000_000:3_300_000].tobytes() == data.tobytes()
            (_, region), = c.memory.regions.items()
            assert isinstance(region, tuple)

        async def trio_side() -> int:
            async with kvstored.aio.connect(up.addr) as t:
                t.register_memory(pool.map, pool.fd)
                n = await t.get_into_parts("page", [pool.bytes[:1000],
                                                    pool.bytes[10_000:305_904]])
                assert t.memory.stats.moved_objects == 1
                return n

        assert trio.run(trio_side) == 296_904
        assert pool.bytes[:1000].tobytes() + pool.bytes[10_000:305_904].tobytes() == expected
    finally:
        pool.close()
        if kind == "dev-shm":
            os.unlink(path)


def test_a_node_that_refuses_the_memory_leaves_the_client_copying(embedded, tmp_path):  # noqa: F811
    up = embedded()
    on_disk = Pool(str(tmp_path / "pool-on-disk"))  # not shared memory: refused
    try:
        on_disk.bytes[:5000] = 7
        with kvstored.connect(up.addr) as c:
            c.register_memory(on_disk.map, on_disk.fd)
            assert c.put_parts("k", [on_disk.bytes[:2000], on_disk.bytes[2000:5000]])
            assert c.get_into_parts("k", [on_disk.bytes[8000:13000]]) == 5000
            assert on_disk.bytes[8000:13000].tobytes() == bytes([7]) * 5000
            (_, reason), = c.memory.regions.items()
            assert "not a shared-memory file" in reason
            assert c.memory.stats.fallback_objects == 2 and c.memory.stats.moved_objects == 0
    finally:
        on_disk.close()


def test_a_client_on_another_host_is_refused_and_copies(embedded, monkeypatch, pool):  # noqa: F811
    up = embedded()
    monkeypatch.setattr(core, "host_id", lambda: "another-host")
    with kvstored.connect(up.addr) as c:
        c.register_memory(pool.map, pool.fd)
        pool.bytes[:10] = 3
        assert c.put("k", pool.bytes[:10])
        assert c.get("k") == bytes([3]) * 10
        (_, reason), = c.memory.regions.items()
        assert "another host" in reason and c.memory.stats.fallback_objects == 1


def _node_connection(c) -> Connection:
    node = next(iter(c.nodes))
    return Connection(c.core.endpoint(node), c.core.token, timeout=10, connect_timeout=10)


def test_a_region_is_its_process_alone_and_ends_with_it(embedded, pool):  # noqa: F811
    up = embedded()
    # A process of its own registers a pool, stores through it, prints its region, exits.
    child = subprocess.run([sys.executable, "-c", CHILD, up.addr], capture_output=True,
                           text=True, timeout=120)
    assert child.returncode == 0, child.stderr
    region, token = child.stdout.split()
    with kvstored.connect(up.addr) as c:
        assert c.get("child/page") == bytes([9]) * 4096
        conn = _node_connection(c)
        try:
            with pytest.raises(BadRequestError, match="its process ended"):
                conn.call(ops.COPY_OUT, RegionRequest(["child/page"], int(region), token,
                                                      [[0, 4096]]))
            stat = os.fstat(pool.fd)
            claim = RegisterMemoryRequest(os.getppid(), pool.fd, stat.st_dev, stat.st_ino,
                                          POOL, host_id())
            with pytest.raises(BadRequestError, match="does not hold this connection"):
                conn.call(ops.REGISTER_MEMORY, claim)
            mine = conn.call(ops.REGISTER_MEMORY, RegisterMemoryRequest(
                os.getpid(), pool.fd, stat.st_dev, stat.st_ino, POOL, host_id()))
            with pytest.raises(BadRequestError, match="with that token"):
                conn.call(ops.COPY_OUT, RegionRequest(["child/page"], mine.region,
                                                      "0" * 32, [[0, 4096]]))
            with pytest.raises(BadRequestError, match="not the file described"):
                conn.call(ops.REGISTER_MEMORY, RegisterMemoryRequest(
                    os.getpid(), pool.fd, stat.st_dev, stat.st_ino + 1, POOL, host_id()))
            with pytest.raises(BadRequestError, match="outside the region"):
                conn.call(ops.COPY_OUT, RegionRequest(["child/page"], mine.region,
                                                      mine.token, [[POOL - 10, 4096]]))
            assert conn.call(ops.COPY_OUT, RegionRequest(
                ["child/page"], mine.region, mine.token, [[100, 4096]])).sizes == [4096]
            assert pool.bytes[100:4196].tobytes() == bytes([9]) * 4096
        finally:
            conn.close()


CHILD = """
import mmap, os, sys
import numpy as np
import kvstored
fd = os.memfd_create("child-pool")
os.ftruncate(fd, 1 << 20)
pool = mmap.mmap(fd, 1 << 20)
np.frombuffer(pool, dtype=np.uint8)[:4096] = 9
with kvstored.connect(sys.argv[1]) as c:
    c.register_memory(pool, fd)
    assert c.put_parts("child/page", [memoryview(pool)[:4096]])
    assert c.memory.stats.moved_objects == 1, c.memory.stats
    (region, token), = c.memory.regions.values()
print(region, token)
"""


def test_what_cannot_be_registered_is_refused_at_once(pool, tmp_path):
    memory = HostMemory()
    with pytest.raises(BadRequestError, match="needs a buffer"):
        memory.add(3, pool.fd)
    with pytest.raises(BadRequestError, match="writable"):
        memory.add(b"read-only", pool.fd)
    with pytest.raises(BadRequestError, match="not an open descriptor"):
        memory.add(pool.map, 10_000)
    small = os.memfd_create("small")
    try:
        with pytest.raises(BadRequestError, match=f"at least {POOL} bytes"):
            memory.add(pool.map, small)
    finally:
        os.close(small)
    memory.add(pool.map, pool.fd)
    # Pieces all in the pool: their extents, adjacent ones merged; else None.
    assert memory.locate(Parts([memoryview(pool.map)[10:20],
                                     memoryview(pool.map)[20:30]]), 20) == (0, [10, 20])
    assert memory.locate(Parts([memoryview(pool.map)[10:20],
                                     memoryview(bytearray(5))]), 15) is None
    assert memory.locate(memoryview(pool.map)[100:200], 50) == (0, [100, 50])


def test_a_region_the_node_no_longer_knows_is_copied_by_the_client_then_renewed(
        embedded, pool):  # noqa: F811
    """As after a node restart: the region the client remembers is refused; that put and
    that get are copied by the client, and the next ones register the pool again."""
    up = embedded()
    pool.bytes[:6000] = 4
    with kvstored.connect(up.addr) as c:
        c.register_memory(pool.map, pool.fd)
        assert c.put("first", pool.bytes[:3000])
        (where, (region, _)), = c.memory.regions.items()
        c.memory.regions[where] = (region, "f" * 32)  # a token the node never gave
        assert c.put("second", pool.bytes[3000:6000])
        assert where not in c.memory.regions  # forgotten, and copied by the client
        assert c.memory.stats.moved_objects == 1
        c.memory.regions[where] = (region, "f" * 32)
        assert c.get_into("second", pool.bytes[10_000:13_000]) == 3000
        assert pool.bytes[10_000:13_000].tobytes() == bytes([4]) * 3000
        assert where not in c.memory.regions and c.memory.stats.moved_objects == 1
        assert c.get_into("first", pool.bytes[20_000:23_000]) == 3000  # registered anew
        assert c.memory.stats.moved_objects == 2
        assert isinstance(c.memory.regions[where], tuple)

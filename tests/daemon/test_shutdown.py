"""Stopping daemons cleanly: a node writes its DRAM-only objects to SSD before it exits,
and tells the master it left, so that reads of its keys miss at once (or go to another
replica) instead of failing until its TTL runs out."""

from __future__ import annotations

import json
import os

import trio

import kvstored
import kvstored.aio
from tests.daemon.harness import kvstore, kvstore_ok, wait_for

MiB = 1 << 20


def _status(master: str) -> dict:
    return json.loads(kvstore_ok("status", "--json", master=master))


def _put_dram_only(addr: str, count: int) -> dict[str, bytes]:
    values = {f"s{i}": os.urandom(200_000) for i in range(count)}
    with kvstored.connect(addr) as c:
        assert c.batch_put(list(values), list(values.values())) == [True] * count
        assert all([r.tier for r in c.stat(k).replicas] == ["dram"] for k in values)
    return values


def test_sigterm_writes_dram_only_objects_to_ssd_and_a_restart_has_them(embedded, tmp_path):
    # The watermark policy never offloads a store this empty: every object is DRAM-only.
    up = embedded("--offload", "watermark")
    values = _put_dram_only(up.addr, 20)
    assert up.stop() == 0
    assert any("shutdown flush: 20 DRAM-only objects written to SSD" in line
               and "0 dropped" in line for line in up.lines), up.log
    again = embedded("--offload", "watermark")
    with kvstored.connect(again.addr) as c:
        for key, value in values.items():
            assert c.get(key) == value, key
            assert [r.tier for r in c.stat(key).replicas] == ["ssd"]


def test_a_zero_shutdown_flush_timeout_drops_them_and_says_so(embedded, tmp_path):
    config = tmp_path / "kvstored.toml"
    config.write_text('[node]\nshutdown_flush_timeout = 0\n')
    up = embedded("--offload", "watermark", "--config", str(config))
    _put_dram_only(up.addr, 5)
    assert up.stop() == 0
    assert any("node.shutdown_flush_timeout is 0, so 5 DRAM-only objects are dropped" in line
               for line in up.lines), up.log
    again = embedded("--offload", "watermark")
    with kvstored.connect(again.addr) as c:
        assert c.get("s0") is None


def test_a_node_stopped_cleanly_leaves_at_once_and_its_keys_miss(spawn, tmp_path):
    master = spawn("master", "--listen", "127.0.0.1:0")  # node_ttl is 10 s
    nodes = {}
    for name in ("n1", "n2"):
        nodes[name] = spawn("node", "--master", master.addr, "--listen", "127.0.0.1:0",
                            "--name", name, "--data", str(tmp_path / name), "--dram", "32MiB",
                            "--ssd", "1GiB", "--backend", "file-per-key")
    # Listed from its hello on; a node takes puts once it has registered its objects.
    wait_for(lambda: [n["state"] for n in _status(master.addr)["nodes"]] == ["ready"] * 2,
             what="two nodes ready")
    values = {f"x{i}": os.urandom(30_000) for i in range(30)}
    with kvstored.connect(master.addr, transport="tcp") as c:
        assert c.batch_put(list(values), list(values.values())) == [True] * len(values)
        holder = {k: c.stat(k).replicas[0].node for k in values}
        assert set(holder.values()) == {"n1", "n2"}
        keys = list(values)
        assert c.batch_get(keys) == list(values.values())
        assert nodes["n1"].stop() == 0
        assert any("unregistered from the master" in line for line in nodes["n1"].lines)
        # At once, not after node_ttl: the master dropped n1's replicas when it left.
        assert [n["node"] for n in _status(master.addr)["nodes"]] == ["n2"]
        expected = [None if holder[k] == "n1" else values[k] for k in keys]
        assert c.batch_get(keys) == expected
        # This client read n1's keys there before (get_held remembers where): it tries
        # n1 once for them, finds it gone, and the lookup it falls back to no longer
        # lists n1, so no read of the lookup path goes there, now or later.
        on_n1 = sum(holder[k] == "n1" for k in keys)
        assert c.stats.node_failures == on_n1
        assert c.batch_get(keys) == expected
        assert c.stats.node_failures == on_n1, "a read was sent to the stopped node again"

    async def trio_reads() -> list:
        async with kvstored.aio.connect(master.addr) as ac:
            return await ac.batch_get(keys)

    assert trio.run(trio_reads) == expected
    gone = next(k for k in keys if holder[k] == "n1")
    run = kvstore("get", gone, master=master.addr)
    assert run.returncode == 3, run.stderr.decode()

"""`kvstored up` with the client library and the CLI: real processes on loopback."""

from __future__ import annotations

import json
import os
import socket
import urllib.request
from functools import partial

import pytest

import kvstored
from kvstored.errors import BadRequestError, UnauthorizedError
from tests.conftest import run_threads
from tests.daemon.harness import closed_port, free_port, kvstore, kvstore_ok, wait_for

MiB = 1 << 20


@pytest.mark.parametrize("transport", ["tcp", "shm", "auto"])
def test_round_trip_through_each_transport(embedded, transport):
    up = embedded()
    values = {f"k{i}": os.urandom(size) for i, size in enumerate([0, 1, 4095, 4096, 3 * MiB])}
    with kvstored.connect(up.addr, transport=transport) as c:
        assert c.batch_put(list(values), list(values.values())) == [True] * len(values)
        assert c.put("k1", b"other") is False  # write-once
        for key, value in values.items():
            assert c.get(key) == value
        bufs = [bytearray(len(v) + 10) for v in values.values()]
        assert c.batch_get_into(list(values), bufs) == [len(v) for v in values.values()]
        assert all(bytes(b[:len(v)]) == v for b, v in zip(bufs, values.values()))
        assert c.get("missing") is None
        assert c.get_into("missing", bytearray(10)) == -1
        assert c.batch_exists(["k0", "nope", "k4"]) == [True, False, True]
        assert c.prefix_hits(["k0", "k1", "nope", "k2"]) == 2
        info = c.stat("k4")
        assert info.size == 3 * MiB and info.replicas[0].tier == "dram"
        assert c.remove("k4") and not c.exists("k4") and not c.remove("k4")


def test_buffer_too_small_is_a_clear_error(embedded):
    up = embedded()
    with kvstored.connect(up.addr) as c:
        c.put("big", b"x" * 1000)
        with pytest.raises(BadRequestError, match="at least 1000"):
            c.get_into("big", bytearray(10))


def test_flush_then_restart_keeps_everything(embedded):
    up = embedded()
    values = {f"obj{i}": os.urandom(256 * 1024) for i in range(12)}
    with kvstored.connect(up.addr) as c:
        c.batch_put(list(values), list(values.values()))
    report = json.loads(kvstore_ok("flush", "--wait", "--json", master=up.addr))
    assert report["done"] is True and not report["failed"]
    assert up.stop() == 0
    up2 = embedded()
    with kvstored.connect(up2.addr) as c:
        for key, value in values.items():
            assert c.get(key) == value
            assert [r.tier for r in c.stat(key).replicas] == ["ssd"]


def test_watermark_eviction_offloads_before_dropping(embedded):
    up = embedded(dram="16MiB")
    values = {f"w{i}": os.urandom(MiB) for i in range(48)}
    with kvstored.connect(up.addr) as c:
        for key, value in values.items():  # three times the DRAM tier
            assert c.put(key, value)
        for key, value in values.items():
            assert c.get(key) == value, key
    def status():
        return json.loads(kvstore_ok("status", "--json", master=up.addr))

    dram = status()["tiers"]["dram"]
    assert dram["used_bytes"] <= dram["capacity_bytes"]
    # Eager offload copies the last few within its batching age.
    wait_for(lambda: status()["tiers"]["ssd"]["objects"] == 48, what="every object on SSD")
    assert status()["objects"] == 48


def test_promotion_brings_hot_ssd_objects_back_to_dram(embedded):
    up = embedded()
    with kvstored.connect(up.addr) as c:
        c.put("hot", b"h" * 100_000)
        kvstore_ok("flush", "--wait", master=up.addr)
        kvstore_ok("evict", "--tier", "dram", "--key", "hot", master=up.addr)
        wait_for(lambda: [r.tier for r in c.stat("hot").replicas] == ["ssd"], timeout=15,
                 what="the DRAM copy to go (after its lease)")
        assert c.get("hot") == b"h" * 100_000
        assert c.get("hot") == b"h" * 100_000
        wait_for(lambda: "dram" in [r.tier for r in c.stat("hot").replicas], timeout=15,
                 what="promotion to DRAM")
        assert c.get("hot") == b"h" * 100_000


def test_cli_round_trip_and_exit_codes(embedded, tmp_path):
    up = embedded()
    source = tmp_path / "in.bin"
    source.write_bytes(os.urandom(70_000))
    kvstore_ok("put", "cli/key", str(source), master=up.addr)
    assert kvstore("put", "cli/key", str(source), master=up.addr).returncode == 0  # exists
    out = tmp_path / "out.bin"
    kvstore_ok("get", "cli/key", "-o", str(out), master=up.addr)
    assert out.read_bytes() == source.read_bytes()
    kvstore_ok("put", "cli/stdin", "-", input=b"from stdin", master=up.addr)
    assert kvstore_ok("get", "cli/stdin", master=up.addr) == "from stdin"
    listing = json.loads(kvstore_ok("ls", "cli/", "--json", master=up.addr))
    assert [o["key"] for o in listing["objects"]] == ["cli/key", "cli/stdin"]
    stat = json.loads(kvstore_ok("stat", "cli/key", "--json", master=up.addr))
    assert stat["size"] == 70_000 and stat["replicas"]
    kvstore_ok("rm", "cli/key", master=up.addr)
    assert kvstore("get", "cli/key", master=up.addr).returncode == 3
    assert kvstore("rm", "cli/key", master=up.addr).returncode == 3
    assert kvstore("stat", "cli/key", master=up.addr).returncode == 3
    assert kvstore("evict", "--tier", "dram", master=up.addr).returncode == 2
    assert kvstore("status", master=f"127.0.0.1:{closed_port()}").returncode == 4


def test_metrics_endpoint(embedded):
    port = free_port()
    up = embedded("--metrics", f"127.0.0.1:{port}")
    with kvstored.connect(up.addr) as c:
        c.put("m", b"x")
        c.get("m")
        c.get("absent")
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    assert 'kvstored_lookups_total{result="hit_dram"} 1.0' in text
    assert 'kvstored_lookups_total{result="miss"} 1.0' in text
    for name in ("kvstored_tier_capacity_bytes", "kvstored_checksum_failures_total",
                 "kvstored_io_seconds_bucket", "kvstored_evictions_total"):
        assert name in text or name.replace("_total", "") in text, name


def test_token_is_required_when_configured(embedded, tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    up = embedded("--token-file", str(token))
    with pytest.raises(UnauthorizedError):
        kvstored.connect(up.addr)
    with kvstored.connect(up.addr, token="s3cret") as c:
        assert c.put("t", b"v") and c.get("t") == b"v"
    assert kvstore("status", master=up.addr).returncode == 2
    kvstore_ok("status", "--token-file", str(token), master=up.addr)


def test_garbage_on_the_ports_leaves_the_daemon_serving(embedded):
    up = embedded()
    with kvstored.connect(up.addr) as c:
        c.put("survivor", b"still here")
        endpoint = next(iter(c.nodes.values())).endpoint
        node_addr = (endpoint.host, endpoint.port)
    rng = __import__("random").Random(7)
    payloads = [b"", b"GET / HTTP/1.1\r\n\r\n", b"KVW1" + b"\xff" * 12,
                b"KVW1\x05\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\xc1\xc1\xc1\xc1\xc1",
                *(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 4000)))
                  for _ in range(30))]
    for host, port in ((up.address[0], up.address[1]), (node_addr[0], node_addr[1])):
        for junk in payloads:
            with socket.create_connection((host, port), timeout=5) as s:
                try:  # the daemon may hang up first: that is a fine answer to garbage
                    s.sendall(junk)
                    s.shutdown(socket.SHUT_WR)
                    while s.recv(65536):
                        pass
                except (ConnectionResetError, BrokenPipeError, OSError) as exc:
                    assert not isinstance(exc, TimeoutError), "the daemon kept a bad peer open"
    with kvstored.connect(up.addr) as c:
        assert c.get("survivor") == b"still here"


@pytest.mark.slow  # 20,000 operations: about 20 s on a loaded machine
def test_eight_threads_twenty_thousand_mixed_operations(embedded, tmp_path):
    # Stopping drops what is still DRAM-only instead of writing it out: the stop is not what
    # this test checks, and writing thousands of small files took it 30 s.
    config = tmp_path / "kvstored.toml"
    config.write_text("[node]\nshutdown_flush_timeout = 0\n")
    up = embedded("--config", str(config), dram="128MiB")
    errors: list[str] = []

    def worker(w: int) -> None:
        rng = __import__("random").Random(w)
        with kvstored.connect(up.addr) as c:
            mine: dict[str, bytes] = {}
            for i in range(2500):
                op = rng.random()
                try:
                    if op < 0.4 or not mine:
                        key = f"t{w}/{i}"
                        value = rng.randbytes(rng.randrange(0, 20_000))
                        if not c.put(key, value):
                            errors.append(f"put {key} said exists")
                        mine[key] = value
                    elif op < 0.8:
                        key = rng.choice(list(mine))
                        if c.get(key) != mine[key]:
                            errors.append(f"get {key} wrong")
                    elif op < 0.9:
                        key = rng.choice(list(mine))
                        if not c.remove(key):
                            errors.append(f"remove {key} missing")
                        del mine[key]
                    else:
                        keys = rng.sample(list(mine), min(8, len(mine)))
                        if c.batch_exists(keys) != [True] * len(keys):
                            errors.append("batch_exists wrong")
                except Exception as exc:  # collected, so one failure shows them all
                    errors.append(f"{type(exc).__name__}: {exc}")

    raised = run_threads(partial(worker, w) for w in range(8))
    assert not errors and not raised, (errors + raised)[:10]


def test_a_key_removed_and_written_again_serves_only_the_new_value(embedded):
    """The old version lingers (leased) in DRAM and on SSD after the remove; the late
    drops of the old version must neither free the new one nor be served for it."""
    up = embedded()
    with kvstored.connect(up.addr) as c:
        assert c.put("v", b"old" * 1000)
        kvstore_ok("flush", "--wait", master=up.addr)
        assert c.get("v") == b"old" * 1000  # a lease on the old version
        assert c.remove("v")
        assert c.put("v", b"new" * 2000) is True
        assert c.get("v") == b"new" * 2000
        kvstore_ok("flush", "--wait", master=up.addr)
        kvstore_ok("evict", "--tier", "dram", "--key", "v", master=up.addr)
        wait_for(lambda: [r.tier for r in c.stat("v").replicas] == ["ssd"], timeout=15,
                 what="the new version's DRAM copy to go")
        assert c.get("v") == b"new" * 2000  # from SSD: the new version, not the old
        wait_for(lambda: c.stat("v").reads >= 2, what="stat")

        def dram_in_use() -> int:
            status = json.loads(kvstore_ok("status", "--json", master=up.addr))
            return status["nodes"][0]["dram"]["used"]

        # The old version's DRAM copy stays retired until its lease expires and the master
        # drops it, in the same heartbeat as its SSD drop; the new version is on SSD only.
        wait_for(lambda: dram_in_use() == 0, timeout=30,
                 what="the old version's lease to expire and its drops to run")
        assert c.get("v") == b"new" * 2000
        assert [r.tier for r in c.stat("v").replicas] in (["ssd"], ["ssd", "dram"])

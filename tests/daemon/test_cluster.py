"""One master and several nodes as separate processes on loopback: placement across
nodes, crashes, restarts, node loss, a full disk and a corrupt record."""

from __future__ import annotations

import json
import os
import time

import pytest

import kvstored
from kvstored.errors import NoSpaceError
from tests.conftest import scratch_fs
from tests.daemon.harness import flip_ssd_byte, kvstore, kvstore_ok, wait_for

MiB = 1 << 20


def _config(tmp_path, **master) -> str:
    path = tmp_path / "kvstored.toml"
    lines = ["[master]"] + [f"{k} = {v!r}" for k, v in master.items()]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def _status(master: str) -> dict:
    return json.loads(kvstore_ok("status", "--json", master=master))


def _start_node(spawn, tmp_path, master, name, *extra, dram="32MiB", data=None):
    return spawn("node", "--master", master, "--listen", "127.0.0.1:0", "--name", name,
                 "--data", str(data or tmp_path / name), "--dram", dram, "--ssd", "1GiB",
                 "--backend", "file-per-key", *extra)


def _live_nodes(master: str) -> int:
    """The nodes that take puts: a node is alive from its hello on, and ready once it has
    registered its objects (a put placed on it before then is refused)."""
    return sum(1 for n in _status(master)["nodes"] if n["state"] == "ready")


def test_three_nodes_share_one_namespace(spawn, tmp_path, rng):
    master = spawn("master", "--listen", "127.0.0.1:0")
    for name in ("n1", "n2", "n3"):  # room for everything: the shm read below needs DRAM
        _start_node(spawn, tmp_path, master.addr, name, dram="96MiB")
    wait_for(lambda: _live_nodes(master.addr) == 3, what="three nodes")
    values = {f"x{i}": rng.randbytes(rng.randrange(1, 2 * MiB)) for i in range(60)}
    with kvstored.connect(master.addr, transport="tcp") as c:
        for start in range(0, 60, 10):
            keys = list(values)[start:start + 10]
            assert c.batch_put(keys, [values[k] for k in keys]) == [True] * 10
    holders = set()
    with kvstored.connect(master.addr, transport="tcp") as c:
        for key, value in values.items():
            assert c.get(key) == value
            holders.update(r.node for r in c.stat(key).replicas)
    assert holders == {"n1", "n2", "n3"}, "placement used only some nodes"
    with kvstored.connect(master.addr, transport="shm") as c:  # same host: mapped segments
        bufs = [bytearray(len(v)) for v in values.values()]
        assert c.batch_get_into(list(values), bufs) == [len(v) for v in values.values()]
        assert [bytes(b) for b in bufs] == list(values.values())


def test_node_killed_during_offload_comes_back_with_its_ssd_objects(spawn, tmp_path, rng):
    master = spawn("master", "--listen", "127.0.0.1:0")
    node = _start_node(spawn, tmp_path, master.addr, "n1", dram="128MiB")
    wait_for(lambda: _live_nodes(master.addr) == 1, what="the node")
    values = {f"crash{i}": os.urandom(MiB) for i in range(80)}
    with kvstored.connect(master.addr) as c:
        for key, value in values.items():
            c.put(key, value)
    kvstore_ok("flush", master=master.addr)  # queue the offload, do not wait
    time.sleep(rng.uniform(0.0, 0.3))  # land the kill somewhere in the offload (seeded)
    node.kill9()
    _start_node(spawn, tmp_path, master.addr, "n1", dram="128MiB")
    wait_for(lambda: _live_nodes(master.addr) == 1, what="the restarted node")
    survived = 0
    with kvstored.connect(master.addr) as c:
        for key, value in values.items():
            got = c.get(key)
            assert got in (value, None), f"{key} came back with wrong bytes"
            survived += got is not None
    ssd_objects = sum(1 for _ in (tmp_path / "n1" / "ssd" / "objects").rglob("*.kvr"))
    assert survived == ssd_objects, "every object on the node's SSD is readable again"


def test_master_restart_loses_nothing(spawn, tmp_path):
    master = spawn("master", "--listen", "127.0.0.1:0")
    port = master.address[1]
    _start_node(spawn, tmp_path, master.addr, "n1")
    wait_for(lambda: _live_nodes(master.addr) == 1, what="the node")
    on_ssd = {f"ssd{i}": os.urandom(300_000) for i in range(10)}
    with kvstored.connect(master.addr) as c:
        c.batch_put(list(on_ssd), list(on_ssd.values()))
        kvstore_ok("flush", "--wait", master=master.addr)
        in_dram = {f"dram{i}": os.urandom(300_000) for i in range(10)}
        c.batch_put(list(in_dram), list(in_dram.values()))
    master.kill9()
    master2 = spawn("master", "--listen", f"127.0.0.1:{port}")
    wait_for(lambda: _live_nodes(master2.addr) == 1, timeout=30, what="re-registration")
    with kvstored.connect(master2.addr) as c:
        for key, value in {**on_ssd, **in_dram}.items():
            assert c.get(key) == value, key


def test_dead_node_is_dropped_after_its_ttl_and_clients_miss_cleanly(spawn, tmp_path):
    config = _config(tmp_path, node_ttl=2.0)
    master = spawn("master", "--listen", "127.0.0.1:0", "--config", config)
    node = _start_node(spawn, tmp_path, master.addr, "n1")
    wait_for(lambda: _live_nodes(master.addr) == 1, what="the node")
    with kvstored.connect(master.addr) as c:
        c.put("doomed", b"x" * 1000)
        node.kill9()
        wait_for(lambda: c.get("doomed") is None, timeout=20, what="the replica to be dropped")
        assert not c.exists("doomed")
    assert _live_nodes(master.addr) == 0


def test_full_disk_keeps_serving_from_dram(spawn, tmp_path):
    with scratch_fs(tmp_path / "small", "12m") as mount:
        master = spawn("master", "--listen", "127.0.0.1:0")
        _start_node(spawn, tmp_path, master.addr, "n1", dram="48MiB", data=mount / "n1")
        wait_for(lambda: _live_nodes(master.addr) == 1, what="the node")
        values = {f"f{i}": os.urandom(MiB) for i in range(30)}
        with kvstored.connect(master.addr) as c:
            for key, value in values.items():
                assert c.put(key, value)
            run = kvstore("flush", "--wait", "--json", master=master.addr)
            report = json.loads(run.stdout)
            assert report["failed"], "offload to a full disk should report failures"
            assert any("full" in f["reason"] for f in report["failed"]), report["failed"]
            # On a terminal's stderr too: what failed and why, not "the node logs say why".
            told = kvstore("flush", "--wait", master=master.addr)
            assert told.returncode == 1, told.stderr.decode()
            assert b"could not be offloaded: " in told.stderr, told.stderr.decode()
            assert b"file system is full" in told.stderr, told.stderr.decode()
            for key, value in values.items():
                assert c.get(key) == value, key
            with pytest.raises(NoSpaceError):
                for i in range(40):
                    c.put(f"more{i}", os.urandom(MiB))
        # The CLI says so too, with its own exit code. Offload may still free room after
        # the NoSpaceError (its retries, after a backoff, write what still fits on the
        # disk, and the DRAM copies of what they wrote go): puts may yet fit, but no more
        # than the 12 MiB disk can take (DRAM was full, and only an SSD copy frees DRAM),
        # so one of 13 puts of 1 MiB is refused, whatever the timing (10 all fit once).
        codes = []
        for i in range(13):
            codes.append(kvstore("put", f"one-more{i}", "-", input=os.urandom(MiB),
                                 master=master.addr).returncode)
            if codes[-1] == 6:
                break
        assert codes[-1] == 6 and set(codes) <= {0, 6}, codes


def test_corrupt_ssd_record_is_a_miss_quarantined_and_counted(embedded, tmp_path):
    up = embedded()
    with kvstored.connect(up.addr) as c:
        c.put("victim", os.urandom(200_000))
        c.put("bystander", b"b" * 50_000)
        kvstore_ok("flush", "--wait", master=up.addr)
        kvstore_ok("evict", "--tier", "dram", "--all", master=up.addr)
        wait_for(lambda: [r.tier for r in c.stat("victim").replicas] == ["ssd"], timeout=15,
                 what="the DRAM copy to go")
        flip_ssd_byte(c, "victim")
        assert c.get("victim") is None
        assert c.get("bystander") == b"b" * 50_000
        wait_for(lambda: _status(up.addr)["nodes"][0]["corrupt_reads"] == 1, what="the count")
        wait_for(lambda: list((tmp_path / "data" / "ssd" / "quarantine").iterdir()),
                 what="the record in quarantine")
        wait_for(lambda: not c.exists("victim"), what="the master to forget the bad copy")
        # Counted from the repair's typed action (RepairAction.QUARANTINED), once.
        wait_for(lambda: _status(up.addr)["nodes"][0]["quarantined"] == 1,
                 what="the quarantine count")

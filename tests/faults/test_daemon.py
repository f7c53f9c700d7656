"""Fault scenarios against real daemons: oversized objects, backend failures in every
background task, a node killed under a batch read, forged shared-memory bytes, and a
full disk. Each checks that the daemon keeps serving and that no caller gets an error
where a clean miss is the answer, or bad bytes where a miss is."""

from __future__ import annotations

import json
import os
import re
import urllib.request
from pathlib import Path

import pytest
import trio

import kvstored
import kvstored.aio
from kvstored.errors import NoSpaceError
from tests.conftest import scratch_fs
from tests.daemon.harness import (
    flip_ssd_byte,
    free_port,
    kvstore,
    kvstore_ok,
    wait_for,
)
from tests.faults import faulty_backend

MiB = 1 << 20
REPO = Path(__file__).resolve().parents[2]
FAULTY = "tests.faults.faulty_backend:FaultyBackend"


def _status(master: str) -> dict:
    return json.loads(kvstore_ok("status", "--json", master=master))


def _metric(port: int, name: str, **labels: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    pattern = re.escape(name) + (r"\{" + re.escape(want) + r"\}" if want else "") + r" (\S+)"
    match = re.search(pattern, text.decode())
    return float(match.group(1)) if match else 0.0


def _config(tmp_path: Path, text: str) -> str:
    path = tmp_path / "kvstored.toml"
    path.write_text(text)
    return str(path)


def _node(spawn, tmp_path, master, name, *extra, dram="32MiB", backend="file-per-key",
          data=None):
    return spawn("node", "--master", master, "--listen", "127.0.0.1:0", "--name", name,
                 "--data", str(data or tmp_path / name), "--dram", dram, "--ssd", "1GiB",
                 "--backend", backend, *extra)


# -- 1. objects the cluster can never place ------------------------------------------------

def test_an_object_larger_than_the_backend_takes_is_refused_and_the_daemon_lives(
        embedded, tmp_path):
    config = _config(tmp_path, '[node.backend_options]\nmax_value_size = "4MiB"\n')
    up = embedded("--config", config, dram="64MiB", backend="bucket")
    with kvstored.connect(up.addr) as c:
        with pytest.raises(NoSpaceError, match=r"5\.0 MiB.*4\.0 MiB.*max_value_size"):
            c.put("too-big", os.urandom(5 * MiB))
        with pytest.raises(NoSpaceError, match=r"80\.0 MiB.*whole DRAM tier.*64\.0 MiB"):
            c.put("bigger-than-dram", b"\0" * (80 * MiB))
        assert c.batch_put(["fits", "fits-too"], [b"a" * MiB, b"b" * 4 * MiB]) == [True, True]
        assert kvstore_ok("flush", "--wait", "--json", master=up.addr)
        assert not c.exists("too-big")
        assert c.get("fits-too") == b"b" * 4 * MiB
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(5 * MiB))
    run = kvstore("put", "k", str(big), master=up.addr)
    assert run.returncode == 6, run.stderr.decode()
    assert b"max_value_size" in run.stderr
    assert up.proc.poll() is None, up.log
    assert up.stop() == 0


# -- 1. every background task survives a failure --------------------------------------------

def test_every_background_task_survives_a_backend_failure(spawn, tmp_path):
    faults = tmp_path / "faults.json"
    # The first registration (its inventory scan) and a heartbeat's usage figures fail.
    faulty_backend.arm(faults, scan=1, usage=1)
    metrics_port = free_port()
    env = {faulty_backend.ENV: str(faults), "PYTHONPATH": str(REPO)}
    up = spawn("up", "--listen", "127.0.0.1:0", "--data", str(tmp_path / "data"),
               "--dram", "64MiB", "--ssd", "1GiB", "--backend", FAULTY,
               "--metrics", f"127.0.0.1:{metrics_port}", env=env)
    wait_for(lambda: faulty_backend.remaining(faults) == {"scan": 0, "usage": 0},
             what="the start-up faults to be used")

    def errors(task: str) -> float:
        return _metric(metrics_port, "kvstored_background_errors_total", task=task)

    with kvstored.connect(up.addr, transport="tcp") as c:
        # Offload: batch_write fails twice; the objects reach SSD on a retry.
        faulty_backend.arm(faults, batch_write=2)
        values = {f"k{i}": os.urandom(100_000) for i in range(4)}
        assert c.batch_put(list(values), list(values.values())) == [True] * 4
        wait_for(lambda: _status(up.addr)["tiers"]["ssd"]["objects"] == 4, timeout=30,
                 what="the offload retries to land")
        assert errors("offload") >= 1

        # Drop: the SSD delete of a removed object fails once, and is retried.
        faulty_backend.arm(faults, batch_delete=1)
        assert c.remove("k0")
        ssd_files = tmp_path / "data" / "ssd" / "objects"
        wait_for(lambda: len(list(ssd_files.rglob("*.kvr"))) == 3, timeout=30,
                 what="k0's SSD record to be deleted on a retry")
        assert errors("drop") >= 1

        # Promotion: reading the SSD copy into DRAM fails once; the next one works.
        kvstore_ok("evict", "--tier", "dram", "--key", "k1", master=up.addr)
        wait_for(lambda: [r.tier for r in c.stat("k1").replicas] == ["ssd"], timeout=15,
                 what="k1's DRAM copy to go")
        faulty_backend.arm(faults, batch_read_into_dram=1)

        def promoted() -> bool:
            assert c.get("k1") == values["k1"]
            return "dram" in [r.tier for r in c.stat("k1").replicas]

        wait_for(promoted, timeout=30, what="k1 to be promoted after a failed try")
        assert errors("promote") >= 1

        # Recovery: `kvstore recover` reports the failed check instead of hanging.
        faulty_backend.arm(faults, check=1)
        run = kvstore("recover", "--json", master=up.addr)
        assert run.returncode == 5, run.stderr.decode()
        report = next(iter(json.loads(run.stdout)["reports"].values()))
        assert "injected fault" in report["problems"][0]["detail"]
        assert errors("recover") >= 1
        assert json.loads(kvstore_ok("recover", "--json", master=up.addr))["missing"] == []

        # Quarantine after a corrupt SSD read: its check fails once; reads stay misses.
        kvstore_ok("evict", "--tier", "dram", "--key", "k2", master=up.addr)
        wait_for(lambda: [r.tier for r in c.stat("k2").replicas] == ["ssd"], timeout=15,
                 what="k2's DRAM copy to go")
        flip_ssd_byte(c, "k2")
        faulty_backend.arm(faults, check=1)
        assert c.get("k2") is None
        wait_for(lambda: errors("quarantine") >= 1, what="the quarantine's failure")

        assert errors("master-session") >= 1  # the start-up faults
        assert errors("heartbeat-stats") >= 1
        assert c.put("after", b"still serving")
        assert c.get("after") == b"still serving"
        assert c.get("k3") == values["k3"]
    assert up.proc.poll() is None, up.log
    assert "Traceback" not in up.log
    assert up.stop() == 0


# -- 23. a node killed under a batch read ----------------------------------------------------

def _two_nodes(spawn, tmp_path):
    master = spawn("master", "--listen", "127.0.0.1:0")
    nodes = {name: _node(spawn, tmp_path, master.addr, name) for name in ("n1", "n2")}
    # A node is listed (alive) as soon as it says hello; it takes puts once registered.
    for name, node in nodes.items():
        wait_for(lambda node=node: any("registered" in line and "objects" in line
                                       for line in node.lines), what=f"{name} registered")
    values = {f"x{i}": os.urandom(50_000) for i in range(40)}
    with kvstored.connect(master.addr, transport="tcp") as c:
        # One batch: each placement counts against its node, so they alternate.
        assert c.batch_put(list(values), list(values.values())) == [True] * len(values)
        holder = {k: c.stat(k).replicas[0].node for k in values}
    assert set(holder.values()) == {"n1", "n2"}, "placement used one node only"
    return master, nodes, values, holder


def test_a_killed_node_makes_its_keys_miss_and_the_rest_of_the_batch_succeed(
        spawn, tmp_path):
    master, nodes, values, holder = _two_nodes(spawn, tmp_path)
    keys = list(values)
    with kvstored.connect(master.addr, transport="tcp") as c:
        assert c.batch_get(keys) == list(values.values())  # connections to both are open
        nodes["n1"].kill9()
        # Well inside master.node_ttl: the master still lists n1's replicas.
        got = c.batch_get(keys)
        assert got == [None if holder[k] == "n1" else values[k] for k in keys]
        assert c.stats.node_failures >= 1
        bufs = [bytearray(50_000) for _ in keys]
        sizes = c.batch_get_into(keys, bufs)
        assert sizes == [-1 if holder[k] == "n1" else 50_000 for k in keys]

    async def trio_reads() -> list:
        async with kvstored.aio.connect(master.addr, transport="tcp") as ac:
            return await ac.batch_get(keys)

    assert trio.run(trio_reads) == [None if holder[k] == "n1" else values[k] for k in keys]
    n1_key = next(k for k in keys if holder[k] == "n1")
    assert kvstore("get", n1_key, master=master.addr).returncode == 3


# -- 13. bytes a same-host writer changed after its seal --------------------------------------

def _forge(c, key: str) -> None:
    """Overwrite ``key``'s DRAM bytes through this client's mapping, after its seal."""
    found = c.call("lookup", keys=[key])
    size, replicas = found["sizes"][0], found["replicas"]
    node, tier, offset = replicas["nodes"][0], replicas["tiers"][0], replicas["offsets"][0]
    assert tier == "dram"
    mapping = c.segments.mapping(node, c.nodes[node])
    mapping.view(offset, size)[:16] = b"forged by client"


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_bytes_forged_after_the_seal_are_a_miss_counted_on_both_sides(embedded, transport):
    metrics_port = free_port()
    up = embedded("--offload", "watermark", "--metrics", f"127.0.0.1:{metrics_port}")
    value = os.urandom(200_000)
    with kvstored.connect(up.addr, transport="shm") as writer:
        assert writer.put("victim", value)
        _forge(writer, "victim")
    with kvstored.connect(up.addr, transport=transport) as reader:
        assert reader.get("victim") is None
        assert reader.stats.checksum_failures == 1
    assert _metric(metrics_port, "kvstored_checksum_failures_total", tier="dram") == 1
    wait_for(lambda: _status(up.addr)["nodes"][0]["corrupt_reads"] == 1, what="the count")
    wait_for(lambda: _status(up.addr)["objects"] == 0, what="the bad copy to be dropped")


def test_a_forged_dram_copy_falls_back_to_the_ssd_copy(embedded):
    up = embedded()
    value = os.urandom(300_000)
    with kvstored.connect(up.addr, transport="auto") as c:  # shm, with TCP to fall back on
        assert c.put("victim", value)
        kvstore_ok("flush", "--wait", master=up.addr)
        _forge(c, "victim")
        assert c.get("victim") == value  # the SSD copy, read over TCP
        assert c.stats.checksum_failures == 1
        assert [r.tier for r in c.stat("victim").replicas] == ["ssd"]


# -- 17, 22. a full disk ----------------------------------------------------------------------

@pytest.fixture
def small_disk(tmp_path):
    with scratch_fs(tmp_path / "small", "24m") as mount:
        yield mount


def test_a_full_disk_offloads_what_fits_names_the_ssd_and_recovers_when_freed(
        spawn, tmp_path, small_disk):
    filler = small_disk / "filler"
    filler.write_bytes(b"\0" * 19 * MiB)  # leaves about 5 MiB for the node
    metrics_port = free_port()
    master = spawn("master", "--listen", "127.0.0.1:0")
    node = _node(spawn, tmp_path, master.addr, "n1", "--metrics", f"127.0.0.1:{metrics_port}",
                 dram="16MiB", backend="bucket", data=small_disk / "n1")
    # Listed from its hello on; it takes puts once it has registered its objects.
    wait_for(lambda: [n["state"] for n in _status(master.addr)["nodes"]] == ["ready"],
             what="the node ready")
    values = {f"f{i}": os.urandom(MiB) for i in range(10)}
    with kvstored.connect(master.addr) as c:
        # One batch of 10 MiB does not fit; what fits of it is written.
        assert c.batch_put(list(values), list(values.values())) == [True] * 10
        wait_for(lambda: _status(master.addr)["tiers"]["ssd"]["objects"] >= 2, timeout=30,
                 what="the objects that fit to reach SSD")
        ssd_now = _status(master.addr)["tiers"]["ssd"]["objects"]
        assert ssd_now < 10
        # DRAM fills with objects that cannot leave it: the error names the SSD.
        with pytest.raises(NoSpaceError, match=r"SSD is full.*bucket backend at "
                           + re.escape(str(small_disk / "n1" / "ssd")) + r".* free"):
            for i in range(20):
                c.put(f"more{i}", os.urandom(MiB))
        problem = _status(master.addr)["nodes"][0]["offload_problem"]
        assert problem and "SSD is full" in problem
        # Retries go on with backoff, logged once.
        wait_for(lambda: _metric(metrics_port, "kvstored_offload_failures_total",
                                 reason="no_space") >= 3 * (10 - ssd_now),
                 timeout=30, what="retries of the waiting offloads")
        assert sum("SSD is full" in line for line in node.lines) == 1, node.log
        filler.unlink()
        report = json.loads(kvstore_ok("flush", "--wait", "--json", master=master.addr))
        assert report["failed"] == [] and report["done"], report
        for key, value in values.items():
            assert c.get(key) == value, key
    wait_for(lambda: any("work again" in line for line in node.lines), what="the log line")
    assert node.proc.poll() is None

"""`kvstore status` on a terminal: it fits 80 columns and never shortens an identifier
(node names and addresses are what `--node` needs), and a node that is still registering
its objects shows as starting, as does the reason a put fails meanwhile."""

from __future__ import annotations

import io
import json
import os

import trio
from rich.console import Console

from kvstored.cli.exitcodes import ExitCode
from kvstored.cli.status_view import render_status
from kvstored.config import credentials_dir
from kvstored.protocol import Role, Tier, ops
from kvstored.protocol.master_api import (
    Endpoint,
    NodeContact,
    RegisterObjectsRequest,
    RegisterRequest,
)
from kvstored.rpc import RpcClient
from tests.daemon.harness import BIN, kvstore, kvstore_ok, wait_for

MiB = 1 << 20
#: Names as operators give them: host and rack, port, a long FQDN (longer than a line).
NAMES = ("gpu-node-0017.rack-b.example.internal:7701",
         "inference-cache-prefill-pool-us-east-1a-node-000042",
         "kvstored-node." + "very-long-subdomain." * 4 + "example.org")


def _reply(nodes: list[dict]) -> dict:
    return {"objects": 1_234_567, "lookups": {"hit_dram": 5, "hit_ssd": 1, "miss": 4},
            "hit_rate": {"dram": 0.5, "ssd": 0.1, "total": 0.6}, "nodes": nodes,
            "tiers": {"dram": {"objects": 1_000_000, "logical_bytes": 900 * MiB,
                               "used_bytes": 1000 * MiB, "capacity_bytes": 64 << 30},
                      "ssd": {"objects": 1_234_567, "logical_bytes": 3 << 40,
                              "used_bytes": 3 << 40, "capacity_bytes": 16 << 40}}}


def _node(name: str, address: str, **extra) -> dict:
    return {"node": name, "address": address, "alive": True, "state": "ready",
            "registering": None, "backend": "bucket",
            "dram": {"used": 40 << 30, "capacity": 64 << 30},
            "ssd": {"used": 3 << 40, "capacity": 16 << 40, "objects": 123_456_789},
            "corrupt_reads": 12, "quarantined": 3, "queued_offloads": 1500,
            "leaving": False, "offload_problem": None, **extra}


def _rendered(reply: dict) -> str:
    out = io.StringIO()
    render_status(Console(file=out, width=80, color_system=None), reply)
    return out.getvalue()


def _assert_fits_and_whole(text: str, identifiers: list[str]) -> None:
    lines = text.splitlines()
    for identifier in identifiers:
        assert any(identifier in line for line in lines), \
            f"{identifier!r} is not whole on any line:\n{text}"
    for line in lines:
        # Only an identifier longer than the width may make a line longer.
        if len(line) > 80:
            assert any(i in line and len(i) > 70 for i in identifiers), \
                f"a line of {len(line)} columns:\n{line}"
    assert "…" not in text


def test_status_fits_80_columns_and_keeps_every_identifier_whole():
    addresses = ["10.12.130.201:7701", "[fd00:1234:5678:9abc:def0:1234:5678:9abc]:40001",
                 "127.0.0.1:39407"]
    nodes = [_node(n, a) for n, a in zip(NAMES, addresses)]
    nodes[1].update(state="starting", registering={"sent": 45_000, "objects": 200_000})
    nodes[2].update(alive=False, state="dead",
                    offload_problem="the SSD tier is full (16.0 TiB of 16.0 TiB)")
    text = _rendered(_reply(nodes))
    _assert_fits_and_whole(text, [*NAMES, *addresses])
    assert "registering its objects: 45,000 of 200,000 sent" in text
    assert "dead" in text and "the SSD tier is full" in text


def test_status_shows_a_leaving_node_as_leaving():
    assert "leaving" in _rendered(_reply([_node("n1", "127.0.0.1:1", state="leaving",
                                               leaving=True)]))


def test_status_of_a_real_cluster_at_80_columns(spawn, tmp_path):
    master = spawn("master", "--listen", "127.0.0.1:0")
    nodes = [spawn("node", "--master", master.addr, "--listen", "127.0.0.1:0", "--name", name,
                   "--data", str(tmp_path / f"node{i}"), "--dram", "16MiB", "--ssd", "64MiB",
                   "--backend", "file-per-key") for i, name in enumerate(NAMES)]
    wait_for(lambda: [n["state"] for n in json.loads(kvstore_ok(
        "status", "--json", master=master.addr))["nodes"]] == ["ready"] * len(NAMES),
        what="every node registered")
    run = kvstore("status", master=master.addr, env={"COLUMNS": "80"})
    assert run.returncode == 0, run.stderr
    _assert_fits_and_whole(run.stdout.decode(), [*NAMES, *(n.addr for n in nodes)])


def test_a_registering_node_shows_as_starting_and_puts_say_why(spawn):
    """A node that has sent 3 of its 10 objects: status says so, and a put that has no
    ready node names the starting one (exit 4) instead of "no node is registered"."""
    # This node never heartbeats: a node_ttl far beyond the test keeps it "starting"
    # however long the three CLI runs take on a loaded machine.
    master = spawn("master", "--listen", "127.0.0.1:0",
                   env={"KVSTORED_MASTER_NODE_TTL": "10m"})
    host, port = master.address
    token = (credentials_dir(os.environ) / "node-token").read_text().strip()

    async def main() -> tuple:
        node = RpcClient((host, port), token=token, role=Role.NODE)
        await node.connect()
        try:
            await node.call(ops.REGISTER, RegisterRequest(
                "slow-starter", NodeContact(Endpoint("127.0.0.1", 1), "h", "kvstored-none",
                                            "00" * 16),
                dram_capacity=64 * MiB, ssd_capacity=1 << 30, backend="bucket", objects=10))
            await node.call(ops.REGISTER_OBJECTS, RegisterObjectsRequest(
                "slow-starter", [f"k{i}" for i in range(3)], [10] * 3, [0] * 3,
                [Tier.SSD] * 3, [-1] * 3))
            # The CLI runs while this session is open, its registration unfinished.
            status = await trio.run_process(
                [str(BIN / "kvstore"), "--master", master.addr, "status"],
                capture_stdout=True, capture_stderr=True, check=False,
                env={**os.environ, "COLUMNS": "80"})
            as_json = await trio.run_process(
                [str(BIN / "kvstore"), "--master", master.addr, "status", "--json"],
                capture_stdout=True, check=False)
            put = await trio.run_process(
                [str(BIN / "kvstore"), "--master", master.addr, "put", "x", "-"],
                stdin=b"abc", capture_stdout=True, capture_stderr=True, check=False)
        finally:
            node.close()
        return status, as_json, put

    status, as_json, put = trio.run(main)
    text = status.stdout.decode()
    assert status.returncode == 0, status.stderr
    assert "node slow-starter" in text and "starting" in text, text
    assert "registering its objects: 3 of 10 sent" in text, text
    entry = json.loads(as_json.stdout)["nodes"][0]
    assert entry["state"] == "starting" and entry["registering"] == {"sent": 3, "objects": 10}
    assert put.returncode == ExitCode.UNREACHABLE
    assert "node slow-starter is starting (registering its objects with the master: 3 of " \
           "10)" in put.stderr.decode(), put.stderr


def test_status_shows_each_namespace_whole_with_its_objects_and_bytes():
    long_ns = "sglang/meta-llama%2FLlama-3.1-70B-Instruct/bfloat16/mha-page_first/page64/" \
              "tp3of8/pages/"
    reply = _reply([_node("n1", "127.0.0.1:1")])
    reply["namespaces"] = {
        "": {"objects": 7, "tiers": {"dram": {"objects": 7, "bytes": 7 * MiB},
                                     "ssd": {"objects": 0, "bytes": 0}}},
        long_ns: {"objects": 1_500, "tiers": {"dram": {"objects": 900, "bytes": 900 * MiB},
                                              "ssd": {"objects": 1_500, "bytes": 1500 * MiB}}}}
    text = _rendered(reply)
    _assert_fits_and_whole(text, [long_ns])
    assert "1,500 (DRAM 900.0 MiB, SSD 1.5 GiB)" in text
    assert "outside every namespace" in text
    # Without a registered namespace, status shows no namespace table at all.
    reply["namespaces"] = {"": reply["namespaces"][""]}
    assert "namespace" not in _rendered(reply)


def test_rm_prefix_says_what_it_removed_and_status_counts_namespaces(spawn, tmp_path):
    up = spawn("up", "--listen", "127.0.0.1:0", "--data", str(tmp_path / "data"),
               "--dram", "64MiB", "--ssd", "256MiB", "--backend", "file-per-key")
    import kvstored

    with kvstored.connect(up.addr) as client:
        client.register_namespace("eng/a/")
        client.batch_put([f"eng/a/{i}" for i in range(5)] + ["eng/b/1"],
                         [b"x" * 1000] * 6)
    document = json.loads(kvstore_ok("status", "--json", master=up.addr))
    assert document["namespaces"]["eng/a/"]["objects"] == 5
    assert document["namespaces"][""]["objects"] == 1
    run = kvstore("rm", "--prefix", "eng/a/", "--dry-run", master=up.addr)
    assert run.returncode == 0 and b"would remove 5 objects" in run.stderr, run.stderr
    run = kvstore("rm", "--prefix", "eng/a/", master=up.addr)
    assert run.returncode == 0 and b"removed 5 objects (4.9 KiB) under 'eng/a/'" in \
        run.stderr, run.stderr
    run = kvstore("rm", "--prefix", "eng/a/", master=up.addr)
    assert run.returncode == ExitCode.NOT_FOUND and b"no object under 'eng/a/'" in \
        run.stderr, run.stderr
    for args in (("rm", "--prefix", ""), ("rm", "k", "--prefix", "eng/"), ("rm",),
                 ("rm", "k", "--dry-run")):
        run = kvstore(*args, master=up.addr)
        assert run.returncode == ExitCode.USAGE, (args, run.stderr)
    assert json.loads(kvstore_ok("status", "--json", master=up.addr)
                      )["namespaces"]["eng/a/"]["objects"] == 0
    assert kvstore_ok("ls", "eng/", master=up.addr).split()[-1] == "eng/b/1"

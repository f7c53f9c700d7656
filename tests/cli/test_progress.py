"""Progress on a real pseudo-terminal: `flush --wait` and `recover` while they wait on a
node (stopped with SIGSTOP, so the wait lasts), `recover --offline`, the simulator while
it reads a trace, `replay`; none draws for quick work, and with `--json` the terminal
shows exactly one JSON document and nothing else."""

from __future__ import annotations

import json
import os
import signal

import pytest

import kvstored
from kvstored.backends import open_backend
from tests.cli.terminal import kvstore_on_terminal
from tests.daemon.harness import wait_for
from tests.tools.conftest import random_requests, write_mooncake

OBJECTS = 200


@pytest.fixture
def cluster(spawn, tmp_path):
    """A master whose objects stay DRAM-only until a flush, one node, ``OBJECTS``
    objects; returns (master address, node daemon)."""
    watermark = {"KVSTORED_POLICY_OFFLOAD": "watermark"}
    master = spawn("master", "--listen", "127.0.0.1:0", env=watermark)
    node = spawn("node", "--master", master.addr, "--listen", "127.0.0.1:0", "--name", "n1",
                 "--data", str(tmp_path / "n1"), "--dram", "64MiB", "--ssd", "1GiB",
                 "--backend", "file-per-key")
    with kvstored.connect(master.addr) as client:
        # Listed from its hello on; it takes puts once it has registered its objects.
        wait_for(lambda: [n["state"] for n in client.call("status")["nodes"]] == ["ready"],
                 what="the node ready")
        keys = [f"p/{i}" for i in range(OBJECTS)]
        client.batch_put(keys, [os.urandom(4096)] * OBJECTS)
    return master.addr, node


@pytest.fixture
def stopped(cluster):
    """The cluster's node stopped (SIGSTOP) until the test lets it go on."""
    master, node = cluster
    node.proc.send_signal(signal.SIGSTOP)
    try:
        yield master, lambda: node.proc.send_signal(signal.SIGCONT)
    finally:
        node.proc.send_signal(signal.SIGCONT)


def test_flush_wait_shows_what_is_left_while_it_waits(stopped, tmp_path):
    master, resume = stopped
    run = kvstore_on_terminal("flush", "--wait", master=master, cwd=tmp_path)
    run.wait_for(f"flush: {OBJECTS:,} objects still to write to SSD")
    resume()
    assert run.finish() == 0, run.text
    assert f"flush done: {OBJECTS} objects offloaded" in run.text


def test_recover_shows_that_it_waits_for_the_nodes(stopped, tmp_path):
    master, resume = stopped
    run = kvstore_on_terminal("recover", master=master, cwd=tmp_path)
    run.wait_for("recover: 1 node reading back and checking every SSD record")
    resume()
    assert run.finish() == 0, run.text
    assert "n1: " in run.text and "no problems" in run.text


def test_quick_work_draws_no_bar(cluster, tmp_path):
    master, _ = cluster
    assert kvstore_on_terminal("flush", "--wait", master=master).finish() == 0
    run = kvstore_on_terminal("flush", "--wait", master=master, cwd=tmp_path)
    assert run.finish() == 0
    assert run.text == "flush done: 0 objects offloaded\n", repr(run.text)


@pytest.fixture
def offline_store(tmp_path):
    path = tmp_path / "ssd"
    with open_backend("bucket", path) as backend:
        for first in range(0, 3000, 500):
            backend.batch_write([(f"k{n}", b"v" * 512) for n in range(first, first + 500)])
    return path


def test_recover_offline_counts_the_records_it_verifies(offline_store, tmp_path):
    run = kvstore_on_terminal("recover", "--offline", str(offline_store), eager=True,
                              cwd=tmp_path)
    assert run.finish() == 0, run.text
    assert "of 3,000 records read back and verified" in run.text, run.text
    assert "3000 objects read back and verified" in run.text


def test_the_simulator_shows_it_reading_the_trace(tmp_path):
    run = kvstore_on_terminal("sim", "builtin:coding-agent", "--model", "glm-5.1",
                              eager=True, cwd=tmp_path)
    assert run.finish() == 0, run.text
    # The phase, not one of its counts: rich redraws ten times a second, and reading the
    # 24 sessions of this trace can take less than that, so "0 of 24" may never be drawn.
    assert "reading the trace" in run.text.replace("\r", "\n"), run.text


@pytest.fixture
def small_trace(tmp_path):
    """80 requests of a few blocks each: a replay of seconds."""
    return write_mooncake(tmp_path / "small.jsonl", random_requests(7, 80))


def test_replay_shows_the_requests_it_sent(embedded, small_trace, tmp_path):
    store = embedded()
    run = kvstore_on_terminal("replay", str(small_trace), "--master", store.addr,
                              eager=True, cwd=tmp_path)
    assert run.finish() == 0, run.text
    assert "replaying " in run.text, run.text


@pytest.mark.parametrize("command", ["flush --wait", "recover", "recover --offline",
                                     "sim", "replay"])
def test_json_on_a_terminal_is_one_document_and_nothing_else(command, request, tmp_path):
    master = None
    if command in ("flush --wait", "recover", "replay"):
        master, _ = request.getfixturevalue("cluster")
    args = {"flush --wait": lambda: ["flush", "--wait"], "recover": lambda: ["recover"],
            "recover --offline": lambda: ["recover", "--offline",
                                          str(request.getfixturevalue("offline_store"))],
            "sim": lambda: ["sim", "builtin:coding-agent", "--model", "glm-5.1"],
            "replay": lambda: ["replay", str(request.getfixturevalue("small_trace"))]}
    run = kvstore_on_terminal(*args[command](), "--json", master=master, eager=True,
                              cwd=tmp_path)
    assert run.finish() == 0, run.text
    assert "\x1b" not in run.raw.decode(errors="replace"), run.raw[:400]
    json.loads(run.text)  # the whole terminal: one document

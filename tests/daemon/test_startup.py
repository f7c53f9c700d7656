"""A node that restarts on a full SSD tier says in its log how far it got, instead of
being silent until it serves; once registered it is ready in `kvstore status`."""

from __future__ import annotations

import json
import re
import signal

from kvstored.backends import open_backend
from tests.daemon.harness import kvstore_ok, wait_for

OBJECTS = 12_000


def test_a_node_whose_master_stalls_mid_registration_says_how_far_it_got(spawn, tmp_path):
    data = tmp_path / "node"
    with open_backend("bucket", data / "ssd") as backend:  # a store the node finds there
        for first in range(0, OBJECTS, 500):
            backend.batch_write([(f"k{n:06d}", b"v" * 64) for n in range(first, first + 500)])
    master = spawn("master", "--listen", "127.0.0.1:0")
    node = spawn("node", "--master", master.addr, "--listen", "127.0.0.1:0", "--name", "n1",
                 "--data", str(data), "--dram", "16MiB", "--ssd", "1GiB",
                 "--backend", "bucket")
    wait_for(lambda: "node n1 registering from" in master.log, what="the registration")
    # The master stops answering: the node waits on it, and says so every few seconds.
    master.proc.send_signal(signal.SIGSTOP)
    try:
        line = re.compile(r"node n1: recovering: registering with the master: [\d,]+ of "
                          + f"{OBJECTS:,} objects$")
        wait_for(lambda: any(line.search(entry) for entry in node.lines), timeout=30,
                 what=f"a progress line in the node's log:\n{node.log}")
    finally:
        master.proc.send_signal(signal.SIGCONT)
    wait_for(lambda: "done in" in node.log, what="the end of the registration")
    status = json.loads(kvstore_ok("status", "--json", master=master.addr))
    (entry,) = status["nodes"]
    assert entry["state"] == "ready" and status["objects"] == OBJECTS, status

"""Every command the documentation shows is run, against real daemons, so the docs
cannot drift from the code (tests/docs/blocks.py says how a block becomes a script).

The blocks run in page order in one scratch environment: a network namespace of their
own (so the documented addresses, 127.0.0.1:7700, 10.0.0.1:7700 and 10.0.0.5:7700, are
free and reachable, and nothing collides with other tests), a mount namespace with a
tmpfs on /mnt (so `mkdir -p /mnt/kv` and the FUSE mounts touch nothing outside), one on
/dev/shm (the nodes' DRAM segments) and one on /var/lib (where a stopped node leaves the
data docs/fuse.md mounts offline), a scratch $HOME (the daemon's default data directory
and token files), and the working directory holding `file`, the file the README stores.
The README's `kvstored up` starts the store that the later blocks use, as a reader's
would. The blocks' `kvstore` and `kvstored` commands and Python examples run through a
fork server that has the programs imported once (tests/docs/forkserver.py): a fresh
interpreter spends seconds on its imports on a loaded machine, and the pages run some two
hundred commands.

:data:`SKIP` lists the blocks that cannot run here, each with the reason.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs.blocks import (
    OUTPUT_CHECKED,
    PREAMBLE,
    PYTHON_PAGES,
    RUN,
    blocks,
    missing_output,
    script,
)
from tests.shared_data import SHARED, missing_reason

BIN = Path(sys.executable).parent

# One driver runs every page (the simulator's sweeps and the runbook's node_ttl wait
# among them): minutes on a loaded machine, which may pass the suite's per-test timeout.
# `slow` only marks it: `make test` (and so CI) selects no markers, so it always runs.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]
SHARED_TRACES = SHARED / "traces"

#: (page, how its first command starts) -> why the block cannot run here.
SKIP: dict[tuple[str, str], str] = {
    ("README.md", "make demo"):
        "make runs the set-up and the whole suite; tests/test_demo.py runs the demo",
    ("docs/3fs.md", "python -m kvstored.sdk.testing 3fs"): "needs a 3FS mount",
    ("docs/sdk.md", "python -m kvstored.sdk.testing flatdir"):
        "needs the tutorial's backend installed: tests/docs/test_sdk_example.py installs "
        "it and runs the kit",
    ("docs/integrations.md", "kvstored up --dram 64GiB"):
        "a 64 GiB DRAM tier and a 2 TiB SSD tier: sized for a GPU server",
    ("docs/integrations.md", "python -m sglang.launch_server"):
        "an engine serving a model on a GPU; tests/integrations drive the engines' "
        "storage code",
    ("docs/integrations.md", "vllm serve"):
        "an engine serving a model on a GPU; tests/integrations drive the engines' "
        "storage code",
    ("docs/integrations.md", "kvstore ls sglang/"):
        "the keys an engine wrote; tests/integrations check them",
    ("docs/nvmeof.md", "apt-get install nvme-cli"): "needs an NVMe-oF target",
    ("docs/nvmeof.md", "wipefs"): "needs a real NVMe device (it erases it)",
    ("docs/nvmeof.md", "kvstored node --config node.toml"):
        "needs a real NVMe device; tests/backends/test_nvmeof_device.py runs the backend on "
        "a loop device",
    ("docs/benchmarks.md", "kvstore bench"):
        "a benchmark of minutes; tests/bench runs each at a small size",
    ("docs/benchmarks.md", "pip install -e '.[bench]'"):
        "installs a peer from a package index; tests/bench skips the peers it lacks",
    ("docs/simulator.md", "kvstore sim plan agents.jsonl.gz"):
        "40 s of planning; tests/tools/test_plan.py runs kvstore sim plan",
}
#: Blocks that read the public traces beside the checkout (../shared/traces).
NEEDS_SHARED = ("traces/mooncake_conversation.jsonl", "traces/mooncake_synthetic.jsonl")


def _skip_reason(block) -> str | None:
    for (page, start), reason in SKIP.items():
        if block.page == page and block.first.startswith(start):
            return reason
    if block.lang == "python" and block.page not in PYTHON_PAGES:
        return "a library example; its page's own test runs it"
    if any(t in block.body for t in NEEDS_SHARED) and not SHARED_TRACES.is_dir():
        return missing_reason(SHARED_TRACES)
    return None


RUNNABLE = [b for b in blocks() if b.lang in RUN]


#: docs/fuse.md mounts "a stopped node's SSD tier" from /var/lib/kvstored: a node is
#: started there (on a tmpfs over /var/lib, in the mount namespace), stores ./file and
#: is stopped, so that directory is what a real stopped node leaves.
_STOPPED_NODE = r"""
mount -t tmpfs -o size=96m kvstored-docs-var /var/lib && mkdir -p /var/lib/kvstored
kvstored up --listen 127.0.0.1:0 --data /var/lib/kvstored --dram 16MiB --ssd 32MiB \
    >{logs}/stopped-node.log 2>&1 &
stopped=$!
deadline=$((SECONDS + 60))
until addr=$(grep -oE '^kvstored up: listening on [0-9.]+:[0-9]+' {logs}/stopped-node.log \
             | awk '{{print $NF}}') && [ -n "$addr" ]; do
    if ! kill -0 $stopped 2>/dev/null || [ $SECONDS -gt $deadline ]; then
        echo "the stopped node did not start"; cat {logs}/stopped-node.log; exit 1
    fi
    sleep 0.05  # the poll's interval; the deadline above bounds it
done
kvstore put docs/stopped-node ./file --master "$addr" || exit 1
kvstore flush --wait --master "$addr" >/dev/null || exit 1
kill -TERM $stopped && wait $stopped
"""


#: The fork server the blocks' `kvstore` and `kvstored` commands run through
#: (tests/docs/forkserver.py): started first, ready once it prints so.
_FORK_SERVER = r"""
"$KVSTORED_DOCS_PYTHON" "$KVSTORED_DOCS_FORKSERVER" serve "$KVSTORED_DOCS_SOCKET" \
    >{logs}/forkserver.log 2>&1 &
echo $! >>{logs}/pids
deadline=$((SECONDS + 120))
until grep -q '^ready$' {logs}/forkserver.log; do
    if ! kill -0 $! 2>/dev/null || [ $SECONDS -gt $deadline ]; then
        echo "the fork server did not start"; cat {logs}/forkserver.log; exit 1
    fi
    sleep 0.05  # the poll's interval; the deadline above bounds it
done
"""


def _driver(work: Path, logs: Path, runs: Path) -> str:
    """One bash script that sets the namespaces up and runs every block in turn."""
    lines = ["set -u", "ip link set lo up",
             "ip addr add 10.0.0.1/32 dev lo", "ip addr add 10.0.0.5/32 dev lo",
             "mount -t tmpfs -o size=256m kvstored-docs /mnt",
             # The DRAM segments are named after the data directory: a /dev/shm of its
             # own keeps them from those of another run of this test (the same paths)
             # and from the segments a node's start-up sweeps.
             "mount -t tmpfs -o size=4g kvstored-docs-shm /dev/shm", f"cd {work}",
             _FORK_SERVER.format(logs=logs), _STOPPED_NODE.format(logs=logs)]
    for index, block in enumerate(RUNNABLE):
        if _skip_reason(block):
            continue
        path = runs / f"{index:03d}.sh"
        path.write_text("set -e -o pipefail\n" + PREAMBLE + script(block))
        lines.append(f"__t=$EPOCHREALTIME; bash {path} >{runs}/{index:03d}.out 2>&1; "
                     f"echo $? >{runs}/{index:03d}.rc; "
                     f"echo $__t $EPOCHREALTIME >{runs}/{index:03d}.time")
    # Stop what the blocks left running: the mounts first, then the daemons, by pid.
    lines += ["for m in $(awk '$2 ~ \"^/mnt/\" {print $2}' /proc/mounts); do "
              "fusermount3 -u -z \"$m\" 2>/dev/null || umount -l \"$m\"; done",
              f"for pid in $(cat {logs}/pids 2>/dev/null); do kill -TERM $pid 2>/dev/null; "
              "done",
              f"for pid in $(cat {logs}/pids 2>/dev/null); do "
              "for _ in $(seq 600); do kill -0 $pid 2>/dev/null || break; sleep 0.1; done; "
              "done"]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("the documented commands run in network and mount namespaces of their "
                    "own, which need root and unshare(1)")
    scratch = tmp_path_factory.mktemp("docs")
    work, logs, runs, home = (scratch / n for n in ("work", "logs", "runs", "home"))
    for folder in (work, logs, runs, home):
        folder.mkdir()
    (work / "file").write_bytes(b"the bytes of ./file, stored by README.md\n")
    if SHARED_TRACES.is_dir():
        (work / "traces").symlink_to(SHARED_TRACES)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("KVSTORED_", "KVSTORE_", "XDG_"))
           and k != "PYTHONDONTWRITEBYTECODE"}
    # The daemons and the Python blocks start fresh interpreters: they write and reuse
    # bytecode (in the suite's shared cache, tests/conftest.py), not compile it each.
    env.update(HOME=str(home), PATH=f"{BIN}:{env.get('PATH', '/usr/bin:/bin')}",
               COLUMNS="80", PYTHONUNBUFFERED="1", KVSTORED_DOCS_LOGS=str(logs),
               KVSTORED_DOCS_PYTHON=sys.executable,
               KVSTORED_DOCS_FORKSERVER=str(Path(__file__).with_name("forkserver.py")),
               KVSTORED_DOCS_SOCKET=str(scratch / "forkserver.sock"))
    driver = scratch / "driver.sh"
    driver.write_text(_driver(work, logs, runs))
    run = subprocess.run(["unshare", "--net", "--mount", "--fork", "bash", str(driver)],
                         env=env, capture_output=True, text=True, timeout=1100)
    assert run.returncode == 0, run.stdout + run.stderr
    return runs


def _result(runs: Path, index: int) -> tuple[int, str]:
    rc = runs / f"{index:03d}.rc"
    out = (runs / f"{index:03d}.out").read_text(errors="replace")
    return int(rc.read_text()) if rc.exists() else -1, out


@pytest.mark.parametrize("index", range(len(RUNNABLE)),
                         ids=[b.ident for b in RUNNABLE])
def test_the_documented_commands_run(index, ran):
    block = RUNNABLE[index]
    reason = _skip_reason(block)
    if reason:
        pytest.skip(reason)
    code, out = _result(ran, index)
    assert code == 0, f"{block.ident} ({block.lang}) exited {code}:\n{script(block)}\n{out}"
    if block.page in OUTPUT_CHECKED and block.output:
        missing = missing_output(block, out)
        assert not missing, (f"{block.ident}: the page shows lines the commands did not "
                             f"print:\n" + "\n".join(missing) + f"\n--- they printed:\n{out}")


def test_every_block_says_what_it_is():
    """An untagged block can be neither run nor told apart from output: tag it."""
    untagged = [b.ident for b in blocks() if not b.lang]
    assert not untagged, f"tag these blocks (sh, console, text, ...): {untagged}"


def test_every_skip_names_a_block():
    for page, start in SKIP:
        assert any(b.page == page and b.first.startswith(start) for b in RUNNABLE), \
            f"SKIP names no block of {page} starting {start!r}"


def test_the_docs_use_the_readmes_command_prefix():
    """README.md says the commands are `kvstore` and `kvstored` on PATH; every page
    writes them so (the README's own set-up line names .venv/bin once)."""
    for block in blocks():
        for line in block.body.splitlines():
            assert not re.search(r"\.venv/bin/kvstored?\b", line) or "PATH" in line, \
                f"{block.ident}: {line.strip()!r} (write kvstore / kvstored)"

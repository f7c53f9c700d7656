"""The security model against real processes (docs/security.md): private files, another
user refused, roles, node names, and what unauthenticated peers can make the daemon hold.

Tests that act as another user run commands under ``setpriv`` as uid/gid 65534 (nobody);
their files live in a world-traversable directory under /tmp, so that only the daemon's
own modes stand between that user and the data.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from crc32c import crc32c

import kvstored
import kvstored.errors
from kvstored.errors import UnauthorizedError
from kvstored.wire import FrameReader
from tests.daemon.harness import BIN, Daemon, kvstore, wait_for
from tests.faults import wirefuzz

MiB = 1 << 20
NOBODY = 65534


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def shared_dir():
    """A directory every user can enter, as /tmp itself is on a shared host."""
    base = Path(tempfile.mkdtemp(prefix="kvstored-shared-", dir="/tmp"))
    base.chmod(0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def start(shared_dir):
    """`kvstored up` (or master/node) with its own $XDG_CONFIG_HOME under ``shared_dir``."""
    started: list[Daemon] = []
    config_home = shared_dir / "config"

    def run(*args: str, env: dict[str, str] | None = None, wait: bool = True) -> Daemon:
        daemon = Daemon(list(args), cwd=shared_dir,
                        env={"XDG_CONFIG_HOME": str(config_home), **(env or {})})
        started.append(daemon)
        if wait:
            daemon.wait_ready()
        return daemon

    run.config_home = config_home
    yield run
    for daemon in started:
        if daemon.proc.poll() is None:
            daemon.stop()


def _up(start, shared_dir, *extra: str, env=None) -> Daemon:
    return start("up", "--listen", "127.0.0.1:0", "--data", str(shared_dir / "data"),
                 "--dram", "64MiB", "--ssd", "1GiB", "--backend", "file-per-key", *extra,
                 env=env)


def _token(start, name: str = "token") -> str | None:
    """A token the master generated (None if it generated none: a daemon without
    authentication, such as one from before this model)."""
    path = start.config_home / "kvstored" / name
    return path.read_text().strip() if path.exists() else None


def _as_nobody(*command: str, cwd: Path, env: dict[str, str] | None = None,
               timeout: float = 60) -> subprocess.CompletedProcess:
    """Run ``command`` as uid/gid 65534 with a clean environment of its own."""
    clean = {"PATH": os.environ["PATH"], "HOME": "/nonexistent", "LANG": "C.UTF-8",
             "PYTHONDONTWRITEBYTECODE": "1", **(env or {})}
    return subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}",
                           "--clear-groups", *command], cwd=cwd, env=clean,
                          capture_output=True, text=True, timeout=timeout)


def _hello(address, role: str, token: str | None) -> tuple[socket.socket, FrameReader, dict]:
    sock = socket.create_connection(address, timeout=20)
    reader = FrameReader(sock)
    sock.sendall(wirefuzz.pack(wirefuzz.hello(role, token)))
    return sock, reader, reader.recv_header()


def _request(sock: socket.socket, reader: FrameReader, header: dict) -> dict:
    sock.sendall(wirefuzz.pack(header))
    reply = reader.recv_header()
    reader.discard_payload()
    return reply


def _node_address(master: str, token: str) -> tuple[str, int]:
    with kvstored.connect(master, token=token) as c:
        c.put("probe", b"p")
        endpoint = next(iter(c.nodes.values())).endpoint
    return endpoint.host, endpoint.port


# -- files ------------------------------------------------------------------------------------

def test_first_start_creates_private_token_files_that_the_same_user_finds(start, shared_dir,
                                                                          monkeypatch):
    up = _up(start, shared_dir)
    folder = start.config_home / "kvstored"
    assert _mode(folder) == 0o700
    for name in ("token", "node-token"):
        assert _mode(folder / name) == 0o600, name
    client, node = _token(start), _token(start, "node-token")
    assert len(client) >= 40 and len(node) >= 40 and client != node
    for path in (shared_dir / "data", shared_dir / "data" / "ssd"):
        assert _mode(path) == 0o700, path
    # The same user's tools need no flag: they read the file where the master wrote it.
    env = {**os.environ, "XDG_CONFIG_HOME": str(start.config_home), "KVSTORE_MASTER": up.addr}
    run = subprocess.run([str(BIN / "kvstore"), "status", "--json"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    monkeypatch.setenv("XDG_CONFIG_HOME", str(start.config_home))
    with kvstored.connect(up.addr) as c:
        assert c.put("mine", b"v") and c.get("mine") == b"v"
    # A restart keeps the tokens (clients configured with them keep working).
    up.stop()
    _up(start, shared_dir)
    assert (_token(start), _token(start, "node-token")) == (client, node)


def test_another_user_can_read_no_token_no_data_and_is_refused(start, shared_dir):
    up = _up(start, shared_dir)
    token = _token(start)
    with kvstored.connect(up.addr, token=token, transport="tcp") as c:
        c.put("secret", b"s" * 5000)
        assert c.call("flush", wait=True)["done"]
        info = next(iter(c.nodes.values()))
    folder = start.config_home / "kvstored"
    for path in (folder / "token", folder / "node-token"):
        assert _as_nobody("cat", str(path), cwd=shared_dir).returncode != 0
    listing = _as_nobody("ls", "-R", str(shared_dir / "data"), cwd=shared_dir)
    assert listing.returncode != 0 and "Permission denied" in listing.stderr
    # Over TCP: no token of its own, and the owner's file out of reach.
    for extra in ([], ["--token-file", str(folder / "token")]):
        run = _as_nobody(str(BIN / "kvstore"), "status", "--master", up.addr, *extra,
                         cwd=shared_dir)
        assert run.returncode == 2, run.stdout + run.stderr
    run = _as_nobody(str(BIN / "kvstore"), "get", "secret", "--master", up.addr,
                     cwd=shared_dir)
    assert run.returncode == 2 and "token" in run.stderr, run.stderr
    assert "s" * 100 not in run.stdout
    # The DRAM segment: 0600, so even its token does not open it to another user.
    segment = Path("/dev/shm") / info.segment
    assert _mode(segment) == 0o600
    probe = ("import sys; from kvstored.shm import SegmentMapping, SegmentUnavailable\n"
             "try:\n    SegmentMapping.attach(sys.argv[1], bytes.fromhex(sys.argv[2]))\n"
             "except SegmentUnavailable as exc:\n    print(exc); sys.exit(3)\n")
    run = _as_nobody(sys.executable, "-c", probe, info.segment, info.segment_token,
                     cwd=shared_dir)
    assert run.returncode == 3 and "permission denied" in run.stdout, run.stdout + run.stderr
    # Given a copy of the client token, the same user is a client like any other.
    copy = shared_dir / "given-token"
    copy.write_text(token + "\n")
    copy.chmod(0o644)
    run = _as_nobody(str(BIN / "kvstore"), "status", "--json", "--master", up.addr,
                     "--token-file", str(copy), cwd=shared_dir)
    assert run.returncode == 0 and json.loads(run.stdout)["objects"] >= 1, run.stderr


def test_a_token_file_that_cannot_be_used_is_a_clear_error(start, shared_dir):
    empty = shared_dir / "empty-token"
    empty.write_text("\n")
    for flag, path, words in (("--token-file", empty, "is empty"),
                              ("--token-file", shared_dir / "missing", "does not exist"),
                              ("--node-token-file", shared_dir / "missing", "does not exist")):
        daemon = start("up", "--listen", "127.0.0.1:0", "--data", str(shared_dir / "data"),
                       "--dram", "16MiB", flag, str(path), wait=False)
        assert daemon.proc.wait(60) == 2, daemon.log
        daemon._reader.join(5)
        assert words in daemon.log and str(path) in daemon.log, daemon.log
        assert "Traceback" not in daemon.log, daemon.log


# -- roles --------------------------------------------------------------------------------------

NODE_OPS = {"register": {"node": "x", "contact": {
                "endpoint": {"host": "127.0.0.1", "port": 1}, "host_id": "h", "segment": "s",
                "segment_token": "00"}, "dram_capacity": 1, "ssd_capacity": 1},
            "register_objects": {"node": "x", "keys": [], "sizes": [], "checksums": [],
                                 "tiers": [], "offsets": []},
            "register_done": {"node": "x"},
            "commit": {"node": "x", "keys": [], "sizes": [], "checksums": [], "offsets": []},
            "heartbeat": {"node": "x"},
            "ssd_evicted": {"node": "x", "keys": []}}


def test_a_client_token_cannot_send_node_operations_nor_forge_a_commit(start, shared_dir):
    up = _up(start, shared_dir)
    token = _token(start)
    with kvstored.connect(up.addr, token=token, transport="tcp") as c:
        c.put("victim", b"the victim's bytes")
        node = c.stat("victim").replicas[0].node
        where = c.locate("victim")[node]["dram"]
    sock, reader, hello = _hello(up.address, "client", token)
    assert hello["ok"]
    for op, fields in NODE_OPS.items():
        fields = json.loads(json.dumps(fields).replace('"x"', json.dumps(node)))
        reply = _request(sock, reader, {"op": op, **fields})
        assert not reply["ok"] and reply["error"]["code"] == "unauthorized", (op, reply)
        assert "node operation" in reply["error"]["message"]
    # The forged commit that made same-host readers get another object's bytes.
    forged = _request(sock, reader, {
        "op": "commit", "node": node, "keys": ["forged"], "sizes": [where["size"]],
        "checksums": [crc32c(b"the victim's bytes")], "offsets": [where["offset"]]})
    assert forged["error"]["code"] == "unauthorized"
    assert _request(sock, reader, {"op": "status"})["ok"]  # the connection is still fine
    assert hello["role"] == "client"
    sock.close()
    # A node hands its segment's name and token only to peers that authenticated.
    node_address = _node_address(up.addr, token)
    for bad in (None, "wrong", "é"):
        sock, _, hello = _hello(node_address, "client", bad)
        assert not hello["ok"] and "segment" not in hello and "token" not in hello, hello
        sock.close()
    # Nor can the client token claim the node role in its hello.
    sock, _, hello = _hello(up.address, "node", token)
    assert hello["error"]["code"] == "unauthorized" and "node token" in hello["error"]["message"]
    sock.close()
    with kvstored.connect(up.addr, token=token) as c:
        assert c.get("forged") is None and c.get("victim") == b"the victim's bytes"


def test_a_live_node_name_cannot_be_taken_over(start, shared_dir):
    master = start("master", "--listen", "127.0.0.1:0")
    first = start("node", "--master", master.addr, "--listen", "127.0.0.1:0", "--name", "n1",
                  "--data", str(shared_dir / "n1a"), "--dram", "32MiB", "--backend",
                  "file-per-key")
    token, node_token = _token(start), _token(start, "node-token")
    with kvstored.connect(master.addr, token=token) as c:
        # Listed (alive) from its hello on; it takes puts once it has registered its objects.
        wait_for(lambda: any("registered 0 objects" in line for line in first.lines),
                 what="n1 registered")
        assert c.put("kept", b"still listed")
    # Even with the node token, a second registration of a live name is refused...
    sock, reader, hello = _hello(master.address, "node", node_token)
    assert hello["ok"]
    reply = _request(sock, reader, {"op": "register", **NODE_OPS["register"], "node": "n1"})
    with kvstored.connect(master.addr, token=token) as c:
        assert c.get("kept") == b"still listed", "the takeover hid the live node's objects"
    assert not reply["ok"] and "live node" in reply["error"]["message"], reply
    assert hello["role"] == "node"
    # ... and node ops for it from another connection too.
    reply = _request(sock, reader, {"op": "heartbeat", "node": "n1"})
    assert not reply["ok"] and "another connection" in reply["error"]["message"], reply
    sock.close()
    # A second process with the same name waits, and takes over once the first is gone.
    second = start("node", "--master", master.addr, "--listen", "127.0.0.1:0", "--name", "n1",
                   "--data", str(shared_dir / "n1b"), "--dram", "32MiB", "--backend",
                   "file-per-key")
    wait_for(lambda: any("belongs to a live node" in line for line in second.lines),
             what="the second n1 refused")
    with kvstored.connect(master.addr, token=token) as c:
        assert c.get("kept") == b"still listed"
    first.kill9()
    wait_for(lambda: any("registered 0 objects" in line for line in second.lines),
             what="the second n1 registered once the first was gone")


def test_a_node_with_the_wrong_node_token_is_refused(start, shared_dir):
    master = start("master", "--listen", "127.0.0.1:0")
    wrong = shared_dir / "wrong"
    wrong.write_text("not-the-node-token\n")
    wrong.chmod(0o600)
    node = start("node", "--master", master.addr, "--listen", "127.0.0.1:0", "--data",
                 str(shared_dir / "n"), "--dram", "16MiB", "--node-token-file", str(wrong))
    wait_for(lambda: any("need the node token" in line for line in node.lines),
             what="the master's refusal in the node's log")
    with kvstored.connect(master.addr, token=_token(start)) as c:
        assert not [n for n in c.call("status")["nodes"] if n["alive"]]


def test_auth_none_is_an_explicit_choice_with_a_warning(start, shared_dir):
    up = _up(start, shared_dir, env={"KVSTORED_SECURITY_AUTH": "none"})
    assert any("security.auth = none" in line for line in up.lines)
    sock, _, hello = _hello(up.address, "client", None)
    assert hello["ok"]
    sock.close()


def test_a_client_refused_says_which_token_it_presented(start, shared_dir, monkeypatch):
    up = _up(start, shared_dir)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(shared_dir / "elsewhere"))
    with pytest.raises(UnauthorizedError) as refused:
        kvstored.connect(up.addr)
    assert "no token" in str(refused.value) and "elsewhere" in str(refused.value)
    run = kvstore("status", master=up.addr)
    assert run.returncode == 2 and b"token" in run.stderr


# -- bounds before (and after) authentication -----------------------------------------------------

def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _peak_rss(pid: int, seconds: float) -> int:
    peak, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        peak = max(peak, _rss(pid))
        time.sleep(0.05)
    return peak


def test_unauthenticated_peers_cannot_make_the_daemon_allocate(start, shared_dir):
    """48 connections declaring an 8 MiB header each took the daemon from 186 to 571 MiB."""
    up = _up(start, shared_dir)
    node = _node_address(up.addr, _token(start))
    pid = up.proc.pid
    with kvstored.connect(up.addr, token=_token(start)) as c:  # start-up allocations done
        assert c.put("before", b"fine") and c.get("before") == b"fine"
    before = _peak_rss(pid, 1)
    held = []
    for address in (up.address, node):
        for i in range(48):
            s = socket.socket()
            s.bind((f"127.0.0.{2 + i % 8}", 0))  # several peer addresses
            s.settimeout(20)
            s.connect(address)
            prefix = wirefuzz.PREFIX.pack(wirefuzz.MAGIC, 8 * MiB, 0)
            try:
                s.sendall(prefix + b"\x80" * (256 * 1024))
            except OSError:
                pass  # refused at the prefix already
            held.append(s)
    during = _peak_rss(pid, 2)
    for s in held:
        s.close()
    print(f"RSS before {before / MiB:.0f} MiB, during the attack {during / MiB:.0f} MiB")
    assert during - before < 32 * MiB, (before, during)
    with kvstored.connect(up.addr, token=_token(start)) as c:
        assert c.put("after", b"fine") and c.get("after") == b"fine"


def test_silent_peers_are_dropped_and_connection_limits_name_their_setting(start, shared_dir):
    up = _up(start, shared_dir, env={"KVSTORED_SECURITY_HELLO_TIMEOUT": "1s",
                         "KVSTORED_SECURITY_MAX_UNAUTHENTICATED_PER_PEER": "4",
                         "KVSTORED_SECURITY_MAX_CONNECTIONS": "12"})
    token = _token(start)
    silent = []
    for _ in range(4):
        s = socket.socket()
        s.bind(("127.0.0.2", 0))
        s.settimeout(20)
        s.connect(up.address)
        silent.append(s)
    extra = socket.socket()
    extra.bind(("127.0.0.2", 0))
    extra.settimeout(20)
    extra.connect(up.address)
    reply = FrameReader(extra).recv_header()
    assert "security.max_unauthenticated_per_peer" in reply["error"]["message"], reply
    extra.close()
    # Another peer address is not affected by the silent ones.
    with kvstored.connect(up.addr, token=token) as c:
        assert c.put("k", b"v")
    started = time.monotonic()
    for s in silent:
        assert s.recv(16) == b""  # dropped at the hello deadline
    assert time.monotonic() - started < 10
    for s in silent:
        s.close()
    # In total: past twelve (the node's own connection is one), new ones are refused.
    held = []
    while True:
        sock, _, hello = _hello(up.address, "client", token)
        held.append(sock)
        if not hello["ok"]:
            break
        assert len(held) <= 11, "more connections than security.max_connections"
    assert "security.max_connections" in hello["error"]["message"], hello
    for s in held:
        s.close()
    wait_for(lambda: _can_connect(up.addr, token), timeout=10, what="connections freed")


def _can_connect(master: str, token: str) -> bool:
    try:
        kvstored.connect(master, token=token).close()
    except kvstored.errors.StoreError:
        return False
    return True


def _ssd_only(client, keys: list[str]) -> None:
    assert client.call("flush", wait=True)["done"]
    client.call("evict", tier="dram", keys=keys)
    wait_for(lambda: all({r.tier for r in client.stat(k).replicas} == {"ssd"} for k in keys),
             what="objects on SSD only")


def test_a_get_naming_one_ssd_key_many_times_reads_it_once(start, shared_dir):
    """A 416-byte get naming one 4 MiB SSD key 48 times cost 192 MiB, held while the
    connection stayed open."""
    up = _up(start, shared_dir)
    token = _token(start)
    value = os.urandom(4 * MiB)
    with kvstored.connect(up.addr, token=token, transport="tcp") as c:
        assert c.put("big", value)
        _ssd_only(c, ["big"])
    node = _node_address(up.addr, token)
    pid = up.proc.pid
    before = _peak_rss(pid, 1)
    sock, reader, _ = _hello(node, "client", token)
    request = {"op": "get", "keys": ["big"] * 48, "checksums": None}
    assert len(wirefuzz.pack(request)) < 450
    sock.sendall(wirefuzz.pack(request))
    reply = reader.recv_header()
    assert reply["sizes"] == [len(value)] * 48
    got = bytearray(len(value))
    for _ in range(48):
        reader.recv_payload_into(memoryview(got))
        assert got == value
    held = _peak_rss(pid, 1)  # the connection stays open
    print(f"RSS before {before / MiB:.0f} MiB, after the get {held / MiB:.0f} MiB")
    assert held - before < 24 * MiB, (before, held)
    sock.close()


def test_a_get_beyond_the_staging_budget_is_refused_and_clients_split_their_gets(start,
                                                                                  shared_dir):
    up = _up(start, shared_dir, env={"KVSTORED_SECURITY_MAX_READ_STAGING": "5MiB"})
    token = _token(start)
    values = {f"s{i}": os.urandom(2 * MiB) for i in range(5)}
    with kvstored.connect(up.addr, token=token, transport="tcp") as c:
        assert all(c.batch_put(list(values), list(values.values())))
        _ssd_only(c, list(values))
    node = _node_address(up.addr, token)
    sock, reader, hello = _hello(node, "client", token)
    assert hello["max_read_staging"] == 5 * MiB
    reply = _request(sock, reader, {"op": "get", "keys": list(values), "checksums": None})
    assert not reply["ok"] and "security.max_read_staging" in reply["error"]["message"]
    sock.close()
    with kvstored.connect(up.addr, token=token, transport="tcp") as c:
        assert c.batch_get(list(values)) == list(values.values())

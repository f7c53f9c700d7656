"""Every exit code docs/cli.md documents, driven against real processes.

The test reads the "exit codes" columns of docs/cli.md; each documented (command, code)
pair must have a scenario here that makes a real `kvstored` or `kvstore` process end with
that code (a pair without one fails), and every scenario must be documented. The
exit-code table itself must list exactly the codes of :class:`ExitCode`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import pytest

import kvstored
from kvstored.capabilities import probe_fuse
from kvstored.cli.exitcodes import ExitCode
from tests.conftest import require
from tests.daemon.harness import BIN, Daemon, closed_port

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "cli.md"
MiB = 1 << 20

pytestmark = pytest.mark.slow


# --- what docs/cli.md says ----------------------------------------------------------------------

def _tables(section: str) -> Iterator[list[list[str]]]:
    """The Markdown tables of one ``## section``, as rows of cells (header first)."""
    body = re.split(r"^## ", DOC.read_text(), flags=re.M)
    text = next(part for part in body if part.split("\n", 1)[0].strip() == section)
    for block in re.findall(r"((?:^\|.*\|\n)+)", text, flags=re.M):
        rows = [re.split(r"(?<!\\)\|", line.strip())[1:-1] for line in block.splitlines()]
        yield [[cell.strip() for cell in row] for row in rows if not set("".join(row)) <= {"-"}]


def documented() -> list[tuple[str, str, int]]:
    """(program, command, code) for every code in an "exit codes" column."""
    pairs = []
    for program in ("kvstored", "kvstore"):
        for table in _tables(program):
            if table[0][-1] != "exit codes":
                continue
            rows = [(re.match(r"`([^`]*)`", row[0]).group(1).split(), row[-1])
                    for row in table[1:]]
            rows = [(words[1:] if words[0] == program else words, codes)
                    for words, codes in rows]
            firsts = [words[0] for words, _ in rows]
            for words, codes in rows:
                # "recover" and "recover --offline": a second word tells rows apart
                # unless it is optional ("[--node N]").
                two = firsts.count(words[0]) > 1 and not words[1].startswith("[")
                name = " ".join(words[:2] if two else words[:1])
                for code in re.findall(r"\d+", re.sub(r"\([^)]*\)", "", codes)):
                    pairs.append((program, name, int(code)))
    return pairs


def test_the_exit_code_table_lists_every_code():
    table = next(t for t in _tables("Errors and exit codes") if t[0][:2] == ["code", "name"])
    assert {(int(code), name) for code, name, _ in table[1:]} == \
        {(int(c), c.name) for c in ExitCode}


# --- the scenarios -------------------------------------------------------------------------------

@dataclass
class Outcome:
    code: int
    output: str


class World:
    """Processes the scenarios share, started on first use; all stopped at the end."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.daemons: list[Daemon] = []
        self.held: list[socket.socket] = []
        self.mounted: list[Path] = []
        self._count = 0

    def path(self, name: str) -> Path:
        self._count += 1
        return self.home / f"{self._count}-{name}"

    def start(self, *args: str) -> Daemon:
        daemon = Daemon(list(args), cwd=self.home)
        self.daemons.append(daemon)
        daemon.wait_ready()
        return daemon

    def up(self, *extra: str, dram: str = "64MiB") -> Daemon:
        return self.start("up", "--listen", "127.0.0.1:0", "--data", str(self.path("data")),
                          "--dram", dram, "--ssd", "1GiB", "--backend", "file-per-key", *extra)

    @cached_property
    def cluster(self) -> str:
        """One healthy embedded store holding "there", for most scenarios. Its DRAM tier
        is small, and objects stay DRAM-only until a flush (the watermark policy)."""
        addr = self.up("--offload", "watermark", dram="32MiB").addr
        with kvstored.connect(addr) as client:
            client.put("there", os.urandom(20_000))
        return addr

    @cached_property
    def closed(self) -> str:
        return f"127.0.0.1:{closed_port()}"

    def held_address(self) -> str:
        """An address another process (this one) listens on."""
        sock = socket.create_server(("127.0.0.1", 0))
        self.held.append(sock)
        return f"127.0.0.1:{sock.getsockname()[1]}"

    @cached_property
    def stopped_store(self) -> Path:
        """The SSD directory of an embedded store, stopped, holding two durable objects."""
        daemon = self.up()
        with kvstored.connect(daemon.addr) as client:
            client.batch_put(["a", "b"], [os.urandom(30_000), os.urandom(40_000)])
        assert self.kvstore("flush", "--wait", master=daemon.addr).code == 0
        assert daemon.stop() == 0
        return Path(daemon.args[daemon.args.index("--data") + 1]) / "ssd"

    def copy_of_store(self) -> Path:
        return Path(shutil.copytree(self.stopped_store, self.path("ssd")))

    def kvstore(self, *args: str, master: str | None = None,
                env: dict[str, str] | None = None) -> Outcome:
        full_env = {**os.environ, "COLUMNS": "200", **(env or {})}
        full_env.pop("KVSTORED_CONFIG", None)
        if master is not None:
            full_env["KVSTORE_MASTER"] = master
        run = subprocess.run([str(BIN / "kvstore"), *args], capture_output=True, text=True,
                             env=full_env, cwd=self.home, timeout=120,
                             stdin=subprocess.DEVNULL)
        return Outcome(run.returncode, run.stdout + run.stderr)

    def kvstored_fails(self, *args: str) -> Outcome:
        """A daemon command that must exit on its own (it cannot start)."""
        run = subprocess.run([str(BIN / "kvstored"), *args], capture_output=True, text=True,
                             cwd=self.home, timeout=120,
                             env={k: v for k, v in os.environ.items() if k != "KVSTORED_CONFIG"})
        return Outcome(run.returncode, run.stdout + run.stderr)

    def kvstored_runs(self, *args: str) -> Outcome:
        """A daemon that starts, then is stopped by SIGTERM."""
        daemon = self.start(*args)
        code = daemon.stop()
        return Outcome(code, daemon.log)

    def close(self) -> None:
        for point in self.mounted:
            subprocess.run(["fusermount3", "-u", "-z", str(point)], check=False)
        for daemon in self.daemons:
            if daemon.proc.poll() is None:
                daemon.stop()
        for sock in self.held:
            sock.close()


SCENARIOS: dict[tuple[str, str, int], Callable[[World], Outcome]] = {}


def scenario(program: str, command: str, code: int):
    def register(run: Callable[[World], Outcome]) -> Callable[[World], Outcome]:
        assert (program, command, code) not in SCENARIOS
        SCENARIOS[(program, command, code)] = run
        return run
    return register


def _free_shm() -> int:
    room = os.statvfs("/dev/shm")
    return room.f_bavail * room.f_frsize


def _corrupt_one_record(ssd: Path) -> None:
    record = sorted((ssd / "objects").rglob("*.kvr"))[0]
    data = bytearray(record.read_bytes())
    data[-100] ^= 0xFF  # inside the value: its CRC-32C no longer matches
    record.write_bytes(bytes(data))


# kvstored ----------------------------------------------------------------------------------------

@scenario("kvstored", "up", 0)
def _(w: World) -> Outcome:
    return w.kvstored_runs("up", "--listen", "127.0.0.1:0", "--data", str(w.path("d")),
                           "--dram", "32MiB")


@scenario("kvstored", "up", 2)
def _(w: World) -> Outcome:
    return w.kvstored_fails("up", "--listen", "127.0.0.1:0", "--data", str(w.path("d")),
                            "--dram", "32MiB", "--backend", "no-such-backend")


@scenario("kvstored", "up", 5)
def _(w: World) -> Outcome:
    """The SSD directory's stamp is damaged: refused (never overwritten), exit 5."""
    data = w.path("d")
    (data / "ssd").mkdir(parents=True)
    (data / "ssd" / "KVSTORED-BACKEND.json").write_bytes(b"\xff not a stamp")
    out = w.kvstored_fails("up", "--listen", "127.0.0.1:0", "--data", str(data),
                           "--dram", "32MiB")
    assert "KVSTORED-BACKEND.json is unreadable" in out.output, out.output
    return out


@scenario("kvstored", "up", 6)
def _(w: World) -> Outcome:
    too_big = f"{(_free_shm() >> 20) + 1024}MiB"
    return w.kvstored_fails("up", "--listen", "127.0.0.1:0", "--data", str(w.path("d")),
                            "--dram", too_big)


@scenario("kvstored", "up", 8)
def _(w: World) -> Outcome:
    held = w.held_address()
    out = w.kvstored_fails("up", "--listen", held, "--data", str(w.path("d")),
                           "--dram", "32MiB")
    assert f"cannot serve on {held}" in out.output, out.output
    return out


@scenario("kvstored", "master", 0)
def _(w: World) -> Outcome:
    return w.kvstored_runs("master", "--listen", "127.0.0.1:0")


@scenario("kvstored", "master", 2)
def _(w: World) -> Outcome:
    return w.kvstored_fails("master", "--listen", "not-an-address")


@scenario("kvstored", "master", 8)
def _(w: World) -> Outcome:
    return w.kvstored_fails("master", "--listen", w.held_address())


def _node(w: World, *extra: str, data: Path | None = None, dram: str = "32MiB") -> list[str]:
    return ["node", "--master", w.closed, "--listen", "127.0.0.1:0",
            "--data", str(data or w.path("d")), "--dram", dram, *extra]


@scenario("kvstored", "node", 0)
def _(w: World) -> Outcome:
    return w.kvstored_runs(*_node(w))


@scenario("kvstored", "node", 2)
def _(w: World) -> Outcome:
    return w.kvstored_fails(*_node(w, "--backend", "no-such-backend"))


@scenario("kvstored", "node", 6)
def _(w: World) -> Outcome:
    return w.kvstored_fails(*_node(w, dram=f"{(_free_shm() >> 20) + 1024}MiB"))


@scenario("kvstored", "node", 8)
def _(w: World) -> Outcome:
    data = w.path("shared-data")
    first = w.start(*_node(w, data=data))
    out = w.kvstored_fails(*_node(w, data=data))
    assert f"data directory {data} is in use by another kvstored node (process " \
           f"{first.proc.pid})" in out.output, out.output
    return out


@scenario("kvstored", "config show", 0)
def _(w: World) -> Outcome:
    return w.kvstored_fails("config", "show")


@scenario("kvstored", "config show", 2)
def _(w: World) -> Outcome:
    bad = w.path("bad.toml")
    bad.write_text("[node]\ndramm = 1\n")
    return w.kvstored_fails("config", "show", "--config", str(bad))


@scenario("kvstored", "config keys", 0)
def _(w: World) -> Outcome:
    return w.kvstored_fails("config", "keys")


# kvstore: reading and writing ---------------------------------------------------------------------

def _unreachable(command: str, *args: str) -> Callable[[World], Outcome]:
    def run(w: World) -> Outcome:
        out = w.kvstore(command, *args, master=w.closed)
        assert f"cannot reach {w.closed}" in out.output, out.output
        return out
    return run


for _command, _args in (("status", ()), ("put", ("k", "-")), ("get", ("k",)), ("ls", ()),
                        ("stat", ("k",)), ("rm", ("k",)), ("flush", ()),
                        ("evict", ("--tier", "dram", "--all")), ("recover", ())):
    scenario("kvstore", _command, ExitCode.UNREACHABLE)(_unreachable(_command, *_args))


def _on_cluster(*args: str) -> Callable[[World], Outcome]:
    return lambda w: w.kvstore(*args, master=w.cluster)


#: Scenarios that are one command against the shared cluster.
for _command, _code, _args in (
        ("ls", 0, ("ls", "--json")),
        ("stat", 0, ("stat", "there")),
        ("stat", 3, ("stat", "absent")),
        ("rm", 3, ("rm", "absent")),
        ("rm", 2, ("rm", "--prefix", "")),  # the whole store: refused
        ("flush", 0, ("flush", "--wait")),
        ("flush", 3, ("flush", "--node", "no-such-node")),
        ("evict", 0, ("evict", "--tier", "dram", "--prefix", "nothing/", "--dry-run")),
        ("evict", 2, ("evict", "--tier", "dram")),  # no selector
        ("recover", 0, ("recover",)),
        ("recover", 1, ("recover", "--wait-timeout", "1ms")),  # the node cannot report in time
        ("recover", 3, ("recover", "--node", "no-such-node"))):
    scenario("kvstore", _command, _code)(_on_cluster(*_args))


@scenario("kvstore", "status", 0)
def _(w: World) -> Outcome:
    out = w.kvstore("--json", "status", master=w.cluster)
    assert json.loads(out.output)["objects"] >= 1
    return out


@scenario("kvstore", "put", 0)
def _(w: World) -> Outcome:
    source = w.path("in.bin")
    source.write_bytes(b"x" * 5000)
    return w.kvstore("put", "put/ok", str(source), master=w.cluster)


@scenario("kvstore", "put", 3)
def _(w: World) -> Outcome:
    return w.kvstore("put", "put/missing", str(w.path("absent.bin")), master=w.cluster)


@scenario("kvstore", "put", 6)
def _(w: World) -> Outcome:
    source = w.path("big.bin")
    source.write_bytes(bytes(48 * MiB))
    out = w.kvstore("put", "put/big", str(source), master=w.cluster)  # a 32 MiB tier
    # At once, naming the size and the limit: not "full of objects that cannot be
    # evicted yet" after the put's wait for room on an empty cluster.
    assert "48.0 MiB, larger than the whole DRAM tier of every node (the largest is " \
           "32.0 MiB)" in out.output, out.output
    assert "node.dram" in out.output and "evicted" not in out.output, out.output
    return out


@scenario("kvstore", "get", 0)
def _(w: World) -> Outcome:
    return w.kvstore("get", "there", "-o", str(w.path("out.bin")), master=w.cluster)


@scenario("kvstore", "get", 3)
def _(w: World) -> Outcome:
    target = w.path("never.bin")
    out = w.kvstore("get", "absent", "-o", str(target), master=w.cluster)
    assert not target.exists(), "a missing key must not leave an empty output file"
    return out


@scenario("kvstore", "rm", 0)
def _(w: World) -> Outcome:
    with kvstored.connect(w.cluster) as client:
        client.put("rm/me", b"short-lived")
    return w.kvstore("rm", "rm/me", master=w.cluster)


# kvstore: administration --------------------------------------------------------------------------

@scenario("kvstore", "flush", 1)
def _(w: World) -> Outcome:
    """Objects stay DRAM-only under the watermark policy; a flush that may wait 1 ms for
    the nodes cannot see them durable (the task reaches the node in a heartbeat)."""
    with kvstored.connect(w.cluster) as client:
        client.batch_put([f"flush/{i}" for i in range(20)], [os.urandom(10_000)] * 20)
    out = w.kvstore("flush", "--wait", "--wait-timeout", "1ms", master=w.cluster)
    assert "not durable after 0.001 s" in out.output, out.output
    return out


@scenario("kvstore", "evict", 3)
def _(w: World) -> Outcome:
    out = w.kvstore("evict", "--tier", "dram", "--key", "absent", "--key", "there",
                    "--dry-run", master=w.cluster)
    assert "no object 'absent'" in out.output, out.output
    return out


@scenario("kvstore", "recover", 5)
def _(w: World) -> Outcome:
    daemon = w.up()
    with kvstored.connect(daemon.addr) as client:
        client.put("r", os.urandom(30_000))
    assert w.kvstore("flush", "--wait", master=daemon.addr).code == 0
    _corrupt_one_record(Path(daemon.args[daemon.args.index("--data") + 1]) / "ssd")
    return w.kvstore("recover", master=daemon.addr)


@scenario("kvstore", "recover --offline", 0)
def _(w: World) -> Outcome:
    return w.kvstore("recover", "--offline", str(w.copy_of_store()))


@scenario("kvstore", "recover --offline", 2)
def _(w: World) -> Outcome:
    out = w.kvstore("recover", "--offline", str(w.copy_of_store()), "--backend", "offset")
    assert "belongs to the 'file-per-key' backend" in out.output, out.output
    return out


@scenario("kvstore", "recover --offline", 3)
def _(w: World) -> Outcome:
    return w.kvstore("recover", "--offline", str(w.path("absent")))


@scenario("kvstore", "recover --offline", 5)
def _(w: World) -> Outcome:
    store = w.copy_of_store()
    _corrupt_one_record(store)
    return w.kvstore("recover", "--offline", str(store))


@scenario("kvstore", "recover --offline", 8)
def _(w: World) -> Outcome:
    """A running node holds the directory: the offline tool refuses, naming it."""
    daemon = w.up()
    ssd = Path(daemon.args[daemon.args.index("--data") + 1]) / "ssd"
    out = w.kvstore("recover", "--offline", str(ssd))
    assert f"pid {daemon.proc.pid}" in out.output, out.output
    return out


# kvstore: the FUSE view ---------------------------------------------------------------------------

def _fuse() -> None:
    require("fuse", *probe_fuse())


def _mountpoint(w: World) -> Path:
    point = w.path("mnt")
    point.mkdir()
    return point


def _background_mount(w: World) -> tuple[Path, Outcome]:
    """Mount the cluster in the background (unmounted at the end, whatever happens)."""
    _fuse()
    point = _mountpoint(w)
    w.mounted.append(point)
    return point, w.kvstore("mount", str(point), "--background", master=w.cluster)


@scenario("kvstore", "mount", 0)
def _(w: World) -> Outcome:
    point, out = _background_mount(w)
    assert "there" in os.listdir(point / "keys")
    subprocess.run(["fusermount3", "-u", str(point)], check=True)
    return out


@scenario("kvstore", "mount", 2)
def _(w: World) -> Outcome:
    return w.kvstore("mount", str(_mountpoint(w)), "--backend", "bucket", master=w.cluster)


@scenario("kvstore", "mount", 3)
def _(w: World) -> Outcome:
    return w.kvstore("mount", str(w.path("absent")), master=w.cluster)


@scenario("kvstore", "mount", 4)
def _(w: World) -> Outcome:
    _fuse()
    return w.kvstore("mount", str(_mountpoint(w)), "--background", master=w.closed)


@scenario("kvstore", "mount", 5)
def _(w: World) -> Outcome:
    """--offline DIR whose stamp is damaged."""
    _fuse()
    store = w.copy_of_store()
    (store / "KVSTORED-BACKEND.json").write_text("{not json")
    return w.kvstore("mount", str(_mountpoint(w)), "--offline", str(store))


@scenario("kvstore", "mount", 7)
def _(w: World) -> Outcome:
    """No fusermount3 on the PATH: FUSE cannot be used."""
    empty = w.path("empty-bin")
    empty.mkdir()
    out = w.kvstore("mount", str(_mountpoint(w)), master=w.cluster, env={"PATH": str(empty)})
    assert "FUSE is unavailable" in out.output, out.output
    return out


@scenario("kvstore", "mount", 8)
def _(w: World) -> Outcome:
    point, first = _background_mount(w)
    assert first.code == 0, first.output
    out = w.kvstore("mount", str(point), master=w.cluster)
    subprocess.run(["fusermount3", "-u", str(point)], check=True)
    return out


# kvstore: benchmarks ------------------------------------------------------------------------------

def _tiny_trace(w: World) -> Path:
    trace = w.path("trace.jsonl")
    trace.write_text("".join(
        json.dumps({"timestamp": i * 10, "input_length": 512 * (1 + i % 4),
                    "output_length": 1, "hash_ids": list(range(i % 7, i % 7 + 1 + i % 4))})
        + "\n" for i in range(300)))
    return trace


@scenario("kvstore", "bench sim", 0)
def _(w: World) -> Outcome:
    pytest.importorskip("kvcache_sim")
    if shutil.which("c++") is None:
        pytest.skip("the reference's C++ backend needs a C++ compiler")
    return w.kvstore("bench", "sim", "--trace", str(_tiny_trace(w)), "--replicate", "2",
                     "--rounds", "1", "--json-out", str(w.path("sim.json")))


@scenario("kvstore", "bench sim", 3)
def _(w: World) -> Outcome:
    return w.kvstore("bench", "sim", "--trace", str(w.path("absent.jsonl")))


@scenario("kvstore", "bench sim", 7)
def _(w: World) -> Outcome:
    """No C++ compiler on the PATH: the reference's backend cannot be built."""
    empty = w.path("empty-bin")
    empty.mkdir()
    return w.kvstore("bench", "sim", "--trace", str(_tiny_trace(w)),
                     env={"PATH": str(empty)})


@scenario("kvstore", "replay", 0)
def _(w: World) -> Outcome:
    return w.kvstore("replay", str(_tiny_trace(w)), "--block-bytes", "4KiB", master=w.cluster)


@scenario("kvstore", "replay", 2)
def _(w: World) -> Outcome:
    return w.kvstore("replay", str(_tiny_trace(w)), "--multiturn", "2x2")


@scenario("kvstore", "replay", 3)
def _(w: World) -> Outcome:
    return w.kvstore("replay", str(w.path("absent.jsonl")), master=w.cluster)


@scenario("kvstore", "replay", 4)
def _(w: World) -> Outcome:
    return w.kvstore("replay", str(_tiny_trace(w)), master=w.closed)


@scenario("kvstore", "replay", 5)
def _(w: World) -> Outcome:
    """A value of other bytes under the key of a block the replay reads back."""
    import numpy as np

    from kvstored.replay.keys import chained_keys

    trace = _tiny_trace(w)
    first = json.loads(trace.read_text().splitlines()[0])["hash_ids"][:1]
    key = chained_keys("forged", np.array(first))[0]
    with kvstored.connect(w.cluster) as client:
        client.put(key, bytes(4096))
    return w.kvstore("replay", str(trace), "--block-bytes", "4KiB", "--namespace", "forged",
                     master=w.cluster)


# --- the tests -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Iterator[World]:
    w = World(tmp_path_factory.mktemp("exit-codes"))
    yield w
    w.close()


PAIRS = documented()


@pytest.mark.parametrize(("program", "command", "code"), PAIRS,
                         ids=[f"{p} {c} -> {n}" for p, c, n in PAIRS])
def test_each_documented_exit_code_happens(world, program, command, code):
    run = SCENARIOS.get((program, command, code))
    assert run is not None, (f"docs/cli.md says `{program} {command}` exits {code}, and "
                             "tests/cli/test_exit_codes.py has no scenario for it")
    out = run(world)
    assert out.code == code, f"`{program} {command}` exited {out.code}, not {code}:\n" \
                             f"{out.output}"
    assert "Traceback" not in out.output, out.output
    if code not in (0, ExitCode.USAGE) and program == "kvstore":  # usage: click's form
        errors = [line for line in out.output.splitlines() if line.startswith("kvstore")]
        assert 1 <= len(errors) <= 2, out.output


def test_every_scenario_is_documented():
    stale = sorted(set(SCENARIOS) - set(PAIRS))
    assert not stale, f"scenarios for codes docs/cli.md does not list: {stale}"


def test_signals_stop_the_daemon_with_0(world):
    """The roles stop cleanly on SIGINT as on SIGTERM (docs/cli.md)."""
    daemon = world.start("up", "--listen", "127.0.0.1:0", "--data", str(world.path("d")),
                         "--dram", "32MiB")
    daemon.proc.send_signal(signal.SIGINT)
    assert daemon.proc.wait(30) == 0, daemon.log

"""Real daemon processes for the tests: start, wait for their banner, stop, kill -9."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from kvstored.processes import stop_process

BIN = Path(sys.executable).parent
ADDRESS = re.compile(
    r"^kvstored (?:up|master|node): (?:listening on|data server on) ([\d.]+):(\d+)")


class Daemon:
    """One `kvstored` process; its output is kept for failure messages."""

    def __init__(self, args: list[str], *, env: dict[str, str] | None = None,
                 cwd: Path | None = None) -> None:
        self.args = args
        self.lines: list[str] = []
        self._banner = threading.Event()
        self.address: tuple[str, int] | None = None
        self.proc = subprocess.Popen(
            [str(BIN / "kvstored"), *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, cwd=cwd, env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())
            match = ADDRESS.search(line)
            if match and self.address is None:
                self.address = (match.group(1), int(match.group(2)))
                self._banner.set()
        self._banner.set()

    def wait_ready(self, timeout: float = 60) -> tuple[str, int]:
        self._banner.wait(timeout)
        if self.address is None:
            raise AssertionError(f"kvstored {' '.join(self.args)} did not start:\n{self.log}")
        return self.address

    @property
    def addr(self) -> str:
        assert self.address is not None
        return f"{self.address[0]}:{self.address[1]}"

    @property
    def log(self) -> str:
        return "\n".join(self.lines[-80:])

    def stop(self, timeout: float = 60) -> int:
        """SIGTERM, then wait: a node first writes its DRAM-only objects to SSD, for at
        most node.shutdown_flush_timeout (30 s by default)."""
        if not stop_process(self.proc, timeout):
            raise AssertionError(f"kvstored ignored SIGTERM:\n{self.log}")
        self._reader.join(5)
        return self.proc.returncode

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self._reader.join(5)


def kvstore(*args: str, master: str | None = None, input: bytes | None = None,
            timeout: float = 120, env: dict[str, str] | None = None
            ) -> subprocess.CompletedProcess:
    """Run the `kvstore` tool against ``master`` (with ``env`` added to the environment);
    returns the completed process."""
    env = {**os.environ, "COLUMNS": "200", **(env or {})}
    if master is not None:
        env["KVSTORE_MASTER"] = master
    return subprocess.run([str(BIN / "kvstore"), *args], input=input, capture_output=True,
                          timeout=timeout, env=env)


def kvstore_ok(*args: str, master: str | None = None, input: bytes | None = None) -> str:
    run = kvstore(*args, master=master, input=input)
    if run.returncode != 0:
        raise AssertionError(f"kvstore {' '.join(args)} exited {run.returncode}:\n"
                             f"{run.stdout.decode(errors='replace')}"
                             f"{run.stderr.decode(errors='replace')}")
    return run.stdout.decode()


def free_port() -> int:
    """A port free now, for a daemon to listen on. Another process may take it before the
    daemon does: for an address nothing must answer on, use :func:`closed_port`."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: The sockets that keep :func:`closed_port`'s ports, for the life of this process.
_CLOSED: list = []


def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on, for the rest of this process: it
    stays bound here without listening, so a connect to it is refused at once and no other
    process can listen on it (a port found free and let go may be taken by another test's
    daemon before the test connects to it, which then answers)."""
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    _CLOSED.append(s)
    return s.getsockname()[1]


def wait_for(predicate, timeout: float = 30, interval: float = 0.05, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def flip_ssd_byte(client, key: str, at: int = 1234) -> None:
    """Flip one byte of ``key``'s value in its SSD record, found through the node's
    ``locate`` op (bit rot, for tests of checksums and quarantine)."""
    ssd = next(w["ssd"] for w in client.locate(key).values() if w.get("ssd"))
    with open(ssd["path"], "r+b") as f:
        f.seek(ssd["offset"] + at)
        byte = f.read(1)
        f.seek(ssd["offset"] + at)
        f.write(bytes([byte[0] ^ 0xFF]))

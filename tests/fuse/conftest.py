"""Real mounts: a `kvstored up` process, `kvstore mount` processes on temporary
directories, and an unmount in teardown whatever the test did."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from kvstored.capabilities import probe_fuse
from tests.conftest import require
from tests.daemon.harness import BIN, Daemon


@pytest.fixture
def fuse():
    """Skip without FUSE, unless KVSTORED_REQUIRE names it (CI): then fail."""
    require("fuse", *probe_fuse())


class Mount:
    """One `kvstore mount` process, serving in the foreground."""

    def __init__(self, mountpoint: Path, *args: str) -> None:
        self.path = mountpoint
        self.args = args
        mountpoint.mkdir(parents=True, exist_ok=True)
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            [str(BIN / "kvstore"), "mount", str(mountpoint), *args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        deadline = time.monotonic() + 60
        while not is_mounted(mountpoint):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.unmount()
                raise AssertionError(f"kvstore mount {' '.join(args)} did not mount:\n"
                                     f"{self.log}")
            time.sleep(0.05)

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())

    @property
    def log(self) -> str:
        return "\n".join(self.lines[-60:])

    def wait_log(self, *texts: str, timeout: float = 10) -> None:
        """Wait until one of ``texts`` is in the log: the process may answer a FUSE
        request before the line about it has come through the pipe and the reader."""
        deadline = time.monotonic() + timeout
        while not any(text in "\n".join(self.lines) for text in texts):
            if time.monotonic() > deadline:
                raise AssertionError(f"none of {texts} in the mount's log:\n{self.log}")
            time.sleep(0.02)

    def __truediv__(self, part: str | bytes) -> Path | bytes:
        if isinstance(part, bytes):
            return os.fsencode(self.path) + b"/" + part
        return self.path / part

    def unmount(self, sig: int = signal.SIGTERM) -> int | None:
        """Stop the process (it unmounts); make sure nothing stays mounted."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if is_mounted(self.path):
            subprocess.run(["fusermount3", "-u", "-z", str(self.path)], check=False)
        self._reader.join(5)
        return self.proc.returncode


def is_mounted(path: Path) -> bool:
    """From mountinfo, so that a hung or dead mount cannot hang the test itself."""
    target = os.path.realpath(path)
    with open("/proc/self/mountinfo") as mounts:
        for line in mounts:
            point = line.split()[4].encode().decode("unicode_escape").encode("latin-1")
            if point.decode() == target:
                return True
    return False


@pytest.fixture
def mount(fuse, tmp_path):
    """Mount with `kvstore mount ARGS`; every mount is unmounted after the test."""
    mounts: list[Mount] = []

    def start(*args: str, at: str = "mnt") -> Mount:
        m = Mount(tmp_path / at, *args)
        mounts.append(m)
        return m

    yield start
    for m in mounts:
        m.unmount()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """One `kvstored up` on the bucket backend for a module's tests (each test uses its
    own keys)."""
    home = tmp_path_factory.mktemp("cluster")
    daemon = Daemon(["up", "--listen", "127.0.0.1:0", "--data", str(home / "data"),
                     "--dram", "256MiB", "--ssd", "1GiB", "--backend", "bucket"], cwd=home)
    try:
        daemon.wait_ready()
        yield daemon
    finally:
        if daemon.proc.poll() is None:
            daemon.stop()

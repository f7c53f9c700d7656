"""Fixtures that run real kvstored processes on loopback, each in its own directory."""

from __future__ import annotations

import pytest

from tests.daemon.harness import Daemon


@pytest.fixture
def spawn(tmp_path):
    """Start kvstored processes; all are stopped (and their logs shown on failure) after."""
    started: list[Daemon] = []

    def start(*args: str, **kwargs) -> Daemon:
        daemon = Daemon(list(args), cwd=tmp_path, **kwargs)
        started.append(daemon)
        daemon.wait_ready()
        return daemon

    yield start
    for daemon in started:
        if daemon.proc.poll() is None:
            daemon.stop()


@pytest.fixture
def embedded(spawn, tmp_path):
    """`kvstored up` with a small DRAM tier on the file-per-key backend."""

    def start(*extra: str, data=None, dram: str = "64MiB", backend: str = "file-per-key",
              env: dict[str, str] | None = None):
        return spawn("up", "--listen", "127.0.0.1:0", "--data", str(data or tmp_path / "data"),
                     "--dram", dram, "--ssd", "1GiB", "--backend", backend, *extra, env=env)

    return start

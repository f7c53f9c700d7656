"""Fixtures and helpers of the backend tests: both io engines, and a writer killed -9."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

import kvstored.native
from tests.conftest import require


@pytest.fixture(params=["posix", "uring"])
def engine(request) -> str:
    """The io engine a backend runs on, each in turn (uring skips where it cannot work)."""
    if request.param == "uring":
        require("uring", *kvstored.native.uring_status())
    return request.param


def item_nbytes(item) -> int:
    """Bytes an io engine item ``(file, offset, buffer or list of pieces)`` moves."""
    buffer = item[2]
    pieces = buffer if isinstance(buffer, list) else [buffer]
    return sum(memoryview(piece).nbytes for piece in pieces)


def kill_9_after_ack(script: str, *args: str) -> None:
    """Run ``script`` (Python) in a child with ``args``; as soon as it prints ``ACK`` (all it
    wrote is acknowledged) kill it with SIGKILL, which no code of it sees coming."""
    child = subprocess.Popen([sys.executable, "-c", script, *args],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ACK", "the writer died before its ACK"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()

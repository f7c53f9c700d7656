"""kvstored.sdk.lock: a second opener is refused, at once unless the holder is exiting.

The holders are real processes. One that is "on its way out" has had its main thread exit
(the kernel marks it exiting) while a second thread keeps it, and so its lock, alive until
the test lets it go: the state a process is in between the start of its exit and the
close of its descriptors, held for as long as the test needs.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvstored.sdk import lock as lock_module
from kvstored.sdk.errors import BackendBusyError
from kvstored.sdk.lock import StoreLock

HOLDER = """
import ctypes, sys, threading
from kvstored.sdk.lock import StoreLock
held = StoreLock.acquire(sys.argv[1])
libc = ctypes.CDLL(None)
main = threading.main_thread().ident

def keep_it() -> None:
    if sys.argv[2] == "exiting":
        libc.pthread_join(ctypes.c_ulong(main), None)  # the main thread has exited
    print("HELD", flush=True)
    sys.stdin.read()  # until the test closes our stdin
    held.release()
    sys.stdout.flush()
    libc._exit(0)

threading.Thread(target=keep_it).start()
if sys.argv[2] == "exiting":
    libc.pthread_exit(None)
"""


def _holder(path: Path, how: str) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(path), how],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdin and proc.stdout
    try:
        assert proc.stdout.readline() == "HELD\n"
        yield proc
    finally:
        if not proc.stdin.closed:
            proc.stdin.close()
        assert proc.wait(60) == 0


@pytest.fixture
def live(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    yield from _holder(tmp_path / "lock", "live")


@pytest.fixture
def exiting(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    yield from _holder(tmp_path / "lock", "exiting")


def test_a_live_holder_is_refused_at_once_and_named(tmp_path, live):
    start = time.monotonic()
    with pytest.raises(BackendBusyError, match=rf"in use by pid {live.pid} \(.*python") as caught:
        StoreLock.acquire(tmp_path / "lock", what="test store", wait=60)
    assert caught.value.pid == live.pid
    assert time.monotonic() - start < 30, "waited for a holder that is not going away"
    with pytest.raises(BackendBusyError, match=f"in use by pid {live.pid}"):
        StoreLock.acquire(tmp_path / "lock", shared=True, wait=60)


def test_a_holder_on_its_way_out_is_waited_for(tmp_path, exiting, monkeypatch):
    awaited = []

    def let_it_go(pid: int, timeout: float) -> bool:
        awaited.append(pid)
        assert exiting.stdin
        exiting.stdin.close()  # now it may finish its exit
        return real(pid, timeout)

    real = lock_module._await_exit
    monkeypatch.setattr(lock_module, "_await_exit", let_it_go)
    held = StoreLock.acquire(tmp_path / "lock", what="test store", wait=60)
    assert held.held and awaited == [exiting.pid]
    held.release()


def test_a_holder_that_does_not_finish_exiting_is_refused_after_the_wait(tmp_path, exiting):
    start = time.monotonic()
    with pytest.raises(BackendBusyError, match=r"is exiting but did not let go of it within "
                                               r"0\.3 s"):
        StoreLock.acquire(tmp_path / "lock", what="test store", wait=0.3)
    assert time.monotonic() - start >= 0.3
    with pytest.raises(BackendBusyError, match=f"in use by pid {exiting.pid}"):
        StoreLock.acquire(tmp_path / "lock", what="test store")  # no wait: at once


def test_this_process_holding_it_is_refused_at_once(tmp_path):
    held = StoreLock.acquire(tmp_path / "lock")
    start = time.monotonic()
    with pytest.raises(BackendBusyError, match="in use by this process"):
        StoreLock.acquire(tmp_path / "lock", wait=60)
    assert time.monotonic() - start < 30
    held.release()
    StoreLock.acquire(tmp_path / "lock").release()  # released by release, at once

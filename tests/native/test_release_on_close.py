"""When a batch that synced a file returns, the engine no longer holds that file: closing
it then releases everything (issue 9 item 24). io_uring runs syncs on io-wq workers, which
may drop their reference to the file a moment after the completion came back; the engine
waits for a NOP linked after each sync (a fence) that the kernel completes only after."""

from __future__ import annotations

import fcntl
import os

import pytest

from kvstored.native import probe_uring
from tests.conftest import require


def make_engine(name: str):
    if name == "posix":
        from kvstored.native.posix import PosixEngine

        return PosixEngine()
    require("uring", *probe_uring())
    from kvstored.native.uring import UringEngine

    return UringEngine(queue_depth=8)


@pytest.mark.parametrize("make", ["posix", "uring"])
def test_a_synced_file_is_released_by_close(tmp_path, make):
    """Lock the very descriptor the engine writes and syncs through, close it, and take
    the lock from a new descriptor at once: 300 times. A reference the ring still held
    would keep the first lock (flock belongs to the open file, not the descriptor)."""
    engine = make_engine(make)
    path = tmp_path / "f"
    data = os.urandom(256 << 10)
    for n in range(300):
        f = engine.open(path, os.O_RDWR | os.O_CREAT)
        fcntl.flock(f.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert engine.write([(f, 0, data), (f, 1 << 20, data)]) == [len(data)] * 2
        assert engine.fsync([f]) == [0] and engine.fsync([f], datasync=True) == [0]
        f.close()
        probe = os.open(path, os.O_RDWR)
        try:
            fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pytest.fail(f"round {n}: the file was still held after close()")
        finally:
            os.close(probe)


def test_every_sync_gets_a_fence_and_depth_one_still_syncs(tmp_path):
    require("uring", *probe_uring())
    from kvstored.native.uring import UringEngine

    engine = UringEngine(queue_depth=8)
    files = [engine.open(tmp_path / f"f{i}", os.O_RDWR | os.O_CREAT) for i in range(5)]
    try:
        before = engine.ring_stats()["fences"]
        assert engine.fsync(files) == [0] * 5
        assert engine.ring_stats()["fences"] - before == 5
        shallow = UringEngine(queue_depth=1)  # no room for a fence: syncs go alone
        assert shallow.write([(files[0], 0, b"x" * 4096)]) == [4096]
        assert shallow.fsync(files) == [0] * 5
        assert shallow.ring_stats()["fences"] == 0
    finally:
        for f in files:
            f.close()

"""What only the uring engine has: the GIL released in C, short transfers completed by the
ring, a ring per thread (and per process after fork), fixed buffers that may fail to pin."""

from __future__ import annotations

import mmap
import os
import threading

import pytest

from kvstored.native import IoFile, probe_uring
from tests.conftest import require
from tests.native.helpers import CAP_IPC_LOCK, read_a_pipe_in_two_parts, run_python


@pytest.fixture
def uring():
    require("uring", *probe_uring())
    from kvstored.native.uring import UringEngine

    return UringEngine(queue_depth=8)


def test_waiting_in_c_releases_the_gil():
    """Two threads block inside the ring's wait, each on a pipe nobody has written yet.
    The main thread can then only write to the pipes, and thread B can only finish while A
    still waits, if the C wait does not hold the GIL. Were it held, the child would hang:
    it runs in its own process so that a hang fails this test instead of the test run."""
    require("uring", *probe_uring())
    out = run_python("""
import json, os, threading, time
from kvstored.native import IoFile
from kvstored.native.uring import UringEngine
engine = UringEngine()
pipes = [os.pipe() for _ in range(2)]
files = [IoFile(read_end, f"pipe{i}") for i, (read_end, _) in enumerate(pipes)]
results = {}
def reader(i):
    buf = bytearray(5)
    results[i] = [engine.read([(files[i], 0, buf)]), buf.decode()]
threads = [threading.Thread(target=reader, args=(i,)) for i in range(2)]
for t in threads:
    t.start()
IO_URING_ENTER = 426  # the same number on every architecture
deadline = time.monotonic() + 20
def waiting_in_the_ring(thread):
    with open(f"/proc/self/task/{thread.native_id}/syscall") as f:
        return f.read().split()[0] == str(IO_URING_ENTER)
while not all(waiting_in_the_ring(t) for t in threads):  # kv_ring_run's wait for a CQE
    assert time.monotonic() < deadline, "the readers never reached io_uring_enter"
    time.sleep(0.001)
os.write(pipes[1][1], b"world")
threads[1].join()
a_still_waiting = threads[0].is_alive()
os.write(pipes[0][1], b"hello")
threads[0].join()
print(json.dumps({"a_still_waiting": a_still_waiting, "results": results}))
""", timeout=30)
    assert out["a_still_waiting"] is True
    assert out["results"] == {"0": [[5], "hello"], "1": [[5], "world"]}


def test_short_reads_are_completed_by_the_ring(uring):
    """A pipe hands out what it has: the first read comes back short, the ring asks for
    the rest, and the caller sees one complete read."""
    buf = bytearray(11)
    result, stats = read_a_pipe_in_two_parts(uring, buf)
    assert result == [11] and bytes(buf) == b"first secon"
    assert stats["resubmits"] >= 1


def test_a_read_stops_short_at_end_of_stream(uring):
    read_end, write_end = os.pipe()
    os.write(write_end, b"only this")
    os.close(write_end)
    buf = bytearray(64)
    with IoFile(read_end, "pipe") as pipe:
        assert uring.read([(pipe, 0, buf)]) == [9]
    assert bytes(buf[:9]) == b"only this"


def test_each_thread_has_its_own_ring(uring, tmp_path):
    from kvstored.native._io import ffi

    path = tmp_path / "data"
    path.write_bytes(b"x" * 4096)
    f = uring.open(path, os.O_RDONLY)
    rings, barrier = {}, threading.Barrier(6)

    def worker(index: int) -> None:
        assert uring.read([(f, 0, bytearray(4096))]) == [4096]
        rings[index] = int(ffi.cast("uintptr_t", uring._local.ring.handle))
        barrier.wait(10)  # all rings alive at once, so no address can be reused

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(5)]
    for t in threads:
        t.start()
    worker(5)
    for t in threads:
        t.join(10)
    f.close()
    assert len(set(rings.values())) == 6


def test_a_forked_child_makes_its_own_ring(uring, tmp_path):
    path = tmp_path / "data"
    path.write_bytes(b"parent and child")
    f = uring.open(path, os.O_RDONLY)
    assert uring.read([(f, 0, bytearray(6))]) == [6]  # the parent's ring exists now
    pid = os.fork()
    if pid == 0:  # child: use the engine, report through the exit status only
        try:
            buf = bytearray(5)
            ok = uring.read([(f, 11, buf)]) == [5] and bytes(buf) == b"child"
            os._exit(0 if ok else 1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    buf = bytearray(6)
    assert uring.read([(f, 0, buf)]) == [6] and bytes(buf) == b"parent"
    f.close()


def test_fixed_buffers_reach_threads_that_did_not_register_them(uring, tmp_path):
    staging = mmap.mmap(-1, 64 << 10)
    assert uring.register_buffer(staging)
    path = tmp_path / "data"
    path.write_bytes(os.urandom(64 << 10))
    f = uring.open(path, os.O_RDONLY, direct=True)
    seen = {}

    def worker() -> None:
        before = uring.ring_stats()["fixed_sqes"]
        seen["result"] = uring.read([(f, 0, memoryview(staging))])
        seen["fixed"] = uring.ring_stats()["fixed_sqes"] - before

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join(10)
    f.close()
    assert seen == {"result": [64 << 10], "fixed": 1}
    assert bytes(staging) == path.read_bytes()


def test_registration_failure_is_logged_once_and_io_goes_on():
    """Without CAP_IPC_LOCK, pinned buffers count against RLIMIT_MEMLOCK. A child without
    that capability and with a 64 KiB limit cannot pin 1 MiB; the engine says so once and
    works on without fixed buffers."""
    require("uring", *probe_uring())
    out = run_python("""
import json, logging, mmap, os, resource, sys, tempfile
from tests.native.helpers import keep_native_logs
records = keep_native_logs(logging.WARNING)
resource.setrlimit(resource.RLIMIT_MEMLOCK, (64 << 10, 64 << 10))
from kvstored.native.uring import UringEngine
engine = UringEngine()
first = engine.register_buffer(mmap.mmap(-1, 1 << 20))
second = engine.register_buffer(mmap.mmap(-1, 1 << 20))
staging = mmap.mmap(-1, 1 << 20)
engine.register_buffer(staging)
with tempfile.TemporaryDirectory() as tmp:
    f = engine.open(os.path.join(tmp, "data"), os.O_RDWR | os.O_CREAT)
    view = memoryview(staging)
    view[:5] = b"still"
    wrote = engine.write([(f, 0, view[:5])])
    back = bytearray(5)
    read = engine.read([(f, 0, back)])
    f.close()
print(json.dumps({"registered": [first, second], "wrote": wrote, "read": read,
                  "data": back.decode(), "fixed": engine.ring_stats()["fixed_sqes"],
                  "logs": records}))
""", drop_capability=CAP_IPC_LOCK)
    assert out["registered"] == [False, False]
    assert out["wrote"] == [5] and out["read"] == [5] and out["data"] == "still"
    assert out["fixed"] == 0
    assert len(out["logs"]) == 1 and "RLIMIT_MEMLOCK" in out["logs"][0], out["logs"]


def test_each_request_enters_the_kernel_on_its_own(uring, tmp_path):
    """Requests are submitted one per io_uring_enter (io_uring_core.c says why): a read
    batch and a stream of batches take one submission per request, and a sync takes one
    with its fence, since a link cannot span two submissions."""
    path = tmp_path / "data"
    path.write_bytes(os.urandom(64 << 12))
    f = uring.open(path, os.O_RDWR)
    buffers = [bytearray(4096) for _ in range(64)]
    try:
        before = uring.ring_stats()
        assert uring.read([(f, n * 4096, buffers[n]) for n in range(20)]) == [4096] * 20
        after = uring.ring_stats()
        assert after["sqes"] - before["sqes"] == 20
        assert after["submits"] - before["submits"] == 20
        batches = [[(f, (b * 16 + n) * 4096, buffers[b * 16 + n]) for n in range(16)]
                   for b in range(4)]
        assert [r for done in uring.read_stream(batches, ahead=2) for r in done] == [4096] * 64
        streamed = uring.ring_stats()
        assert streamed["submits"] - after["submits"] == 64
        assert b"".join(buffers) == path.read_bytes()
        assert uring.fsync([f, f]) == [0, 0]
        synced = uring.ring_stats()
        assert synced["fences"] - streamed["fences"] == 2
        assert synced["sqes"] - streamed["sqes"] == 4
        assert synced["submits"] - streamed["submits"] == 2
    finally:
        f.close()

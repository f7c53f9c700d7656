"""What only the uring engine has: the GIL released in C, short transfers completed by the
ring, a ring per thread (and per process after fork), fixed buffers that may fail to pin,
and started batches served by a worker thread that refills the queue on its own."""

from __future__ import annotations

import mmap
import os
import threading
import time

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


def _pipe_files(count: int) -> tuple[list[IoFile], list[int]]:
    pipes = [os.pipe() for _ in range(count)]
    return [IoFile(r, f"pipe{i}") for i, (r, _) in enumerate(pipes)], [w for _, w in pipes]


def _until(condition, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.001)


@pytest.mark.parametrize("vectored", [False, True], ids=["plain", "vectored"])
def test_a_started_batch_is_refilled_while_the_caller_is_away(vectored):
    """With a queue of one, a started batch of two reads has the second in the kernel
    only once the first completed. The caller makes no call that runs the ring in
    between (ring_stats only reads counters): the worker serving the ring queues the
    second read on its own, as it would refill a disk's queue while a stream's caller
    checks the last group's records. Vectored items (the general path) are pushed the
    same way as plain ones."""
    require("uring", *probe_uring())
    from kvstored.native.uring import UringEngine

    engine = UringEngine(queue_depth=1)
    files, writers = _pipe_files(2)
    buffers = [bytearray(5), bytearray(5)]
    items = [(f, 0, [memoryview(b)[:2], memoryview(b)[2:]] if vectored else b)
             for f, b in zip(files, buffers)]
    try:
        pending = engine.start_read(items)
        _until(lambda: engine.ring_stats()["sqes"] >= 1, "the first read never went in")
        assert engine.ring_stats()["sqes"] == 1  # a queue of one
        os.write(writers[0], b"first")
        _until(lambda: engine.ring_stats()["sqes"] == 2,
               "the second read never went in without the caller")
        os.write(writers[1], b"again")
        assert pending.wait() == [5, 5]
        assert [bytes(b) for b in buffers] == [b"first", b"again"]
    finally:
        for fd in [f.fd for f in files] + writers:
            os.close(fd)


def test_waiting_for_a_started_batch_releases_the_gil():
    """A thread waits for a started batch (on the served ring: two reads, a queue of
    one) on pipes nobody has written. The main thread sees it sleeping on that line and
    only then writes the pipes: were the GIL held while waiting, the main thread could
    not run and the child would hang (it runs in its own process, so a hang fails this
    test)."""
    require("uring", *probe_uring())
    out = run_python("""
import json, os, sys, threading, time
from kvstored.native import IoFile
from kvstored.native.uring import UringEngine
engine = UringEngine(queue_depth=1)
pipes = [os.pipe() for _ in range(2)]
bufs = [bytearray(5), bytearray(5)]
results = {}
def waiter():
    pending = engine.start_read([(IoFile(r, "pipe"), 0, b) for (r, _), b in zip(pipes, bufs)])
    results["read"] = pending.wait()  # the line the main thread looks for
thread = threading.Thread(target=waiter)
thread.start()
line = waiter.__code__.co_firstlineno + 2
def waiting():
    frame = sys._current_frames().get(thread.ident)  # innermost: the engine's wait
    while frame is not None and frame.f_code is not waiter.__code__:
        frame = frame.f_back
    with open(f"/proc/self/task/{thread.native_id}/stat") as f:
        state = f.read().rsplit(")", 1)[1].split()[0]
    return frame is not None and frame.f_lineno == line and state == "S"
deadline = time.monotonic() + 20
while not waiting():
    assert time.monotonic() < deadline, "the thread never waited for its batch"
    time.sleep(0.001)
for (_, write_end), word in zip(pipes, (b"hello", b"world")):
    os.write(write_end, word)
thread.join()
print(json.dumps({"results": results, "data": [b.decode() for b in bufs]}))
""", timeout=30)
    assert out == {"results": {"read": [5, 5]}, "data": ["hello", "world"]}


def _tasks() -> set[str]:
    return set(os.listdir("/proc/self/task"))


def test_a_threads_served_ring_and_its_worker_go_with_the_thread(tmp_path):
    """Each thread that starts batches gets a served ring with a worker thread; when the
    thread ends, its ring is destroyed and the worker joined: no worker outlives it."""
    require("uring", *probe_uring())
    from kvstored.native.uring import UringEngine

    engine = UringEngine(queue_depth=4)
    path = tmp_path / "data"
    path.write_bytes(os.urandom(4096 * 8))
    f = engine.open(path, os.O_RDONLY)
    before = _tasks()
    results = []

    def streamer() -> None:
        batches = [[(f, (b * 4 + n) * 4096, bytearray(4096)) for n in range(4)]
                   for b in range(2)]
        results.append([r for done in engine.read_stream(batches) for r in done])

    threads = [threading.Thread(target=streamer) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    f.close()
    assert results == [[4096] * 8] * 3
    _until(lambda: _tasks() <= before, f"workers left behind: {_tasks() - before}")


def test_a_forked_child_starts_batches_on_a_served_ring_of_its_own(tmp_path):
    """The parent's served ring has a worker the child does not (fork copies one
    thread): the child's batches go to a ring and worker of its own, and the parent's
    ring goes on working."""
    require("uring", *probe_uring())
    from kvstored.native.uring import UringEngine

    engine = UringEngine(queue_depth=1)  # two reads: more than fits, so served
    path = tmp_path / "data"
    path.write_bytes(b"parent and child")
    f = engine.open(path, os.O_RDONLY)

    def both() -> list[bytes] | None:
        bufs = [bytearray(6), bytearray(5)]
        got = engine.start_read([(f, 0, bufs[0]), (f, 11, bufs[1])]).wait()
        return [bytes(b) for b in bufs] if got == [6, 5] else None

    assert both() == [b"parent", b"child"]  # the parent's served ring exists now
    pid = os.fork()
    if pid == 0:  # child: report through the exit status only
        try:
            os._exit(0 if both() == [b"parent", b"child"] else 1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert both() == [b"parent", b"child"]
    f.close()


def test_a_batch_that_fits_an_idle_queue_needs_no_worker(tmp_path):
    """A started batch that fits the queue while the thread's rings are idle goes to
    the thread's own ring whole (nothing to refill, no handover to a worker and back):
    one such read starts no worker thread. A batch started while another is in flight
    goes to the served ring, whose worker keeps both queues' worth moving."""
    require("uring", *probe_uring())
    from kvstored.native.uring import UringEngine

    path = tmp_path / "data"
    path.write_bytes(os.urandom(4096 * 8))
    seen = {}

    def reader() -> None:
        engine = UringEngine(queue_depth=4)
        f = engine.open(path, os.O_RDONLY)
        before = _tasks()
        seen["single"] = engine.start_read([(f, 0, bytearray(4096))]).wait()
        seen["workers after one"] = len(_tasks() - before)
        files, writers = _pipe_files(1)
        waiting = engine.start_read([(files[0], 0, bytearray(5))])  # in flight: no data
        second = engine.start_read([(f, 4096, bytearray(4096))])
        seen["workers with two in flight"] = len(_tasks() - before)
        seen["second"] = second.wait()
        os.write(writers[0], b"later")
        seen["first"] = waiting.wait()
        os.close(files[0].fd)
        os.close(writers[0])
        f.close()

    thread = threading.Thread(target=reader)  # its own rings, gone with it
    thread.start()
    thread.join(20)
    assert seen == {"single": [4096], "workers after one": 0,
                    "workers with two in flight": 1, "second": [4096], "first": [5]}

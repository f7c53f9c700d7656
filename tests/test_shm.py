"""The DRAM segment on real /dev/shm, with real second processes.

``python -m tests.test_shm`` runs the copy and pre-fault measurements
(:func:`run_benchmark`); they are not tests.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import signal
import stat
import struct
import subprocess
import sys
import textwrap
import threading
import time
import uuid

import numpy as np
import pytest

from kvstored import shm as segment_module
from kvstored.shm import (
    DATA_OFFSET,
    FORMAT_VERSION,
    MAGIC,
    SHM_DIR,
    DramSegment,
    SegmentExistsError,
    SegmentMapping,
    SegmentUnavailable,
    copy_into,
    same_host_probe,
)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def name():
    """A unique segment name; whatever is left under it is removed afterwards."""
    value = f"kvstored-test-{os.getpid()}-{uuid.uuid4().hex[:10]}"
    yield value
    try:
        os.unlink(os.path.join(SHM_DIR, value))
    except FileNotFoundError:
        pass


def shm_path(name: str) -> str:
    return os.path.join(SHM_DIR, name)


def python(code: str, *args: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            **kwargs)


HOLDER = """
    import sys, time
    from kvstored.shm import DramSegment
    segment = DramSegment.create(sys.argv[1], 1 << 20, populate=False)
    segment.view(0, 5)[:] = b"stale"
    print(segment.token.hex(), flush=True)
    time.sleep(120)
"""


def start_holder(name: str) -> tuple[subprocess.Popen, bytes]:
    child = python(HOLDER, name)
    line = child.stdout.readline()
    assert line, child.stderr.read()
    return child, bytes.fromhex(line.strip())


# -- create ---------------------------------------------------------------------------------


@pytest.mark.parametrize("umask", [0o000, 0o277])
def test_create_is_mode_0600_whatever_the_umask_and_writes_its_header(name, umask):
    old = os.umask(umask)
    try:
        segment = DramSegment.create(name, 3 * 4096 + 100, populate=False)
    finally:
        os.umask(old)
    with segment:
        info = os.stat(shm_path(name))
        assert stat.S_IMODE(info.st_mode) == 0o600
        assert info.st_uid == os.getuid()
        assert info.st_size == DATA_OFFSET + 4 * 4096
        assert segment.data_size == 3 * 4096 + 100 and len(segment.token) == 16
        with open(shm_path(name), "rb") as f:
            header = f.read(56)
        magic, version, data_offset, data_size, pid, ticks, token = struct.unpack(
            "<8sIIQQQ16s", header)
        assert (magic, version, data_offset) == (MAGIC, FORMAT_VERSION, DATA_OFFSET)
        assert (data_size, pid, token) == (segment.data_size, os.getpid(), segment.token)
        assert ticks > 0
    assert not os.path.exists(shm_path(name))


def test_populate_reserves_the_memory_up_front(name):
    size = 16 << 20
    with DramSegment.create(name, size, populate=True):
        assert os.stat(shm_path(name)).st_blocks * 512 >= size
    with DramSegment.create(name, size, populate=False):
        assert os.stat(shm_path(name)).st_blocks * 512 < size // 4


def test_every_segment_gets_a_new_token(name):
    with DramSegment.create(name, 4096, populate=False) as first:
        token = first.token
    with DramSegment.create(name, 4096, populate=False) as second:
        assert second.token != token


def test_a_segment_larger_than_dev_shm_is_refused_and_leaves_nothing(name):
    room = os.statvfs(SHM_DIR)
    with pytest.raises(OSError) as caught:
        DramSegment.create(name, room.f_blocks * room.f_frsize + (1 << 30))
    assert caught.value.errno == errno.ENOSPC
    assert "shrink the DRAM tier" in str(caught.value)
    assert not os.path.exists(shm_path(name))


@pytest.mark.parametrize("bad", ["", "a/b", "../x", ".hidden", "x" * 201, "a b", 7])
def test_bad_names_are_refused(bad):
    with pytest.raises(ValueError, match="not a valid segment name"):
        DramSegment.create(bad, 4096)
    with pytest.raises(ValueError, match="not a valid segment name"):
        SegmentMapping.attach(bad, b"x" * 16)


@pytest.mark.parametrize("size", [0, -1, 1.5])
def test_bad_sizes_are_refused(name, size):
    with pytest.raises(ValueError, match="size"):
        DramSegment.create(name, size)
    assert not os.path.exists(shm_path(name))


# -- names already taken --------------------------------------------------------------------


def test_a_live_holder_in_another_process_is_not_replaced(name):
    child, token = start_holder(name)
    try:
        with pytest.raises(SegmentExistsError, match="in use by a running node"):
            DramSegment.create(name, 4096)
        assert same_host_probe(name, token)[0]
    finally:
        child.kill()
        child.wait()


def test_a_stale_segment_of_a_killed_node_is_replaced_and_logged(name, caplog):
    child, old_token = start_holder(name)
    child.send_signal(signal.SIGKILL)
    child.wait()
    # The killed node's segment is still there, but clients must not use it.
    assert os.path.exists(shm_path(name))
    with pytest.raises(SegmentUnavailable, match="is gone"):
        SegmentMapping.attach(name, old_token)
    with caplog.at_level(logging.WARNING, logger="kvstored.shm"):
        segment = DramSegment.create(name, 8192, populate=False)
    with segment:
        assert segment.token != old_token
        assert bytes(segment.view(0, 5)) == b"\0" * 5      # fresh memory, not the old
        assert any("stale" in r.getMessage() and str(child.pid) in r.getMessage()
                   for r in caplog.records)


def test_sweep_removes_only_segments_whose_creator_is_gone(name):
    from kvstored.shm import sweep_stale

    # Not under "kvstored-": every node starting beside this test (other workers) sweeps
    # those, and could take the dead segment first, leaving this sweep nothing to remove.
    prefix = f"kvsweep-test-{os.getpid()}-"
    name = prefix + name.rsplit("-", 1)[1]
    dead, _ = start_holder(name)
    dead.send_signal(signal.SIGKILL)
    dead.wait()
    alive, _ = start_holder(name + "-alive")
    try:
        removed = sweep_stale(prefix=prefix)
        assert name in removed and name + "-alive" not in removed
        assert not os.path.exists(shm_path(name))
        assert os.path.exists(shm_path(name + "-alive"))
    finally:
        alive.kill()
        alive.wait()
        for left in (name, name + "-alive"):
            if os.path.exists(shm_path(left)):
                os.unlink(shm_path(left))


def test_a_killed_node_not_yet_reaped_counts_as_gone(name):
    child, _ = start_holder(name)
    child.kill()
    try:
        deadline = time.monotonic() + 10
        while segment_module._start_ticks(child.pid) is not None:   # until it is a zombie
            assert time.monotonic() < deadline, "the killed holder never died"
            time.sleep(0.01)
        assert child.poll() is None or child.returncode == -signal.SIGKILL
        with DramSegment.create(name, 4096, populate=False):
            pass
    finally:
        child.wait()


FORKING_HOLDER = """
    import os, sys, time
    from kvstored.shm import DramSegment
    segment = DramSegment.create(sys.argv[1], 1 << 20, populate=False)
    if os.fork() == 0:          # the child inherits the open segment, and its lock
        time.sleep(120)
        os._exit(0)
    print(segment.token.hex(), flush=True)
    time.sleep(120)
"""


def test_a_dead_creators_segment_held_open_by_its_fork_is_not_replaced(name, monkeypatch):
    monkeypatch.setattr(segment_module, "STALE_LOCK_WAIT", 0.3)
    holder = python(FORKING_HOLDER, name, start_new_session=True)
    try:
        assert holder.stdout.readline(), holder.stderr.read()
        holder.kill()
        holder.wait()
        with pytest.raises(SegmentExistsError, match="still holds it open"):
            DramSegment.create(name, 4096, populate=False)
        assert os.path.exists(shm_path(name))
    finally:
        try:
            os.killpg(holder.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_the_same_live_process_cannot_create_a_name_twice(name):
    with DramSegment.create(name, 4096, populate=False), \
            pytest.raises(SegmentExistsError, match="in use"):
        DramSegment.create(name, 4096, populate=False)
    # Closed without unlinking: the lock is gone but the creator (us) still runs.
    DramSegment.create(name, 4096, populate=False).close(unlink=False)
    with pytest.raises(SegmentExistsError, match=f"process {os.getpid()}, which is still"):
        DramSegment.create(name, 4096, populate=False)


def write_header(name: str, pid: int, ticks: int) -> None:
    header = struct.pack("<8sIIQQQ16s", MAGIC, FORMAT_VERSION, DATA_OFFSET, 4096, pid,
                         ticks, b"t" * 16)
    with open(shm_path(name), "wb") as f:
        f.write(header.ljust(DATA_OFFSET + 4096, b"\0"))


def test_a_reused_pid_does_not_keep_a_stale_segment_alive(name):
    # Our own pid, but a different start time: the creator is another, dead process.
    write_header(name, os.getpid(), ticks=1)
    with DramSegment.create(name, 4096, populate=False) as segment:
        assert segment.token != b"t" * 16


def test_a_segment_of_a_reaped_process_is_stale(name):
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    write_header(name, child.pid, ticks=0)
    with DramSegment.create(name, 4096, populate=False) as segment:
        assert segment.token != b"t" * 16


def test_a_foreign_file_under_the_name_is_left_alone(name):
    with open(shm_path(name), "wb") as f:
        f.write(b"somebody else's data")
    with pytest.raises(SegmentExistsError, match="not a kvstored DRAM segment"):
        DramSegment.create(name, 4096)
    with open(shm_path(name), "rb") as f:
        assert f.read() == b"somebody else's data"
    assert same_host_probe(name, b"t" * 16) == (
        False, f"{shm_path(name)} is not a kvstored DRAM segment")


# -- views, close ---------------------------------------------------------------------------


def test_views_are_bounds_checked(name):
    with DramSegment.create(name, 10_000, populate=False) as segment:
        assert len(segment.view(0, 10_000)) == 10_000
        assert len(segment.view(10_000, 0)) == 0
        assert len(segment.view(9_999, 1)) == 1
        for offset, nbytes in ((-1, 1), (0, 10_001), (10_000, 1), (5, -1)):
            with pytest.raises(ValueError, match=rf"view\({offset}, {nbytes}\).*outside"):
                segment.view(offset, nbytes)
        with pytest.raises(TypeError):
            segment.view(0.0, 1)
        assert len(segment.view(np.int64(4), np.int64(4))) == 4
        view = segment.view(100, 4)
        view[:] = b"abcd"
        assert view.format == "B" and not view.readonly
        assert bytes(segment.view(98, 8)) == b"\0\0abcd\0\0"


def test_close_is_idempotent_unlinks_and_spares_live_views(name):
    segment = DramSegment.create(name, 8192, populate=False)
    view = segment.view(0, 4)
    segment.close()
    assert not os.path.exists(shm_path(name))
    segment.close()
    assert segment.closed
    with pytest.raises(ValueError, match="closed"):
        segment.view(0, 1)
    view[:] = b"live"               # the memory stays mapped while a view holds it
    assert bytes(view) == b"live"
    view.release()


def test_close_without_unlink_keeps_the_name(name):
    segment = DramSegment.create(name, 8192, populate=False)
    segment.close(unlink=False)
    segment.close(unlink=False)
    assert os.path.exists(shm_path(name))


def test_close_does_not_unlink_a_replacement(name):
    segment = DramSegment.create(name, 8192, populate=False)
    os.unlink(shm_path(name))
    write_header(name, 1, 0)        # someone else's file now holds the name
    segment.close()
    assert os.path.exists(shm_path(name))


# -- attach ---------------------------------------------------------------------------------


CLIENT = """
    import sys
    from kvstored.shm import SegmentMapping
    mapping = SegmentMapping.attach(sys.argv[1], bytes.fromhex(sys.argv[2]),
                                    populate=sys.argv[3] == "1")
    print(bytes(mapping.view(4096, 11)).decode(), mapping.data_size, flush=True)
    mapping.view(8192, 14)[:] = b"from the child"
    mapping.close()
    mapping.close()
"""


@pytest.mark.parametrize("populate", [False, True])
def test_a_second_process_sees_and_writes_the_same_memory(name, populate):
    with DramSegment.create(name, 1 << 20, populate=True) as segment:
        segment.view(4096, 11)[:] = b"from parent"
        child = python(CLIENT, name, segment.token.hex(), "1" if populate else "0")
        out, err = child.communicate(timeout=60)
        assert child.returncode == 0, err
        assert out.split() == ["from", "parent", str(1 << 20)]
        assert bytes(segment.view(8192, 14)) == b"from the child"


def test_attach_in_process_checks_the_token(name):
    with DramSegment.create(name, 1 << 16, populate=False) as segment:
        with SegmentMapping.attach(name, segment.token) as mapping:
            segment.view(0, 3)[:] = b"abc"
            assert bytes(mapping.view(0, 3)) == b"abc"
            assert mapping.token == segment.token
            with pytest.raises(ValueError, match="outside"):
                mapping.view(1, 1 << 16)
        assert mapping.closed
        wrong = bytes(16 - len(b"x")) + b"x"
        for token in (wrong, segment.token[:8], "not bytes"):
            with pytest.raises(SegmentUnavailable, match="token mismatch") as caught:
                SegmentMapping.attach(name, token)
            assert "restarted" in caught.value.reason
        assert same_host_probe(name, segment.token)[0]
        ok, reason = same_host_probe(name, wrong)
        assert not ok and "token mismatch" in reason
    ok, reason = same_host_probe(name, segment.token)
    assert not ok and "does not exist" in reason


def test_attach_refuses_other_format_versions(name):
    header = struct.pack("<8sIIQQQ16s", MAGIC, FORMAT_VERSION + 1, DATA_OFFSET, 4096,
                         os.getpid(), 0, b"t" * 16)
    with open(shm_path(name), "wb") as f:
        f.write(header.ljust(DATA_OFFSET + 4096, b"\0"))
    with pytest.raises(SegmentUnavailable, match="format version 2"):
        SegmentMapping.attach(name, b"t" * 16)


def test_attach_refuses_a_truncated_segment(name):
    write_header(name, os.getpid(), 0)
    os.truncate(shm_path(name), DATA_OFFSET + 100)
    with pytest.raises(SegmentUnavailable, match="holds 4196 bytes"):
        SegmentMapping.attach(name, b"t" * 16)


# -- copy_into ------------------------------------------------------------------------------


@pytest.mark.parametrize("nbytes", [0, 1, 4096, segment_module.GIL_RELEASE_THRESHOLD - 1,
                                    segment_module.GIL_RELEASE_THRESHOLD, 3 << 20])
def test_copy_into_copies_every_byte_from_any_buffer(name, nbytes):
    data = os.urandom(nbytes)
    with DramSegment.create(name, 4 << 20, populate=False) as segment:
        sources = [data, bytearray(data), memoryview(data),
                   np.frombuffer(data, dtype=np.uint8)]
        if nbytes % 4 == 0:
            sources.append(np.frombuffer(data, dtype=np.float32))
        for source in sources:
            dst = segment.view(4096, nbytes)
            dst[:] = b"\0" * nbytes
            copy_into(dst, source)
            assert bytes(dst) == data
        out = bytearray(nbytes)
        copy_into(memoryview(out), segment.view(4096, nbytes))
        assert out == data


def test_copy_into_refuses_mismatches(name):
    with DramSegment.create(name, 1 << 20, populate=False) as segment:
        with pytest.raises(ValueError, match="holds 10 bytes, the source 11"):
            copy_into(segment.view(0, 10), b"x" * 11)
        with pytest.raises(TypeError, match="read-only"):
            copy_into(memoryview(b"x" * 10), segment.view(0, 10))
        with pytest.raises(TypeError, match="C-contiguous"):
            copy_into(segment.view(0, 6), np.zeros((3, 4), dtype=np.uint8)[:, :2])


@pytest.mark.parametrize("nbytes", [1000, segment_module.GIL_RELEASE_THRESHOLD])
def test_copy_into_accepts_a_strided_byte_source(name, nbytes):
    data = os.urandom(2 * nbytes)
    with DramSegment.create(name, 1 << 20, populate=False) as segment:
        copy_into(segment.view(0, nbytes), memoryview(data)[::2])
        assert bytes(segment.view(0, nbytes)) == data[::2]


def test_large_copies_release_the_gil(name):
    # While one thread copies, another must make progress: numpy.copyto drops the GIL.
    with DramSegment.create(name, 64 << 20, populate=True) as segment:
        source = np.ones(64 << 20, dtype=np.uint8)
        dst = segment.view(0, 64 << 20)
        done = threading.Event()
        ticks = []

        def copier():
            for _ in range(10):
                copy_into(dst, source)
            done.set()

        thread = threading.Thread(target=copier)
        old_interval = sys.getswitchinterval()
        sys.setswitchinterval(10.0)      # a GIL-holding copier would starve us for 10 s
        try:
            thread.start()
            while not done.is_set():
                ticks.append(time.perf_counter())
                time.sleep(0)
        finally:
            sys.setswitchinterval(old_interval)
            thread.join()
        assert len(ticks) > 10
        dst.release()


# -- measurements (run by hand; not tests) ----------------------------------------------------


def _rate(fn, nbytes: int, repeat: int) -> float:
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        for i in range(repeat):
            fn(i)
        best = min(best, (time.perf_counter() - started) / repeat)
    return round(nbytes / best / 1e9, 2)


def _first_copy_gbps(view: memoryview, source_np) -> float:
    """GB/s of copying ``source_np`` (64 MiB) over the whole of ``view``, once."""
    dst = np.frombuffer(view, dtype=np.uint8)
    started = time.perf_counter()
    for offset in range(0, len(dst), 64 << 20):
        np.copyto(dst[offset:offset + (64 << 20)], source_np)
    return round(len(dst) / (time.perf_counter() - started) / 1e9, 2)


def run_benchmark(segment_size: int = 1 << 30) -> dict:
    """Copy rates into a pre-faulted segment, and what pre-faulting costs and buys.

    Copies cycle through the whole segment (destinations are not cache-hot), from a
    64 MiB source that is. Best of 5 runs, GB/s.
    """
    name = f"kvstored-bench-{os.getpid()}"
    results: dict = {"copy_gbps": {}, "prefault": {}}
    source = bytearray(os.urandom(1 << 20)) * 64
    source_np = np.frombuffer(source, dtype=np.uint8)
    for populate in (False, True):
        started = time.perf_counter()
        segment = DramSegment.create(name, segment_size, populate=populate)
        created = time.perf_counter() - started
        first_gbps = _first_copy_gbps(segment.view(0, segment_size), source_np)
        attach = {}
        for attach_populate in (False, True):
            started = time.perf_counter()
            mapping = SegmentMapping.attach(name, segment.token, populate=attach_populate)
            attached = time.perf_counter() - started
            copy_gbps = _first_copy_gbps(mapping.view(0, segment_size), source_np)
            mapping.close()
            attach[f"attach_populate_{attach_populate}"] = {
                "attach_seconds": round(attached, 3), "first_copy_gbps": copy_gbps}
        results["prefault"][f"create_populate_{populate}"] = {
            "create_seconds": round(created, 3),
            "first_copy_gbps": first_gbps, **attach}
        if populate:
            break
        segment.close()
    with segment:
        whole = segment.view(0, segment_size)
        whole_np = np.frombuffer(whole, dtype=np.uint8)
        for nbytes in (64 << 10, 1 << 20, 64 << 20):
            slots = segment_size // nbytes
            repeat = max(3, (256 << 20) // nbytes)
            src, src_np = memoryview(source)[:nbytes], source_np[:nbytes]

            def slice_assign(i, nbytes=nbytes, slots=slots, src=src):
                offset = i % slots * nbytes
                whole[offset:offset + nbytes] = src

            def numpy_copyto(i, nbytes=nbytes, slots=slots, src=src):
                offset = i % slots * nbytes
                np.copyto(np.frombuffer(whole[offset:offset + nbytes], dtype=np.uint8),
                          np.frombuffer(src, dtype=np.uint8))

            def numpy_copyto_prebuilt(i, nbytes=nbytes, slots=slots, src_np=src_np,
                                      whole_np=whole_np):
                offset = i % slots * nbytes
                np.copyto(whole_np[offset:offset + nbytes], src_np)

            def helper(i, nbytes=nbytes, slots=slots, src=src):
                offset = i % slots * nbytes
                copy_into(segment.view(offset, nbytes), src)

            def bytes_of_view(i, nbytes=nbytes, slots=slots):
                offset = i % slots * nbytes
                bytes(whole[offset:offset + nbytes])

            results["copy_gbps"][f"{nbytes >> 10}KiB"] = {
                fn.__name__: _rate(fn, nbytes, repeat)
                for fn in (slice_assign, numpy_copyto, numpy_copyto_prebuilt, helper,
                           bytes_of_view)}
        del whole_np
        whole.release()
    return results


if __name__ == "__main__":
    size = int(sys.argv[1]) if len(sys.argv) > 1 else 1 << 30
    print(json.dumps(run_benchmark(size), indent=2))

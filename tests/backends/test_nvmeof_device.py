"""nvmeof on real block devices (loop devices) and files: size detection, O_DIRECT and
O_EXCL, what may be formatted, the directory-to-volume binding, crashes."""

from __future__ import annotations

import os

import pytest

from kvstored.backends.nvmeof.device import device_size, is_block_device
from kvstored.sdk.errors import BackendBusyError, CorruptionError, InvalidRequestError
from kvstored.sdk.registry import open_backend
from kvstored.sdk.testing import flip_byte, payload
from kvstored.sdk.types import WriteOutcome
from tests.backends.conftest import kill_9_after_ack
from tests.backends.test_nvmeof_conformance import LOOP_IMAGE_SIZE, attach_loop, detach_loop

MiB = 1 << 20


@pytest.fixture
def loops(tmp_path):
    """Attach loop devices on demand; all are detached at the end."""
    attached: list[str] = []

    def attach() -> str:
        device = attach_loop(tmp_path / f"loop{len(attached)}.img")
        attached.append(device)
        return device

    yield attach
    for device in attached:
        detach_loop(device)


def write_all(backend, items) -> None:
    assert all(r.outcome is WriteOutcome.WRITTEN for r in backend.batch_write(items))


def test_device_size_and_defaults(loops):
    device = loops()
    assert is_block_device(device)
    fd = os.open(device, os.O_RDONLY)
    try:
        assert device_size(fd) == LOOP_IMAGE_SIZE == os.lseek(fd, 0, os.SEEK_END)
    finally:
        os.close(fd)
    backend = open_backend("nvmeof", device, engine="posix")
    try:
        assert backend.volume_file.direct, "O_DIRECT is the default on block devices"
        assert backend.usage().capacity_bytes == LOOP_IMAGE_SIZE
        write_all(backend, [("k", payload("k", 12_345))])
        where = backend.locate("k")
        assert where.device and where.path == device and where.offset % 4096 == 0
        assert backend.read("k") == payload("k", 12_345)
    finally:
        backend.close()


def test_capacity_may_use_part_of_the_device_not_more(loops):
    device = loops()
    with pytest.raises(InvalidRequestError, match="exceeds"):
        open_backend("nvmeof", device, capacity=2 * LOOP_IMAGE_SIZE)
    backend = open_backend("nvmeof", device, capacity=32 * MiB)
    assert backend.usage().capacity_bytes == 32 * MiB
    backend.close()
    open_backend("nvmeof", device).close()  # no capacity: as formatted


def test_device_in_use_is_refused(loops, monkeypatch):
    import kvstored.backends.nvmeof.backend as nvmeof

    monkeypatch.setattr(nvmeof, "BUSY_WAIT", 0.1)
    device = loops()
    backend = open_backend("nvmeof", device)
    try:
        with pytest.raises(BackendBusyError, match="in use") as refused:
            open_backend("nvmeof", device)
        assert "this process" in str(refused.value) or refused.value.holder is None
    finally:
        backend.close()


def test_a_device_released_while_waiting_is_opened(loops, monkeypatch, caplog):
    """A device still held when we open it (its previous user exiting, the kernel's
    deferred release) is waited for, with one log line, and then opened."""
    import threading

    import kvstored.backends.nvmeof.backend as nvmeof

    monkeypatch.setattr(nvmeof, "BUSY_NOTICE", 0.05)
    device = loops()
    holder = os.open(device, os.O_RDWR | os.O_EXCL)
    releaser = threading.Timer(0.5, os.close, [holder])
    releaser.start()
    try:
        with caplog.at_level("WARNING", logger="kvstored.backends.nvmeof"):
            backend = open_backend("nvmeof", device)
        backend.close()
    finally:
        releaser.join()
    waits = [r for r in caplog.records if "is busy" in r.getMessage()]
    assert len(waits) == 1, caplog.text


def test_foreign_data_is_not_formatted_without_consent(loops):
    device = loops()
    fd = os.open(device, os.O_WRONLY)
    try:  # something that looks like a file system's superblock
        os.pwrite(fd, b"\x53\xef" + os.urandom(510), 1024 + 56)
        os.fsync(fd)
    finally:
        os.close(fd)
    with pytest.raises(InvalidRequestError, match="wipefs"):
        open_backend("nvmeof", device)
    backend = open_backend("nvmeof", device, format=True)
    write_all(backend, [("mine", b"now")])
    backend.close()


def test_a_kvstored_volume_is_never_reformatted(loops):
    device = loops()
    backend = open_backend("nvmeof", device)
    write_all(backend, [("keep", b"me")])
    backend.close()
    flip_byte(device, 40)  # damage the superblock, magic intact
    with pytest.raises(CorruptionError, match="superblock"):
        open_backend("nvmeof", device, format=True)


def test_directory_is_bound_to_its_volume(loops, tmp_path):
    first, second = loops(), loops()
    store = tmp_path / "node-ssd"
    backend = open_backend("nvmeof", store, device=first)
    write_all(backend, [("a", b"1")])
    backend.close()
    open_backend("nvmeof", tmp_path / "other", device=second).close()  # a second volume
    with pytest.raises(InvalidRequestError, match="holds volume"):
        open_backend("nvmeof", store, device=second)
    backend = open_backend("nvmeof", store, device=first)
    assert backend.read("a") == b"1"
    backend.close()


def test_naming_mistakes_get_clear_errors(tmp_path):
    folder = tmp_path / "dir"
    folder.mkdir()
    with pytest.raises(InvalidRequestError, match="device option"):
        open_backend("nvmeof", folder)
    with pytest.raises(InvalidRequestError, match="nvme connect"):
        open_backend("nvmeof", tmp_path / "store", device=str(tmp_path / "no-such-device"))


def test_earlier_format_of_the_same_file_is_never_read(tmp_path):
    """Reformatting gives a new uuid: the old checkpoints, journal entries and records,
    all still on disk, are ignored."""
    path = tmp_path / "volume"
    backend = open_backend("nvmeof", path, capacity=16 * MiB)
    write_all(backend, [(f"old{i}", payload(f"old{i}", 9000)) for i in range(20)])
    backend.batch_delete(["old3"])
    backend.close()
    with open(path, "r+b") as f:
        f.write(bytes(4096))  # lose the superblock
    with pytest.raises(CorruptionError, match=r"superblock does not check.*format=true"):
        open_backend("nvmeof", path)
    backend = open_backend("nvmeof", path, format=True)
    assert backend.usage().objects == 0 and not list(backend.scan())
    write_all(backend, [("new", b"fresh")])
    backend.close()
    backend = open_backend("nvmeof", path)
    assert [r.key for r in backend.scan()] == ["new"]
    backend.close()


WRITER = """
import sys
from kvstored.sdk.registry import open_backend
backend = open_backend("nvmeof", sys.argv[1], engine=sys.argv[2], checkpoint_bytes=1 << 40)
backend.batch_write([(f"k{i}", bytes([i]) * (3000 + i)) for i in range(40)])
backend.batch_delete(["k7", "k8"])
print("ACK", flush=True)
sys.stdin.read()
"""


def test_kill_9_on_a_device(loops, engine):
    device = loops()
    kill_9_after_ack(WRITER, device, engine)
    backend = open_backend("nvmeof", device, engine=engine)
    try:
        for i in range(40):
            expected = None if i in (7, 8) else bytes([i]) * (3000 + i)
            assert backend.read(f"k{i}") == expected
        assert not backend.check().problems
    finally:
        backend.close()


def test_quarantine_of_a_bare_device_goes_where_asked(loops, tmp_path):
    device = loops()
    backend = open_backend("nvmeof", device, quarantine_dir=str(tmp_path / "q"))
    write_all(backend, [("bad", payload("bad", 5000)), ("good", b"fine")])
    where = backend.locate("bad")
    flip_byte(device, where.offset + 1)
    report = backend.check(repair=True)
    assert [p.key for p in report.problems] == ["bad"] and report.ok
    assert len(list((tmp_path / "q").glob("*.kvr"))) == 1
    assert backend.read("good") == b"fine" and not backend.contains("bad")
    backend.close()

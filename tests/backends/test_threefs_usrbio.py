"""USRBIO detection and fallback, and the USRBIO engine over a test double of 3FS's API.

3FS cannot run here. Detection is tested for every way it can decide (module missing,
module incomplete, path not on a 3FS mount, ring creation failing, success, and the three
modes). The engine and the whole backend are then run against ``usrbio_double``, a double
of ``hf3fs_fuse.io`` that follows 3FS's documented API (see its README): that checks our
bookkeeping, not 3FS.
"""

from __future__ import annotations

import errno
import importlib
import os
import sys
import types
from functools import partial
from pathlib import Path

import pytest

from kvstored.backends.threefs.usrbio import UsrbioEngine, choose_usrbio
from kvstored.native import IoError
from kvstored.sdk.errors import InvalidRequestError
from kvstored.sdk.registry import open_backend
from kvstored.sdk.testing import BackendConformance
from tests.conftest import run_threads

DOUBLE = Path(__file__).parent / "usrbio_double"


@pytest.fixture
def double(monkeypatch, tmp_path):
    """Make the double importable as ``hf3fs_fuse.io`` with ``tmp_path`` as a 3FS mount."""
    monkeypatch.syspath_prepend(str(DOUBLE))
    monkeypatch.setenv("HF3FS_DOUBLE_MOUNTS", str(tmp_path))
    for name in ("hf3fs_fuse", "hf3fs_fuse.io"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    module = importlib.import_module("hf3fs_fuse.io")
    monkeypatch.setattr(module, "fail_ring", None)
    yield module
    for name in ("hf3fs_fuse", "hf3fs_fuse.io"):
        sys.modules.pop(name, None)


def _missing(name: str):
    raise ImportError(f"No module named {name!r}")


# -- detection ---------------------------------------------------------------------------


def test_module_missing_falls_back_and_says_why(tmp_path):
    choice = choose_usrbio(str(tmp_path), "auto", importer=_missing)
    assert choice.engine is None
    assert "hf3fs_fuse.io is not importable" in choice.reason
    assert "falling back to POSIX" in choice.reason


def test_module_missing_with_usrbio_on_is_an_error(tmp_path):
    with pytest.raises(InvalidRequestError, match=r"usrbio=on.*not importable"):
        choose_usrbio(str(tmp_path), "on", importer=_missing)


def test_off_never_imports(tmp_path):
    def refuse(name):
        raise AssertionError("usrbio=off must not import anything")

    choice = choose_usrbio(str(tmp_path), "off", importer=refuse)
    assert choice.engine is None and "usrbio=off" in choice.reason


def test_unknown_mode_is_refused(tmp_path):
    with pytest.raises(InvalidRequestError, match="auto, on, off"):
        choose_usrbio(str(tmp_path), "maybe")


def test_incomplete_module_falls_back(tmp_path):
    partial = types.ModuleType("hf3fs_fuse.io")
    partial.extract_mount_point = lambda path: str(tmp_path)
    choice = choose_usrbio(str(tmp_path), "auto", importer=lambda name: partial)
    assert choice.engine is None
    assert "lacks make_iovec, make_ioring, register_fd, deregister_fd" in choice.reason


def test_path_outside_3fs_falls_back(double, tmp_path, monkeypatch):
    monkeypatch.setenv("HF3FS_DOUBLE_MOUNTS", str(tmp_path / "elsewhere"))
    choice = choose_usrbio(str(tmp_path / "store"), "auto")
    assert choice.engine is None and "is not on a 3FS mount" in choice.reason
    with pytest.raises(InvalidRequestError, match="not on a 3FS mount"):
        choose_usrbio(str(tmp_path / "store"), "on")


def test_ring_failure_falls_back(double, tmp_path):
    double.fail_ring = OSError(errno.ENOMEM, "no shared memory for the ring")
    choice = choose_usrbio(str(tmp_path / "store"), "auto", staging_bytes=1 << 20)
    assert choice.engine is None
    assert "creating a USRBIO ring and iovec" in choice.reason and "shared memory" in choice.reason
    with pytest.raises(InvalidRequestError, match="creating a USRBIO ring"):
        choose_usrbio(str(tmp_path / "store"), "on", staging_bytes=1 << 20)


def test_detected_when_everything_is_there(double, tmp_path):
    choice = choose_usrbio(str(tmp_path / "store"), "auto", staging_bytes=1 << 20)
    assert isinstance(choice.engine, UsrbioEngine)
    assert choice.mount_point == str(tmp_path)
    assert "using USRBIO" in choice.reason


def test_backend_reports_its_io_path(double, tmp_path):
    with open_backend("3fs", tmp_path / "store", usrbio="auto") as backend:
        assert backend.io.name == "usrbio" and "using USRBIO" in backend.io_path
    with open_backend("3fs", tmp_path / "store", usrbio="off", engine="posix") as backend:
        assert backend.io.name == "posix" and "usrbio=off" in backend.io_path


def test_backend_without_3fs_uses_the_engine(tmp_path):
    with open_backend("3fs", tmp_path / "store", engine="posix") as backend:
        assert backend.io.name == "posix"
        assert "not importable" in backend.io_path


# -- the engine over the double ----------------------------------------------------------


def _engine(double, tmp_path, **options) -> UsrbioEngine:
    return UsrbioEngine(double, str(tmp_path), **options)


def test_engine_splits_items_larger_than_staging(double, tmp_path):
    engine = _engine(double, tmp_path, queue_depth=3, staging_bytes=64 << 10)
    data = [os.urandom(n) for n in (200_000, 1, 70_000, 0, 65_536, 5)]
    with engine.open(tmp_path / "f", os.O_RDWR | os.O_CREAT) as f:
        offsets, at = [], 0
        for chunk in data:
            offsets.append(at)
            at += len(chunk) + 100
        written = engine.write([(f, o, d) for o, d in zip(offsets, data)])
        assert written == [len(d) for d in data]
        assert engine.fsync([f]) == [0]
        buffers = [bytearray(len(d)) for d in data]
        assert engine.read([(f, o, b) for o, b in zip(offsets, buffers)]) == [len(d) for d in data]
        assert [bytes(b) for b in buffers] == data


def test_engine_short_read_at_end_of_file(double, tmp_path):
    engine = _engine(double, tmp_path, staging_bytes=64 << 10)
    with engine.open(tmp_path / "f", os.O_RDWR | os.O_CREAT) as f:
        engine.write([(f, 0, b"x" * 100_000)])
        buf = bytearray(50_000)
        assert engine.read([(f, 80_000, buf)]) == [20_000]
        assert bytes(buf[:20_000]) == b"x" * 20_000


def test_engine_fd_registration_and_errors(double, tmp_path):
    engine = _engine(double, tmp_path, staging_bytes=64 << 10)
    f = engine.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    assert f.fd in double.registered
    foreign = os.open(tmp_path / "g", os.O_RDWR | os.O_CREAT)
    try:
        from kvstored.native import IoFile

        unregistered = IoFile(foreign, str(tmp_path / "g"))
        results = engine.write([(f, 0, b"ok"), (unregistered, 0, b"no")])
        assert results[0] == 2
        assert isinstance(results[1], IoError) and results[1].errno == errno.EBADF
        unregistered.fd = -1  # the test closes the descriptor itself
    finally:
        os.close(foreign)
    fd = f.fd
    f.close()
    assert fd not in double.registered, "closing must deregister (3FS requires it)"


def test_engine_rings_are_per_thread(double, tmp_path):
    engine = _engine(double, tmp_path, queue_depth=4, staging_bytes=64 << 10)
    with engine.open(tmp_path / "f", os.O_RDWR | os.O_CREAT) as f:
        engine.write([(f, 0, bytes(8 * 4096))])

        def work(n: int) -> None:
            for _ in range(20):
                data = bytes([n]) * 4096
                assert engine.write([(f, n * 4096, data)]) == [4096]
                buf = bytearray(4096)
                assert engine.read([(f, n * 4096, buf)]) == [4096]
                assert buf == data

        errors = run_threads(partial(work, n) for n in range(8))
    assert not errors, errors[:3]


def test_backend_over_the_double_shares_with_a_posix_node(double, tmp_path):
    """A node on USRBIO and a node on POSIX read each other's records."""
    store = tmp_path / "store"
    with open_backend("3fs", store, node_id="u", usrbio="on") as fast, \
            open_backend("3fs", store, node_id="p", usrbio="off", engine="posix") as plain:
        assert fast.io.name == "usrbio" and plain.io.name == "posix"
        fast.batch_write([("from-u", os.urandom(300_000))])
        plain.batch_write([("from-p", b"p" * 5000)])
        assert plain.read("from-u") == fast.read("from-u")
        assert fast.read("from-p") == b"p" * 5000


class TestThreeFsUsrbioDouble(BackendConformance):
    """The whole kit with data I/O through the USRBIO adapter (over the double)."""

    backend = "3fs"
    options = {"usrbio": "on"}

    @pytest.fixture(autouse=True)
    def _double(self, double) -> None:
        pass

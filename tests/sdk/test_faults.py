"""Fault injection: the power-loss file system fails chosen operations with EIO or
ENOSPC, both io engines see the error (posix and io_uring, O_DIRECT too), and the kit's
fault checks catch backends that mishandle it (tests/sdk/fault_broken_backends.py)."""

from __future__ import annotations

import errno
import os

import pytest

from kvstored.native import get_engine
from kvstored.native.errors import IoError
from kvstored.sdk.testing import run_kit
from kvstored.sdk.testing.powerfs import PAGE
from kvstored.sdk.testing.powerloss import PowerFsError
from tests.sdk.conftest import passed_by_broken, require_engine, require_fuse

MODULE = "tests.sdk.fault_broken_backends"
FAULT_CHECKS = {"faults_eio_per_item", "faults_enospc_per_item"}


def test_a_fault_fails_the_named_operations_until_healed(mount):
    root = mount.mountpoint
    (root / "kept").write_bytes(b"before")
    mount.fail({"write"}, errno.ENOSPC)
    with pytest.raises(OSError) as caught:
        (root / "kept").write_bytes(b"during")
    assert caught.value.errno == errno.ENOSPC
    assert (root / "kept").read_bytes() == b"", "the open truncated; the write changed nothing"
    (root / "created").touch()  # create is not named: it works
    mount.heal()
    (root / "kept").write_bytes(b"after")
    assert (root / "kept").read_bytes() == b"after"
    assert mount.stats()["faults"] == 1


def test_a_counted_fault_stops_by_itself(mount):
    root = mount.mountpoint
    mount.fail({"create", "mkdir"}, errno.EIO, count=2)
    for name in ("a", "b"):
        with pytest.raises(OSError) as caught:
            os.mkdir(root / name)
        assert caught.value.errno == errno.EIO
    os.mkdir(root / "c")
    assert sorted(os.listdir(root)) == ["c"]


def test_an_unknown_operation_is_refused(mount):
    with pytest.raises(PowerFsError, match="cannot inject"):
        mount.fail({"read"}, errno.EIO)
    (mount.mountpoint / "still-mounted").touch()


@pytest.mark.parametrize("kind,direct", [("posix", False), ("posix", True),
                                         ("uring", False), ("uring", True)])
@pytest.mark.parametrize("code", [errno.EIO, errno.ENOSPC])
def test_both_engines_return_the_fault_per_item(mount, kind, direct, code):
    """The file system's error reaches a backend through either engine as the item's
    IoError (never raised), for writes and flushes alike; the other items are unharmed."""
    require_engine(kind)
    engine = get_engine(kind, direct=direct)
    files = [engine.open(mount.mountpoint / name, os.O_RDWR | os.O_CREAT)
             for name in ("a", "b")]
    try:
        assert all(f.direct == direct for f in files)
        mount.fail({"write"}, code, count=1)
        results = engine.write([(files[0], 0, b"x" * PAGE), (files[1], 0, b"y" * PAGE)])
        failed = [r for r in results if isinstance(r, IoError)]
        assert len(failed) == 1 and failed[0].errno == code and failed[0].op == "write", \
            results
        assert PAGE in results
        mount.fail({"fsync"}, code)
        synced = engine.fsync(files)
        assert all(isinstance(r, IoError) and r.errno == code for r in synced), synced
        mount.heal()
        assert engine.fsync(files) == [0, 0]
    finally:
        for f in files:
            f.close()


CASES = {
    "IgnoresFsyncErrors": ({}, FAULT_CHECKS),
    "RaisesWriteErrors": ({}, FAULT_CHECKS),
    "ENOSPCAsIOError": ({}, {"faults_enospc_per_item"}),
    "EvictsSilentlyWhenFull": ({}, {"faults_enospc_per_item"}),
    "LeavesFailedObjects": ({}, FAULT_CHECKS),
    "IgnoresFlushErrors": ({"engine": "posix"}, FAULT_CHECKS),
    "IgnoresFlushErrors-uring-direct": ({"engine": "uring", "direct": True}, FAULT_CHECKS),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_fault_checks_catch(case, tmp_path):
    passed = passed_by_broken(MODULE, case, *CASES[case], tmp_path)
    assert not passed, f"the fault checks let {case} pass {passed}"


@pytest.mark.parametrize("options", [{}, {"engine": "uring", "direct": True}])
def test_honest_built_ins_pass(options, tmp_path):
    require_fuse()
    require_engine(options.get("engine"))
    for name in (["file-per-key"] if not options else []) + ["bucket", "offset"]:
        outcomes = run_kit(name, options, directory=tmp_path, names=FAULT_CHECKS)
        assert {o.name for o in outcomes} == FAULT_CHECKS
        failed = [(o.name, o.error) for o in outcomes if not o.passed or o.not_applicable]
        assert not failed, (name, options, failed)


def test_not_persistent_is_not_applicable(tmp_path):
    require_fuse()
    outcomes = run_kit("tests.sdk.power_broken_backends:NotPersistent", directory=tmp_path,
                       names=FAULT_CHECKS)
    assert {o.name for o in outcomes} == FAULT_CHECKS
    for outcome in outcomes:
        assert outcome.not_applicable and "not persistent" in outcome.not_applicable, outcome


def test_a_block_device_outside_the_mount_is_not_applicable(tmp_path):
    """nvmeof on a loop device writes to the device, not through the file system the
    faults are injected into: the checks say so, naming the device, rather than pass."""
    from tests.backends.test_nvmeof_conformance import loop_attached

    require_fuse()
    with loop_attached(tmp_path / "loop.img") as device:
        [outcome] = run_kit("nvmeof", {"engine": "posix", "device": device},
                            directory=tmp_path, names={"faults_eio_per_item"})
    assert outcome.not_applicable and device in outcome.not_applicable, outcome

"""Conformance checks: Fault injection: EIO and ENOSPC from the file system under the store.

These run the backend in the kit's process on the power-loss file system
(:mod:`kvstored.sdk.testing.powerfs`, whose server is a process of its own) and make one
kind of operation fail for a while: every ``write``, then every ``fdatasync`` (the flush
of data files a backend may sync apart from its index), then every file
``fsync``/``fdatasync``, then every directory ``fsync``, then every ``create``/``mkdir``,
each with EIO (and, in the sibling check, ENOSPC). The fault is seen at the VFS, so it
reaches a backend through either io engine (POSIX or io_uring, O_DIRECT or not) exactly
as a failing disk would.

While a fault lasts, every item of ``batch_write`` must be reported, not raised: FAILED
with the documented error (:func:`kvstored.sdk.errors.from_oserror`: EIO is a
:class:`~kvstored.sdk.BackendIOError` carrying ``errno.EIO``, ENOSPC a
:class:`~kvstored.sdk.CapacityError`), or WRITTEN only where it can have become durable
(no item can while every write fails, nor while every sync fails unless the backend
writes through O_SYNC/O_DSYNC descriptors). Objects acknowledged before the fault read
back byte for byte during it and after it (unless the backend evicted them and said so
through ``on_evict``). Once the fault clears, the failed keys write again, and after a
reopen everything acknowledged is there and nothing reported failed is.

A backend that is not persistent gets them as not applicable, as does one whose data
does not go through the file system (a block device elsewhere: the files it opened
outside the mount are named), and a machine without FUSE (unless ``KVSTORED_REQUIRE``
names ``fuse``).
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass, field

from kvstored.sdk.backend import StorageBackend
from kvstored.sdk.errors import BackendError, BackendIOError, CapacityError
from kvstored.sdk.testing.checks._common import Clause, KiB, check, describe, make_items
from kvstored.sdk.testing.checks.power import POWER_CAPACITY, power_loss_mount
from kvstored.sdk.testing.kit import BackendSpec, Kit, NotApplicable, Requirement
from kvstored.sdk.testing.powerloss import PowerLossMount
from kvstored.sdk.types import ReadStatus, WriteOutcome, WriteResult

#: The phases of a fault check: what fails, in order, and whether an item may still be
#: WRITTEN while it does (None: only through O_SYNC/O_DSYNC descriptors).
PHASES: tuple[tuple[str, frozenset[str], bool | None], ...] = (
    ("write", frozenset({"write"}), False),
    ("fdatasync", frozenset({"fdatasync"}), None),
    ("fsync", frozenset({"fsync"}), None),
    # a new file's name needs its directory synced, but an item written into a file
    # that exists needs no directory sync: here an item may be WRITTEN
    ("fsyncdir", frozenset({"fsyncdir"}), True),
    ("create", frozenset({"create", "mkdir"}), True),
)
#: Objects per batch, and the largest value (small: FUSE is slow, and the cap is small).
BATCH = 6
SIZE_LIMIT = 48 * KiB


@dataclass
class FaultRun:
    """The backend open on the mount, and what it acknowledged and evicted."""

    mount: PowerLossMount
    spec: BackendSpec
    errno_code: int
    acked: dict[str, bytes] = field(default_factory=dict)
    failed: dict[str, bytes] = field(default_factory=dict)
    evicted: set[str] = field(default_factory=set)
    backend: StorageBackend | None = None

    @property
    def store(self):
        return self.mount.mountpoint / "store"

    def open(self) -> StorageBackend:
        self.backend = self.spec.open(self.store, on_evict=self.evicted.update)
        return self.backend

    def close(self) -> None:
        backend, self.backend = self.backend, None
        if backend is not None:
            backend.close()


def _documented(code: int, error: BackendError | None) -> bool:
    if code == errno.ENOSPC:
        return isinstance(error, CapacityError)
    return isinstance(error, BackendIOError) and error.errno == code


def _kind(code: int) -> str:
    return ("CapacityError" if code == errno.ENOSPC
            else f"BackendIOError with errno {errno.errorcode[code]}")


def _write(run: FaultRun, items: list[tuple[str, bytes]], when: str) -> list[WriteResult]:
    assert run.backend is not None
    try:
        results = run.backend.batch_write(items)
    except (BackendError, OSError) as exc:
        raise AssertionError(f"batch_write raised {type(exc).__name__} ({exc}) {when}: "
                             f"per-item failures must be reported in the results") from None
    assert len(results) == len(items), f"batch_write returned {len(results)} results " \
                                       f"for {len(items)} items {when}"
    return results


def _acked_read_back(kit: Kit, run: FaultRun, when: str) -> None:
    assert run.backend is not None
    lost = []
    for key, value in run.acked.items():
        if key in run.evicted:
            continue
        got = kit.read(run.backend, key)
        if got != value:
            lost.append(f"{key} ({describe(got)})")
    assert not lost, f"{len(lost)} object(s) acknowledged before the fault no longer read " \
                     f"back {when}: {lost[:3]} (none was reported to on_evict)"


def _fault_phase(kit: Kit, run: FaultRun, phase: str, operations: frozenset[str],
                 may_write: bool | None, name: str) -> int:
    """One phase: ``operations`` fail with the run's errno while a batch is written;
    returns how many operations the fault failed."""
    code = run.errno_code
    when = f"while every {'/'.join(sorted(operations))} failed with " \
           f"{errno.errorcode[code]}"
    items = make_items(f"{name}/{phase}", BATCH, SIZE_LIMIT)
    before = run.mount.fail(operations, code)
    try:
        results = _write(run, items, when)
        after = run.mount.stats()
        _acked_read_back(kit, run, when)
    finally:
        run.mount.heal()
    faults = after["faults"] - before["faults"]
    if may_write is None:
        may_write = after["sync_opens"] > 0
    if not faults:
        may_write = True  # the backend never needed the operation for this batch
    assert run.backend is not None
    wrong, lies = [], []
    for (key, value), result in zip(items, results):
        if result.outcome is WriteOutcome.WRITTEN:
            if not may_write:
                lies.append(key)
            run.acked[key] = value
        elif result.outcome is WriteOutcome.FAILED:
            if not _documented(code, result.error):
                wrong.append(f"{key}: {type(result.error).__name__} ({result.error})")
            run.failed[key] = value
            if run.backend.contains(key) or not isinstance(kit.read(run.backend, key),
                                                           ReadStatus):
                lies.append(f"{key} (reported FAILED, yet visible)")
        else:
            wrong.append(f"{key}: {result.outcome.name} for a key never written")
    assert not lies, f"{len(lies)} item(s) reported WRITTEN (or visible) {when}, which " \
                     f"cannot be durable: {lies[:3]}"
    assert not wrong, f"{len(wrong)} item(s) did not get the documented per-item error " \
                      f"({_kind(code)}) {when}: {wrong[:3]}"
    return faults


def _outside(mountpoint) -> set[str]:
    """Block devices and regular files this process holds open outside ``mountpoint``."""
    found = set()
    inside = str(mountpoint) + os.sep
    for name in os.listdir("/proc/self/fd"):
        link = os.path.join("/proc/self/fd", name)
        try:
            target = os.readlink(link)
            mode = os.stat(link).st_mode
        except OSError:
            continue
        if target.startswith("/") and not target.startswith(inside) and (
                stat.S_ISBLK(mode) or stat.S_ISREG(mode)):
            found.add(target)
    return found


def run_faults(kit: Kit, code: int) -> None:
    """The whole fault check for errno ``code`` (see the module docstring)."""
    name = f"fault-{errno.errorcode[code].lower()}"
    spec = BackendSpec(kit.spec.target, {"capacity": POWER_CAPACITY, **kit.spec.options},
                       kit.spec.factory)
    with power_loss_mount(kit) as mount:
        run = FaultRun(mount, spec, code)
        held = _outside(mount.mountpoint)
        try:
            backend = run.open()
            if not backend.capabilities.persistent:
                raise NotApplicable("the backend is not persistent (capabilities.persistent "
                                    "is False), so no write of it can fail on a disk")
            foreign = sorted(_outside(mount.mountpoint) - held)
            before = mount.stats()
            items = make_items(f"{name}/before", BATCH, SIZE_LIMIT)
            for (key, value), result in zip(items, _write(run, items, "before the fault")):
                assert result.outcome is WriteOutcome.WRITTEN, \
                    f"a write before any fault failed: {result}"
                run.acked[key] = value
            if mount.stats()["writes"] == before["writes"]:
                if foreign:
                    raise NotApplicable(
                        f"the backend keeps its data outside the file system the kit "
                        f"injects faults into ({', '.join(foreign[:3])})")
                raise AssertionError("a persistent backend acknowledged a batch without "
                                     "writing anything to the file system under its store")
            faults = sum(_fault_phase(kit, run, phase, operations, may_write, name)
                         for phase, operations, may_write in PHASES)
            assert faults, "no injected fault hit the backend (it neither wrote nor synced)"
            _acked_read_back(kit, run, "after the fault cleared")
            retry = list(run.failed.items())[::2]  # every phase keeps failed keys unretried
            for (key, _), result in zip(retry, _write(run, retry, "after the fault cleared")):
                assert result.outcome is WriteOutcome.WRITTEN, \
                    f"a key whose write failed during the fault does not write once it " \
                    f"cleared: {result}"
                run.acked[key] = run.failed.pop(key)
            fresh = make_items(f"{name}/after", BATCH, SIZE_LIMIT)
            for (key, value), result in zip(fresh, _write(run, fresh, "after the fault")):
                assert result.outcome is WriteOutcome.WRITTEN, \
                    f"the backend does not write again once the fault cleared: {result}"
                run.acked[key] = value
            run.close()
            backend = run.open()
            _acked_read_back(kit, run, "after the fault cleared and a reopen")
            back = [key for key in run.failed if backend.contains(key)
                    or not isinstance(kit.read(backend, key), ReadStatus)]
            assert not back, f"{len(back)} item(s) reported FAILED during the fault are " \
                             f"present after a reopen: {back[:3]}"
        finally:
            mount.heal()
            run.close()


@check(Clause.BATCHES, Requirement.PERSISTENT)
def faults_eio_per_item(kit: Kit) -> None:
    """While every write, then every fdatasync, then every file fsync/fdatasync, then
    every directory fsync, then every
    create/mkdir of the file system fails with EIO, each item of batch_write is FAILED with
    a BackendIOError carrying EIO (never raised, never WRITTEN unless it can be durable,
    never visible); objects acknowledged before read back byte for byte during and after
    the fault; once it clears the failed keys write again, and a reopen keeps every
    acknowledged object and no failed one."""
    run_faults(kit, errno.EIO)


@check(Clause.BATCHES, Requirement.PERSISTENT)
def faults_enospc_per_item(kit: Kit) -> None:
    """The same with ENOSPC (a full file system): each item the backend could not write is
    FAILED with CapacityError, nothing acknowledged is lost (unless evicted through
    on_evict), and the backend writes again once there is room."""
    run_faults(kit, errno.ENOSPC)

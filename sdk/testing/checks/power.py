"""Conformance checks: Power loss: what was acknowledged survives losing the page cache.

The crash checks elsewhere kill a process, which leaves the page cache (and so every
write that was never fsync'd) intact. These run the backend on the kit's power-loss file
system (:mod:`kvstored.sdk.testing.powerfs`), which at a cut keeps only what was made
durable: a backend that drops an fsync, or the fsync of a directory it created or
renamed a file in, or makes its deletes durable lazily, fails them.

Each check runs the backend in a child process (:mod:`~kvstored.sdk.testing._power_child`)
on a fresh store, cuts the power at a chosen moment, kills the child, brings the power
back and opens the store in the kit's process. A backend that is not persistent gets
them as not applicable, as does a machine without FUSE (unless ``KVSTORED_REQUIRE`` names
``fuse``). The seed of each cut is in every failure message; ``KVSTORED_KIT_SEED`` fixes it.
"""

from __future__ import annotations

import json
import os
import random
import stat
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from kvstored.sdk.backend import StorageBackend
from kvstored.sdk.errors import BackendError
from kvstored.sdk.testing import _power_child
from kvstored.sdk.testing.checks._common import Clause, MiB, check, child_env, describe
from kvstored.sdk.testing.kit import BackendSpec, Kit, NotApplicable, Requirement
from kvstored.sdk.testing.powerloss import (
    PowerLossMount,
    fuse_required,
    fuse_unavailable,
)
from kvstored.sdk.types import ReadStatus

#: The capacity the power and fault checks open a backend with unless the options give
#: one: a backend that preallocates its volume does so through glibc's emulation on FUSE
#: (one write per 4 KiB, 2 s for 32 MiB on a loaded machine), so the volume is only as
#: large as what the check writes needs. The ``hold`` and ``delete-last`` children write
#: at most 2.4 MB, the fault checks under 3 MB.
POWER_CAPACITY = 8 * MiB
#: The same for the ``churn`` child, which writes until the cut: on a loaded machine that
#: can come a dozen batches (up to 10 MB) after the ones the kit waited for, and nothing
#: acknowledged may have been evicted to make room.
CHURN_CAPACITY = 32 * MiB
#: Batches the child must have acknowledged before a cut in the middle of its writes.
ACKED_BEFORE_CUT = 4
#: The cut during a store's creation replaces one of its last this many changes.
CREATION_TAIL = 64
#: How long the child may take to open the store and reach the moment of the cut.
CHILD_DEADLINE = 90.0


@dataclass
class PowerCut:
    """What happened up to a cut: what the child acknowledged, and what the file system
    lost."""

    store: Path
    spec: BackendSpec
    seed: int
    survival: float
    acked: set[int] = field(default_factory=set)
    deleted: bool = False
    counters: dict[str, int] = field(default_factory=dict)
    #: What :meth:`reopen` opened, closed by :meth:`close`.
    opened: list[StorageBackend] = field(default_factory=list)
    #: The file system's count of cuts before this one.
    cuts_before: int = 0
    #: Which change (counted from the child's start) the cut replaced, if it was armed.
    armed: int | None = None

    def describe(self) -> str:
        c = self.counters
        where = f" in place of change {self.armed} of the store's creation" \
            if self.armed else ""
        return (f"power cut{where} with seed {self.seed}, survival {self.survival}: "
                f"{c.get('lost_pages', 0)} unsynced page(s), {c.get('lost_entries', 0)} "
                f"directory change(s), {c.get('lost_inodes', 0)} file(s) lost; the backend "
                f"made {c.get('fsyncs', 0)} fsync(s) and {c.get('dir_fsyncs', 0)} directory "
                f"fsync(s), opened {c.get('direct_opens', 0)} file(s) O_DIRECT")

    def close(self) -> None:
        """Close what :meth:`reopen` opened (before the file system is unmounted)."""
        while self.opened:
            self.opened.pop().close()

    def reopen(self) -> StorageBackend:
        try:
            backend = self.spec.open(self.store)
        except BackendError as exc:
            raise AssertionError(f"the backend does not open after a power cut: {exc} "
                                 f"({self.describe()})") from None
        self.opened.append(backend)
        return backend


def _seed() -> int:
    fixed = os.environ.get("KVSTORED_KIT_SEED")
    return int(fixed) if fixed else random.SystemRandom().randrange(2**32)


def _power_spec(kit: Kit, program: str) -> BackendSpec:
    capacity = CHURN_CAPACITY if program == "churn" else POWER_CAPACITY
    return BackendSpec(kit.spec.target, {"capacity": capacity, **kit.spec.options})


@contextmanager
def power_loss_mount(kit: Kit) -> Iterator[PowerLossMount]:
    """The power-loss file system, mounted in the workspace while the context is open."""
    reason = fuse_unavailable()
    if reason is not None:
        if fuse_required():
            raise AssertionError(f"FUSE is required (KVSTORED_REQUIRE) for the power-loss "
                                 f"checks but unavailable: {reason}")
        raise NotApplicable(f"the power-loss file system needs FUSE: {reason}")
    with PowerLossMount(kit.workspace / "powerfs", kit.workspace / "powerfs.log") as mount:
        yield mount


def cut_child(kit: Kit, mount: PowerLossMount, store: str, program: str, survival: float,
              ready: Callable[[list[str]], bool], *, arm: int | None = None) -> PowerCut:
    """Run the child ``program`` on the store ``store`` of ``mount``, cut the power once
    ``ready(lines printed after OPEN)`` (or, with ``arm``, in place of the ``arm``-th
    operation that changes something, whatever the child is doing), kill the child and
    power on again."""
    spec = _power_spec(kit, program)
    seed = _seed()
    rng = random.Random(seed)
    cut = PowerCut(mount.mountpoint / store, spec, seed, survival,
                   cuts_before=mount.stats()["cuts"])
    if arm is not None:
        mount.arm(arm, survival, seed)
    child_log = kit.workspace / f"{store}.child.log"
    assert spec.target is not None  # the power checks require Requirement.CHILD_PROCESS
    with open(child_log, "wb") as errors:
        child = subprocess.Popen(
            [sys.executable, "-m", _power_child.__name__, spec.target,
             json.dumps(spec.options), str(cut.store), program],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors, text=True,
            env=child_env())
    watchdog = threading.Timer(CHILD_DEADLINE, child.kill)
    watchdog.start()
    lines: list[str] = []
    cut_already = False
    try:
        assert child.stdout is not None
        opened = False
        while not (opened and ready(lines)):
            line = child.stdout.readline()
            cut_already = arm is not None and mount.stats()["cuts"] > cut.cuts_before
            if cut_already:
                break  # the armed cut happened; the child fails or dies from here on
            if not line:
                raise AssertionError(f"the child using the store died (or took over "
                                     f"{CHILD_DEADLINE:.0f} s): {_tail(child_log)}")
            line = line.strip()
            if line == "OPEN volatile":
                raise NotApplicable("the backend is not persistent (capabilities.persistent "
                                    "is False), so a power cut may lose everything")
            if line.startswith("FAILED"):
                raise AssertionError(f"the backend did not open on the power-loss file "
                                     f"system: {line} {_tail(child_log)}")
            if line == "OPEN persistent":
                opened = True
                continue
            lines.append(line)
            _note(cut, line)
        if not cut_already:
            foreign = _files_outside(child.pid, mount.mountpoint)
            if foreign:
                raise NotApplicable(
                    f"the backend keeps data outside the power-loss file system "
                    f"({', '.join(foreign[:3])}), which it cannot make lose power")
            if program == "churn":
                # land the cut somewhere inside the next batch
                threading.Event().wait(rng.uniform(0, 0.02))
            mount.cut(survival, seed)
    finally:
        watchdog.cancel()
        child.kill()
        rest, _ = child.communicate()
    cut.counters = mount.stats()
    for line in rest.splitlines():
        _note(cut, line.strip())
    if program != "hold" and not cut.counters.get("writes"):
        raise NotApplicable("the backend wrote nothing through the power-loss file "
                            "system, so a cut there cannot test it")
    mount.power_on()
    return cut


@contextmanager
def power_cut(kit: Kit, program: str, survival: float,
              ready: Callable[[list[str]], bool]) -> Iterator[PowerCut]:
    """:func:`cut_child` on a fresh power-loss mount; yields what happened, with the file
    system mounted until the context ends (and what was reopened closed before)."""
    with power_loss_mount(kit) as mount:
        cut = cut_child(kit, mount, "store", program, survival, ready)
        try:
            yield cut
        finally:
            cut.close()


def _files_outside(pid: int, mountpoint: Path) -> list[str]:
    """Block devices and regular files process ``pid`` holds open outside
    ``mountpoint``: data the power-loss file system never sees."""
    found = []
    folder = f"/proc/{pid}/fd"
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    inside = str(mountpoint) + os.sep
    for name in names:
        if name in ("0", "1", "2"):
            continue  # the pipes and log the kit gave it
        try:
            target = os.readlink(os.path.join(folder, name))
            mode = os.stat(os.path.join(folder, name)).st_mode
        except OSError:
            continue  # closed meanwhile
        if not target.startswith("/") or target.startswith(inside):
            continue  # pipes, sockets, io_uring rings, and the store itself
        if stat.S_ISBLK(mode) or stat.S_ISREG(mode):
            found.append(target)
    return sorted(set(found))


def _note(cut: PowerCut, line: str) -> None:
    if line.startswith("ACK "):
        cut.acked.add(int(line.split()[1]))
    elif line == "DELETED":
        cut.deleted = True


def _tail(path: Path) -> str:
    try:
        text = path.read_text(errors="replace").strip()
    except OSError:
        text = ""
    return text[-1500:] or "(no error output)"


def _acked_enough(lines: list[str]) -> bool:
    return sum(1 for line in lines if line.startswith("ACK ")) >= ACKED_BEFORE_CUT


def _verify_churn(kit: Kit, cut: PowerCut) -> None:
    """Acknowledged writes read back, acknowledged deletes stay deleted, and nothing
    the backend returns is torn."""
    backend = cut.reopen()
    gone = set(_power_child.deleted_keys()) if cut.deleted else set()
    lost, resurrected, torn = [], [], []
    for n in sorted(cut.acked):
        for key in _power_child.batch_keys(n):
            if key in gone:
                continue
            got = kit.read(backend, key)
            if got != _power_child.value_of(key):
                lost.append(f"{key} ({describe(got)})")
    for key in sorted(gone):
        got = kit.read(backend, key)
        if backend.contains(key) or not isinstance(got, ReadStatus):
            resurrected.append(key)
    last = max(cut.acked, default=0)
    maybe = [k for n in range(last + 1, last + 3) for k in _power_child.batch_keys(n)]
    listed = [record.key for record in backend.scan()]
    for key in dict.fromkeys([*listed, *maybe]):
        got = kit.read(backend, key)
        if isinstance(got, bytes) and (not key.startswith("power/")
                                       or got != _power_child.value_of(key)):
            torn.append(f"{key} ({len(got)} wrong bytes)")
    problems = []
    if lost:
        problems.append(f"{len(lost)} acknowledged write(s) lost or wrong: {lost[:3]} (is "
                        "every file fsync'd, and the directory of every file created or "
                        "renamed?)")
    if resurrected:
        problems.append(f"{len(resurrected)} acknowledged delete(s) undone: {resurrected[:3]}"
                        " (is the delete durable before batch_delete returns?)")
    if torn:
        problems.append(f"{len(torn)} torn object(s) returned as values: {torn[:3]} (a "
                        "record that fails its checksum must be a miss)")
    assert not problems, "; ".join(problems) + f" after a {cut.describe()}"


def _deleted(lines: list[str]) -> bool:
    return "DELETED" in lines


@check(Clause.ATOMICITY, Requirement.CHILD_PROCESS)
def power_cut_keeps_acknowledged(kit: Kit) -> None:
    """A power cut right after a batch_delete returned, losing every unsynced write,
    keeps all acknowledged writes and deletes; the store opens and returns nothing torn."""
    with power_cut(kit, "delete-last", 0.0, _deleted) as cut:
        _verify_churn(kit, cut)


@check(Clause.ATOMICITY, Requirement.CHILD_PROCESS)
def power_cut_tears_nothing(kit: Kit) -> None:
    """A power cut that keeps a random half of the unsynced pages and directory changes
    (so records in flight tear) keeps all acknowledged writes and deletes; the store opens
    and returns nothing torn."""
    with power_cut(kit, "churn", 0.5, _acked_enough) as cut:
        _verify_churn(kit, cut)


def _opens_empty(cut: PowerCut) -> None:
    backend = cut.reopen()
    found = [record.key for record in backend.scan()]
    assert not found, f"a store that was never written lists {found[:3]} after a " \
                      f"{cut.describe()}"


@check(Clause.OPENING, Requirement.CHILD_PROCESS)
def power_cut_after_create(kit: Kit) -> None:
    """A power cut right after a new store was opened (losing every unsynced write), and
    one at a random point of its creation (keeping a random half), leave a store that
    opens, empty, without error."""
    with power_loss_mount(kit) as mount:
        after = cut_child(kit, mount, "store", "hold", 0.0, lambda lines: True)
        try:
            _opens_empty(after)
        finally:
            after.close()
        # one of the last CREATION_TAIL changes the creation made (counted up to the
        # first cut): before them a preallocating backend is still filling its volume
        changes = after.counters["mutations"]
        at = random.Random(after.seed).randint(max(1, changes - CREATION_TAIL + 1),
                                               max(changes, 1))
        midway = cut_child(kit, mount, "created-midway", "hold", 0.5, lambda lines: True,
                           arm=at)
        midway.armed = at
        try:
            _opens_empty(midway)
        finally:
            midway.close()

"""Conformance checks: scan, locate and capabilities."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections import Counter

from crc32c import crc32c

from kvstored.sdk.testing.checks._common import (
    Clause,
    KiB,
    check,
    located,
    make_items,
    stat_of,
    write_all,
)
from kvstored.sdk.testing.kit import Kit, Requirement, read_location
from kvstored.sdk.types import (
    Capabilities,
    EvictionGranularity,
)
from kvstored.sdk.version import SDK_VERSION, Compatibility, compatibility

# -- scan, locate, capabilities ----------------------------------------------------------


@check(Clause.SCAN)
def scan_agrees_with_contains(kit: Kit) -> None:
    """scan() lists exactly the keys contains() admits, with right sizes and checksums."""
    backend = kit.open()
    items = make_items("sc", 20)
    write_all(backend, items)
    backend.batch_delete([k for k, _ in items[:5]])
    records = {r.key: r for r in backend.scan()}
    candidates = [k for k, _ in items]
    present = {k for k, hit in zip(candidates, backend.batch_contains(candidates)) if hit}
    assert set(records) == present, f"scan {sorted(records)} vs contains {sorted(present)}"
    for key, value in items[5:]:
        assert (records[key].size, records[key].checksum) == (len(value), crc32c(value))
        assert records[key].location == backend.locate(key)


@check(Clause.SCAN)
def batch_versions_agree_with_stat(kit: Kit) -> None:
    """batch_versions() gives, per key, the size and checksum stat() reports (None where
    stat() does), a key named twice both times, and a rewritten key's new version."""
    backend = kit.open()
    items = make_items("ver", 8, 3 * KiB)
    write_all(backend, items)
    backend.batch_delete([items[0][0]])
    rewritten = (items[1][0], b"a new value of another length")
    backend.batch_delete([rewritten[0]])
    write_all(backend, [rewritten])
    keys = [k for k, _ in items] + ["ver/absent", items[2][0]]
    versions = backend.batch_versions(keys)
    assert len(versions) == len(keys), f"{len(versions)} answers for {len(keys)} keys"
    for key, version in zip(keys, versions):
        record = backend.stat(key)
        expected = None if record is None else (record.size, record.checksum)
        got = None if version is None else (version.size, version.checksum)
        assert got == expected, f"batch_versions gives {got} for {key!r}, stat {expected}"
    assert versions[0] is None and versions[-2] is None
    assert versions[1] == (len(rewritten[1]), crc32c(rewritten[1])), versions[1]


@check(Clause.CAPABILITIES)
def locate_points_at_value(kit: Kit) -> None:
    """locate() gives the file and offset where the value's bytes really are."""
    backend = kit.open()
    items = make_items("loc", 5, 50 * KiB)
    write_all(backend, items)
    for key, value in items:
        where = backend.locate(key)
        assert where is not None and where.length == len(value), where
        assert read_location(where) == value, f"bytes at {where} are not {key!r}'s value"


@check(Clause.CAPABILITIES)
def capabilities_well_formed(kit: Kit) -> None:
    """capabilities reports typed fields, and max_value_size honours the option."""
    backend = kit.open(max_value_size=123_456)
    caps = backend.capabilities
    assert isinstance(caps, Capabilities)
    assert isinstance(caps.shared, bool) and isinstance(caps.persistent, bool)
    assert isinstance(caps.aligned_values, bool)
    assert isinstance(caps.eviction, EvictionGranularity)
    assert caps.max_value_size == 123_456


@check(Clause.SCAN)
def scan_yields_each_once(kit: Kit) -> None:
    """scan() yields every object live throughout exactly once, never a key deleted
    before it began, and no key twice, while another thread writes and deletes."""
    backend = kit.open()
    items = make_items("once", 300, 2 * KiB)
    write_all(backend, items)
    dead = [k for k, _ in items[::7]]
    backend.batch_delete(dead)
    # Deleted while the scan runs: they may appear or not, but deleting them must not
    # make the scan skip or repeat the others.
    doomed = [k for k, _ in items[1:60:3]]
    live = {k for k, _ in items} - set(dead) - set(doomed)
    go, done = threading.Event(), threading.Event()
    failures: list[str] = []

    def churn() -> None:  # one step per request: writes two keys, deletes two
        for n in range(len(doomed)):
            if not go.wait(STEP_TIMEOUT):
                return
            go.clear()
            try:
                backend.batch_write(make_items(f"during{n}", 2, 2 * KiB))
                backend.batch_delete([f"during{n - 1}/0", doomed[n]])
            except Exception as exc:  # reported below
                failures.append(f"{type(exc).__name__}: {exc}")
            done.set()

    thread = threading.Thread(target=churn, daemon=True)
    thread.start()
    seen: list[str] = []
    steps = 0
    for record in backend.scan():
        seen.append(record.key)
        if len(seen) % 8 == 1 and steps < len(doomed):
            # Pause the scan between two steps while the other thread writes and deletes.
            done.clear()
            go.set()
            steps += 1
            if not done.wait(STEP_TIMEOUT):
                kit.abandon(backend)
                raise AssertionError("a write and a delete could not finish while a scan "
                                     "was paused between two steps (scan holds a lock)")
    go.set()
    thread.join(STEP_TIMEOUT)
    assert not failures, failures[:3]
    twice = [k for k, n in Counter(seen).items() if n > 1]
    assert not twice, f"scan() yielded keys more than once: {twice[:5]}"
    assert not live - set(seen), f"scan() missed live keys: {sorted(live - set(seen))[:5]}"
    assert not set(dead) & set(seen), "scan() yielded keys deleted before it began"


#: How long scan_yields_each_once waits for one write-and-delete step.
STEP_TIMEOUT = 20.0


def _thread_io() -> tuple[int, int]:
    """(read syscalls, write syscalls) this thread has made (/proc/thread-self/io)."""
    with open("/proc/thread-self/io") as f:
        fields = dict(line.split(": ") for line in f.read().splitlines())
    return int(fields["syscr"]), int(fields["syscw"])


@check(Clause.BLOCKING)
def memory_only_calls_do_no_io(kit: Kit) -> None:
    """stat(), batch_versions(), usage(), batch_contains(), locate() and capabilities
    answer from memory: they make no read or write system call, and answer the same
    while the store's directory is moved away (no path is touched)."""
    backend = kit.open()
    items = make_items("mem", 12, 8 * KiB)
    write_all(backend, items)
    keys = [k for k, _ in items] + ["mem/absent"]

    def answers():
        return ([backend.stat(k) for k in keys], backend.batch_versions(keys),
                backend.usage(), backend.batch_contains(keys),
                [backend.locate(k) for k in keys], backend.capabilities)

    expected = answers()  # warm: lazy imports and first-use set-up are not the point
    # Reading the counter costs system calls of its own: measure them, then subtract.
    first, second = _thread_io(), _thread_io()
    own = (second[0] - first[0], second[1] - first[1])
    before = _thread_io()
    for _ in range(3):
        answers()
    after = _thread_io()
    extra = (after[0] - before[0] - own[0], after[1] - before[1] - own[1])
    assert extra[0] <= 0 and extra[1] <= 0, \
        f"memory-only calls made {extra[0]} read and {extra[1]} write system calls " \
        "(the node calls them on its event loop)"
    moved = kit.workspace / "moved-away"
    os.rename(kit.path, moved)
    try:
        try:
            during = answers()
        except Exception as exc:
            raise AssertionError(f"with the store's directory moved away, a memory-only "
                                 f"call raised {type(exc).__name__}: {exc}") from None
    finally:
        os.rename(moved, kit.path)
    assert during == expected, "with the store's directory moved away, memory-only " \
                               "calls answered differently: they look at the disk"


@check(Clause.SHARING, Requirement.SHARED)
def shared_objects_readable_elsewhere(kit: Kit) -> None:
    """A shared backend's objects can be read by another process directly at locate()
    (as another node would), and they match stat()'s checksum."""
    backend = kit.open()
    items = make_items("shared", 5, 40 * KiB)
    write_all(backend, items)
    places = [(located(backend, k), stat_of(backend, k).checksum) for k, _ in items]
    program = ("import os, sys, json, crc32c\n"
               "for path, offset, length, crc in json.load(sys.stdin):\n"
               "    fd = os.open(path, os.O_RDONLY)\n"
               "    data = os.pread(fd, length, offset); os.close(fd)\n"
               "    print(crc32c.crc32c(data) == crc)\n")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=60, input=json.dumps(
                              [[w.path, w.offset, w.length, crc] for w, crc in places]))
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["True"] * len(items), \
        f"another process read other bytes at locate(): {done.stdout.split()}"


@check(Clause.VERSION)
def sdk_version_declared(kit: Kit) -> None:
    """The backend declares the SDK version it targets (StorageBackend.sdk_version), and
    this SDK can run it: the same major version, and a minor version no newer than this
    SDK's."""
    cls = kit.backend_type()
    declared = getattr(cls, "sdk_version", None)
    relation = compatibility(declared)
    hint = f"{cls.__name__} declares sdk_version={declared!r}; this SDK is {SDK_VERSION}"
    assert relation is not Compatibility.UNDECLARED, \
        f"{hint}: declare the version you target, sdk_version = {SDK_VERSION!r}"
    assert relation is not Compatibility.OTHER_MAJOR, \
        f"{hint}: another major version, whose contract differs (docs/sdk.md, Versions)"
    assert relation is not Compatibility.NEWER_MINOR, \
        f"{hint}: the backend may rely on what this SDK lacks; upgrade kvstored"

"""Conformance checks: Crashes and corruption: torn writes, flipped bytes, check and repair."""

from __future__ import annotations

import os
from collections.abc import Callable, Collection
from dataclasses import replace

from kvstored.sdk.testing import _writer
from kvstored.sdk.testing.checks._common import (
    Clause,
    KiB,
    MiB,
    check,
    describe,
    kill_writer_midway,
    located,
    make_items,
    write_all,
)
from kvstored.sdk.testing.kit import (
    Kit,
    NotApplicable,
    Requirement,
    flip_byte,
    payload,
    read_location,
    size_for,
)
from kvstored.sdk.types import Location, ReadStatus

# -- crashes and corruption --------------------------------------------------------------


@check(Clause.ATOMICITY, Requirement.PERSISTENT, Requirement.CHILD_PROCESS)
def torn_write_process_killed(kit: Kit) -> None:
    """kill -9 in the middle of batches: acknowledged objects survive, and every object
    is complete and correct or absent."""
    acked = kill_writer_midway(kit)
    backend = kit.open()
    for n in range(acked + 3):
        for key in _writer.batch_keys(n):
            value = payload(key, size_for(key, _writer.SIZE_LIMIT))
            got = kit.read(backend, key)
            if n <= acked:
                assert got == value, f"acknowledged {key!r} read back as {describe(got)}"
            else:
                assert got in (value, ReadStatus.MISSING), f"{key!r} is {describe(got)}"


def _flipped_byte_is_never_returned(kit: Kit, key: str, size: int,
                                    byte_of: Callable[[Location], int],
                                    at_once: Collection[ReadStatus]) -> None:
    """Write ``key`` (``size`` bytes) beside an intact ``ok``, flip the byte ``byte_of``
    its location names, and read both, before and after a reopen: ``key`` reads as one of
    ``at_once`` (after the reopen, CORRUPT or MISSING), never as bytes; ``ok`` is intact."""
    backend = kit.open()
    write_all(backend, [(key, payload(key, size)), ("ok", payload("ok", size))])
    flip_byte((where := located(backend, key)).path, byte_of(where))
    assert kit.read(backend, key, size) in at_once
    kit.assert_value(backend, "ok", payload("ok", size))
    backend = kit.reopen(backend)
    assert kit.read(backend, key, size) in (ReadStatus.CORRUPT, ReadStatus.MISSING)
    kit.assert_value(backend, "ok", payload("ok", size))


def _header_byte(where: Location) -> int:
    assert where.record_offset is not None, "locate() must give record_offset"
    return where.record_offset + 20


@check(Clause.INTEGRITY)
def flipped_value_byte(kit: Kit) -> None:
    """One flipped byte in a value is reported CORRUPT, never returned, also after reopen."""
    _flipped_byte_is_never_returned(kit, "f", 20_000, lambda w: w.offset + w.length // 2,
                                    at_once={ReadStatus.CORRUPT})


@check(Clause.INTEGRITY)
def flipped_header_byte(kit: Kit) -> None:
    """One flipped byte in a record header is reported, never returned, also after reopen."""
    _flipped_byte_is_never_returned(kit, "h", 9_000, _header_byte,
                                    at_once={ReadStatus.CORRUPT, ReadStatus.MISSING})


@check(Clause.SCAN)
def scan_verify_skips_corrupt(kit: Kit) -> None:
    """scan(verify=True) leaves out an object whose value fails its checksum."""
    backend = kit.open()
    items = make_items("v", 6)
    write_all(backend, items)
    where = located(backend, items[2][0])
    flip_byte(where.path, where.offset + where.length // 2)
    verified = {r.key for r in backend.scan(verify=True)}
    assert verified == {k for k, _ in items} - {items[2][0]}, verified


@check(Clause.CHECK)
def check_clean_store(kit: Kit) -> None:
    """check() on an undamaged store reports no problems."""
    backend = kit.open()
    write_all(backend, make_items("c", 10))
    backend.batch_delete(["c/3"])
    report = backend.check()
    assert not report.problems, report.problems


@check(Clause.CHECK)
def check_finds_and_repairs(kit: Kit) -> None:
    """check() finds a damaged record; check(repair=True) quarantines it; then all is clean."""
    backend = kit.open()
    items = make_items("x", 8, 32 * KiB)
    write_all(backend, items)
    bad_key = items[3][0]
    where = located(backend, bad_key)
    flip_byte(where.path, where.offset + where.length // 2)
    report = backend.check()
    assert report.problems, "check() missed a flipped value byte"
    assert any(p.key == bad_key or p.path == where.path for p in report.problems), report.problems
    report = backend.check(repair=True)
    assert report.problems and all(p.action for p in report.problems), report.problems
    assert not backend.check().problems, "problems remain after repair"
    assert kit.read(backend, bad_key, 32 * KiB) == ReadStatus.MISSING
    backend = kit.reopen(backend)
    assert not backend.check().problems, "problems came back after reopen"
    for key, value in items:
        if key != bad_key:
            got = kit.read(backend, key, len(value))
            assert got in (value, ReadStatus.MISSING), f"{key!r} read as {describe(got)}"


@check(Clause.INTEGRITY)
def checksum_every_read(kit: Kit) -> None:
    """The checksum is verified on every read, not only the first: a value read cleanly
    (so caches and "verified" flags are warm) and damaged afterwards reads CORRUPT (or
    the right bytes), never the damaged bytes, however often it is read."""
    backend = kit.open()
    items = [(f"every/{n}", payload(f"every/{n}", size)) for n, size in
             enumerate((1, 4095, 4096, 70_000))]
    write_all(backend, items)
    for key, value in items:
        for _ in range(2):
            kit.assert_value(backend, key, value)
    for key, value in items:
        where = located(backend, key)
        flip_byte(where.path, where.offset + where.length // 2)
        damaged = bytearray(value)
        damaged[len(value) // 2] ^= 0xFF
        for attempt in range(3):
            got = kit.read(backend, key, len(value))
            assert got in (ReadStatus.CORRUPT, value), \
                f"read {attempt + 1} after damage of {key!r} gave {describe(got)}" + (
                    " (the damaged bytes: the checksum was not verified)"
                    if got == bytes(damaged) else "")


@check(Clause.BUFFERS)
def failed_read_leaves_no_value_bytes(kit: Kit) -> None:
    """A read that fails (CORRUPT, BUFFER_TOO_SMALL) leaves nothing of the stored bytes
    in the caller's buffer: it is left as it was or zeroed."""
    backend = kit.open()
    size = 12_345
    write_all(backend, [("dirty", payload("dirty", size)), ("small", payload("small", size))])
    where = located(backend, "dirty")
    flip_byte(where.path, where.offset + size // 2)
    for key, room, expected in (("dirty", size, ReadStatus.CORRUPT),
                                ("small", size - 1, ReadStatus.BUFFER_TOO_SMALL)):
        buf = bytearray(b"\xa5" * room)
        got = backend.batch_read([key], [memoryview(buf)])[0]
        assert got == expected, f"reading {key!r} into {room} bytes gave {got}, not {expected}"
        assert buf in (bytearray(b"\xa5" * room), bytearray(room)), \
            f"a failed read of {key!r} ({expected.name}) left bytes in the caller's buffer"


def _truncate_tail(kit: Kit):
    """Write objects, cut the last one's record in half on disk, and reopen: the backend,
    the victim's key, and the other items."""
    backend = kit.open()
    items = [*make_items("t", 8, 64 * KiB), ("victim", payload("victim", 50_000))]
    write_all(backend, items)
    where = located(backend, "victim")
    backend.close()
    if where.device:
        raise NotApplicable(f"the store is on a block device ({where.path}), which cannot "
                            "be cut short")
    os.truncate(where.path, where.offset + where.length // 2)
    return kit.open(), items[:-1], where


@check(Clause.RECORDS, Requirement.PERSISTENT)
def torn_write_truncated(kit: Kit) -> None:
    """A record cut short at the tail (a torn write) is left out at the next open: it is
    not read, not admitted by contains() and not listed by scan(); every other object is
    either readable and correct or absent everywhere."""
    backend, others, _ = _truncate_tail(kit)
    got = kit.read(backend, "victim", 50_000)
    assert got == ReadStatus.MISSING, f"the truncated record read as {describe(got)}"
    assert not backend.contains("victim"), "contains() admits a record cut short on disk"
    listed = [r.key for r in backend.scan()]
    assert "victim" not in listed, "scan() lists a record cut short on disk"
    present = dict(zip([k for k, _ in others], backend.batch_contains([k for k, _ in others])))
    for key, value in others:
        got = kit.read(backend, key, len(value))
        if present[key]:
            assert got == value, f"{key!r} is admitted by contains() but reads {describe(got)}"
            assert key in listed, f"{key!r} is admitted by contains() but scan() misses it"
        else:
            assert got == ReadStatus.MISSING and key not in listed, \
                f"{key!r} is denied by contains() but reads {describe(got)} or is scanned"


@check(Clause.CHECK, Requirement.PERSISTENT)
def check_reports_dropped_record(kit: Kit) -> None:
    """After an open that left out an acknowledged record (cut short on disk), check()
    is not clean: it reports the record (by key or file), so the loss is never silent."""
    backend, _, where = _truncate_tail(kit)
    report = backend.check()
    assert report.problems, "check() reports a clean store although an acknowledged " \
                            "record was cut short and left out at open"
    assert any(p.key == "victim" or p.path == where.path for p in report.problems), \
        f"check() does not name the dropped record: {report.problems}"


@check(Clause.CHECK)
def repair_keeps_evidence(kit: Kit) -> None:
    """check(repair=True) sets a damaged record aside: its bytes (the damage included)
    are still on disk after the store evicted everything and wrote anew (in a quarantine,
    not in space it may reuse), never deleted."""
    backend = kit.open(capacity=32 * MiB)
    items = make_items("ev", 6, 32 * KiB)
    items.append(("evidence", payload("evidence", 40_000)))
    write_all(backend, items)
    where = located(backend, "evidence")
    flip_byte(where.path, where.offset + 20_000)
    window = read_location(replace(where, offset=where.offset + 19_000, length=2_000))
    report = backend.check(repair=True)
    assert report.problems, "check(repair=True) found nothing to repair"
    assert not backend.contains("evidence"), "the damaged record is still indexed"
    # Free and reuse every byte the store may reuse: what survives is what was set aside.
    backend.evict(10**15)
    write_all(backend, make_items("after", 12, 64 * KiB))
    backend.close()
    assert _somewhere_under(kit.workspace, window), \
        "check(repair=True) deleted the damaged record's bytes instead of quarantining them"


def _somewhere_under(root, needle: bytes) -> bool:
    for folder, _, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            try:
                with open(path, "rb") as f:
                    if needle in f.read():
                        return True
            except OSError:
                continue
    return False

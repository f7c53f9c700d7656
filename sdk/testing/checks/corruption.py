"""Conformance checks: Crashes and corruption: torn writes, flipped bytes, check and repair."""

from __future__ import annotations

import os

from kvstored.sdk.backend import StorageBackend
from kvstored.sdk.testing import _writer
from kvstored.sdk.testing.checks._common import (
    KiB,
    check,
    describe,
    kill_writer_midway,
    make_items,
    write_all,
)
from kvstored.sdk.testing.kit import Kit, flip_byte, payload, size_for
from kvstored.sdk.types import Location, ReadStatus

# -- crashes and corruption --------------------------------------------------------------


def _located(backend: StorageBackend, key: str) -> Location:
    where = backend.locate(key)
    assert where is not None, f"locate({key!r}) of a stored key gave None"
    return where


@check
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


@check
def torn_write_truncated(kit: Kit) -> None:
    """A record cut short on disk (a torn write) reads as absent or corrupt after reopen,
    never as a value."""
    backend = kit.open()
    items = [*make_items("t", 8, 64 * KiB), ("victim", payload("victim", 50000))]
    write_all(backend, items)
    where = _located(backend, "victim")
    backend.close()
    os.truncate(where.path, where.offset + where.length // 2)
    backend = kit.open()
    got = kit.read(backend, "victim", 50_000)
    assert got in (ReadStatus.MISSING, ReadStatus.CORRUPT), f"victim read as {describe(got)}"
    for key, value in items[:-1]:
        got = kit.read(backend, key, len(value))
        assert got in (value, ReadStatus.MISSING, ReadStatus.CORRUPT), \
            f"{key!r} read as {describe(got)}"


@check
def flipped_value_byte(kit: Kit) -> None:
    """One flipped byte in a value is reported CORRUPT, never returned, also after reopen."""
    backend = kit.open()
    write_all(backend, [("f", payload("f", 20_000)), ("ok", payload("ok", 20_000))])
    where = _located(backend, "f")
    flip_byte(where.path, where.offset + where.length // 2)
    assert kit.read(backend, "f") == ReadStatus.CORRUPT
    kit.assert_value(backend, "ok", payload("ok", 20_000))
    backend = kit.reopen(backend)
    assert kit.read(backend, "f", 20_000) in (ReadStatus.CORRUPT, ReadStatus.MISSING)
    kit.assert_value(backend, "ok", payload("ok", 20_000))


@check
def flipped_header_byte(kit: Kit) -> None:
    """One flipped byte in a record header is reported, never returned, also after reopen."""
    backend = kit.open()
    write_all(backend, [("h", payload("h", 9_000)), ("ok", payload("ok", 9_000))])
    where = _located(backend, "h")
    assert where.record_offset is not None, "locate() must give record_offset"
    flip_byte(where.path, where.record_offset + 20)
    assert kit.read(backend, "h", 9_000) in (ReadStatus.CORRUPT, ReadStatus.MISSING)
    backend = kit.reopen(backend)
    assert kit.read(backend, "h", 9_000) in (ReadStatus.CORRUPT, ReadStatus.MISSING)
    kit.assert_value(backend, "ok", payload("ok", 9_000))


@check
def scan_verify_skips_corrupt(kit: Kit) -> None:
    """scan(verify=True) leaves out an object whose value fails its checksum."""
    backend = kit.open()
    items = make_items("v", 6)
    write_all(backend, items)
    where = _located(backend, items[2][0])
    flip_byte(where.path, where.offset + where.length // 2)
    verified = {r.key for r in backend.scan(verify=True)}
    assert verified == {k for k, _ in items} - {items[2][0]}, verified


@check
def check_clean_store(kit: Kit) -> None:
    """check() on an undamaged store reports no problems."""
    backend = kit.open()
    write_all(backend, make_items("c", 10))
    backend.batch_delete(["c/3"])
    report = backend.check()
    assert not report.problems, report.problems


@check
def check_finds_and_repairs(kit: Kit) -> None:
    """check() finds a damaged record; check(repair=True) quarantines it; then all is clean."""
    backend = kit.open()
    items = make_items("x", 8, 32 * KiB)
    write_all(backend, items)
    bad_key = items[3][0]
    where = _located(backend, bad_key)
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



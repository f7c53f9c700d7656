"""The conformance checks. Each proves one clause of the StorageBackend contract; its
docstring's first line says which, and is what the kit's table prints."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time

from crc32c import crc32c
from kvstored.sdk.errors import (
    BackendClosedError,
    CapacityError,
    InvalidKeyError,
    InvalidRequestError,
    ValueTooLargeError,
)
from kvstored.sdk.testing import _writer
from kvstored.sdk.testing.kit import Check, Kit, flip_byte, payload, read_location, size_for
from kvstored.sdk.types import (
    MAX_KEY_BYTES,
    Capabilities,
    EvictionGranularity,
    ReadStatus,
    WriteOutcome,
)

CHECKS: list[Check] = []
KiB, MiB = 1024, 1024 * 1024


def check(function):
    CHECKS.append(Check(function.__name__, function))
    return function


def _roundtrip(kit: Kit, size: int) -> None:
    backend = kit.open()
    key = f"size-{size}"
    value = payload(key, size)
    [result] = backend.batch_write([(key, value)])
    assert result.outcome is WriteOutcome.WRITTEN, f"write of {size} bytes: {result}"
    kit.assert_value(backend, key, value)
    record = backend.stat(key)
    assert record is not None and record.size == size, f"stat after write: {record}"
    assert record.checksum == crc32c(value), "stat's checksum is not the CRC-32C of the value"
    assert backend.contains(key)


def _write_all(backend, items) -> None:
    results = backend.batch_write(items)
    bad = [r for r in results if r.outcome is not WriteOutcome.WRITTEN]
    assert not bad, f"writes failed: {bad[:3]}"


def _items(prefix: str, count: int, size_limit: int = 64 * KiB) -> list[tuple[str, bytes]]:
    keys = [f"{prefix}/{i}" for i in range(count)]
    return [(k, payload(k, size_for(k, size_limit))) for k in keys]


# -- round trips -------------------------------------------------------------------------


@check
def roundtrip_empty(kit: Kit) -> None:
    """A zero-byte value round-trips and is told apart from a missing key."""
    _roundtrip(kit, 0)


@check
def roundtrip_one_byte(kit: Kit) -> None:
    """A one-byte value round-trips."""
    _roundtrip(kit, 1)


@check
def roundtrip_4095(kit: Kit) -> None:
    """A value one byte short of 4 KiB round-trips (alignment edge)."""
    _roundtrip(kit, 4095)


@check
def roundtrip_4096(kit: Kit) -> None:
    """A value of exactly 4 KiB round-trips (alignment edge)."""
    _roundtrip(kit, 4096)


@check
def roundtrip_4097(kit: Kit) -> None:
    """A value one byte over 4 KiB round-trips (alignment edge)."""
    _roundtrip(kit, 4097)


@check
def roundtrip_1mib(kit: Kit) -> None:
    """A 1 MiB value round-trips."""
    _roundtrip(kit, MiB)


@check
def roundtrip_max_size(kit: Kit) -> None:
    """A value of exactly max_value_size round-trips; one byte more is refused cleanly."""
    backend = kit.open()
    limit = backend.capabilities.max_value_size
    key = "max"
    value = payload(key, limit)
    _write_all(backend, [(key, value)])
    kit.assert_value(backend, key, value)
    try:
        backend.batch_write([("too-big", bytes(limit + 1))])
    except ValueTooLargeError as exc:
        assert exc.key == "too-big", "ValueTooLargeError must name the key"
    else:
        raise AssertionError("a value over max_value_size was accepted")
    assert not backend.contains("too-big"), "a refused value became visible"


@check
def roundtrip_random_sizes(kit: Kit) -> None:
    """Values of random sizes (hypothesis) round-trip, in batches, before and after reopen."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    backend = kit.open()
    written: dict[str, bytes] = {}
    counter = iter(range(10**9))

    @settings(max_examples=40, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(st.lists(st.one_of(st.integers(0, 3 * 4096 + 7), st.integers(0, 600 * KiB)),
                    min_size=1, max_size=6))
    def roundtrip_batch(sizes: list[int]) -> None:
        items = [(f"h/{next(counter)}", b"") for _ in sizes]
        items = [(k, payload(k, n)) for (k, _), n in zip(items, sizes)]
        _write_all(backend, items)
        for key, value in items:
            kit.assert_value(backend, key, value)
        written.update(items)

    roundtrip_batch()
    backend = kit.reopen(backend)
    for key, value in written.items():
        kit.assert_value(backend, key, value)


# -- keys --------------------------------------------------------------------------------


@check
def invalid_keys_rejected(kit: Kit) -> None:
    """Empty, over-long and non-UTF-8 keys raise InvalidKeyError, and the batch writes
    nothing."""
    backend = kit.open()
    for bad in ("", "k" * (MAX_KEY_BYTES + 1), "\ud800"):
        try:
            backend.batch_write([("fine", b"x"), (bad, b"y")])
        except InvalidKeyError:
            pass
        else:
            raise AssertionError(f"key {bad[:20]!r} was accepted")
        assert not backend.contains("fine"), "a batch with an invalid key wrote part of itself"


@check
def longest_key_accepted(kit: Kit) -> None:
    """A key of exactly 1024 bytes of UTF-8 (multi-byte characters) round-trips."""
    backend = kit.open()
    key = "é" * (MAX_KEY_BYTES // 2)
    _write_all(backend, [(key, b"long key")])
    backend = kit.reopen(backend)
    kit.assert_value(backend, key, b"long key")


@check
def hostile_keys(kit: Kit) -> None:
    """Keys with '/', '..', NUL, spaces and non-ASCII neither escape the directory nor
    collide."""
    keys = ["a/b", "a", "b", "../escape", "../../etc/passwd", "/abs", ".", "..", "a\x00b",
            "a\x00c", " ", "a b", "a  b", "ключ", "鍵", "🔑", "\\", "a/../b", "A", "CON"]
    before = set(os.listdir(kit.workspace))
    backend = kit.open()
    items = [(k, payload(k, 100 + i)) for i, k in enumerate(keys)]
    _write_all(backend, items)
    for key, value in items:
        kit.assert_value(backend, key, value)
    backend = kit.reopen(backend)
    for key, value in items:
        kit.assert_value(backend, key, value)
    after = set(os.listdir(kit.workspace))
    assert after - before <= {"store"}, f"files appeared outside the store: {after - before}"
    assert not os.path.exists("/etc/passwd.kvr")


# -- batches and write-once -------------------------------------------------------------


@check
def batch_read_mixed(kit: Kit) -> None:
    """A batch read mixing present, missing and repeated keys answers each item."""
    backend = kit.open()
    _write_all(backend, [("p1", b"one"), ("p2", b"two" * 1000)])
    keys = ["p1", "nope", "p2", "p1", "also-nope"]
    bufs = [memoryview(bytearray(4000)) for _ in keys]
    results = backend.batch_read(keys, bufs)
    assert results == [3, ReadStatus.MISSING, 3000, 3, ReadStatus.MISSING], results
    assert bytes(bufs[0][:3]) == b"one" and bytes(bufs[3][:3]) == b"one"
    assert bytes(bufs[2][:3000]) == b"two" * 1000


@check
def batch_write_duplicates(kit: Kit) -> None:
    """A key repeated within one batch is written once: the first value wins."""
    backend = kit.open()
    results = backend.batch_write([("d", b"first"), ("e", b"x"), ("d", b"second")])
    outcomes = [r.outcome for r in results]
    assert outcomes == [WriteOutcome.WRITTEN, WriteOutcome.WRITTEN, WriteOutcome.EXISTS], outcomes
    kit.assert_value(backend, "d", b"first")


@check
def put_existing_key(kit: Kit) -> None:
    """Writing an existing key reports EXISTS and keeps the stored value, across reopen."""
    backend = kit.open()
    _write_all(backend, [("k", b"original")])
    [result] = backend.batch_write([("k", b"replacement")])
    assert result.outcome is WriteOutcome.EXISTS and result.ok, result
    kit.assert_value(backend, "k", b"original")
    backend = kit.reopen(backend)
    kit.assert_value(backend, "k", b"original")


@check
def missing_key(kit: Kit) -> None:
    """A key never written is missing everywhere: read, contains, stat, locate, delete."""
    backend = kit.open()
    _write_all(backend, [("present", b"x")])
    assert kit.read(backend, "absent", 10) == ReadStatus.MISSING
    assert backend.batch_contains(["absent", "present"]) == [False, True]
    assert backend.stat("absent") is None and backend.locate("absent") is None
    assert backend.batch_delete(["absent"]) == [False]


@check
def buffer_too_small(kit: Kit) -> None:
    """A buffer shorter than the value gets BUFFER_TOO_SMALL, not a truncated value."""
    backend = kit.open()
    _write_all(backend, [("big", payload("big", 10_000))])
    assert kit.read(backend, "big", 9_999) == ReadStatus.BUFFER_TOO_SMALL
    kit.assert_value(backend, "big", payload("big", 10_000))


# -- lifecycle and persistence -----------------------------------------------------------


@check
def close_is_idempotent(kit: Kit) -> None:
    """close() twice is fine; any use after close raises BackendClosedError."""
    backend = kit.open()
    _write_all(backend, [("k", b"v")])
    backend.close()
    backend.close()
    for call in (lambda: backend.batch_read(["k"], [memoryview(bytearray(1))]),
                 lambda: backend.batch_write([("j", b"v")]),
                 lambda: backend.batch_contains(["k"]), backend.usage):
        try:
            call()
        except BackendClosedError:
            continue
        raise AssertionError("a closed backend accepted a call")


@check
def reopen_keeps_everything(kit: Kit) -> None:
    """After close and reopen every object is there, byte for byte, with its stat."""
    backend = kit.open()
    items = [*_items("keep", 40, 200 * KiB), ("empty", b"")]
    _write_all(backend, items)
    stats = {k: backend.stat(k) for k, _ in items}
    backend = kit.reopen(backend)
    for key, value in items:
        kit.assert_value(backend, key, value)
        record = backend.stat(key)
        assert record is not None and (record.size, record.checksum) == (
            stats[key].size, stats[key].checksum), f"stat of {key!r} changed across reopen"
    assert sum(1 for _ in backend.scan()) == len(items)


@check
def usage_tracks_contents(kit: Kit) -> None:
    """usage() counts objects and logical bytes exactly, and physical >= logical."""
    backend = kit.open()
    items = _items("u", 25, 100 * KiB)
    _write_all(backend, items)
    backend.batch_delete([k for k, _ in items[:5]])
    usage = backend.usage()
    live = items[5:]
    assert usage.objects == len(live), usage
    assert usage.logical_bytes == sum(len(v) for _, v in live), usage
    assert usage.physical_bytes >= usage.logical_bytes, usage


@check
def usage_stable_across_reopen(kit: Kit) -> None:
    """usage() is the same before and after a close and reopen."""
    backend = kit.open()
    items = _items("s", 30, 300 * KiB)
    _write_all(backend, items)
    backend.batch_delete([k for k, _ in items[::4]])
    before = backend.usage()
    backend = kit.reopen(backend)
    after = backend.usage()
    assert before == after, f"before reopen {before}, after {after}"


@check
def delete_stays_deleted(kit: Kit) -> None:
    """Deleted keys are gone at once and stay gone after a reopen; the rest survive."""
    backend = kit.open()
    items = _items("del", 12)
    _write_all(backend, items)
    gone = [k for k, _ in items[::3]]
    assert backend.batch_delete(gone) == [True] * len(gone)
    assert backend.batch_delete(gone) == [False] * len(gone), "a second delete found the keys"
    assert not any(backend.batch_contains(gone))
    backend = kit.reopen(backend)
    assert not any(backend.batch_contains(gone)), "a deleted key came back after reopen"
    assert not {r.key for r in backend.scan()} & set(gone), "scan lists a deleted key"
    for key, value in items:
        if key not in gone:
            kit.assert_value(backend, key, value)


@check
def delete_then_rewrite(kit: Kit) -> None:
    """A key deleted and written again reads the new value, also after a reopen."""
    backend = kit.open()
    _write_all(backend, [("r", b"old value")])
    kit.assert_value(backend, "r", b"old value")  # a read first, so caches get involved
    backend.batch_delete(["r"])
    _write_all(backend, [("r", b"new value!")])
    kit.assert_value(backend, "r", b"new value!")
    backend = kit.reopen(backend)
    kit.assert_value(backend, "r", b"new value!")


# -- crashes and corruption --------------------------------------------------------------


@check
def torn_write_process_killed(kit: Kit) -> None:
    """kill -9 in the middle of batches: acknowledged objects survive, and every object
    is complete and correct or absent."""
    try:
        options = json.dumps(kit.spec.options)
    except TypeError as exc:
        raise AssertionError(f"options must be JSON-serialisable for this check: {exc}") from None
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    child = subprocess.Popen(
        [sys.executable, "-m", _writer.__name__, kit.spec.target, options, str(kit.path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    acked = -1
    try:
        deadline = time.monotonic() + 60
        while acked < 5 and time.monotonic() < deadline:
            line = child.stdout.readline()
            if not line:
                raise AssertionError(f"the writer died: {child.stderr.read()[-2000:]}")
            acked = int(line.split()[1])
        time.sleep(random.uniform(0, 0.02))  # land the kill somewhere inside a batch
    finally:
        child.send_signal(signal.SIGKILL)
        rest, _ = child.communicate()
    for line in rest.splitlines():
        acked = max(acked, int(line.split()[1]))
    assert acked >= 5, "the writer acknowledged too few batches to test anything"
    backend = kit.open()
    for n in range(acked + 3):
        for key in _writer.batch_keys(n):
            value = payload(key, size_for(key, _writer.SIZE_LIMIT))
            got = kit.read(backend, key)
            if n <= acked:
                assert got == value, f"acknowledged {key!r} read back as {_describe(got)}"
            else:
                assert got in (value, ReadStatus.MISSING), f"{key!r} is {_describe(got)}"


def _describe(got) -> str:
    return got.name if isinstance(got, ReadStatus) else f"{len(got)} wrong bytes"


@check
def torn_write_truncated(kit: Kit) -> None:
    """A record cut short on disk (a torn write) reads as absent or corrupt after reopen,
    never as a value."""
    backend = kit.open()
    items = [*_items("t", 8, 64 * KiB), ("victim", payload("victim", 50000))]
    _write_all(backend, items)
    where = backend.locate("victim")
    backend.close()
    os.truncate(where.path, where.offset + where.length // 2)
    backend = kit.open()
    got = kit.read(backend, "victim", 50_000)
    assert got in (ReadStatus.MISSING, ReadStatus.CORRUPT), f"victim read as {_describe(got)}"
    for key, value in items[:-1]:
        got = kit.read(backend, key, len(value))
        assert got in (value, ReadStatus.MISSING, ReadStatus.CORRUPT), \
            f"{key!r} read as {_describe(got)}"


@check
def flipped_value_byte(kit: Kit) -> None:
    """One flipped byte in a value is reported CORRUPT, never returned, also after reopen."""
    backend = kit.open()
    _write_all(backend, [("f", payload("f", 20_000)), ("ok", payload("ok", 20_000))])
    where = backend.locate("f")
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
    _write_all(backend, [("h", payload("h", 9_000)), ("ok", payload("ok", 9_000))])
    where = backend.locate("h")
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
    items = _items("v", 6)
    _write_all(backend, items)
    where = backend.locate(items[2][0])
    flip_byte(where.path, where.offset + where.length // 2)
    verified = {r.key for r in backend.scan(verify=True)}
    assert verified == {k for k, _ in items} - {items[2][0]}, verified


@check
def check_clean_store(kit: Kit) -> None:
    """check() on an undamaged store reports no problems."""
    backend = kit.open()
    _write_all(backend, _items("c", 10))
    backend.batch_delete(["c/3"])
    report = backend.check()
    assert not report.problems, report.problems


@check
def check_finds_and_repairs(kit: Kit) -> None:
    """check() finds a damaged record; check(repair=True) quarantines it; then all is clean."""
    backend = kit.open()
    items = _items("x", 8, 32 * KiB)
    _write_all(backend, items)
    bad_key = items[3][0]
    where = backend.locate(bad_key)
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
            assert got in (value, ReadStatus.MISSING), f"{key!r} read as {_describe(got)}"


# -- scan, locate, capabilities ----------------------------------------------------------


@check
def scan_agrees_with_contains(kit: Kit) -> None:
    """scan() lists exactly the keys contains() admits, with right sizes and checksums."""
    backend = kit.open()
    items = _items("sc", 20)
    _write_all(backend, items)
    backend.batch_delete([k for k, _ in items[:5]])
    records = {r.key: r for r in backend.scan()}
    candidates = [k for k, _ in items]
    present = {k for k, hit in zip(candidates, backend.batch_contains(candidates)) if hit}
    assert set(records) == present, f"scan {sorted(records)} vs contains {sorted(present)}"
    for key, value in items[5:]:
        assert (records[key].size, records[key].checksum) == (len(value), crc32c(value))
        assert records[key].location == backend.locate(key)


@check
def locate_points_at_value(kit: Kit) -> None:
    """locate() gives the file and offset where the value's bytes really are."""
    backend = kit.open()
    items = _items("loc", 5, 50 * KiB)
    _write_all(backend, items)
    for key, value in items:
        where = backend.locate(key)
        assert where is not None and where.length == len(value), where
        assert read_location(where) == value, f"bytes at {where} are not {key!r}'s value"


@check
def capabilities_well_formed(kit: Kit) -> None:
    """capabilities reports typed fields, and max_value_size honours the option."""
    backend = kit.open(max_value_size=123_456)
    caps = backend.capabilities
    assert isinstance(caps, Capabilities)
    assert isinstance(caps.shared, bool) and isinstance(caps.persistent, bool)
    assert isinstance(caps.aligned_values, bool)
    assert isinstance(caps.eviction, EvictionGranularity)
    assert caps.max_value_size == 123_456


# -- capacity and eviction -----------------------------------------------------------


@check
def capacity_never_exceeded(kit: Kit) -> None:
    """Writes past the capacity evict or fail with CapacityError, and usage never exceeds
    the cap; what survives reads back correctly."""
    capacity = 4 * MiB
    evicted: list[str] = []
    backend = kit.open(capacity=capacity, on_evict=evicted.extend)
    stored: dict[str, bytes] = {}
    for n in range(12):
        items = _items(f"cap{n}", 4, 256 * KiB)
        for item, result in zip(items, backend.batch_write(items)):
            if result.outcome is WriteOutcome.WRITTEN:
                stored[item[0]] = item[1]
            else:
                assert isinstance(result.error, CapacityError), result
        usage = backend.usage()
        assert usage.physical_bytes <= capacity, f"usage {usage} exceeds capacity {capacity}"
    assert stored, "nothing could be written under a 4 MiB capacity"
    [huge] = backend.batch_write([("huge", bytes(6 * MiB))])
    assert huge.outcome is WriteOutcome.FAILED and isinstance(huge.error, CapacityError), huge
    assert not backend.contains("huge")
    for key, value in stored.items():
        got = kit.read(backend, key, len(value))
        if key in evicted:
            assert got == ReadStatus.MISSING, f"evicted {key!r} is still readable"
        else:
            assert got == value, f"{key!r} was neither kept nor reported evicted"


@check
def evict_reports_victims(kit: Kit) -> None:
    """evict() returns what it removed, calls back with the same keys first, and frees
    room."""
    backend = kit.open()
    items = _items("ev", 16, 128 * KiB)
    _write_all(backend, items)
    called: list[list[str]] = []
    before = backend.usage()
    victims = backend.evict(before.physical_bytes // 3, on_evict=lambda ks: called.append(ks))
    if backend.capabilities.eviction is EvictionGranularity.NONE:
        assert victims == [] and not called
        return
    assert victims, "evict() removed nothing from a backend full of unpinned objects"
    assert sorted(k for batch in called for k in batch) == sorted(victims)
    assert not any(backend.batch_contains(victims))
    after = backend.usage()
    assert after.objects == before.objects - len(victims)
    assert after.physical_bytes < before.physical_bytes
    backend = kit.reopen(backend)
    for key, value in items:
        if key not in victims:
            kit.assert_value(backend, key, value)


@check
def evict_callback_before_reuse(kit: Kit) -> None:
    """When on_evict runs, the victims' bytes are still intact on disk, even while another
    thread writes: their space is reused only after the callback."""
    backend = kit.open()
    items = _items("reuse", 24, 128 * KiB)
    _write_all(backend, items)
    places = {k: backend.locate(k) for k, _ in items}
    values = dict(items)
    damaged: list[str] = []
    stop = threading.Event()

    def writer() -> None:
        n = 0
        while not stop.is_set():
            backend.batch_write(_items(f"w{n}", 2, 128 * KiB))
            n += 1

    def on_evict(keys: list[str]) -> None:
        time.sleep(0.01)  # give the writer a chance to grab freed space, if it were free
        for key in keys:
            where = places.get(key)
            if where is None:
                continue
            try:
                intact = read_location(where) == values[key]
            except FileNotFoundError:
                intact = False
            if not intact:
                damaged.append(key)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        for _ in range(6):
            backend.evict(256 * KiB, on_evict=on_evict)
    finally:
        stop.set()
        thread.join()
    assert not damaged, f"victims' space was reused before the callback: {damaged[:5]}"


@check
def evict_skips_pinned(kit: Kit) -> None:
    """Pinned keys (a read in progress) are never evicted; once unpinned they can be."""
    backend = kit.open()
    items = _items("pin", 10, 64 * KiB)
    _write_all(backend, items)
    pinned = items[0][0]
    with backend.pin([pinned]):
        victims = backend.evict(10**12)
        assert pinned not in victims, "evict() removed a pinned key"
        kit.assert_value(backend, pinned, items[0][1])
    victims = backend.evict(10**12)
    if backend.capabilities.eviction is not EvictionGranularity.NONE:
        assert pinned in victims, "an unpinned key survived evicting everything"


@check
def reads_race_eviction(kit: Kit) -> None:
    """Reads racing eviction and writes on other threads return the right bytes or
    MISSING, never wrong bytes or CORRUPT."""
    backend = kit.open(capacity=6 * MiB)
    items = _items("race", 30, 256 * KiB)
    values = dict(items)
    backend.batch_write(items[:15])
    errors: list[str] = []
    stop = threading.Event()

    def reader() -> None:
        rng = random.Random()
        while not stop.is_set():
            key = rng.choice(items)[0]
            got = kit.read(backend, key, 256 * KiB)
            if got != values[key] and got != ReadStatus.MISSING:
                errors.append(f"{key}: {_describe(got)}")

    def churn() -> None:
        for n in range(40):
            backend.batch_write(_items(f"churn{n}", 2, 256 * KiB))
            backend.evict(512 * KiB)

    threads = [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        churn()
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors, errors[:5]


# -- concurrency -------------------------------------------------------------------------


@check
def concurrent_writers_and_readers(kit: Kit) -> None:
    """Four writer and four reader threads at once: every write lands, every read is right."""
    backend = kit.open()
    done: list[str] = []
    lock = threading.Lock()
    errors: list[str] = []
    stop = threading.Event()

    def writer(w: int) -> None:
        for key, value in _items(f"cw{w}", 25, 96 * KiB):
            [result] = backend.batch_write([(key, value)])
            if result.outcome is not WriteOutcome.WRITTEN:
                errors.append(f"write {key}: {result}")
            with lock:
                done.append(key)

    def reader() -> None:
        rng = random.Random()
        while not stop.is_set() or not done:
            with lock:
                key = rng.choice(done) if done else None
            if key is None:
                continue
            expected = payload(key, size_for(key, 96 * KiB))
            got = kit.read(backend, key, 96 * KiB)
            if got != expected:
                errors.append(f"read {key}: {_describe(got)}")

    writers = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
    readers = [threading.Thread(target=reader) for _ in range(4)]
    for t in writers + readers:
        t.start()
    for t in writers:
        t.join()
    stop.set()
    for t in readers:
        t.join()
    assert not errors, errors[:5]
    assert backend.usage().objects == 100


@check
def concurrent_same_key(kit: Kit) -> None:
    """Threads racing to write one key: exactly one value wins and every reader sees it."""
    backend = kit.open()
    outcomes: list[WriteOutcome] = []
    lock = threading.Lock()

    def writer(i: int) -> None:
        [result] = backend.batch_write([("contested", payload(f"v{i}", 50_000))])
        with lock:
            outcomes.append(result.outcome)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert outcomes.count(WriteOutcome.WRITTEN) == 1, outcomes
    assert outcomes.count(WriteOutcome.EXISTS) == 7, outcomes
    got = kit.read(backend, "contested")
    assert got in [payload(f"v{i}", 50_000) for i in range(8)], "the stored value is a mix"


@check
def invalid_request_is_raised(kit: Kit) -> None:
    """Mismatched keys and buffers raise InvalidRequestError instead of guessing."""
    backend = kit.open()
    try:
        backend.batch_read(["a", "b"], [memoryview(bytearray(1))])
    except InvalidRequestError:
        return
    raise AssertionError("batch_read accepted 2 keys with 1 buffer")

"""Conformance checks: Capacity and eviction."""

from __future__ import annotations

import random
import threading
import time

from kvstored.sdk.errors import (
    CapacityError,
)
from kvstored.sdk.testing.checks._common import (
    KiB,
    MiB,
    check,
    describe,
    make_items,
    write_all,
)
from kvstored.sdk.testing.kit import Kit, read_location
from kvstored.sdk.types import (
    EvictionGranularity,
    ReadStatus,
    WriteOutcome,
)

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
        items = make_items(f"cap{n}", 4, 256 * KiB)
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
    items = make_items("ev", 16, 128 * KiB)
    write_all(backend, items)
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
    items = make_items("reuse", 24, 128 * KiB)
    write_all(backend, items)
    places = {k: backend.locate(k) for k, _ in items}
    values = dict(items)
    damaged: list[str] = []
    stop = threading.Event()

    def writer() -> None:
        n = 0
        while not stop.is_set():
            backend.batch_write(make_items(f"w{n}", 2, 128 * KiB))
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
    items = make_items("pin", 10, 64 * KiB)
    write_all(backend, items)
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
    items = make_items("race", 30, 256 * KiB)
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
                errors.append(f"{key}: {describe(got)}")

    def churn() -> None:
        for n in range(40):
            backend.batch_write(make_items(f"churn{n}", 2, 256 * KiB))
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



"""Conformance checks: Capacity and eviction."""

from __future__ import annotations

import random
import threading
import time

from kvstored.sdk.errors import (
    CapacityError,
)
from kvstored.sdk.files import allocated_bytes
from kvstored.sdk.testing.checks._common import (
    Clause,
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


@check(Clause.CAPACITY)
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


@check(Clause.EVICTION)
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


@check(Clause.EVICTION)
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


@check(Clause.PINS)
def evict_skips_pinned(kit: Kit) -> None:
    """Pinned keys (a read in progress) are never evicted; once unpinned they can be."""
    backend = kit.open()
    items = make_items("pin", 10, 64 * KiB)
    values = dict(items)
    write_all(backend, items)
    pinned = [items[1][0], items[4][0], items[8][0]]
    with backend.pin(pinned):
        victims = backend.evict(10**12)
        assert not set(pinned) & set(victims), "evict() removed a pinned key"
        for key in pinned:
            kit.assert_value(backend, key, values[key])
    victims = backend.evict(10**12)
    if backend.capabilities.eviction is not EvictionGranularity.NONE:
        assert set(pinned) <= set(victims), "an unpinned key survived evicting everything"


@check(Clause.PINS)
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


@check(Clause.PINS)
def pins_hold_against_capacity_eviction(kit: Kit) -> None:
    """Every pinned key survives the evictions a backend does on its own to make room
    for writes (not only evict()), and reads back correctly while and after it is pinned."""
    evicted: list[str] = []
    backend = kit.open(capacity=4 * MiB, on_evict=evicted.extend)
    # Two batches (two buckets, for a bucket backend); the pinned keys are none of them
    # the first of their batch, so a backend that looks only at the first key of a unit,
    # or honours only the first key pinned, is caught.
    first = make_items("old", 8, 256 * KiB)
    write_all(backend, first[:4])
    write_all(backend, first[4:])
    pinned = [first[1][0], first[3][0], first[6][0]]
    values = dict(first)
    with backend.pin(pinned):
        for n in range(10):
            backend.batch_write(make_items(f"new{n}", 4, 256 * KiB))
        assert evicted or backend.capabilities.eviction is EvictionGranularity.NONE, \
            "writing 10 MiB into 4 MiB evicted nothing, so pins were not tested"
        assert not set(pinned) & set(evicted), \
            f"the backend's own eviction reported pinned keys as evicted: " \
            f"{sorted(set(pinned) & set(evicted))}"
        for key in pinned:
            got = kit.read(backend, key, 256 * KiB)
            assert got == values[key], f"pinned {key!r} read as {describe(got)} after the " \
                                       "backend evicted to make room"
    for key in pinned:
        kit.assert_value(backend, key, values[key])


#: Disk a store's files may take beyond its capacity: its stamp, lock and other small
#: fixed files.
FIXED_FILES_SLACK = 16 * KiB
#: How much more the files may grow than physical_bytes does: one block the file system
#: may add to a file's extent map.
GROWTH_SLACK = 4 * KiB


@check(Clause.CAPACITY)
def disk_use_measured(kit: Kit) -> None:
    """Measured, not trusted: the blocks (st_blocks) of the store's files never pass the
    capacity, and the disk the files grow by is counted in physical_bytes (headers,
    padding and index included)."""
    capacity = 4 * MiB
    backend = kit.open(capacity=capacity)
    empty_disk, empty_physical = allocated_bytes(kit.path), backend.usage().physical_bytes
    for n in range(10):
        backend.batch_write(make_items(f"disk{n}", 6, 200 * KiB))
        disk, usage = allocated_bytes(kit.path), backend.usage()
        grown = disk - empty_disk
        assert disk <= capacity + FIXED_FILES_SLACK, \
            f"the store's files occupy {disk} bytes of disk, more than its capacity " \
            f"{capacity} (usage says {usage.physical_bytes})"
        assert grown <= usage.physical_bytes - empty_physical + GROWTH_SLACK, \
            f"the store's files grew by {grown} bytes of disk but physical_bytes only by " \
            f"{usage.physical_bytes - empty_physical}: headers, padding or index uncounted"


@check(Clause.USAGE)
def counters_match_model(kit: Kit) -> None:
    """usage()'s objects and logical_bytes equal a model of what was written, evicted
    (by the backend, to make room, and by evict()) and deleted, under concurrent
    writers, and again after a reopen."""
    evicted: list[str] = []
    lock = threading.Lock()

    def on_evict(keys: list[str]) -> None:
        with lock:
            evicted.extend(keys)

    backend = kit.open(capacity=6 * MiB, on_evict=on_evict)
    written: dict[str, int] = {}
    errors: list[str] = []

    def writer(w: int) -> None:
        for n in range(8):
            items = make_items(f"m{w}/{n}", 3, 160 * KiB)
            for (key, value), result in zip(items, backend.batch_write(items)):
                if result.outcome is WriteOutcome.WRITTEN:
                    with lock:
                        written[key] = len(value)
                elif not isinstance(result.error, CapacityError):
                    errors.append(f"{key}: {result}")
            if n % 3 == 2:
                on_evict(backend.evict(300 * KiB))

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    deleted = [k for k in list(written)[::5] if k not in evicted]
    backend.batch_delete(deleted)

    def expect(backend, what: str) -> None:
        live = {k: n for k, n in written.items() if k not in evicted and k not in deleted}
        present = dict(zip(written, backend.batch_contains(list(written))))
        wrong = [k for k in written if present[k] != (k in live)]
        assert not wrong, f"{what}: contains() disagrees with the model for {wrong[:5]}"
        usage = backend.usage()
        assert (usage.objects, usage.logical_bytes) == (len(live), sum(live.values())), \
            f"{what}: usage {usage} but the model holds {len(live)} objects of " \
            f"{sum(live.values())} bytes"

    expect(backend, "after concurrent writes and evictions")
    if backend.capabilities.persistent:
        expect(kit.reopen(backend), "after a reopen")


@check(Clause.EVICTION)
def evict_frees_what_was_asked(kit: Kit) -> None:
    """evict(n) frees at least n bytes (physical_bytes drops by n or more) and at most n
    plus one eviction unit (an object, or for a bucket backend one bucket): it neither
    stops short nor empties the store."""
    backend = kit.open()
    caps = backend.capabilities
    if caps.eviction is EvictionGranularity.NONE:
        assert backend.evict(1) == [], "a backend that never evicts evicted"
        return
    unit = 0 if caps.eviction is EvictionGranularity.OBJECT else \
        backend.write_batch_hint().max_bytes
    for round_number, share in enumerate((0, 4)):
        for n in range(8):
            write_all(backend, make_items(f"unit{round_number}/{n}", 4, 96 * KiB))
        sizes = {r.key: r.size for r in backend.scan()}
        ask = backend.usage().logical_bytes // share if share else 1
        before = backend.usage()
        victims = backend.evict(ask)
        after = backend.usage()
        freed = before.physical_bytes - after.physical_bytes
        assert freed >= ask, f"evict({ask}) freed {freed} bytes, evicting {len(victims)}"
        logical = sum(sizes[k] for k in victims)
        largest = max((sizes[k] for k in victims), default=0)
        if caps.eviction is EvictionGranularity.OBJECT:
            assert logical - largest < ask, \
                f"evict({ask}) evicted {len(victims)} objects of {logical} bytes: more " \
                "than one object beyond what was asked"
        else:
            assert logical < ask + unit, \
                f"evict({ask}) evicted {logical} bytes, more than one bucket ({unit}) " \
                "beyond what was asked"
        if caps.eviction is EvictionGranularity.OBJECT:
            assert after.objects > 0, f"evict({ask}) emptied the store"

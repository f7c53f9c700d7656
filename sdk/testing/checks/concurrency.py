"""Conformance checks: Concurrency."""

from __future__ import annotations

import random
import sys
import threading
import time

from kvstored.sdk.errors import (
    InvalidRequestError,
)
from kvstored.sdk.testing.checks._common import (
    Clause,
    KiB,
    check,
    describe,
    make_items,
    write_all,
)
from kvstored.sdk.testing.kit import Kit, payload, size_for
from kvstored.sdk.types import (
    WriteOutcome,
    WriteResult,
)

# -- concurrency -------------------------------------------------------------------------


@check(Clause.BLOCKING)
def concurrent_writers_and_readers(kit: Kit) -> None:
    """Four writer and four reader threads at once: every write lands, every read is right."""
    backend = kit.open()
    done: list[str] = []
    lock = threading.Lock()
    errors: list[str] = []
    stop = threading.Event()

    def writer(w: int) -> None:
        for key, value in make_items(f"cw{w}", 25, 96 * KiB):
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
                errors.append(f"read {key}: {describe(got)}")

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


@check(Clause.WRITE_ONCE)
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


#: How long a round of the opposite-order check may take before it counts as a deadlock:
#: a round takes under a second even on a loaded machine (file-per-key, which fsyncs
#: every file: 0.6 s at a load of 14 on two CPUs), so this is generous, and it is paid
#: only by a backend that hangs.
DEADLOCK_TIMEOUT = 10.0

#: Rounds of the opposite-order race, and the new keys each round's batches share.
RACE_ROUNDS, RACE_KEYS = 8, 32

#: Stored keys put before each new key of a race batch. They cost a backend no I/O (it
#: answers EXISTS from its index) but make claiming a batch's keys take long enough
#: (thousands of entries) that the two writers are claiming at the same time even when
#: one of them gets a CPU a few milliseconds late on a loaded machine; without them a
#: batch of new keys only is claimed in well under a millisecond, and a backend that
#: deadlocks is caught in about half the rounds instead of nearly all.
RACE_PADDING = 256


@check(Clause.BLOCKING)
def opposite_order_batches(kit: Kit) -> None:
    """Two threads writing overlapping multi-key batches in opposite orders both finish
    (no deadlock), and each key ends up written exactly once."""
    backend = kit.open()
    stored = [(f"oo-stored/{i}", payload(f"oo-stored/{i}", 512)) for i in range(8)]
    write_all(backend, stored)
    padding = stored * (RACE_PADDING // len(stored))
    for round_number in range(RACE_ROUNDS):
        keys = [f"oo{round_number}/{i}" for i in range(RACE_KEYS)]
        new = [(k, payload(k, 512)) for k in keys]
        batches = {"forward": [x for item in new for x in (*padding, item)],
                   "backward": [x for item in new[::-1] for x in (*padding, item)]}
        results = _race(kit, backend, batches, f"round {round_number}")
        outcomes: dict[str, list[str]] = {key: [] for key in keys}
        for name, got in results.items():
            assert len(got) == len(batches[name]), \
                f"round {round_number}: {name} got {len(got)} results for " \
                f"{len(batches[name])} items"
            for (key, _), result in zip(batches[name], got):
                if key in outcomes:
                    outcomes[key].append(result.outcome.value)
                elif result.outcome is not WriteOutcome.EXISTS:
                    raise AssertionError(f"round {round_number}: {name} wrote {key!r}, "
                                         f"stored before the race, again: {result}")
        for key, got in outcomes.items():
            assert sorted(got) == ["exists", "written"], \
                f"round {round_number}: {key!r} was {sorted(got)} by the two writers"
        for key in keys[::7]:
            kit.assert_value(backend, key, payload(key, 512))
    for key, value in stored:
        kit.assert_value(backend, key, value)


def _race(kit: Kit, backend, batches: dict[str, list[tuple[str, bytes]]],
          what: str) -> dict[str, list[WriteResult]]:
    """Write ``batches`` from one thread each, started together; their results by name.
    Fails (without hanging) if they do not finish in time."""
    start = threading.Barrier(len(batches))
    results: dict[str, list[WriteResult]] = {}
    failures: list[str] = []

    def writer(name: str) -> None:
        try:
            start.wait()
            results[name] = backend.batch_write(batches[name])
        except Exception as exc:  # reported below
            failures.append(f"{name}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=writer, args=(name,), daemon=True,
                                name=f"kit-{name}") for name in batches]
    # Hand the interpreter between threads every microsecond instead of every 5 ms, so
    # that the writers interleave even where claiming a batch's keys takes no I/O at all
    # (one writer would otherwise claim all its keys before the other starts).
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for t in threads:
            t.start()
        deadline = time.monotonic() + DEADLOCK_TIMEOUT
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
    finally:
        sys.setswitchinterval(interval)
    if any(t.is_alive() for t in threads):
        kit.abandon(backend)  # its threads hold it: closing it could hang the kit too
        raise AssertionError(
            f"{what}: batch_write calls naming the same keys in opposite orders were still "
            f"running after {DEADLOCK_TIMEOUT:.0f} s (a deadlock: a writer waits for "
            "another's key claim while holding its own; see kvstored.sdk.claims)")
    assert not failures, failures
    return results


@check(Clause.ERRORS)
def invalid_request_is_raised(kit: Kit) -> None:
    """Mismatched keys and buffers raise InvalidRequestError instead of guessing."""
    backend = kit.open()
    try:
        backend.batch_read(["a", "b"], [memoryview(bytearray(1))])
    except InvalidRequestError:
        return
    raise AssertionError("batch_read accepted 2 keys with 1 buffer")

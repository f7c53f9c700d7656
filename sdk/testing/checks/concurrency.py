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
)
from kvstored.sdk.testing.kit import Kit, payload, size_for
from kvstored.sdk.types import (
    WriteOutcome,
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
#: generous, since a loaded machine is slow, and paid only by a backend that hangs.
DEADLOCK_TIMEOUT = 20.0


@check(Clause.BLOCKING)
def opposite_order_batches(kit: Kit) -> None:
    """Two threads writing overlapping multi-key batches in opposite orders both finish
    (no deadlock), and each key ends up written exactly once."""
    backend = kit.open()
    for round_number in range(8):
        keys = [f"oo{round_number}/{i}" for i in range(256)]
        results = _race(kit, backend, {"forward": keys, "backward": keys[::-1]},
                        f"round {round_number}")
        for n, key in enumerate(keys):
            got = sorted([results["forward"][n].outcome.value,
                          results["backward"][len(keys) - 1 - n].outcome.value])
            assert got == ["exists", "written"], \
                f"round {round_number}: {key!r} was {got} by the two writers"
        for key in keys[::37]:
            kit.assert_value(backend, key, payload(key, 512))


def _race(kit: Kit, backend, orders: dict[str, list[str]], what: str) -> dict[str, list]:
    """Write the batches of ``orders`` from one thread each, started together; their
    results by name. Fails (without hanging) if they do not finish in time."""
    start = threading.Barrier(len(orders))
    results: dict[str, list] = {}
    failures: list[str] = []

    def writer(name: str) -> None:
        try:
            start.wait()
            results[name] = backend.batch_write([(k, payload(k, 512)) for k in orders[name]])
        except Exception as exc:  # reported below
            failures.append(f"{name}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=writer, args=(name,), daemon=True,
                                name=f"kit-{name}") for name in orders]
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

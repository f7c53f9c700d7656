"""Conformance checks: Lifecycle and persistence: close, reopen, usage, deletes."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

from crc32c import crc32c

from kvstored.sdk.errors import (
    BackendClosedError,
)
from kvstored.sdk.testing import _deleter
from kvstored.sdk.testing.checks._common import (
    Clause,
    KiB,
    check,
    child_env,
    child_target,
    make_items,
    spec_options,
    stat_of,
    write_all,
)
from kvstored.sdk.testing.kit import Kit, Requirement, payload
from kvstored.sdk.types import EvictionGranularity

# -- lifecycle and persistence -----------------------------------------------------------


@check(Clause.CLOSE)
def close_refuses_every_method(kit: Kit) -> None:
    """close() twice is fine; afterwards every method and property of the contract,
    capabilities and write_batch_hint included, raises BackendClosedError, and so does
    the next step of a scan() or a read_stream() begun before the close."""
    backend = kit.open()
    write_all(backend, make_items("closed", 5, 4 * KiB))
    unfinished = backend.scan()
    next(unfinished)
    streaming = backend.read_stream([f"closed/{n}" for n in range(5)],
                                    [memoryview(bytearray(4 * KiB)) for _ in range(5)])
    next(streaming)
    backend.close()
    backend.close()
    calls = {
        "batch_read": lambda: backend.batch_read(["closed/0"], [memoryview(bytearray(8))]),
        "batch_write": lambda: backend.batch_write([("j", b"v")]),
        "batch_delete": lambda: backend.batch_delete(["closed/0"]),
        "batch_contains": lambda: backend.batch_contains(["closed/0"]),
        "stat": lambda: backend.stat("closed/0"),
        "batch_versions": lambda: backend.batch_versions(["closed/0"]),
        "locate": lambda: backend.locate("closed/0"),
        "scan": lambda: next(backend.scan()),
        "scan (unfinished)": lambda: next(unfinished),
        "read_stream": lambda: backend.read_stream(["closed/0"], [memoryview(bytearray(8))]),
        "read_stream (unfinished)": lambda: next(streaming),
        "usage": backend.usage,
        "evict": lambda: backend.evict(1),
        "check": backend.check,
        "capabilities": lambda: backend.capabilities,
        "write_batch_hint": backend.write_batch_hint,
        "pin": lambda: backend.pin(["closed/0"]),
        "contains": lambda: backend.contains("closed/0"),
        "read": lambda: backend.read("closed/0"),
    }
    accepted = []
    for name, call in calls.items():
        try:
            call()
        except BackendClosedError:
            continue
        except StopIteration:
            pass
        accepted.append(name)
    assert not accepted, f"a closed backend accepted {', '.join(accepted)}"


@check(Clause.DELETES, Requirement.PERSISTENT, Requirement.CHILD_PROCESS)
def deletes_survive_kill(kit: Kit) -> None:
    """Deletes and evictions are durable when they return: a process killed with SIGKILL
    right after batch_delete and evict never brings the keys back."""
    child = subprocess.Popen(
        [sys.executable, "-m", _deleter.__name__, child_target(kit), spec_options(kit),
         str(kit.path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env=child_env())
    assert child.stdout is not None
    try:
        line = child.stdout.readline()
    finally:
        child.send_signal(signal.SIGKILL)
        _, err = child.communicate()
    assert line.startswith("DONE "), f"the deleting process failed: {line}{err[-2000:]}"
    removed = json.loads(line[5:])
    backend = kit.open()
    gone = removed["deleted"] + removed["evicted"]
    back = [k for k, hit in zip(gone, backend.batch_contains(gone)) if hit]
    assert not back, f"keys deleted or evicted before the kill came back: {back[:5]}"
    assert not {r.key for r in backend.scan()} & set(gone), "scan lists a removed key"
    for i, key in enumerate(_deleter.keys()):
        if key not in gone:
            kit.assert_value(backend, key, payload(key, 3000 + 97 * i))


@check(Clause.ATOMICITY, Requirement.PERSISTENT)
def reopen_keeps_everything(kit: Kit) -> None:
    """After close and reopen every object is there, byte for byte, with its stat."""
    backend = kit.open()
    items = [*make_items("keep", 40, 200 * KiB), ("empty", b"")]
    write_all(backend, items)
    stats = {k: backend.stat(k) for k, _ in items}
    backend = kit.reopen(backend)
    for key, value in items:
        kit.assert_value(backend, key, value)
        record = backend.stat(key)
        before = stats[key]
        assert before is not None, f"stat of {key!r} gave nothing before the reopen"
        assert record is not None and (record.size, record.checksum) == (
            before.size, before.checksum), f"stat of {key!r} changed across reopen"
    assert sum(1 for _ in backend.scan()) == len(items)


@check(Clause.USAGE)
def usage_tracks_contents(kit: Kit) -> None:
    """usage() counts objects and logical bytes exactly, and physical >= logical."""
    backend = kit.open()
    items = make_items("u", 25, 100 * KiB)
    write_all(backend, items)
    backend.batch_delete([k for k, _ in items[:5]])
    usage = backend.usage()
    live = items[5:]
    assert usage.objects == len(live), usage
    assert usage.logical_bytes == sum(len(v) for _, v in live), usage
    assert usage.physical_bytes >= usage.logical_bytes, usage


@check(Clause.USAGE, Requirement.PERSISTENT)
def usage_stable_across_reopen(kit: Kit) -> None:
    """usage() is the same before and after a close and reopen."""
    backend = kit.open()
    items = make_items("s", 30, 300 * KiB)
    write_all(backend, items)
    backend.batch_delete([k for k, _ in items[::4]])
    before = backend.usage()
    backend = kit.reopen(backend)
    after = backend.usage()
    assert before == after, f"before reopen {before}, after {after}"


@check(Clause.DELETES, Requirement.PERSISTENT)
def delete_stays_deleted(kit: Kit) -> None:
    """Deleted keys are gone at once and stay gone after a reopen; the rest survive."""
    backend = kit.open()
    items = make_items("del", 12)
    write_all(backend, items)
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


@check(Clause.DELETES)
def rewrite_after_delete_or_evict(kit: Kit) -> None:
    """A key deleted (or evicted) and written again with new bytes of the same size
    reads the new bytes, with the new checksum, never the old ones (no stale cache,
    index entry or slot), also after a reopen."""
    backend = kit.open()
    persistent = backend.capabilities.persistent
    evicts = backend.capabilities.eviction is not EvictionGranularity.NONE
    expected: dict[str, bytes] = {}
    for generation in range(3):
        items = [(f"same/{n}", payload(f"same/{n}#{generation}", size))
                 for n, size in enumerate((100, 4096, 40_000))]
        if generation:
            if generation == 2 and evicts:
                backend.evict(10**15)
            else:
                backend.batch_delete([k for k, _ in items])
            assert not any(backend.batch_contains([k for k, _ in items])), "still present"
        write_all(backend, items)
        for key, value in items:
            kit.assert_value(backend, key, value)
            kit.assert_value(backend, key, value)
            record = backend.stat(key)
            assert record is not None and record.checksum == crc32c(value), \
                f"stat of rewritten {key!r} has the old checksum"
        expected = dict(items)
    if persistent:
        backend = kit.reopen(backend)
        for key, value in expected.items():
            kit.assert_value(backend, key, value)


@check(Clause.SEQ, Requirement.PERSISTENT)
def seq_grows_across_reopen(kit: Kit) -> None:
    """seq numbers rise with every write, are kept by a reopen, and a write after the
    reopen gets a seq larger than every stored object's."""
    backend = kit.open()
    seqs = []
    for n in range(6):
        write_all(backend, [(f"seq/{n}", payload(f"seq/{n}", 500))])
        seqs.append(stat_of(backend, f"seq/{n}").seq)
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs), f"seqs do not rise: {seqs}"
    backend.batch_delete(["seq/5"])  # the highest seq is gone: it must not be handed out
    backend = kit.reopen(backend)
    again = [stat_of(backend, f"seq/{n}").seq for n in range(5)]
    assert again == seqs[:5], f"a reopen changed the seqs: {seqs[:5]} -> {again}"
    write_all(backend, [("seq/after", b"later")])
    after = stat_of(backend, "seq/after").seq
    assert after > max(again), f"a write after reopen got seq {after}, not above the " \
                               f"stored objects' {max(again)}"


@check(Clause.DELETES, Requirement.PERSISTENT)
def delete_then_rewrite(kit: Kit) -> None:
    """A key deleted and written again reads the new value, also after a reopen."""
    backend = kit.open()
    write_all(backend, [("r", b"old value")])
    kit.assert_value(backend, "r", b"old value")  # a read first, so caches get involved
    backend.batch_delete(["r"])
    write_all(backend, [("r", b"new value!")])
    kit.assert_value(backend, "r", b"new value!")
    backend = kit.reopen(backend)
    kit.assert_value(backend, "r", b"new value!")



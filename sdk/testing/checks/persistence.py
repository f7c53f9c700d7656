"""Conformance checks: Lifecycle and persistence: close, reopen, usage, deletes."""

from __future__ import annotations

from kvstored.sdk.errors import (
    BackendClosedError,
)
from kvstored.sdk.testing.checks._common import (
    KiB,
    check,
    make_items,
    write_all,
)
from kvstored.sdk.testing.kit import Kit

# -- lifecycle and persistence -----------------------------------------------------------


@check
def close_is_idempotent(kit: Kit) -> None:
    """close() twice is fine; any use after close raises BackendClosedError."""
    backend = kit.open()
    write_all(backend, [("k", b"v")])
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


@check
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


@check
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


@check
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


@check
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



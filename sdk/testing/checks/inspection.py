"""Conformance checks: scan, locate and capabilities."""

from __future__ import annotations

from crc32c import crc32c

from kvstored.sdk.testing.checks._common import (
    KiB,
    check,
    make_items,
    write_all,
)
from kvstored.sdk.testing.kit import Kit, read_location
from kvstored.sdk.types import (
    Capabilities,
    EvictionGranularity,
)

# -- scan, locate, capabilities ----------------------------------------------------------


@check
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


@check
def locate_points_at_value(kit: Kit) -> None:
    """locate() gives the file and offset where the value's bytes really are."""
    backend = kit.open()
    items = make_items("loc", 5, 50 * KiB)
    write_all(backend, items)
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



"""What the checks share: the registry, the @check decorator and small helpers."""

from __future__ import annotations

from crc32c import crc32c
from kvstored.sdk.testing.kit import Check, Kit, payload, size_for
from kvstored.sdk.types import (
    ReadStatus,
    WriteOutcome,
)

KiB, MiB = 1024, 1024 * 1024

#: Every check, by the module that defines it, in definition order.
REGISTERED: dict[str, list[Check]] = {}


def check(function):
    """Register a check function; its name and docstring become the check's."""
    REGISTERED.setdefault(function.__module__.rsplit(".", 1)[-1], []).append(
        Check(function.__name__, function))
    return function


def roundtrip_of_size(kit: Kit, size: int) -> None:
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


def write_all(backend, items) -> None:
    results = backend.batch_write(items)
    bad = [r for r in results if r.outcome is not WriteOutcome.WRITTEN]
    assert not bad, f"writes failed: {bad[:3]}"


def make_items(prefix: str, count: int, size_limit: int = 64 * KiB) -> list[tuple[str, bytes]]:
    keys = [f"{prefix}/{i}" for i in range(count)]
    return [(k, payload(k, size_for(k, size_limit))) for k in keys]


def describe(got) -> str:
    return got.name if isinstance(got, ReadStatus) else f"{len(got)} wrong bytes"

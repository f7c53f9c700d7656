"""What the checks share: the registry, the @check decorator and small helpers."""

from __future__ import annotations

import enum
import json
import os
import random
import signal
import subprocess
import sys
import time

from crc32c import crc32c

from kvstored.sdk.backend import StorageBackend
from kvstored.sdk.testing import _writer
from kvstored.sdk.testing.kit import Check, Kit, Requirement, payload, size_for
from kvstored.sdk.types import (
    Location,
    ObjectRecord,
    ReadStatus,
    WriteOutcome,
)

KiB, MiB = 1024, 1024 * 1024

#: Every check, by the module that defines it, in definition order.
REGISTERED: dict[str, list[Check]] = {}


class Clause(enum.Enum):
    """The contract's clauses, named as the headings of :mod:`kvstored.sdk.backend`'s
    docstring; every check proves one."""

    KEYS = "Keys"
    BUFFERS = "Buffers"
    BLOCKING = "Blocking and threads"
    ATOMICITY = "Atomicity and durability"
    WRITE_ONCE = "Write-once"
    BATCHES = "Batch failures"
    INTEGRITY = "Integrity"
    STREAMS = "Read streams"
    RECORDS = "Records that check"
    DELETES = "Deletes"
    CAPACITY = "Capacity"
    EVICTION = "Eviction"
    PINS = "Pins"
    USAGE = "Usage"
    SCAN = "Scan"
    SEQ = "Sequence numbers"
    CHECK = "Check and repair"
    CLOSE = "After close"
    OPENING = "Opening, and who else may"
    SHARING = "Sharing"
    CAPABILITIES = "Capabilities"
    ERRORS = "Errors"
    VERSION = "Versions"


def check(clause: Clause, *requires: Requirement):
    """Register a check function for ``clause``; its name and docstring become the
    check's, and it runs only on backends that meet ``requires``."""

    def register(function):
        REGISTERED.setdefault(function.__module__.rsplit(".", 1)[-1], []).append(
            Check(function.__name__, function, clause.value, frozenset(requires)))
        return function

    return register


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


def located(backend: StorageBackend, key: str) -> Location:
    """``backend.locate(key)``, which must not be None (the key was just written)."""
    where = backend.locate(key)
    assert where is not None, f"locate({key!r}) is None for a stored key"
    return where


def stat_of(backend: StorageBackend, key: str) -> ObjectRecord:
    """``backend.stat(key)``, which must not be None (the key was just written)."""
    record = backend.stat(key)
    assert record is not None, f"stat({key!r}) is None for a stored key"
    return record


def write_all(backend, items) -> None:
    results = backend.batch_write(items)
    bad = [r for r in results if r.outcome is not WriteOutcome.WRITTEN]
    assert not bad, f"writes failed: {bad[:3]}"


def make_items(prefix: str, count: int, size_limit: int = 64 * KiB) -> list[tuple[str, bytes]]:
    keys = [f"{prefix}/{i}" for i in range(count)]
    return [(k, payload(k, size_for(k, size_limit))) for k in keys]


def describe(got) -> str:
    return got.name if isinstance(got, ReadStatus) else f"{len(got)} wrong bytes"


def child_env() -> dict[str, str]:
    """The environment of a kit child process: this one's, with its import path."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}


def spec_options(kit: Kit) -> str:
    return json.dumps(kit.spec.options)


def child_target(kit: Kit) -> str:
    """The reference a child process opens the backend by (checks that start one require
    :attr:`Requirement.CHILD_PROCESS`, so there is one)."""
    assert kit.spec.target is not None
    return kit.spec.target


def kill_writer_midway(kit: Kit) -> int:
    """Run the kit's writer (:mod:`kvstored.sdk.testing._writer`) on the workspace in a
    child process and kill -9 it in the middle of a batch, after at least 6 acknowledged
    batches; return the number of the last batch acknowledged."""
    child = subprocess.Popen(
        [sys.executable, "-m", _writer.__name__, child_target(kit), spec_options(kit),
         str(kit.path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=child_env())
    assert child.stdout is not None and child.stderr is not None  # both piped
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
    return acked

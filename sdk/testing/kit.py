"""The machinery under the conformance checks: a backend spec, a per-check workspace,
deterministic payloads and on-disk damage."""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvstored.sdk.backend import StorageBackend
from kvstored.sdk.registry import open_backend
from kvstored.sdk.types import Location, ReadStatus

#: The kit opens backends with this max_value_size unless told otherwise, so that the
#: "maximum size" round trip stays quick. ``--option max_value_size=…`` overrides it.
KIT_MAX_VALUE_SIZE = 8 * 1024 * 1024


@dataclass(frozen=True)
class BackendSpec:
    """What to test: a registered name or ``module:Class``, and its options."""

    target: str
    options: dict[str, Any] = field(default_factory=dict)

    def open(self, path: Path, **extra: Any) -> StorageBackend:
        options = {"max_value_size": KIT_MAX_VALUE_SIZE, **self.options, **extra}
        return open_backend(self.target, path, **options)


def payload(key: str, size: int) -> bytes:
    """The deterministic value the kit stores under ``key``: any process can rebuild it."""
    return random.Random(f"kvstored-kit:{key}:{size}").randbytes(size)


def size_for(key: str, limit: int) -> int:
    """A deterministic size in ``[0, limit)`` derived from the key."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little") % limit


def flip_byte(path: str, offset: int) -> None:
    """Invert one byte of a file or device in place, and make it durable."""
    fd = os.open(path, os.O_RDWR)
    try:
        (old,) = os.pread(fd, 1, offset) or b"\0"
        os.pwrite(fd, bytes([old ^ 0xFF]), offset)
        os.fsync(fd)
    finally:
        os.close(fd)


def read_location(location: Location) -> bytes:
    """The bytes at ``location``, read with plain file I/O (not through the backend)."""
    fd = os.open(location.path, os.O_RDONLY)
    try:
        return os.pread(fd, location.length, location.offset)
    finally:
        os.close(fd)


class Kit:
    """A check's workspace: a fresh directory and the backends opened on it.

    ``kit.open()`` opens the backend under test on the workspace; ``kit.reopen(b)``
    closes ``b`` and opens again with the same options; everything still open is closed
    when the check ends.
    """

    def __init__(self, spec: BackendSpec, workspace: Path) -> None:
        self.spec = spec
        self.workspace = workspace
        self.path = workspace / "store"
        self._open: list[StorageBackend] = []
        self._last_extra: dict[str, Any] = {}

    def open(self, **extra: Any) -> StorageBackend:
        self._last_extra = extra
        backend = self.spec.open(self.path, **extra)
        self._open.append(backend)
        return backend

    def reopen(self, backend: StorageBackend) -> StorageBackend:
        backend.close()
        return self.open(**self._last_extra)

    def abandon(self, backend: StorageBackend) -> None:
        """Leave ``backend`` open when the check ends (threads the check gave up on still
        use it, so closing it could hang)."""
        self._open = [b for b in self._open if b is not backend]

    def close_all(self) -> None:
        for backend in self._open:
            backend.close()
        self._open.clear()

    # -- assertions used by many checks ----------------------------------------------

    @staticmethod
    def read(backend: StorageBackend, key: str, capacity: int | None = None) -> bytes | int:
        """The value of ``key``, or the negative status the backend reported."""
        record = backend.stat(key)
        size = capacity if capacity is not None else (record.size if record else 1)
        buf = bytearray(max(size, 1))
        got = backend.batch_read([key], [memoryview(buf)])[0]
        return bytes(buf[:got]) if got >= 0 else ReadStatus(got)

    def assert_value(self, backend: StorageBackend, key: str, expected: bytes) -> None:
        got = self.read(backend, key)
        if not isinstance(got, bytes):
            raise AssertionError(f"reading {key!r} gave {ReadStatus(got).name}, expected "
                                 f"{len(expected)} bytes")
        if got != expected:
            raise AssertionError(f"reading {key!r} gave wrong bytes ({len(got)} bytes, "
                                 f"expected {len(expected)}; first difference at "
                                 f"{_first_difference(got, expected)})")


def _first_difference(a: bytes, b: bytes) -> int:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


class NotApplicable(Exception):
    """Raised by a check that does not apply to this backend, or cannot run on this
    machine; the kit reports it as not applicable, with this reason, never as a pass."""


@dataclass
class CheckOutcome:
    name: str
    passed: bool
    seconds: float
    doc: str
    error: str | None = None
    #: Why the check does not apply (then ``passed`` is True and nothing was proven).
    not_applicable: str | None = None


@dataclass(frozen=True)
class Check:
    name: str
    function: Callable[[Kit], None]

    @property
    def doc(self) -> str:
        first_paragraph = (self.function.__doc__ or "").strip().split("\n\n")[0]
        return " ".join(first_paragraph.split())

    def run(self, spec: BackendSpec, workspace: Path) -> None:
        kit = Kit(spec, workspace)
        try:
            self.function(kit)
        finally:
            kit.close_all()


def run_checks(spec: BackendSpec, checks: list[Check], directory: Path | None = None,
               progress: Callable[[CheckOutcome], None] | None = None) -> list[CheckOutcome]:
    """Run ``checks`` against ``spec``, each in a fresh folder under ``directory``."""
    base = Path(tempfile.mkdtemp(prefix="kvstored-kit-", dir=directory))
    outcomes = []
    try:
        for check in checks:
            workspace = base / check.name
            workspace.mkdir()
            started = time.perf_counter()
            error = not_applicable = None
            try:
                check.run(spec, workspace)
            except NotApplicable as exc:
                not_applicable = str(exc)
            except Exception as exc:  # the table reports every kind of failure
                error = f"{type(exc).__name__}: {exc}"
                if not isinstance(exc, AssertionError):
                    error += "\n" + "".join(traceback.format_exception(exc)[-3:])
            outcome = CheckOutcome(check.name, error is None, time.perf_counter() - started,
                                   check.doc, error, not_applicable)
            outcomes.append(outcome)
            if progress:
                progress(outcome)
            shutil.rmtree(workspace, ignore_errors=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return outcomes

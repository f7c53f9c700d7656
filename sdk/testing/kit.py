"""The machinery under the conformance checks: a backend spec, a per-check workspace,
deterministic payloads and on-disk damage."""

from __future__ import annotations

import enum
import hashlib
import importlib
import json
import os
import random
import shutil
import tempfile
import time
import traceback
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvstored.sdk.backend import StorageBackend
from kvstored.sdk.registry import backend_class, known_backends, open_backend
from kvstored.sdk.types import Capabilities, Location, ReadStatus

#: The kit opens backends with this max_value_size unless told otherwise, so that the
#: "maximum size" round trip stays quick. ``--option max_value_size=…`` overrides it.
KIT_MAX_VALUE_SIZE = 8 * 1024 * 1024


#: What a backend is opened with: ``make_backend(path, **options)`` returns an open
#: backend. A StorageBackend subclass is one (its constructor), and so is any function of
#: that shape; the options are the kit's (``max_value_size``, ``capacity``, ``on_evict``,
#: ``mode``) merged with the ones the kit was given.
BackendFactory = Callable[..., StorageBackend]


class Requirement(enum.Enum):
    """What a check needs of the backend beyond the contract every backend keeps. A check
    whose requirement is not met is reported NOT_APPLICABLE, with the reason."""

    #: ``capabilities.persistent``: objects survive close, reopen and a killed process.
    PERSISTENT = "persistent"
    #: ``capabilities.shared``: every node reads every object directly.
    SHARED = "shared"
    #: The backend can be opened again in a child process: it is named by a registered
    #: name or an importable ``module:attribute``, with JSON-serialisable options.
    CHILD_PROCESS = "child-process"


@dataclass(frozen=True)
class BackendSpec:
    """What to test: a registered name, ``module:Class`` or ``module:factory``, and its
    options; or an in-process ``factory`` (then ``target`` is the importable reference
    to it, or None when there is none and checks in a child process cannot run)."""

    target: str | None
    options: dict[str, Any] = field(default_factory=dict)
    factory: BackendFactory | None = None

    def open(self, path: Path, **extra: Any) -> StorageBackend:
        options = {"max_value_size": KIT_MAX_VALUE_SIZE, **self.options, **extra}
        factory = self.factory
        if factory is None:
            assert self.target is not None, "a BackendSpec needs a target or a factory"
            factory = resolve_factory(self.target)
        return factory(path, **options)

    def child_problem(self) -> str | None:
        """Why a child process cannot open this backend, or None if it can."""
        if self.target is None:
            return ("make_backend is not importable by name (a lambda, a closure or a "
                    "partial); pass a module-level function or class to run the checks "
                    "that kill a child process")
        try:
            json.dumps(self.options)
        except TypeError as exc:
            return f"the options are not JSON-serialisable, so a child cannot get them: {exc}"
        return None


def resolve_factory(target: str) -> BackendFactory:
    """The factory a reference names: a registered backend name or ``module:Class`` opens
    through the registry (:func:`kvstored.sdk.registry.open_backend`); ``module:function``
    names a factory function."""
    if ":" in target and target not in known_backends():
        module_name, _, attribute = target.partition(":")
        found: Any = importlib.import_module(module_name)
        for part in attribute.split("."):
            found = getattr(found, part)
        if not (isinstance(found, type) and issubclass(found, StorageBackend)):
            if not callable(found):
                raise TypeError(f"{target} is neither a StorageBackend nor a factory")
            return typing.cast(BackendFactory, found)
    return lambda path, **options: open_backend(target, path, **options)


def reference_of(make_backend: BackendFactory) -> str | None:
    """``module:qualname`` of ``make_backend`` if importing that gives it back, else None."""
    module = getattr(make_backend, "__module__", None)
    qualname = getattr(make_backend, "__qualname__", None)
    if not module or not qualname or "<" in qualname or module == "__main__":
        return None
    try:
        found: Any = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError):
        return None
    return f"{module}:{qualname}" if found is make_backend else None


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

    def __init__(self, spec: BackendSpec, workspace: Path,
                 requires: frozenset[Requirement] = frozenset()) -> None:
        self.spec = spec
        self.requires = requires
        self._judged = False
        self.workspace = workspace
        self.path = workspace / "store"
        self._open: list[StorageBackend] = []
        self._last_extra: dict[str, Any] = {}
        self._type: type[StorageBackend] | None = None

    def open(self, **extra: Any) -> StorageBackend:
        """Open the backend on the workspace. The first open of a check also judges the
        check's requirements on the backend's capabilities: NotApplicable if unmet."""
        self._last_extra = extra
        backend = self.spec.open(self.path, **extra)
        self._open.append(backend)
        if not self._judged:
            self._judged = True
            reason = unmet_requirement(self.requires, self.spec, backend.capabilities)
            if reason:
                raise NotApplicable(reason)
        return backend

    def reopen(self, backend: StorageBackend) -> StorageBackend:
        backend.close()
        return self.open(**self._last_extra)

    def backend_type(self) -> type[StorageBackend]:
        """The class of the backend under test (opened once on a scratch folder)."""
        if self._type is None:
            self._type = self._type_without_opening()
        if self._type is None:
            backend = self.spec.open(self.workspace / "type-probe")
            backend.close()
            shutil.rmtree(self.workspace / "type-probe", ignore_errors=True)
            self._type = type(backend)
        return self._type

    def _type_without_opening(self) -> type[StorageBackend] | None:
        factory = self.spec.factory
        if isinstance(factory, type) and issubclass(factory, StorageBackend):
            return factory
        if factory is None and self.spec.target is not None:
            try:
                return backend_class(self.spec.target)
            except Exception:  # a factory function's reference: open one to see
                return None
        return None

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
    """Raised by a check that finds, once running, that it cannot apply to this backend
    (a store on a block device cannot be cut short); reported NOT_APPLICABLE with the
    message, never as a pass."""


class CheckStatus(enum.Enum):
    PASSED = "passed"
    FAILED = "failed"
    #: The check needs a capability the backend does not claim (the reason says which);
    #: it was not run, and it does not count against the backend.
    NOT_APPLICABLE = "not-applicable"


@dataclass
class CheckOutcome:
    name: str
    status: CheckStatus
    seconds: float
    doc: str
    #: Why it failed, or why it does not apply.
    error: str | None = None
    clause: str = ""

    @property
    def passed(self) -> bool:
        """True unless the check failed (a check that does not apply is no failure)."""
        return self.status is not CheckStatus.FAILED

    @property
    def not_applicable(self) -> str | None:
        """Why the check does not apply, or None if it ran."""
        return self.error if self.status is CheckStatus.NOT_APPLICABLE else None

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status.value, "clause": self.clause,
                "seconds": round(self.seconds, 3), "doc": self.doc,
                "error": None if self.not_applicable else self.error,
                "not_applicable": self.not_applicable}


@dataclass(frozen=True)
class Check:
    name: str
    function: Callable[[Kit], None]
    #: The contract clause it proves (a heading of :mod:`kvstored.sdk.backend`).
    clause: str = ""
    requires: frozenset[Requirement] = frozenset()

    @property
    def doc(self) -> str:
        first_paragraph = (self.function.__doc__ or "").strip().split("\n\n")[0]
        return " ".join(first_paragraph.split())

    def run(self, spec: BackendSpec, workspace: Path) -> None:
        kit = Kit(spec, workspace, self.requires)
        try:
            self.function(kit)
        finally:
            kit.close_all()


def unmet_requirement(requires: frozenset[Requirement], spec: BackendSpec,
                      capabilities: Capabilities | None) -> str | None:
    """Why a check needing ``requires`` does not apply, or None if it does. Without
    ``capabilities`` (nothing opened yet) only what the spec alone tells is judged."""
    for need in sorted(requires, key=lambda r: r.value):
        if need is Requirement.CHILD_PROCESS:
            problem = spec.child_problem()
            if problem:
                return problem
        if capabilities is None:
            continue
        if need is Requirement.PERSISTENT and not capabilities.persistent:
            return "the backend is not persistent (capabilities.persistent is False)"
        if need is Requirement.SHARED and not capabilities.shared:
            return "the backend is not shared (capabilities.shared is False)"
    return None


def _failure_text(exc: BaseException) -> str:
    error = f"{type(exc).__name__}: {exc}"
    if not isinstance(exc, AssertionError):
        error += "\n" + "".join(traceback.format_exception(exc)[-3:])
    return error


def run_checks(spec: BackendSpec, checks: list[Check], directory: Path | None = None,
               progress: Callable[[CheckOutcome], None] | None = None) -> list[CheckOutcome]:
    """Run ``checks`` against ``spec``, each in a fresh folder under ``directory``; a
    check whose requirements the backend does not meet is reported NOT_APPLICABLE.

    Capabilities are judged on the first backend a check opens (the kit never opens one
    just to look: a store on a device would be formatted with the wrong options)."""
    base = Path(tempfile.mkdtemp(prefix="kvstored-kit-", dir=directory))
    outcomes = []
    try:
        for check in checks:
            workspace = base / check.name
            workspace.mkdir()
            started = time.perf_counter()
            status, error = CheckStatus.PASSED, None
            reason = unmet_requirement(check.requires, spec, None)
            if reason:
                status, error = CheckStatus.NOT_APPLICABLE, reason
            else:
                try:
                    check.run(spec, workspace)
                except NotApplicable as exc:
                    status, error = CheckStatus.NOT_APPLICABLE, str(exc)
                except Exception as exc:  # the table reports every kind of failure
                    status, error = CheckStatus.FAILED, _failure_text(exc)
            outcome = CheckOutcome(check.name, status, time.perf_counter() - started,
                                   check.doc, error, check.clause)
            outcomes.append(outcome)
            if progress:
                progress(outcome)
            shutil.rmtree(workspace, ignore_errors=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return outcomes

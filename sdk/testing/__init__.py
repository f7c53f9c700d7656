"""The backend conformance kit: prove a :class:`~kvstored.sdk.StorageBackend` correct.

From the shell::

    python -m kvstored.sdk.testing file-per-key
    python -m kvstored.sdk.testing my_pkg.backend:MyBackend --option policy=lru

From Python, on any callable that opens a backend (``make_backend(path, **options)``;
a StorageBackend subclass is one)::

    from kvstored.sdk.testing import check_backend

    report = check_backend(MyBackend, {"policy": "lru"})
    assert report.ok, report.failures

From pytest, subclass :class:`BackendConformance` in a class whose name starts with
``Test``; every check becomes a test::

    from kvstored.sdk.testing import BackendConformance

    class TestMyBackend(BackendConformance):
        backend = "my-backend"          # a registered name, or "module:Class"
        options = {"policy": "lru"}

The CLI and the mix-in both run :func:`check_backend`. Each check runs on a fresh
directory and its docstring says what it proves; see :data:`CHECKS`. A check that needs
a capability the backend does not claim (persistence, sharing) is reported
NOT_APPLICABLE with the reason, never silently skipped.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from kvstored.sdk.testing.checks import CHECKS
from kvstored.sdk.testing.kit import (
    BackendFactory,
    BackendSpec,
    Check,
    CheckOutcome,
    CheckStatus,
    Kit,
    NotApplicable,
    Requirement,
    flip_byte,
    payload,
    read_location,
    reference_of,
    run_checks,
)

__all__ = [
    "CHECKS",
    "BackendConformance",
    "BackendFactory",
    "BackendSpec",
    "Check",
    "CheckOutcome",
    "CheckStatus",
    "Kit",
    "KitReport",
    "NotApplicable",
    "Requirement",
    "check_backend",
    "flip_byte",
    "payload",
    "read_location",
    "run_checks",
    "run_kit",
]


@dataclass
class KitReport:
    """The outcomes of one run of the kit."""

    outcomes: list[CheckOutcome]

    @property
    def ok(self) -> bool:
        """True when no check failed (checks that do not apply are no failure)."""
        return not self.failures

    @property
    def failures(self) -> list[CheckOutcome]:
        return [o for o in self.outcomes if o.status is CheckStatus.FAILED]

    def by_name(self) -> dict[str, CheckOutcome]:
        return {o.name: o for o in self.outcomes}


def select_checks(select: str | None = None,
                  names: Collection[str] | None = None) -> list[Check]:
    """The checks whose name contains ``select`` and is in ``names`` (both optional)."""
    return [c for c in CHECKS if (select is None or select in c.name)
            and (names is None or c.name in names)]


def check_backend(make_backend: BackendFactory | str, options: dict[str, Any] | None = None,
                  *, directory: Path | None = None, select: str | None = None,
                  names: Collection[str] | None = None,
                  progress: Callable[[CheckOutcome], None] | None = None) -> KitReport:
    """Run the kit on the backend ``make_backend`` opens.

    ``make_backend`` is a callable ``make_backend(path, **options) -> StorageBackend``
    (a StorageBackend subclass, or a factory function), or a registered name or
    ``module:Class`` string. ``options`` are passed on every open, after the kit's own.
    The checks that kill a child process need to open the backend in that child, so
    they apply only when ``make_backend`` is a name or an importable module-level
    callable with JSON-serialisable options; otherwise they are NOT_APPLICABLE.
    """
    options = dict(options or {})
    if isinstance(make_backend, str):
        spec = BackendSpec(make_backend, options)
    else:
        spec = BackendSpec(reference_of(make_backend), options, factory=make_backend)
    return KitReport(run_checks(spec, select_checks(select, names), directory, progress))


def run_kit(target: str | BackendFactory, options: dict[str, Any] | None = None, *,
            directory: Path | None = None, select: str | None = None,
            names: Collection[str] | None = None) -> list[CheckOutcome]:
    """:func:`check_backend`'s outcomes as a list."""
    return check_backend(target, options, directory=directory, select=select,
                         names=names).outcomes


class BackendConformance:
    """Mix-in that turns every check into a pytest test method (``test_<check>``).

    Set ``backend`` (a registered name or ``module:Class``), or ``make_backend`` (a
    factory, as :func:`check_backend` takes), and optionally ``options``. A check that
    does not apply to the backend is reported as a pytest skip naming the reason.
    """

    backend: ClassVar[str] = ""
    make_backend: ClassVar[BackendFactory | None] = None
    options: ClassVar[dict[str, Any]] = {}


def _as_test(check: Check):
    def test(self, tmp_path: Path) -> None:
        factory = inspect.getattr_static(type(self), "make_backend")
        if isinstance(factory, staticmethod):
            factory = factory.__func__
        target = factory if factory is not None else self.backend
        if not target:
            raise AssertionError(f"{type(self).__name__} must set `backend` or `make_backend`")
        report = check_backend(target, dict(self.options), directory=tmp_path,
                               names={check.name})
        [outcome] = report.outcomes
        if outcome.status is CheckStatus.NOT_APPLICABLE:
            import pytest

            pytest.skip(f"not applicable: {outcome.error}")
        if outcome.status is CheckStatus.FAILED:
            raise AssertionError(f"{check.name} ({check.clause}): {outcome.error}")

    test.__name__ = f"test_{check.name}"
    test.__doc__ = check.function.__doc__
    return test


def _add_tests() -> None:
    for check in CHECKS:
        setattr(BackendConformance, f"test_{check.name}", _as_test(check))


_add_tests()

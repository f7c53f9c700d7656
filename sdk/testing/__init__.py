"""The backend conformance kit: prove a :class:`~kvstored.sdk.StorageBackend` correct.

From the shell::

    python -m kvstored.sdk.testing file-per-key
    python -m kvstored.sdk.testing my_pkg.backend:MyBackend --option policy=lru

From pytest, subclass :class:`BackendConformance` in a class whose name starts with
``Test``; every check becomes a test::

    from kvstored.sdk.testing import BackendConformance

    class TestMyBackend(BackendConformance):
        backend = "my-backend"          # a registered name, or "module:Class"
        options = {"policy": "lru"}

Each check runs on a fresh directory and its docstring says what it proves; see
:data:`CHECKS`.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Any, ClassVar

from kvstored.sdk.testing.checks import CHECKS
from kvstored.sdk.testing.kit import (
    BackendSpec,
    Check,
    CheckOutcome,
    Kit,
    NotApplicable,
    flip_byte,
    payload,
    read_location,
    run_checks,
)

__all__ = [
    "CHECKS",
    "BackendConformance",
    "BackendSpec",
    "Check",
    "CheckOutcome",
    "Kit",
    "NotApplicable",
    "flip_byte",
    "payload",
    "read_location",
    "run_checks",
    "run_kit",
]


def run_kit(target: str, options: dict[str, Any] | None = None, *,
            directory: Path | None = None, select: str | None = None,
            names: Collection[str] | None = None) -> list[CheckOutcome]:
    """Run every check, or those whose name contains ``select`` or is in ``names``, and
    return the outcomes."""
    checks = [c for c in CHECKS if (select is None or select in c.name)
              and (names is None or c.name in names)]
    return run_checks(BackendSpec(target, dict(options or {})), checks, directory)


class BackendConformance:
    """Mix-in that turns every check into a pytest test method (``test_<check>``).

    Set ``backend`` (a registered name or ``module:Class``) and optionally ``options``.
    """

    backend: ClassVar[str] = ""
    options: ClassVar[dict[str, Any]] = {}


def _as_test(check: Check):
    def test(self, tmp_path: Path) -> None:
        if not self.backend:
            raise AssertionError(f"{type(self).__name__} must set `backend`")
        try:
            check.run(BackendSpec(self.backend, dict(self.options)), tmp_path)
        except NotApplicable as exc:
            import pytest

            pytest.skip(f"not applicable: {exc}")

    test.__name__ = f"test_{check.name}"
    test.__doc__ = check.function.__doc__
    return test


def _add_tests() -> None:
    for check in CHECKS:
        setattr(BackendConformance, f"test_{check.name}", _as_test(check))


_add_tests()

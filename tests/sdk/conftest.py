"""What the fault-injection and power-loss tests share: the machine they need (FUSE for
the power-loss file system, io_uring for the uring engine), its mount, and the run of
the kit's checks against a deliberately broken backend."""

from __future__ import annotations

from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

import pytest

from kvstored.native import uring_status
from kvstored.sdk.testing import run_kit
from kvstored.sdk.testing.powerloss import PowerLossMount, fuse_unavailable
from tests.conftest import require


def require_fuse() -> None:
    """The power-loss file system is a FUSE mount: skip without FUSE (fail when
    KVSTORED_REQUIRE names it)."""
    reason = fuse_unavailable()
    require("fuse", reason is None, reason or "")


def require_engine(kind: str | None) -> None:
    """``kind`` (a backend's ``engine`` option, or an io engine's name) can run here."""
    if kind == "uring":
        require("uring", *uring_status())


@pytest.fixture
def mount(tmp_path: Path) -> Iterator[PowerLossMount]:
    require_fuse()
    with PowerLossMount(tmp_path / "m", tmp_path / "powerfs.log") as mounted:
        yield mounted


def passed_by_broken(module: str, case: str, options: dict[str, Any],
                     checks: Collection[str], directory: Path) -> list[str]:
    """Run ``checks`` on the broken backend ``case`` of ``module`` (``Name`` or
    ``Name-variant``: the class is the part before the dash) with ``options``; the
    names of the checks it passed, which should be none."""
    require_fuse()
    require_engine(options.get("engine"))
    outcomes = {o.name: o for o in run_kit(f"{module}:{case.split('-')[0]}", options,
                                           directory=directory, names=set(checks))}
    assert set(outcomes) == set(checks)
    return [name for name, o in outcomes.items() if o.passed]

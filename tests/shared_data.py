"""The public reference data beside the checkout (``../shared``): the two Mooncake traces
and the reference simulator's results on them. It is not in the repository (it is not
ours to ship), so the tests that need it skip without it, saying so; tests that only need
a trace use the built-in ones that ship in the package instead.
"""

from __future__ import annotations

from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[2] / "shared"


def missing_reason(path: Path) -> str:
    """The skip reason of a test that needs ``path`` under ../shared."""
    return (f"needs ../shared beside the checkout (the public Mooncake traces and the "
            f"reference simulator's results): {path} is not there")


def shared_file(*parts: str) -> Path:
    """``../shared/PARTS``, or skip the test, saying it needs ../shared."""
    path = SHARED.joinpath(*parts)
    if not path.exists():
        pytest.skip(missing_reason(path))
    return path

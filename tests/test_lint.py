"""The type checker's baseline only shrinks, and holds nothing of the SDK or the io engine.

``make lint`` runs basedpyright against ``.basedpyright/baseline.json``: an error in the
baseline is tolerated, any other fails. Fixing baselined errors and running
``basedpyright --writebaseline`` drops them from the file; this test then fails until
:data:`BASELINE_ERRORS` is lowered to the new total, so the number never climbs back.
The SDK (``sdk/``, for backend authors) and the io engine (``native/``) must have none at
all: they are the parts others build on.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASELINE = ROOT / ".basedpyright" / "baseline.json"

#: The baseline's total when this was last lowered. Lower it (never raise it) when the
#: test says the baseline shrank: that is the new floor.
BASELINE_ERRORS = 98

#: Folders (as the checker names them, through kvstored/) that must have no baselined
#: error at all.
CLEAN = ("kvstored/sdk/", "kvstored/native/")


def _counts() -> Counter[str]:
    """Baselined errors per file, ``kvstored/...`` paths."""
    files = json.loads(BASELINE.read_text())["files"]
    return Counter({path.removeprefix("./"): len(errors) for path, errors in files.items()})


def test_the_baseline_never_grows():
    total = sum(_counts().values())
    assert total <= BASELINE_ERRORS, (
        f"the type checker's baseline holds {total} errors, more than the "
        f"{BASELINE_ERRORS} recorded: fix the new ones instead of baselining them "
        "(`basedpyright` lists them)")
    assert total == BASELINE_ERRORS, (
        f"the baseline shrank to {total} errors (from {BASELINE_ERRORS}): set "
        f"BASELINE_ERRORS = {total} in tests/test_lint.py, so it cannot grow back")


def test_the_sdk_and_the_io_engine_have_no_baselined_errors():
    counts = _counts()
    left = {path: n for path, n in sorted(counts.items()) if path.startswith(CLEAN)}
    assert not left, f"{sum(left.values())} baselined errors in sdk/ and native/: {left}"


def test_the_baseline_names_files_that_exist():
    """A file renamed or removed leaves its entries behind unless the baseline is
    rewritten (``basedpyright --writebaseline``)."""
    missing = [path for path in _counts() if not (ROOT / path).exists()]
    assert not missing, f"rewrite the baseline: it names files that are gone: {missing}"

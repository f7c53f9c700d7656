"""docs/sdk.md lists the kit's check count and, for every check, the clause it proves and
what it needs: the page cannot drift from the kit."""

from pathlib import Path

from kvstored.sdk.testing import CHECKS

PAGE = Path(__file__).resolve().parents[2] / "docs" / "sdk.md"


def test_sdk_page_lists_every_check_with_its_clause():
    text = PAGE.read_text()
    assert f"The kit has **{len(CHECKS)} checks**" in text
    for check in CHECKS:
        needs = ", ".join(sorted(r.value for r in check.requires)) or "-"
        assert f"| `{check.name}` | {check.clause} | {needs} |" in text, \
            f"docs/sdk.md does not list {check.name} ({check.clause}, needs {needs})"

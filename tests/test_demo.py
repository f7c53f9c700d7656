"""``make demo``: the whole demo as a user runs it, at 80 columns, with the default
security, from a directory with no ../shared beside it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def test_the_demo_runs_writes_its_pages_and_leaves_no_store_behind(tmp_path):
    work = tmp_path / "elsewhere" / "checkout"
    work.mkdir(parents=True)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    run = subprocess.run([sys.executable, "-m", "kvstored.demo", "--out", "pages"],
                         cwd=work, capture_output=True, text=True, timeout=300,
                         stdin=subprocess.DEVNULL,
                         env={**os.environ, "COLUMNS": "80", "TMPDIR": str(scratch)})
    assert run.returncode == 0, run.stdout + run.stderr
    out = run.stdout
    assert "demo ok" in out and "every byte read matched" in out
    assert "token hit rate" in out and "per round" in out
    assert max(len(line) for line in out.splitlines()) <= 80, out
    pages = work / "pages"
    for name in ("replay.png", "multiturn.png", "index.html"):
        assert f"  pages/{name}" in out.splitlines(), out
    for name in ("replay.png", "multiturn.png"):
        assert (pages / name).read_bytes()[:4] == b"\x89PNG"
    page = (pages / "index.html").read_text()
    assert page.count("data:image/png;base64,") == 2 and "Multi-round" in page
    assert list(scratch.iterdir()) == [], "a store's temporary directory was left behind"

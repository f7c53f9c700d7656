"""The docs/sdk.md tutorial's example backend installs as a real distribution, registers
through the entry point, and passes the conformance kit: the tutorial cannot go stale."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "flatdir"


@pytest.mark.slow
def test_example_backend_registers_and_passes_the_kit(tmp_path):
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                    "--no-build-isolation", "--target", str(site), str(EXAMPLE)],
                   check=True, capture_output=True, cwd=tmp_path)
    env = {**os.environ, "PYTHONPATH": str(site), "COLUMNS": "200"}
    listed = subprocess.run(
        [sys.executable, "-c", "from kvstored.sdk.registry import known_backends as k; print(k())"],
        check=True, capture_output=True, text=True, env=env).stdout
    assert "flatdir" in listed
    run = subprocess.run([sys.executable, "-m", "kvstored.sdk.testing", "flatdir",
                          "--dir", str(tmp_path / "kit")],
                         capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert " passed, 0 failed" in run.stdout, run.stdout[-3000:]

"""``python -m kvstored.sdk.testing``: not-applicable checks are reported, not failed;
a failing check exits 1; the JSON names each check's status and clause."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def kit(tmp_path, *args):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "kvstored.sdk.testing", *args,
                           "--dir", str(tmp_path), "--json"],
                          capture_output=True, text=True, env=env, timeout=600)


def test_not_applicable_is_reported_and_passes(tmp_path):
    run = kit(tmp_path, "tests.sdk.broken_backends:ClaimsNotPersistent", "-k", "reopen_keeps")
    assert run.returncode == 0, run.stderr[-2000:]
    doc = json.loads(run.stdout)
    [only] = doc["checks"]
    assert only["status"] == "not-applicable" and "not persistent" in only["not_applicable"]
    assert only["clause"] == "Atomicity and durability"


def test_a_failed_check_exits_1(tmp_path):
    run = kit(tmp_path, "tests.sdk.broken_backends:NoSdkVersion", "-k", "sdk_version")
    assert run.returncode == 1, run.stderr[-2000:]
    [only] = json.loads(run.stdout)["checks"]
    assert only["status"] == "failed" and "declare the version" in only["error"]

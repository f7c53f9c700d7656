"""``kvstore bench mixed`` end to end, briefly: a real ``kvstored up``, real threads, and
the JSON's shape. Figures are not checked (benchmarks are not timed tests); a wrong
value or a failed call would be an error, and the run would exit 1."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

KVSTORE = str(Path(sys.executable).parent / "kvstore")


def test_a_short_mixed_run_has_no_errors_and_reports_every_op(tmp_path):
    out = tmp_path / "mixed.json"
    done = subprocess.run(
        [KVSTORE, "bench", "mixed", "--threads", "3", "--seconds", "2", "--rounds", "2",
         "--dram", "16MiB", "--max-size", "64KiB", "--backend", "file-per-key",
         "--workdir", str(tmp_path / "work"), "--json-out", str(out)],
        capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    document = json.loads(out.read_text())
    assert document["config"]["threads"] == 3 and len(document["rounds"]) == 2
    for result in document["rounds"]:
        assert result["errors"] == 0, result["first_errors"]
        assert set(result["ops"]) == {"put", "get", "remove", "exists"}
        assert result["ops"]["put"]["count"] > 0 and result["ops_per_s"] > 0
        assert result["daemon_cpu_ms_per_op"] > 0
    assert document["median_ops_per_s"] > 0

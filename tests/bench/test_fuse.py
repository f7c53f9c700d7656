"""`kvstore bench fuse` end to end, on a small object (the figures are not checked here:
performance is measured by running the benchmark, not in tests)."""

from __future__ import annotations

import json

from kvstored.capabilities import probe_fuse
from tests.conftest import require
from tests.daemon.harness import kvstore


def test_bench_fuse_runs_every_reader_and_writes_ratios(tmp_path):
    require("fuse", *probe_fuse())
    out = tmp_path / "fuse.json"
    run = kvstore("bench", "fuse", "--size", "8MiB", "--rounds", "1", "--json-out", str(out))
    assert run.returncode == 0, run.stderr.decode()
    report = json.loads(out.read_text())
    runners = set(report["results"])
    assert {"client", "client-tcp", "direct-io-1.0MiB", "page-cache-cold-128.0KiB",
            "page-cache-warm-1.0MiB"} <= runners
    assert report["results"]["client"]["ratio_to_client"] == 1.0
    assert all(r["median_gb_per_s"] > 0 for r in report["results"].values())

"""``kvstore bench scale`` end to end, at a tiny size: a real ``kvstored master`` and
``kvstored node``, a restart, client processes, and the JSON's shape. Figures are checked
for sanity only (benchmarks are not timed tests)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

KVSTORE = str(Path(sys.executable).parent / "kvstore")


def _run(tmp_path: Path, *options: str) -> subprocess.CompletedProcess:
    return subprocess.run([KVSTORE, "bench", "scale", *options], capture_output=True,
                          text=True, timeout=300)


def test_a_tiny_scale_run_reports_every_figure(tmp_path):
    out = tmp_path / "scale.json"
    objects = 1500
    done = _run(tmp_path, "--objects", str(objects), "--value-size", "100B", "--backends",
                "bucket", "--clients", "1,2", "--seconds", "0.3", "--rounds", "2",
                "--dir", str(tmp_path / "work"), "--json-out", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(out.read_text())
    assert report["benchmark"] == "scale" and report["objects"] == objects
    assert report["command"].startswith("kvstore bench scale --objects 1500")
    assert len(report["load_average"]["before"]) == 3
    (backend,) = report["backends"]
    result = report["backends"][backend]
    master = result["master"]
    assert master["objects"] == objects and master["replicas"]["ssd"] == objects
    assert master["rss_full"] > master["rss_empty"] > 0
    # A Python master cannot hold an object in less than its key, nor in megabytes.
    assert 20 < master["bytes_per_object"] < 1 << 20
    # Each record takes at least its value on disk.
    assert result["disk"]["bytes_per_object"] >= 100
    assert set(result["lookup"]) == {"at_1000", f"at_{objects}"}
    for figures in result["lookup"].values():
        for op in ("lookup", "exists"):
            assert 0 < figures[op]["p50_us"] <= figures[op]["p99_us"]
    recovery = result["recovery"]
    assert recovery["objects"] == objects and len(recovery["rounds_s"]) == 2
    assert recovery["empty_start_s"] > 0 and 0 < recovery["median_s"] < 300
    assert set(result["clients"]) == {"1", "2"}
    for processes, figures in result["clients"].items():
        assert len(figures["rounds"]) == 2
        median = figures["median"]
        assert median["ops_per_s"] > 0 and median["p50_us"] > 0
        assert all(r["gets"] > 0 and r["misses"] == 0 for r in figures["rounds"])
        assert abs(median["per_process_ops_per_s"] * int(processes)
                   - median["ops_per_s"]) < 1e-6 * median["ops_per_s"] + 1e-9
    assert result["put_objects_per_s"] > 0
    assert "results:" in done.stdout
    assert not (tmp_path / "work" / backend).exists()  # removed once measured


def test_a_run_the_machine_cannot_hold_is_refused_before_it_starts(tmp_path):
    done = _run(tmp_path, "--objects", str(10**12), "--json-out", str(tmp_path / "x.json"))
    assert done.returncode == 1
    assert "extrapolate" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "x.json").exists()


def test_bad_options_are_usage_errors(tmp_path):
    for options in (["--clients", "0"], ["--clients", "two"], ["--value-size", "lots"],
                    ["--backends", ","]):
        done = _run(tmp_path, *options)
        assert done.returncode == 2, (options, done.stderr)


def test_a_metadata_only_run_registers_the_inventory_with_a_master_alone(tmp_path):
    out = tmp_path / "scale.json"
    objects = 12_000  # more than a node's REGISTER_CHUNK: several register_objects calls
    done = _run(tmp_path, "--objects", str(objects), "--metadata-only", "--rounds", "1",
                "--dir", str(tmp_path / "work"), "--json-out", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(out.read_text())
    assert "--metadata-only" in report["command"]
    result = report["backends"]["metadata-only"]
    master = result["master"]
    assert master["objects"] == objects
    assert master["replicas"] == {"dram": 0, "ssd": objects}
    assert 20 < master["bytes_per_object"] < 1 << 20
    assert result["register"]["seconds"] > 0
    assert set(result["lookup"]) == {"at_1000", f"at_{objects}"}
    assert "recovery" not in result and "clients" not in result

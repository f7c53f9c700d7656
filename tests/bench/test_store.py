"""``kvstore bench store`` end to end at a tiny size: a real ``kvstored up`` process,
real sockets, a real raw-socket server and (when its wheel is installed) a real
Mooncake cluster. Figures are not checked here (benchmarks are not timed tests); the
JSON's shape, kvstored's own rows and the reporting of missing peers are."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvstored.bench.mooncake_peer import probe
from kvstored.bench.store import GOALS, TABLES, evaluate_goals, median_of_rounds
from kvstored.bench.store_workload import OPS, object_count

KVSTORE = str(Path(sys.executable).parent / "kvstore")
KVSTORED_RUNNERS = ("kvstored-tcp", "kvstored-shm", "kvstored-ssd")
MOONCAKE_RUNNERS = ("mooncake-remote", "mooncake-shm", "mooncake-ssd")
FIGURES = {"op", "object_size", "objects", "bytes", "seconds", "calls", "bytes_per_s",
           "objects_per_s", "p50_us", "p99_us"}


def run_bench(tmp_path: Path, *args: str, timeout: float = 240) -> dict:
    out = tmp_path / "store.json"
    done = subprocess.run(
        [KVSTORE, "bench", "store", "--workdir", str(tmp_path / "work"), "--json-out",
         str(out), "--markdown-out", str(tmp_path / "store.md"), *args],
        capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "TCP (loopback)" in done.stdout and f"results: {out}" in done.stdout
    return json.loads(out.read_text())


def check_figures(figures: dict, op: str, size: int, count: int) -> None:
    assert set(figures) >= FIGURES
    assert figures["op"] == op and figures["object_size"] == size
    assert figures["objects"] == count and figures["bytes"] == count * size
    assert figures["bytes_per_s"] > 0 and figures["seconds"] > 0
    assert 0 < figures["p50_us"] <= figures["p99_us"]
    # One call per object for singles, one per batch of 32 otherwise.
    assert figures["calls"] == (count if op.endswith("-single") else count // 32)


def test_kvstored_raw_socket_and_memcpy_rows(tmp_path):
    report = run_bench(tmp_path, "--total", "2MiB", "--sizes", "64KiB",
                       "--peers", "raw-socket,memcpy", "--rounds", "2")
    assert report["benchmark"] == "store" and report["sizes"] == ["64KiB"]
    assert report["ops"] == list(OPS) and report["batch"] == 32 and report["rounds"] == 2
    assert set(report["page_cache"]) == {"dropped", "reason"}
    for size, label in ((64 << 10, "64KiB"),):
        count = object_count(2 << 20, size)
        rows = report["results"][label]
        for runner in ("kvstored-tcp", "kvstored-shm", "raw-socket", "memcpy"):
            assert set(rows[runner]) == set(OPS), runner
            assert len(rows[runner]["get-batch"]["rounds_bytes_per_s"]) == 2
            for op in OPS:
                check_figures(rows[runner][op], op, size, count)
        # SSD-only: reads only, of objects that were flushed and evicted from DRAM.
        assert set(rows["kvstored-ssd"]) == {"get-single", "get-batch"}
        for op, figures in rows["kvstored-ssd"].items():
            check_figures(figures, op, size, count)
        notes = report["notes"]["round 1"][label]["kvstored-ssd"]
        assert notes["flushed"] == notes["evicted"] == notes["ssd_only"] == 2 * count
        for runner in MOONCAKE_RUNNERS:
            assert runner not in rows
    assert all(report["skipped"][r] == "not requested (--peers)" for r in MOONCAKE_RUNNERS)
    goals = {g["goal"]: g for g in report["goals"]}
    assert len(goals) == len(GOALS)
    # Only 64KiB ran, without Mooncake: every goal says what it lacks.
    assert all(g["status"] == "not measured" for g in goals.values())
    markdown = (tmp_path / "store.md").read_text()
    assert all(f"**{title}**" in markdown for title, _, _ in TABLES)
    assert "| 64KiB | get-batch |" in markdown


@pytest.mark.slow
def test_mooncake_measured_or_reported_skipped(tmp_path):
    binaries, reason = probe()
    report = run_bench(tmp_path, "--total", "2MiB", "--sizes", "64KiB", "--peers",
                       "mooncake", timeout=600)
    rows = report["results"]["64KiB"]
    assert set(KVSTORED_RUNNERS) <= set(rows)
    if binaries is None:
        assert "pip install" in reason
        assert all(report["skipped"][r] == reason for r in MOONCAKE_RUNNERS)
        assert not set(MOONCAKE_RUNNERS) & set(rows)
        return
    count = object_count(2 << 20, 64 << 10)
    for runner in ("mooncake-remote", "mooncake-shm"):
        assert "error" not in rows[runner], rows[runner]
        for op in OPS:
            check_figures(rows[runner][op], op, 64 << 10, count)
    assert "error" not in rows["mooncake-ssd"], rows["mooncake-ssd"]
    assert set(rows["mooncake-ssd"]) == {"get-single", "get-batch"}
    notes = report["notes"]["round 1"]["64KiB"]["mooncake-ssd"]
    assert notes["disk_only"] == notes["wanted"] == 2 * count


def test_goals_compare_ratios_and_report_what_is_missing():
    figures = {"bytes_per_s": 2e9, "p50_us": 100.0}
    results = {"1MiB": {"kvstored-tcp": {"get-batch": figures},
                        "mooncake-remote": {"get-batch": {"bytes_per_s": 1e9}},
                        "raw-socket": {"get-batch": {"bytes_per_s": 4e9}}},
               "64KiB": {"kvstored-tcp": {"get-single": figures},
                         "mooncake-remote": {"get-single": {"p50_us": 50.0}}}}
    goals = {g["goal"]: g for g in evaluate_goals(results)}
    assert goals["TCP batched get 1MiB: kvstored >= 1.5x Mooncake remote client"] == {
        "goal": "TCP batched get 1MiB: kvstored >= 1.5x Mooncake remote client",
        "ratio": 2.0, "minimum": 1.5, "met": True, "short_by_pct": 0.0}
    raw = goals["TCP batched get 1MiB: kvstored >= 0.7x raw Python socket"]
    assert raw["ratio"] == 0.5 and not raw["met"] and raw["short_by_pct"] == pytest.approx(28.6)
    # Latency: theirs over ours, so 50 µs against our 100 µs is 0.5x, a miss.
    latency = goals["single 64KiB get p50 latency: kvstored (TCP) no worse than "
                    "Mooncake remote"]
    assert latency["ratio"] == 0.5 and not latency["met"]
    missing = goals["TCP batched get 4MiB: kvstored >= 1.5x Mooncake remote client"]
    assert missing == {"goal": missing["goal"], "status": "not measured",
                       "missing": ["kvstored-tcp", "mooncake-remote"]}


def test_rounds_merge_to_medians_and_keep_failures():
    def figures(rate: float) -> dict:
        return {"op": "get-batch", "bytes_per_s": rate, "p50_us": rate / 10}

    rounds = [{"1MiB": {"kvstored-tcp": {"get-batch": figures(rate)},
                        "mooncake-shm": {"error": f"round {i} failed"} if i != 1
                        else {"get-batch": figures(7.0)}}}
              for i, rate in enumerate((3.0, 1.0, 2.0))]
    merged = median_of_rounds(rounds)["1MiB"]
    assert merged["kvstored-tcp"]["get-batch"] == {
        "op": "get-batch", "bytes_per_s": 2.0, "p50_us": 0.2,
        "rounds_bytes_per_s": [3.0, 1.0, 2.0]}
    assert merged["mooncake-shm"]["get-batch"]["bytes_per_s"] == 7.0
    assert merged["mooncake-shm"]["failed_rounds"] == ["round 0 failed", "round 2 failed"]
    only_errors = median_of_rounds([{"4MiB": {"x": {"error": "e1"}}},
                                    {"4MiB": {"x": {"error": "e2"}}}])
    assert only_errors == {"4MiB": {"x": {"error": "e1"}}}


def test_runners_picks_which_runners_run(tmp_path):
    report = run_bench(tmp_path, "--total", "2MiB", "--sizes", "64KiB", "--peers",
                       "memcpy", "--runners", "kvstored-ssd")
    rows = report["results"]["64KiB"]
    assert set(rows) == {"kvstored-ssd", "memcpy"}
    assert set(rows["kvstored-ssd"]) == {"get-single", "get-batch"}
    assert report["skipped"]["kvstored-tcp"] == "not requested (--runners)"
    assert "--runners kvstored-ssd" in report["command"]
    wrong = subprocess.run([KVSTORE, "bench", "store", "--runners", "kvstored-ssd,nope"],
                           capture_output=True, text=True, timeout=60)
    assert wrong.returncode == 2 and "unknown runner 'nope'" in wrong.stderr

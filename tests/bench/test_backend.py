"""``kvstore bench backend`` runs end to end through the SDK and writes its JSON (tiny
sizes: the figures themselves are for docs/benchmarks.md, not for tests)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from kvstored.capabilities import probe_fio
from kvstored.cli.tool import main
from tests.conftest import require

WORKLOADS = ["flush-1m", "flush-128k", "read-4k", "read-128k", "read-1m"]


def run_bench(tmp_path, *options: str) -> tuple[int, str, dict | None]:
    out = tmp_path / "backend.json"
    result = CliRunner().invoke(main, [
        "bench", "backend", "--dir", str(tmp_path / "work"), "--data", "16MiB",
        "--small-data", "4MiB", "--runtime", "0.2", "--rounds", "1", "--read-batch", "8",
        "--recovery-objects", "300", "--engine", "posix", "--json-out", str(out), *options])
    report = json.loads(out.read_text()) if out.exists() else None
    return result.exit_code, result.output, report


def test_backends_without_fio(tmp_path):
    code, output, report = run_bench(tmp_path, "--backends", "3fs", "--fio", "/nonexistent/fio")
    assert code == 0, output
    assert list(report["backends"]) == ["3fs"]
    assert report["backends"]["3fs"]["direct"] is True
    for name, backend in report["backends"].items():
        assert list(backend["workloads"]) == WORKLOADS
        for workload, runners in backend["workloads"].items():
            calls = {"backend"} if workload.startswith("flush") else {"backend",
                                                                      "backend-stream"}
            assert set(runners) == calls, workload
            for call in calls:
                assert runners[call]["median"]["bytes_per_s"] > 0
        assert backend["reopen"]["objects"] == 300 and len(backend["reopen"]["seconds"]) == 3
        assert report["ratios"][name] == {}
    assert all(g["status"] == "not measured" for g in report["goals"])
    assert "3fs" in output and "reopen" in output and "results:" in output
    assert not any((tmp_path / "work").iterdir()), "the stores were left behind"


@pytest.mark.slow
def test_against_fio(tmp_path):
    require("fio", *probe_fio())
    code, output, report = run_bench(tmp_path, "--backends", "3fs,file-per-key",
                                     "--recovery-objects", "0")
    assert code == 0, output
    assert report["backends"]["file-per-key"]["direct"] is False, "it takes no direct option"
    runners = report["backends"]["3fs"]["workloads"]
    assert set(runners["flush-1m"]) == {"backend", "fio", "fio-overwrite"}
    assert set(runners["read-128k"]) == {"backend", "backend-stream", "fio"}
    assert set(runners["read-4k"]) == {"backend", "backend-stream", "fio", "fio-8k"}
    assert report["ratios"]["3fs"]["read-1m"] > 0
    assert report["ratios"]["3fs"]["read-4k stream"] > 0
    assert report["ratios"]["3fs"]["read-4k stream vs fio-8k"] > 0
    assert report["ratios"]["3fs"]["flush-1m vs fio-overwrite"] > 0
    assert report["fio_version"].startswith("fio-")
    assert {g["goal"] for g in report["goals"] if "ratio" in g and "3fs" in g["goal"]} == {
        "3fs flush-1m >= 0.8x fio", "3fs flush-128k >= 0.8x fio",
        "3fs read-128k >= 0.8x fio", "3fs read-1m >= 0.8x fio",
        "3fs read-4k stream >= 0.7x fio"}


def test_unknown_backend_is_a_usage_error(tmp_path):
    code, output, _ = run_bench(tmp_path, "--backends", "3fs,nope")
    assert code == 2 and "nope" in output and "file-per-key" in output


def test_bad_size_is_a_usage_error(tmp_path):
    code, output, _ = run_bench(tmp_path, "--data", "lots")
    assert code == 2 and "--data" in output

"""``kvstore bench io`` runs end to end and writes its JSON (on a small file: the figures
themselves are for docs/benchmarks.md, not for tests)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from kvstored.capabilities import probe_fio
from kvstored.cli.tool import main
from kvstored.native import probe_uring
from tests.conftest import require

PATTERNS = ["seq-read-1m", "rand-read-256k", "rand-read-4k", "seq-write-1m"]


def run_bench(tmp_path, *options: str) -> tuple[int, str, dict | None]:
    out = tmp_path / "io.json"
    result = CliRunner().invoke(main, ["bench", "io", "--file", str(tmp_path / "data"),
                                       "--size", "64MiB", "--runtime", "0.2", "--rounds", "1",
                                       "--json-out", str(out), *options])
    report = json.loads(out.read_text()) if out.exists() else None
    return result.exit_code, result.output, report


def test_bench_io_compares_the_engines_without_fio(tmp_path):
    require("uring", *probe_uring())
    code, output, report = run_bench(tmp_path, "--runners", "fio,uring,posix",
                                     "--fio", "/nonexistent/fio")
    assert code == 0, output
    assert report["skipped"] == {"fio": "/nonexistent/fio is not installed "
                                        "(Debian: apt install fio)"}
    assert list(report["results"]) == PATTERNS
    for pattern in PATTERNS:
        runners = report["results"][pattern]
        assert set(runners) == {"uring", "posix"}
        for runner in runners.values():
            assert len(runner["rounds"]) == 1 and runner["median"]["bytes_per_s"] > 0
        assert report["ratios"][pattern]["uring/posix"] > 0
        assert not any(key.endswith("/fio") for key in report["ratios"][pattern])
    assert [g["status"] for g in report["goals"][:3]] == ["not measured"] * 3
    assert "rand-read-4k" in output and "results:" in output


@pytest.mark.slow
def test_bench_io_against_fio(tmp_path):
    require("fio", *probe_fio())
    code, output, report = run_bench(tmp_path, "--runners", "fio,posix")
    assert code == 0, output
    for pattern in PATTERNS:
        assert report["ratios"][pattern]["posix/fio"] > 0
    assert report["fio_version"].startswith("fio-")


def test_bench_io_refuses_a_bad_size(tmp_path):
    code, output, _ = run_bench(tmp_path, "--size", "lots")
    assert code == 2 and "--size" in output

"""``kvstore bench engines`` end to end at a tiny size: SGLang's own host pool and page
functions driving kvstored (a real ``kvstored up``) and SGLang's file backend, every page
compared with what was backed up. Figures are not checked (benchmarks are not timed
tests); the JSON's shape, the verification and the goal verdicts are."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvstored.bench.engines import GOALS, evaluate_goals, render_markdown
from kvstored.capabilities import probe_engine
from tests.conftest import require

KVSTORE = str(Path(sys.executable).parent / "kvstore")
TINY = ("--pages", "3", "--page-tokens", "4", "--layers", "2", "--heads", "2",
        "--head-dim", "16", "--batch", "2", "--rounds", "2")


def run_bench(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [KVSTORE, "bench", "engines", "--workdir", str(tmp_path / "work"), "--json-out",
         str(tmp_path / "engines.json"), "--markdown-out", str(tmp_path / "engines.md"),
         *args], capture_output=True, text=True, timeout=600)


# A minute or more on a loaded machine: each peer imports SGLang (and torch) afresh.
@pytest.mark.slow
def test_kvstored_and_the_file_backend_through_sglangs_own_path(tmp_path):
    available, reason = probe_engine("sglang")
    require("engines", available, reason)
    done = run_bench(tmp_path, *TINY, "--runners", "kvstored-shm,sglang-file")
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((tmp_path / "engines.json").read_text())
    assert report["benchmark"] == "engines" and report["skipped"] == {}
    # 2 KV heads x 16 dims x bf16, K and V, 2 layers, 4 tokens.
    assert report["page_bytes"] == 2 * 16 * 2 * 2 * 2 * 4
    ours, file = report["results"]["kvstored-shm"], report["results"]["sglang-file"]
    assert ours["zero_copy_path"] and not file["zero_copy_path"]
    for entry in (ours, file):
        assert len(entry["rounds"]) == 2, entry
        assert entry["median"]["prefetch_gbps"] > 0 and entry["median"]["backup_gbps"] > 0
    # The adapter's copies are counted: an MHA page is two pieces (K and V), handed to
    # the client as they are, so none.
    assert ours["adapter_copies"] == {"gathered_bytes": 0, "scattered_bytes": 0}
    verdicts = {g["goal"]: g for g in report["goals"]}
    assert all(verdicts[goal]["status"] == "not measured" for goal, *_ in GOALS)
    assert verdicts["zero copies in the adapter (kvstored-shm)"]["met"] is True
    assert "| kvstored-shm |" in (tmp_path / "engines.md").read_text()


def test_an_unknown_runner_is_a_usage_error(tmp_path):
    done = run_bench(tmp_path, "--runners", "kvstored-shm,redis")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "unknown runner 'redis'" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize(("ours", "theirs", "met"), [(3.0, 1.5, True), (1.0, 1.0, False)])
def test_goals_are_ratios_of_this_runs_medians(ours, theirs, met):
    results = {"kvstored-shm": {"median": {"prefetch_gbps": ours},
                                "adapter_copies": {"gathered_bytes": 0,
                                                   "scattered_bytes": 0}},
               "mooncake-embedded": {"median": {"prefetch_gbps": theirs}}}
    verdicts = evaluate_goals(results)
    assert verdicts[0]["ratio"] == round(ours / theirs, 3) and verdicts[0]["met"] is met
    assert verdicts[1]["status"] == "not measured"  # no mooncake-remote in this run
    assert verdicts[2] == {"goal": "zero copies in the adapter (kvstored-shm)",
                           "copied_bytes": 0, "met": True}
    assert render_markdown({"kvstored-tcp": {"error": "boom"}}).count("| error |") == 1

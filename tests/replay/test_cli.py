"""``kvstore replay`` as a user runs it: real processes, exit codes, JSON, 80 columns,
progress only on a terminal and never with --json."""

from __future__ import annotations

import json
import os
import pty
import subprocess

import pytest

import kvstored
from kvstored.replay import values
from kvstored.replay.keys import chained_keys
from tests.daemon.harness import BIN, closed_port

from .test_report import check_replay_schema

TRACE = [
    {"timestamp": 0, "input_length": 2048, "output_length": 1, "hash_ids": [1, 2, 3, 4]},
    {"timestamp": 1000, "input_length": 2500, "output_length": 1, "hash_ids": [1, 2, 3, 4, 5]},
    {"timestamp": 2000, "input_length": 1024, "output_length": 1, "hash_ids": [1, 2]},
    {"timestamp": 3000, "input_length": 1536, "output_length": 1, "hash_ids": [7, 8, 9]},
    {"timestamp": 4000, "input_length": 3000, "output_length": 1,
     "hash_ids": [1, 2, 3, 4, 5, 6]},
]


@pytest.fixture
def trace_file(tmp_path):
    path = tmp_path / "tiny.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in TRACE))
    return path


def kvstore(*args, env=None, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "kvstore"), *map(str, args)], capture_output=True,
                          text=True, timeout=300, env={**os.environ, **(env or {})},
                          stdin=subprocess.DEVNULL, **kwargs)


@pytest.mark.parametrize("args, says", [
    ((), "give a TRACE"),
    (("t.jsonl", "--multiturn", "2x2"), "not both"),
    (("t.jsonl", "--speed", "2", "--as-fast-as-possible"), "exclude each other"),
    (("t.jsonl", "--speed", "0"), "must be positive"),
    (("t.jsonl", "--dram", "1GiB"), "belong to --multiturn"),
    (("--multiturn", "2x2", "--speed", "3"), "belong to a TRACE"),
    (("--multiturn", "2x2", "--warmup", "0.5", "--namespace", "x"), "--namespace, --warmup"),
    (("--multiturn", "twenty"), "CLIENTSxROUNDS"),
    (("--multiturn", "0x3"), "CLIENTSxROUNDS"),
    (("t.jsonl", "--block-bytes", "lots"), "--block-bytes"),
    (("t.jsonl", "--block-bytes", "1GiB"), "at most"),
    (("t.jsonl", "--namespace", "a/b"), "--namespace"),
])
def test_bad_usage_exits_2_and_says_why(args, says):
    run = kvstore("replay", *args)
    assert run.returncode == 2, run.stderr
    assert says in run.stderr and "Traceback" not in run.stderr


def test_a_missing_trace_exits_3_and_an_unreachable_master_4(tmp_path, trace_file):
    missing = kvstore("replay", tmp_path / "nope.jsonl", "--master", "127.0.0.1:1")
    assert missing.returncode == 3 and "nope.jsonl" in missing.stderr
    closed = kvstore("replay", trace_file, "--master", f"127.0.0.1:{closed_port()}")
    assert closed.returncode == 4, closed.stderr
    assert "Traceback" not in closed.stderr


def test_json_document_plot_and_page(store, trace_file, tmp_path):
    png, page = tmp_path / "r.png", tmp_path / "r.html"
    run = kvstore("replay", trace_file, "--master", store.address, "--json",
                  "--block-bytes", "8KiB", "--plot", png, "--html", page)
    assert run.returncode == 0, run.stderr
    assert run.stderr == ""
    doc = json.loads(run.stdout)
    check_replay_schema(doc)
    assert doc["requests"] == 5 and doc["block_bytes"] == 8192
    # request 2 hits blocks 1-4, request 3 blocks 1-2, request 5 blocks 1-5 (512 tokens
    # each there: block 5 was partial in request 2, full in request 5)
    assert doc["measured"]["hit_tokens"] == 4 * 512 + 2 * 512 + 5 * 512
    assert doc["measured"]["hit_rate"] == doc["predicted"]["hit_rate"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = page.read_text()
    assert "data:image/png;base64," in text and "no wrong byte" in text


def test_tables_fit_80_columns(store, trace_file):
    run = kvstore("replay", trace_file, "--master", store.address, "--block-bytes", "4KiB",
                  env={"COLUMNS": "80"})
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert "token hit rate" in run.stdout and "every byte read matched" in run.stdout
    assert max(len(line) for line in lines) <= 80, "\n".join(lines)


def _on_a_terminal(args) -> tuple[int, str, str]:
    """Run with stderr on a pseudo-terminal; returns (exit code, stdout, terminal text)."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen([str(BIN / "kvstore"), *map(str, args)], stdout=subprocess.PIPE,
                            stderr=follower, stdin=subprocess.DEVNULL, text=True,
                            env={**os.environ, "COLUMNS": "80"})
    os.close(follower)
    seen = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal closed: the process ended
            break
        if not chunk:
            break
        seen += chunk
    out = proc.stdout.read()
    os.close(leader)
    return proc.wait(60), out, seen.decode(errors="replace")


def test_progress_shows_on_a_terminal_never_with_json(store, tmp_path):
    """A trace long enough to take more than half a second draws a bar on a terminal;
    with --json the same terminal stays blank."""
    path = tmp_path / "long.jsonl"
    path.write_text("".join(json.dumps({"timestamp": i * 10, "input_length": 512 * 8,
                                        "output_length": 1,
                                        "hash_ids": [i % 7, 100 + i % 13, 1000 + i, 2000 + i,
                                                     3000 + i, 4000 + i, 5000 + i, 6000 + i]})
                        + "\n" for i in range(600)))
    code, _, terminal = _on_a_terminal(["replay", path, "--master", store.address,
                                        "--block-bytes", "4KiB", "--namespace", "bar"])
    assert code == 0
    assert "replaying" in terminal
    code, out, terminal = _on_a_terminal(["replay", path, "--master", store.address,
                                          "--block-bytes", "4KiB", "--json"])
    assert code == 0 and json.loads(out)["requests"] == 600
    assert terminal == ""


def test_a_wrong_byte_in_the_store_exits_5(store, trace_file):
    """The test writes a value of other bytes under the key of the trace's first block
    before the replay: the replay reads it back, counts it, and fails."""
    key = chained_keys("forged", __import__("numpy").array([1]))[0]
    bad = bytearray(values.value(key, 4096))
    bad[7] ^= 0x55
    with kvstored.connect(store.address) as client:
        assert client.put(key, bytes(bad))
    run = kvstore("replay", trace_file, "--master", store.address, "--block-bytes", "4KiB",
                  "--namespace", "forged", "--json")
    assert run.returncode == 5, run.stderr
    doc = json.loads(run.stdout)
    # every request starting with block 1 reads it: 1, 2, 3 and 5
    assert doc["wrong_bytes"] == 4 and doc["wrong_blocks"] == 4
    assert doc["wrong_examples"][0] == {"key": key, "wrong_bytes": 1}
    assert key in run.stderr and "corrupt" in run.stderr

"""Trace inputs and result outputs: standard input, --skip-bad-lines, the session readers'
field fallbacks and absolute-time sub-agents, -o FILE, and the reference's JSON layout."""

from __future__ import annotations

import gzip
import json

import pytest
from click.testing import CliRunner

from kvstored.cli.exitcodes import ExitCode
from kvstored.cli.tool import main
from kvstored.tools import reader
from kvstored.tools.errors import TraceError

from .conftest import random_requests, write_mooncake

BAD = ('{"timestamp": 0, "input_length": 8, "hash_ids": [1, 2]}\n'
       'not json\n'
       '{"timestamp": 1, "input_length": 8, "hash_ids": [1, 2.5]}\n'
       '{"timestamp": 2, "input_length": 8, "hash_ids": [1, 2]}\n'
       '[1]\n'
       '{"timestamp": 3, "input_length": "x", "hash_ids": [1, 2]}\n'
       '{"timestamp": 4, "input_length": 8, "hash_ids": [1, 2, 3], "block_tokens": [4, 4, 1]}\n')


def run(*args, stdin=None):
    return CliRunner().invoke(main, list(map(str, args)), input=stdin,
                              catch_exceptions=False)


def test_strict_by_default_naming_the_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(BAD)
    with pytest.raises(TraceError, match=r"bad.jsonl:2: not valid JSON"):
        reader.load([path], block_size=4)
    result = run("sim", path, "--blocks", "2", "--block-size", "4")
    assert result.exit_code == ExitCode.CORRUPT
    assert "bad.jsonl:2: not valid JSON" in result.output


def test_skip_bad_lines_counts_and_reports(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(BAD)
    trace = reader.load([path], block_size=4, skip_bad_lines=True)
    assert trace.requests == 3
    assert trace.bad_lines["skipped"] == 4
    lines = [e.split(": ", 1)[0].rsplit(":", 1)[1] for e in trace.bad_lines["examples"]]
    assert lines == ["2", "5", "6", "3"]  # line 3's float id is found when its batch converts
    # the explicit weights of the last good record stay with it
    assert trace.tokens.tolist() == [4, 4, 4, 4, 4, 4, 1]
    result = run("sim", path, "--blocks", "2", "--block-size", "4", "--skip-bad-lines",
                 "--json")
    assert result.exit_code == 0
    document = json.loads(result.stdout)
    assert document["trace"]["badLines"]["skipped"] == 4
    table = run("sim", path, "--blocks", "2", "--block-size", "4", "--skip-bad-lines")
    assert "Skipped 4 bad line(s)" in table.output


def test_stdin_plain_and_gzip(tmp_path):
    path = write_mooncake(tmp_path / "t.jsonl", random_requests(2, requests=50))
    from_file = json.loads(run("sim", path, "--blocks", "3,9", "--block-size", "4",
                               "--json").stdout)
    for data in (path.read_bytes(), gzip.compress(path.read_bytes())):
        result = run("sim", "-", "--blocks", "3,9", "--block-size", "4", "--json",
                     stdin=data)
        assert result.exit_code == 0, result.output
        document = json.loads(result.stdout)
        assert document["trace"]["sources"] == ["-"]
        assert document["points"] == from_file["points"]
    broken = run("sim", "-", "--blocks", "3", stdin=b'{"hash_ids": [1], "input_length": 4}\n{')
    assert broken.exit_code == ExitCode.CORRUPT and "-:2: not valid JSON" in broken.output
    empty = run("sim", "-", "--blocks", "3", stdin=b"")
    assert empty.exit_code == ExitCode.NOT_FOUND and "standard input is empty" in empty.output


def test_session_field_fallbacks_and_absolute_subagents(tmp_path):
    relative = {"id": "a", "block_size": 4, "requests": [
        {"t": 0, "in": 8, "out": 1, "hash_ids": [1, 2]},
        {"t": 10, "in": 12, "out": 1, "hash_ids": [1, 2, 3], "requests": [
            {"t": 5, "in": 8, "out": 1, "hash_ids": [7, 8]}]},
        {"t": 12, "in": 8, "out": 1, "hash_ids": [1, 2]}]}
    fallback = {"session_id": "a", "block_size": 4, "subagent_time": "absolute",
                "requests": [
        {"timestamp": 0, "input_tokens": 8, "output_tokens": 1, "hash_ids": [1, 2]},
        {"time": 10, "prompt_tokens": 12, "completion_tokens": 1, "hash_ids": [1, 2, 3],
         "requests": [{"t": 15, "input_length": 8, "hash_ids": [7, 8]}]},
        {"t": 12, "in": 8, "out": 1, "hash_ids": [1, 2]}]}
    one, two = tmp_path / "one.json", tmp_path / "two.json"
    one.write_text(json.dumps(relative))
    two.write_text(json.dumps(fallback))
    a, b = reader.load([one]), reader.load([two])
    # the sub-agent request runs at t = 15 either way: after the t = 12 request
    assert a.timestamps.tolist() == b.timestamps.tolist() == [0, 10, 12, 15]
    assert a.ids.tolist() == b.ids.tolist()
    assert a.input_lengths.tolist() == b.input_lengths.tolist() == [8, 12, 8, 8]
    # a group holder may say otherwise for its own group
    fallback["requests"][1]["subagent_time"] = "relative"
    two.write_text(json.dumps(fallback))
    assert reader.load([two]).timestamps.tolist() == [0, 10, 12, 25]
    fallback["subagent_time"] = "sideways"
    two.write_text(json.dumps(fallback))
    with pytest.raises(TraceError, match="subagent_time must be relative or absolute"):
        reader.load([two])


def test_sessions_jsonl_skips_a_bad_session(tmp_path):
    good = {"id": "g", "requests": [{"t": 0, "in": 64, "hash_ids": [0]},
                                    {"t": 1, "in": 64, "hash_ids": [0]}]}
    bad = {"id": "b", "requests": [{"t": 0, "in": -1, "hash_ids": [0]}]}
    path = tmp_path / "s.jsonl"
    path.write_text("\n".join([json.dumps(good), json.dumps(bad), "{", json.dumps(good)])
                    + "\n")
    with pytest.raises(TraceError, match=r"s.jsonl:3: not valid JSON"):
        reader.load([path])
    path.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(TraceError, match=r"s.jsonl:2: session 'b', request 0: 'in'"):
        reader.load([path])
    path.write_text("\n".join([json.dumps(good), json.dumps(bad), "{", json.dumps(good)])
                    + "\n")
    trace = reader.load([path], skip_bad_lines=True)
    assert trace.requests == 4 and trace.bad_lines["skipped"] == 2


def test_output_file_for_table_and_json(tmp_path):
    path = write_mooncake(tmp_path / "t.jsonl", random_requests(4, requests=40))
    table, document = tmp_path / "out.txt", tmp_path / "out.json"
    first = run("sim", path, "--blocks", "3", "--block-size", "4", "-o", table)
    assert first.exit_code == 0 and first.stdout == ""
    assert "Budget" in table.read_text() and "\x1b[" not in table.read_text()
    second = run("sim", path, "--blocks", "3", "--block-size", "4", "--json", "-o", document)
    assert second.exit_code == 0
    assert json.loads(document.read_text())["points"][0]["cacheBlocks"] == 3
    assert not list(tmp_path.glob("*.partial"))


def test_reference_json_schema_matches_the_reference(tmp_path):
    simulator = pytest.importorskip("kvcache_sim.simulator")
    trace_module = pytest.importorskip("kvcache_sim.trace")
    path = write_mooncake(tmp_path / "t.jsonl", random_requests(6, requests=300),
                          with_block_size=True)
    budgets = [0, 0.0005, 0.001, 0.002, 0.004]  # qwen3-0.6b, 4-token blocks: 0..9 blocks
    theirs = simulator.run_sweep(trace_module.parse_trace_file(path), model_id="qwen3-0.6b",
                                 budgets_gib=budgets, backend="python")
    result = run("sim", path, "--model", "qwen3-0.6b", "--budgets",
                 ",".join(map(str, budgets)), "--json-schema", "reference")
    assert result.exit_code == 0, result.output
    ours = json.loads(result.stdout)
    assert set(ours) == set(theirs)
    assert set(ours["metadata"]) == set(theirs["metadata"])
    for key, value in theirs["metadata"].items():
        if key not in ("backend", "speedupBaseline"):
            assert ours["metadata"][key] == value, key
    assert ours["hitRateCeiling"] == theirs["hitRateCeiling"]
    assert ours["ceiling"] == theirs["ceiling"]
    assert ours["policies"] == theirs["policies"]
    assert len(theirs["points"]) >= 3
    assert ours["points"] == theirs["points"]


def test_a_missing_models_file_is_not_found(tmp_path):
    result = run("sim", "builtin:rag", "--models-file", tmp_path / "nope.toml")
    assert result.exit_code == ExitCode.NOT_FOUND
    assert "nope.toml does not exist (--models-file)" in result.output

"""The binary event file and `kvstore trace convert`: the replay never changes."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kvstored.tools import binfile, builtin, reader, writers
from kvstored.tools.errors import TraceError, UsageProblem
from kvstored.tools.simulate import SimOptions, simulate

from .conftest import random_requests, write_mooncake


def _same_arrays(a, b):
    for name in ("ids", "tokens", "offsets", "input_lengths", "output_lengths"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert a.block_size == b.block_size


def test_binary_round_trip(tmp_path):
    requests = random_requests(2)
    requests[4] = ["a-string-id", *requests[4]]
    trace = reader.load([write_mooncake(tmp_path / "t.jsonl", requests)], block_size=4)
    path = tmp_path / "t.kvtrace"
    binfile.write(trace, path)
    assert binfile.is_binary(path) and reader.detect_format(path) == "binary"
    back = reader.load([path])
    _same_arrays(trace, back)
    assert np.array_equal(trace.timestamps, back.timestamps)
    assert back.id_names == ["a-string-id"] and back.format == "mooncake"


def test_binary_damage_is_detected(tmp_path):
    trace = reader.load([write_mooncake(tmp_path / "t.jsonl", random_requests(1))],
                        block_size=4)
    path = tmp_path / "t.kvtrace"
    binfile.write(trace, path)
    data = bytearray(path.read_bytes())
    flipped = bytearray(data)
    flipped[-3] ^= 0x40
    (tmp_path / "flip.kvtrace").write_bytes(flipped)
    with pytest.raises(TraceError, match="fails its checksum"):
        binfile.read(tmp_path / "flip.kvtrace")
    (tmp_path / "short.kvtrace").write_bytes(data[:-8])
    with pytest.raises(TraceError, match="truncated or damaged"):
        binfile.read(tmp_path / "short.kvtrace")
    newer = bytearray(data)
    newer[8] = 9
    (tmp_path / "newer.kvtrace").write_bytes(newer)
    with pytest.raises(TraceError, match=r"version 9.*upgrade"):
        binfile.read(tmp_path / "newer.kvtrace")
    (tmp_path / "tiny.kvtrace").write_bytes(binfile.MAGIC + b"\0" * 8)
    with pytest.raises(TraceError, match="too short"):
        binfile.read(tmp_path / "tiny.kvtrace")


@pytest.mark.parametrize("target", ["mooncake", "bailian", "sessions", "binary"])
def test_convert_keeps_the_replay(tmp_path, target):
    head = builtin.path_of("multi-turn-chat")  # Mooncake's format; ships in the package
    out = tmp_path / f"converted.{target}"
    writers.write(reader.load([head]), target, out)
    options = SimOptions(model="glm-5.1", budgets_gib=[1, 8, 64, 512],
                         policies=["fifo", "lru", "optimal", "s3fifo"])
    original = simulate([head], options)
    converted = simulate([out], options)
    assert converted["points"] == original["points"]
    assert converted["ceiling"] == original["ceiling"]


def test_convert_explicit_weights_and_gzip(tmp_path):
    path = tmp_path / "w.jsonl"
    path.write_text('{"input_length": 9, "hash_ids": [1, 2], "block_tokens": [3, 6]}\n'
                    '{"input_length": 9, "hash_ids": [1, 2, 3]}\n')
    trace = reader.load([path], "mooncake", 4)
    assert trace.tokens.tolist() == [3, 6, 4, 4, 1]
    out = tmp_path / "w.jsonl.gz"
    writers.write(trace, "mooncake", out)
    _same_arrays(trace, reader.load([out]))
    with pytest.raises(UsageProblem, match="explicit block weights"):
        writers.write(trace, "sessions", tmp_path / "s.json")
    assert not (tmp_path / "s.json").exists() and not list(tmp_path.glob("*.partial"))


def test_sessions_need_ordered_time(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"timestamp": 5, "input_length": 4, "hash_ids": [1]}\n'
                    '{"timestamp": 1, "input_length": 4, "hash_ids": [2]}\n')
    with pytest.raises(UsageProblem, match="timestamps go backwards"):
        writers.write(reader.load([path], block_size=4), "sessions", tmp_path / "s.json")


def test_sessions_output_is_a_session_file(tmp_path):
    trace = reader.load([write_mooncake(tmp_path / "t.jsonl", random_requests(5))],
                        block_size=4)
    out = tmp_path / "s.json"
    writers.write(trace, "sessions", out)
    session = json.loads(out.read_text())
    assert session["hash_id_scope"] == "global" and session["block_size"] == 4
    assert len(session["requests"]) == trace.requests

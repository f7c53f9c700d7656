"""Trace formats: parsing, session normalisation, and malformed input reported by line."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from kvstored.tools import reader
from kvstored.tools.errors import TraceError, TraceNotFoundError, UsageProblem
from kvstored.tools.ids import INT_KEY_LIMIT

from .conftest import write_mooncake


def test_mooncake_weights_and_defaults(tmp_path):
    path = write_mooncake(tmp_path / "t.jsonl", [[1, 2, 3], [1, 2, 4, 5]],
                          lengths=[1100, 1030])
    trace = reader.load([path], block_size=512)
    assert trace.format == "mooncake" and trace.block_size == 512
    # w_i = max(1, min(B, L - i*B)): 512, 512, 76; then 512, 6, 1 (L - 2B < 0), 1.
    assert trace.tokens.tolist() == [512, 512, 76, 512, 512, 6, 1]
    assert trace.offsets.tolist() == [0, 3, 7]
    assert trace.timestamps.tolist() == [0.0, 1.0]  # milliseconds to seconds


def test_block_size_on_lines_wins_and_must_agree(tmp_path):
    path = write_mooncake(tmp_path / "t.jsonl", [[1, 2], [3]], block_size=16,
                          with_block_size=True)
    assert reader.load([path], block_size=512).block_size == 16
    lines = path.read_text().splitlines()
    record = json.loads(lines[1])
    record["block_size"] = 32
    path.write_text(lines[0] + "\n" + json.dumps(record) + "\n")
    with pytest.raises(TraceError, match=r"t\.jsonl:2: block_size 32 differs from 16"):
        reader.load([path])


def test_records_without_blocks_are_skipped(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 10, "hash_ids": [1]}\n\n'
                    '{"timestamp": 1, "input_length": 10, "hash_ids": []}\n'
                    '{"timestamp": 2, "input_length": 10}\n'
                    '{"timestamp": 3, "input_length": 10, "hash_ids": [1, 2]}\n')
    trace = reader.load([path], "mooncake")
    assert (trace.requests, trace.skipped) == (2, 2)


def test_ids_compare_by_decimal_text(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"input_length": 8, "hash_ids": [5, "5", "05", "x", -3, "-3"]}\n'
                    f'{{"input_length": 8, "hash_ids": [{2**70}, "{2**70}", "x"]}}\n')
    trace = reader.load([path], "mooncake", 2)
    ids = trace.ids.tolist()
    assert ids[0] == ids[1] == 5 and ids[4] == ids[5] == -3
    assert ids[2] >= INT_KEY_LIMIT and ids[3] >= INT_KEY_LIMIT and ids[2] != ids[3]
    assert ids[6] == ids[7] and ids[8] == ids[3]
    assert trace.id_names[ids[2] - INT_KEY_LIMIT] == "05"


@pytest.mark.parametrize("line, message", [
    ('{"input_length": 8, "hash_ids": [1, 2', "not valid JSON"),
    ('[1, 2, 3]', "is a JSON list, not an object"),
    ('{"input_length": 8, "hash_ids": 7}', "hash_ids is not a list"),
    ('{"input_length": 0, "hash_ids": [1]}', "input_length must be a positive integer"),
    ('{"input_length": "8", "hash_ids": [1]}', "input_length must be a positive integer"),
    ('{"input_length": 8, "hash_ids": [1, true]}', "a hash id is a boolean"),
    ('{"input_length": 8, "hash_ids": [1, 2.5]}', "a hash id is float"),
    ('{"input_length": 8, "hash_ids": [1, [2]]}', "a hash id is list"),
    ('{"input_length": 8, "timestamp": "now", "hash_ids": [1]}', "timestamp must be a number"),
    ('{"input_length": 8, "hash_ids": [1], "block_tokens": [0]}', "block_tokens must list"),
    ('{"input_length": 8, "hash_ids": [1], "block_size": -4}', "block_size must be a positive"),
])
def test_malformed_lines_name_file_and_line(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"input_length": 8, "hash_ids": [1]}\n'
                    '{"input_length": 8, "hash_ids": [1, 2]}\n' + line + "\n")
    with pytest.raises(TraceError, match=message) as error:
        reader.load([path], "mooncake", 4)
    assert error.value.line == 3 and str(error.value).startswith(f"{path}:3: ")


def test_bad_id_found_in_a_large_batch_names_its_line(tmp_path):
    path = tmp_path / "big.jsonl"
    with path.open("w") as out:
        for k in range(3000):
            ids = list(range(k, k + 5)) if k != 2500 else [1, 2, 3.5]
            out.write(json.dumps({"input_length": 20, "hash_ids": ids}) + "\n")
    with pytest.raises(TraceError, match=r"big\.jsonl:2501: a hash id is float"):
        reader.load([path], "mooncake", 4)


def test_gzip_and_several_files(tmp_path):
    first = write_mooncake(tmp_path / "a.jsonl", [[1, 2], [1, 3]])
    second = tmp_path / "b.jsonl.gz"
    with gzip.open(second, "wt") as out:
        out.write('{"timestamp": 5, "input_length": 8, "hash_ids": [1, 2, 9]}\n')
    trace = reader.load([first, second], block_size=4)
    assert trace.requests == 3 and trace.ids.tolist() == [1, 2, 1, 3, 1, 2, 9]
    broken = tmp_path / "c.jsonl.gz"
    broken.write_bytes(gzip.compress(b'{"input_length": 8, "hash_ids": [1]}\n' * 50)[:40])
    with pytest.raises(TraceError, match="cannot be read"):
        reader.load([broken], "mooncake")


def test_missing_and_unknown(tmp_path):
    with pytest.raises(TraceNotFoundError):
        reader.load([tmp_path / "nope.jsonl"])
    weird = tmp_path / "w.jsonl"
    weird.write_text('{"something": 1}\n')
    with pytest.raises(TraceError, match="give --format"):
        reader.load([weird])
    with pytest.raises(UsageProblem, match="unknown format"):
        reader.load([weird], "csv")


def _session(name, requests, **extra):
    return {"id": name, "block_size": 64, "hash_id_scope": "local", "requests": requests,
            **extra}


def test_session_normalisation(tmp_path):
    # Session A (file a.json): t=5 [0,1,2], t=1 [0,1] whose nested group at +2 (so t=3)
    # sends [0, 7]. Session B (file b.json): t=1 [0, 3], t=0 [4].
    folder = tmp_path / "sessions"
    folder.mkdir()
    (folder / "a.json").write_text(json.dumps(_session("A", [
        {"t": 5, "in": 150, "out": 1, "hash_ids": [0, 1, 2]},
        {"t": 1, "in": 100, "out": 1, "hash_ids": [0, 1],
         "requests": [{"t": 2, "in": 90, "out": 1, "hash_ids": [0, 7]}]},
    ])))
    (folder / "b.json").write_text(json.dumps(_session("B", [
        {"t": 1, "in": 70, "out": 1, "hash_ids": [0, 3]},
        {"t": 0, "in": 10, "out": 1, "hash_ids": [4]},
    ])))
    trace = reader.load([folder])
    assert trace.format == "sessions" and trace.block_size == 64
    # A: base 1, ids + 1, max id 7 -> next base 9. B: ids + 9.
    # Per-session order by t: A = [t1 (0,1)], [t3 (0,7)], [t5 (0,1,2)]; B = [t0 (4)], [t1 (0,3)].
    # Ordinals: A's three are 0-2, B's 3-4; global stable sort by (t, ordinal):
    # t0 B(4) | t1 A(0,1) | t1 B(0,3) | t3 A(0,7) | t5 A(0,1,2)
    expected = [[13], [1, 2], [9, 12], [1, 8], [1, 2, 3]]
    assert trace.timestamps.tolist() == [0, 1, 1, 3, 5]
    got = [trace.ids[trace.offsets[r]:trace.offsets[r + 1]].tolist()
           for r in range(trace.requests)]
    assert got == expected
    assert trace.input_lengths.tolist() == [10, 100, 70, 90, 150]
    # The same sessions as a JSONL file, one per line, give the same events.
    lines = tmp_path / "sessions.jsonl"
    lines.write_text("\n".join((folder / n).read_text() for n in ("a.json", "b.json")) + "\n")
    again = reader.load([lines])
    assert np.array_equal(again.ids, trace.ids) and again.format == "sessions"


def test_session_errors(tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps(_session("ok", [{"t": 0, "in": 64, "hash_ids": [1]}])) + "\n"
                    + json.dumps(_session("bad", [{"t": 0, "in": 64, "hash_ids": [1, -2]}]))
                    + "\n")
    with pytest.raises(TraceError, match=r"s\.jsonl:2: session 'bad', request 0: hash_ids"):
        reader.load([path])
    path.write_text(json.dumps(_session("x", [{"t": 0, "in": 0, "hash_ids": [1]}])) + "\n")
    with pytest.raises(TraceError, match=r"'in' .* must be a positive integer"):
        reader.load([path])
    path.write_text(json.dumps(_session("x", [{"t": 0, "in": 9, "hash_ids": [1]}])) + "\n"
                    + json.dumps(_session("y", [{"t": 0, "in": 9, "hash_ids": [1]}],
                                          hash_id_scope="global")) + "\n")
    with pytest.raises(TraceError, match="mixes hash_id_scope"):
        reader.load([path])


def test_compiled_interner_keys_as_the_python_rules():
    from kvstored.tools.ids import IdInterner

    values = ["5", 5, "05", "-0", "-5", "abc", "abc", "ÿ-ünï", str(INT_KEY_LIMIT),
              INT_KEY_LIMIT, -INT_KEY_LIMIT, str(-INT_KEY_LIMIT - 1), "", "9" * 19,
              "12a", " 1", "\ud800x", 2**70, "0"]
    native, python = IdInterner(), IdInterner()
    python._native = None  # the pure-Python fallback's dict
    assert native._native is not None
    got = native.batch(values).tolist()
    assert got == python.batch(values).tolist()
    assert got[:2] == [5, 5] and got[2] != 5 and got[3] == 0
    assert list(native.names) == python.names
    assert native.names[native.key("abc") - INT_KEY_LIMIT] == "abc"
    assert [native.key(v) for v in values] == got
    assert native.batch([1.5, "x"]) is None and native.batch([[1], "x"]) is None

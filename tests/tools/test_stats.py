"""`kvstore trace stats`: counts, the ceiling and reuse gaps, on a hand-made trace."""

from __future__ import annotations

import json

from kvstored.tools import reader, stats


def test_reuse_gaps_by_hand(tmp_path):
    # Times in seconds (Bailian). Block chains: [1,2] at t=0, [1,2,3] at 300 s
    # (reuses 1, 2 after 5 min), [1] at 1500 s (reuse of 1 after 20 min),
    # [4] at 1600, [1,2,3] at 9000 s (1 after 125 min, 2 and 3 after 145 min).
    path = tmp_path / "b.jsonl"
    rows = [(0, [1, 2]), (300, [1, 2, 3]), (1500, [1]), (1600, [4]), (9000, [1, 2, 3])]
    path.write_text("".join(json.dumps({"chat_id": k, "timestamp": t, "input_length": 16 *
                                        len(ids), "hash_ids": ids}) + "\n"
                            for k, (t, ids) in enumerate(rows)))
    result = stats.describe(reader.load([path]), warmup=0.0)
    assert (result["requests"], result["blockEvents"], result["uniqueBlocks"]) == (5, 10, 4)
    assert result["timeSpanSeconds"] == 9000
    gaps = result["reuseGaps"]["perReuse"]
    assert gaps["count"] == 6
    assert [b["count"] for b in gaps["bins"]] == [2, 0, 1, 3]
    assert sum(gaps["histogram"]["counts"]) == 6
    # Per block, by its longest gap: block 1 (gaps 5, 20, 125 min) -> >30; block 2
    # (5, 145 min) -> >30; block 3 (145 min) -> >30; block 4 never reused.
    blocks = result["reuseGaps"]["perBlockMaxGap"]
    assert blocks["count"] == 3
    assert [b["count"] for b in blocks["bins"]] == [0, 0, 0, 3]
    # Ceiling over all requests: r1 hits 2 of 3 blocks (16 tokens each), r2 hits 1 of 1,
    # r4 hits 3 of 3: 6 of 10 blocks, and every block weighs 16 tokens.
    assert result["ceilingAllRequests"]["hitTokens"] == 6 * 16
    assert result["ceilingAllRequests"]["totalTokens"] == 10 * 16


def test_figure(tmp_path):
    from kvstored.tools import plots

    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps({"timestamp": k * 60_000, "input_length": 1024,
                                        "hash_ids": [k % 3, 10 + k % 5]}) + "\n"
                            for k in range(40)))
    out = tmp_path / "gaps.png"
    described = stats.describe(reader.load([path]))
    for weight in ("count", "tokens"):
        plots.save(stats.figure(described, weight), out)
        assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_reuse_gaps_two_ways_weighted_and_by_type(tmp_path):
    # Bailian, 16-token blocks, times in seconds. r0 text [1,2] at 0; r1 image [1,2,3]
    # at 60 (1 and 2 reused after 1 min); r2 text [1] at 1260 (1 after 20 min).
    # Per reuse: 0-10 min: 2 (blocks 1, 2 in r1), 20-30: 1. Per block by its longest gap:
    # block 1 -> 20 min, block 2 -> 1 min; block 3 never reused.
    # r1's input is 40 tokens: its blocks weigh 16, 16, 8; r2 weighs 16.
    path = tmp_path / "b.jsonl"
    rows = [(0, [1, 2], 32, "text"), (60, [1, 2, 3], 40, "image"), (1260, [1], 16, "text")]
    path.write_text("".join(json.dumps({"chat_id": k, "timestamp": t, "input_length": n,
                                        "type": kind, "hash_ids": ids}) + "\n"
                            for k, (t, ids, n, kind) in enumerate(rows)))
    gaps = stats.describe(reader.load([path]), warmup=0.0)["reuseGaps"]
    per_reuse, per_block = gaps["perReuse"], gaps["perBlockMaxGap"]
    assert [b["count"] for b in per_reuse["bins"]] == [2, 0, 1, 0]
    assert [b["tokens"] for b in per_reuse["bins"]] == [32, 0, 16, 0]
    assert [b["count"] for b in per_block["bins"]] == [1, 0, 1, 0]
    assert [b["tokens"] for b in per_block["bins"]] == [16, 0, 16, 0]
    by_type = gaps["byRequestType"]
    assert set(by_type) == {"text", "image"}
    # reuses go to the reusing request's type; blocks to the type that first wrote them
    assert by_type["image"]["perReuse"]["count"] == 2
    assert by_type["text"]["perReuse"]["count"] == 1
    assert by_type["text"]["perBlockMaxGap"]["count"] == 2
    assert by_type["image"]["perBlockMaxGap"]["count"] == 0

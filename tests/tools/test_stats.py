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
    gaps = result["reuseGaps"]
    assert gaps["reuses"] == 6
    assert [b["reuses"] for b in gaps["bins"]] == [2, 0, 1, 3]
    assert sum(gaps["histogram"]["counts"]) == 6
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
    plots.save(stats.figure(stats.describe(reader.load([path]))), out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

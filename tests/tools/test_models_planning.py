"""The model table (data, not code) and the capacity arithmetic."""

from __future__ import annotations

import math

import pytest

from kvstored.tools import models, planning
from kvstored.tools.errors import UsageProblem

# docs/simulator.md (from the reference's semantics page): bytes per token at BF16.
PUBLISHED = {"qwen3-32b": 262_144, "llama-3.1-70b": 327_680, "llama-3.1-8b": 131_072,
             "qwen3-8b": 147_456, "deepseek-v3": 70_272, "deepseek-r1": 70_272,
             "kimi-k2.5": 70_272, "deepseek-v3.2": 85_888, "glm-5.1": 109_824}


def test_published_values():
    table = models.load()
    for model_id, expected in PUBLISHED.items():
        assert table.bytes_per_token(model_id, "bf16") == expected, model_id
        assert table.bytes_per_token(model_id, "fp8") == expected // 2
        assert table.bytes_per_token(model_id, "fp4") == expected // 4


def test_every_formula_is_covered():
    table = models.load()
    assert {m.formula for m in table.models.values()} == set(models.FORMULAS)
    assert set(table.precisions) == {"bf16", "fp8", "fp4"}
    assert all(m.source for m in table.models.values())


def test_precision_defaults_and_fixed_formats():
    table = models.load()
    # DeepSeek-V4 defaults to FP8 KV with FP4 indexer keys; V4.1 ships in FP4 only.
    v4 = table.sizing("deepseek-v4-flash", tokens=4096)
    assert (v4.precision, v4.indexer_precision) == ("fp8", "fp4")
    assert table.sizing("deepseek-v4.1-flash", "bf16", tokens=4096).precision == "fp4"
    # the reference's precision ids are accepted as they are
    assert table.bytes_per_token("glm-5.1", "fp8_int8") == 109_824 // 2
    # the indexer precision moves only the indexer part
    mixed = table.sizing("glm-5.1", "bf16", indexer_precision="fp8")
    assert mixed.kv_bytes_per_token == 89_856 and mixed.indexer_bytes_per_token == 9_984
    # a draft model adds its layers
    assert table.bytes_per_token("glm-5.1", draft=True) > 109_824


def test_user_table_adds_and_overrides(tmp_path):
    extra = tmp_path / "mine.toml"
    extra.write_text('[models."tiny"]\nformula = "gqa"\nlayers = 2\nkv_heads = 1\n'
                     'head_dim = 4\n[models."glm-5.1"]\nformula = "mla"\nlayers = 1\n'
                     'kv_lora_rank = 10\nrope_dim = 6\n[precisions]\nfp32 = 4.0\n')
    table = models.load(extra)
    assert table.bytes_per_token("tiny") == 2 * 2 * 1 * 4 * 2
    assert table.bytes_per_token("glm-5.1", "fp32") == 64
    extra.write_text('[models."bad"]\nformula = "gqa"\nlayers = 2\n')
    with pytest.raises(UsageProblem, match=r"needs num_key_value_heads \(or kv_heads\)"):
        models.load(extra)
    with pytest.raises(UsageProblem, match="unknown model"):
        models.load().bytes_per_token("gpt-9")


def test_cache_blocks_and_speedup():
    assert planning.cache_blocks(1, 109_824 * 512) == 19
    assert planning.cache_blocks(16384, 109_824 * 512) == 312_861
    assert planning.cache_blocks(0.5, 0) == 0
    assert planning.ideal_speedup(0.0) == 1.0
    assert planning.ideal_speedup(0.9) == pytest.approx(10.0)
    assert planning.ideal_speedup(1.0) == 1000.0


def test_recommend_budget():
    weka = [(512, 6.34), (1024, 7.91), (2048, 8.67), (4096, 8.99)]
    pick = planning.recommend_budget
    assert pick(weka, 0.05, ceiling_speedup=9.53, fits=False)["gib"] == 2048  # 8.67 >= 8.54
    assert pick(weka, 0.15, ceiling_speedup=9.53, fits=False)["gib"] == 1024  # 7.91 >= 7.64
    assert pick(weka, 0.0, ceiling_speedup=9.53, fits=False)["gib"] == 4096
    assert pick([], 0.05, ceiling_speedup=2, fits=False)["gib"] is None
    # never "larger budgets" where the trace fits, whatever the slope
    fitted = pick([(1, 1.2), (2, 1.5), (4, 3.0), (8, 16.9)], 0.05, ceiling_speedup=16.9,
                  fits=True)
    assert fitted["gib"] == 8 and "larger budgets" not in fitted["reason"]
    rising = pick(weka, 0.0, ceiling_speedup=20.0, fits=False)
    assert "larger budgets" in rising["reason"]
    # the same curve scaled to another trace size (budgets x 1000) picks the same point
    scaled = [(g * 1000, s) for g, s in weka]
    assert pick(scaled, 0.05, ceiling_speedup=9.53, fits=False)["gib"] == 2048 * 1000
    gains = planning.marginal_gains(weka)
    assert gains[0] is None and math.isclose(gains[1], (7.91 - 6.34) / 0.5)

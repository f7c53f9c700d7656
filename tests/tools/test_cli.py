"""`kvstore sim` and `kvstore trace` end to end: output files, JSON, errors and exit codes."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from kvstored.cli.exitcodes import ExitCode
from kvstored.cli.tool import main
from kvstored.tools import builtin

from .conftest import random_requests, write_mooncake


def run(*args):
    return CliRunner().invoke(main, list(map(str, args)), catch_exceptions=False)


@pytest.fixture
def chat_trace():
    """A chat trace in Mooncake's format that ships in the package (no ../shared)."""
    return builtin.path_of("multi-turn-chat")


def test_sim_table_plot_and_html(tmp_path, chat_trace):
    png, page = tmp_path / "out.png", tmp_path / "report.html"
    result = run("sim", chat_trace, "--model", "glm-5.1", "--budgets",
                 "16GiB,64GiB,256GiB,1TiB", "--plot", png, "--html", page)
    assert result.exit_code == 0, result.output
    assert "Recommended" in result.output and "256 GiB" in result.output
    assert png.read_bytes()[:4] == b"\x89PNG"
    text = page.read_text()
    assert "data:image/png;base64," in text and "Recommended budget" in text
    assert not re.search(r"(src|href)=\"https?:", text)  # self-contained


def test_sim_json_with_tiered(chat_trace):
    result = run("sim", chat_trace, "--model", "glm-5.1", "--budgets", "64,256",
                 "--policies", "lru,s3fifo,tiered", "--ssd", "1TiB", "--tier-mode", "offload",
                 "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["tiered"]["mode"] == "offload-on-evict" and doc["tiered"]["promotion"]
    point = doc["points"][0]["results"]["tiered"]
    assert point["dramHitTokens"] + point["ssdHitTokens"] == point["hitTokens"]
    assert 0 <= point["twoPointDramShare"] <= 1
    assert point["ttft"]["speedup"] > 1
    assert doc["memory"]["bytesPerEvent"] > 0


def test_list_models():
    result = run("sim", "--list-models")
    assert result.exit_code == 0 and "glm-5.1" in result.output and "109,824" in result.output
    doc = json.loads(run("sim", "--list-models", "--json").output)
    assert any(m["id"] == "deepseek-v3.2" for m in doc["models"])


def test_trace_stats_and_convert(tmp_path, chat_trace):
    png = tmp_path / "gaps.png"
    result = run("trace", "stats", chat_trace, "--plot", png)
    assert result.exit_code == 0, result.output
    assert "reused 0-10 min" in result.output and png.exists()
    assert "longest gap >30 min" in result.output
    doc = json.loads(run("trace", "stats", chat_trace, "--json").output)
    for key in ("perReuse", "perBlockMaxGap"):
        assert [b["label"] for b in doc["reuseGaps"][key]["bins"]] == \
            ["0-10 min", "10-20 min", "20-30 min", ">30 min"]
    binary = tmp_path / "t.kvtrace"
    result = run("trace", "convert", chat_trace, "--to", "binary", "-o", binary)
    assert result.exit_code == 0 and "wrote" in result.output
    a = json.loads(run("sim", chat_trace, "--model", "glm-5.1", "--json").output)
    b = json.loads(run("sim", binary, "--model", "glm-5.1", "--json").output)
    assert a["points"] == b["points"]


@pytest.mark.parametrize("args, code, message", [
    (["sim", "{bad}", "--model", "glm-5.1"], ExitCode.CORRUPT, "{bad}:2: not valid JSON"),
    (["sim", "{missing}", "--model", "glm-5.1"], ExitCode.NOT_FOUND, "no such file"),
    (["sim", "{good}", "--model", "gpt-9"], ExitCode.USAGE, "unknown model 'gpt-9'"),
    (["sim", "{good}"], ExitCode.USAGE, "give --model"),
    (["sim", "{good}", "--model", "glm-5.1", "--policies", "lru,arc"], ExitCode.USAGE,
     "unknown policy arc"),
    (["sim", "{good}", "--model", "glm-5.1", "--policies", "tiered"], ExitCode.USAGE,
     "needs the SSD tier's size"),
    (["sim", "{good}", "--model", "glm-5.1", "--budgets", "12 apples"], ExitCode.USAGE,
     "is not a size"),
    (["trace", "stats", "{bad}"], ExitCode.CORRUPT, "{bad}:2: not valid JSON"),
    (["trace", "convert", "{good}", "--to", "binary", "-o", "{good}"], ExitCode.USAGE,
     "is also an input"),
])
def test_errors_are_one_line_with_exit_codes(tmp_path, args, code, message):
    good = write_mooncake(tmp_path / "good.jsonl", random_requests(1))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"input_length": 8, "hash_ids": [1]}\n{"input_length": 8, "hash_\n')
    names = {"good": good, "bad": bad, "missing": tmp_path / "missing.jsonl"}
    result = CliRunner().invoke(main, [a.format(**names) for a in args])
    assert result.exit_code == code, result.output
    assert message.format(**names) in result.output
    assert "Traceback" not in result.output

"""The built-in traces: shipped in the package, exactly what their workload models
generate at the default seed, and usable by name without ../shared."""

from __future__ import annotations

import gzip
import json

import pytest
from click.testing import CliRunner

from kvstored.cli.tool import main
from kvstored.tools import builtin, reader, stats, workloads
from kvstored.tools.errors import UsageProblem


def run(*args):
    return CliRunner().invoke(main, list(map(str, args)), catch_exceptions=False)


@pytest.mark.parametrize("name", list(workloads.WORKLOADS))
def test_shipped_file_is_the_model_at_the_default_seed(name):
    shipped = builtin.path_of(name).read_bytes()
    assert shipped == workloads.generate(name), (
        f"data/traces/{name}.jsonl.gz differs from its workload model: regenerate it with "
        f"kvstore trace generate {name} -o tools/data/traces/{name}.jsonl.gz")
    assert len(shipped) < 256 * 1024  # small enough to ship
    assert workloads.generate(name, seed=7) != shipped


def test_each_trace_reads_in_its_format_with_its_workload_shape():
    chat, agent, rag = (reader.load([builtin.PREFIX + n])
                        for n in ("multi-turn-chat", "coding-agent", "rag"))
    assert (chat.format, chat.block_size) == ("mooncake", 512)
    assert (agent.format, agent.block_size) == ("sessions", 64)
    assert (rag.format, rag.block_size) == ("bailian", 16)
    assert agent.kind_names == ["main", "subagent"]
    assert rag.kind_names == ["search", "text"]
    # what each model is for: agents resend long contexts, chat and RAG share prefixes
    for trace, low in ((chat, 0.6), (agent, 0.85), (rag, 0.55)):
        ceiling = stats.describe(trace)["ceiling"]["hitRate"]
        assert low < ceiling < 1, trace.sources
    assert agent.input_lengths.mean() > 20_000


def test_scale_multiplies_the_load():
    half = workloads.generate("coding-agent", scale=0.5)
    sessions = gzip.decompress(half).splitlines()
    assert len(sessions) == workloads.AgentModel().sessions // 2
    with pytest.raises(ValueError):
        workloads.generate("rag", scale=0)


def test_sim_by_name_positional_and_option(tmp_path):
    by_option = run("sim", "--trace", "builtin:coding-agent", "--model", "glm-5.1",
                    "--budgets", "4,16", "--json")
    positional = run("sim", "builtin:coding-agent", "--model", "glm-5.1", "--budgets",
                     "4,16", "--json")
    assert by_option.exit_code == positional.exit_code == 0, by_option.output
    a, b = json.loads(by_option.stdout), json.loads(positional.stdout)
    assert a["trace"]["sources"] == ["builtin:coding-agent"]
    assert a["points"] == b["points"]
    listed = run("sim", "--list-traces", "--json")
    assert [row["name"] for row in json.loads(listed.stdout)] == \
        [builtin.PREFIX + n for n in workloads.WORKLOADS]
    unknown = run("sim", "builtin:nope", "--model", "glm-5.1")
    assert unknown.exit_code == 2 and "builtin:coding-agent" in unknown.output
    with pytest.raises(UsageProblem):
        builtin.path_of("nope")


def test_generate_writes_the_same_bytes(tmp_path):
    out = tmp_path / "rag.jsonl.gz"
    result = run("trace", "generate", "rag", "-o", out)
    assert result.exit_code == 0 and "wrote" in result.output
    assert out.read_bytes() == builtin.path_of("rag").read_bytes()

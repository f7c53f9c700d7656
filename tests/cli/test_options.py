"""Argument handling of both programs, in-process: global options where people put them,
the configuration and environment `kvstore` reads, and usage errors before any
connection. Nothing listens on the addresses used here (a closed port answers at once)."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from kvstored.cli.daemon import main as kvstored_main
from kvstored.cli.exitcodes import ExitCode
from kvstored.cli.tool import main as kvstore_main
from tests.daemon.harness import closed_port


def _run(program, *args, env=None):
    # Neither the developer's configuration nor their KVSTORE_MASTER may leak in.
    clean = {"KVSTORED_CONFIG": None, "KVSTORE_MASTER": None, "KVSTORED_CLIENT_MASTER": None,
             "KVSTORED_CLIENT_TIMEOUT": None, "KVSTORED_SECURITY_TOKEN_FILE": None,
             "KVSTORED_DEBUG": None}
    return CliRunner(env={**clean, **(env or {})}).invoke(program, [str(a) for a in args])


def kvstore(*args, env=None):
    return _run(kvstore_main, *args, env=env)


def _commands(group: click.Group, ctx: click.Context, path: tuple[str, ...] = ()):
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        yield (*path, name)
        if isinstance(command, click.Group):
            yield from _commands(command, ctx, (*path, name))


def _every_command():
    for program in (kvstored_main, kvstore_main):
        with click.Context(program) as ctx:
            for path in _commands(program, ctx):
                yield pytest.param(program, path, id=f"{program.name} {' '.join(path)}")


@pytest.mark.parametrize(("program", "path"), list(_every_command()))
def test_every_command_exits_2_on_an_unknown_option(program, path):
    result = _run(program, *path, "--no-such-option")
    assert result.exit_code == ExitCode.USAGE, result.output
    assert "No such option" in result.stderr and "Traceback" not in result.stderr


@pytest.fixture
def closed():
    """An address nothing listens on, and another: which one a message names tells which
    option won."""
    return f"127.0.0.1:{closed_port()}", f"127.0.0.1:{closed_port()}"


@pytest.mark.parametrize("where", ["group", "command"])
@pytest.mark.parametrize("command", ["status", "ls", "flush", "recover", "rm k", "get k",
                                     "evict --tier dram --all"])
def test_master_works_before_and_after_the_command(closed, where, command):
    words = command.split()
    args = ["--master", closed[0], *words] if where == "group" else \
        [*words, "--master", closed[0]]
    result = kvstore(*args)
    assert result.exit_code == ExitCode.UNREACHABLE, result.output
    assert f"kvstore {words[0]}: cannot reach {closed[0]}" in result.stderr


def test_the_commands_option_wins_over_the_groups(closed):
    result = kvstore("--master", closed[0], "status", "--master", closed[1])
    assert result.exit_code == ExitCode.UNREACHABLE and closed[1] in result.stderr


def test_the_master_comes_from_flag_env_and_file_in_that_order(closed, tmp_path):
    config = tmp_path / "kvstored.toml"
    config.write_text(f'[client]\nmaster = "{closed[0]}"\n')
    from_file = kvstore("status", "--config", config)
    assert closed[0] in from_file.stderr, from_file.output
    from_env = kvstore("status", env={"KVSTORED_CONFIG": str(config),
                                      "KVSTORED_CLIENT_MASTER": closed[1]})
    assert closed[1] in from_env.stderr, from_env.output
    tool_env = kvstore("status", env={"KVSTORE_MASTER": closed[1]})
    assert closed[1] in tool_env.stderr, tool_env.output
    from_flag = kvstore("--config", config, "status", "--master", closed[1],
                        env={"KVSTORE_MASTER": closed[0]})
    assert closed[1] in from_flag.stderr, from_flag.output


def test_bad_timeouts_are_usage_errors_naming_where_they_came_from(closed):
    flag = kvstore("status", "--master", closed[0], "--timeout", "soon")
    assert flag.exit_code == ExitCode.USAGE
    assert "flag --timeout: client.timeout: 'soon' is not a duration" in flag.stderr
    env = kvstore("status", "--master", closed[0], env={"KVSTORED_CLIENT_TIMEOUT": "-1"})
    assert env.exit_code == ExitCode.USAGE and "KVSTORED_CLIENT_TIMEOUT" in env.stderr
    wait = kvstore("flush", "--wait", "--wait-timeout", "forever", "--master", closed[0])
    assert wait.exit_code == ExitCode.USAGE and "--wait-timeout" in wait.stderr


def test_a_missing_or_empty_token_file_is_named(closed, tmp_path):
    missing = kvstore("status", "--master", closed[0], "--token-file", tmp_path / "nope")
    assert missing.exit_code == ExitCode.NOT_FOUND
    assert f"cannot read the token file {tmp_path / 'nope'} (flag --token-file)" \
        in missing.stderr
    empty = tmp_path / "empty"
    empty.write_text("\n")
    blank = kvstore("--token-file", empty, "status", "--master", closed[0])
    assert blank.exit_code == ExitCode.USAGE and "is empty" in blank.stderr


@pytest.mark.parametrize("args", [
    ["evict", "--tier", "dram"],
    ["evict", "--tier", "dram", "--all", "--prefix", "p"],
    ["evict", "--tier", "ssd", "--bytes", "lots"],
    ["recover", "--backend", "bucket"],
    ["mount", ".", "--backend", "bucket"],
])
def test_usage_is_checked_before_connecting(closed, args):
    result = kvstore(*args, "--master", closed[0])
    assert result.exit_code == ExitCode.USAGE, result.output
    assert "cannot reach" not in result.stderr


@pytest.mark.parametrize("args", [
    ["put", "k", "{tmp}/absent.bin"],
    ["recover", "--offline", "{tmp}/absent"],
    ["mount", "{tmp}/absent"],
    ["mount", "{tmp}", "--offline", "{tmp}/absent"],
    ["bench", "sim", "--trace", "{tmp}/absent.jsonl"],
])
def test_a_path_that_does_not_exist_is_not_found(closed, tmp_path, args):
    result = kvstore(*[a.format(tmp=tmp_path) for a in args], env={"KVSTORE_MASTER": closed[0]})
    assert result.exit_code == ExitCode.NOT_FOUND, result.output
    assert f"{tmp_path}/absent" in result.stderr and "does not exist" in result.stderr


def test_a_file_where_a_directory_belongs_is_usage(tmp_path):
    afile = tmp_path / "f"
    afile.write_text("x")
    result = kvstore("recover", "--offline", afile)
    assert result.exit_code == ExitCode.USAGE and "is a file" in result.stderr


@pytest.mark.parametrize("args", [["--debug", "status"], ["status", "--debug"]])
def test_debug_adds_the_traceback_wherever_it_is_given(closed, args):
    result = kvstore(*args, "--master", closed[0])
    assert result.exit_code == ExitCode.UNREACHABLE
    assert "Traceback" in result.stderr
    assert result.stderr.rstrip().endswith(f"kvstore status: cannot reach {closed[0]} "
                                           "(Connection refused); is kvstored running?")
    quiet = kvstore("status", "--master", closed[0])
    assert quiet.stderr.count("\n") == 1 and "Traceback" not in quiet.stderr


def test_kvstored_takes_debug_on_the_group_and_on_the_role(tmp_path):
    for args in (["--debug", "config", "show"], ["config", "show", "--debug"]):
        result = _run(kvstored_main, *args, "--config", tmp_path / "absent.toml")
        assert result.exit_code == ExitCode.USAGE and "Traceback" in result.stderr
    plain = _run(kvstored_main, "config", "show", "--config", tmp_path / "absent.toml")
    assert plain.exit_code == ExitCode.USAGE and "Traceback" not in plain.stderr
    assert plain.stderr.startswith("kvstored config show: configuration file ")

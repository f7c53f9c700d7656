"""Every command's --help: it shows every default (a setting's from the settings table,
not a copy), and it speaks to the user, never of issue numbers or the project's history."""

from __future__ import annotations

import re

import click
import pytest
from click.testing import CliRunner

from kvstored.cli.daemon import main as kvstored_main
from kvstored.cli.settings import SettingOption, shown_default
from kvstored.cli.tool import main as kvstore_main
from kvstored.config import SCHEMA

#: What a help text must not say: the tracker's vocabulary and the project's past.
INTERNAL = re.compile(r"\bissues?\b|#\d|\bsession\s+\d|\bno longer\b|\bused to\b|"
                      r"\bpreviously\b|\bformerly\b|\bnowadays\b|\blegacy\b|\bTODO\b",
                      re.IGNORECASE)
#: The role commands, whose every option but these sets a configuration key.
ROLES = {("up",), ("master",), ("node",)}
NOT_SETTINGS = {"config_file", "verbose", "debug", "help"}


def _commands(group: click.Group, ctx: click.Context, path: tuple[str, ...] = ()):
    yield path, group
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if isinstance(command, click.Group):
            yield from _commands(command, ctx, (*path, name))
        else:
            yield (*path, name), command


def _every_command():
    for program in (kvstored_main, kvstore_main):
        with click.Context(program) as ctx:
            for path, command in _commands(program, ctx):
                yield pytest.param(program, path, command,
                                   id=" ".join((program.name or "", *path)))


def _help(program, path) -> str:
    result = CliRunner(env={"COLUMNS": "100"}).invoke(program, [*path, "--help"])
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize(("program", "path", "command"), list(_every_command()))
def test_help_shows_every_default_and_no_internal_history(program, path, command):
    text = _help(program, path)
    found = INTERNAL.search(text)
    assert found is None, f"--help says {found.group(0)!r}:\n{text}"
    flat = " ".join(text.split())  # the help as one line: wrapping splits words
    for param in command.params:
        if not isinstance(param, click.Option) or param.name == "help":
            continue
        if isinstance(param, SettingOption):
            shown = f"[{param.setting_key}; default {shown_default(param.setting_key)}]"
            assert " ".join(shown.split()) in flat, f"{param.opts[0]} hides {shown}:\n{text}"
        elif not param.is_flag and param.default not in (None, (), click.core.UNSET):
            assert param.show_default or "default" in (param.help or "").lower(), \
                f"{param.opts[0]} has the default {param.default!r} but does not show it"
        if path in ROLES and param.name not in NOT_SETTINGS:
            assert isinstance(param, SettingOption), \
                f"{' '.join(path)} {param.opts[0]} sets a setting but does not name it"


def test_a_changed_default_shows_in_help(monkeypatch):
    """The help reads the table when it is built: nothing is copied."""
    from kvstored import config

    setting = SCHEMA["node.dram"]
    changed = config.Setting(setting.key, setting.kind, "3GiB", setting.help)
    monkeypatch.setitem(config.SCHEMA, "node.dram", changed)
    assert shown_default("node.dram") == "3GiB"

"""Parameter types of the CLI whose failures are not bad usage.

click reports every bad parameter as usage (exit 2), but a path that does not exist is
NOT_FOUND (exit 3) in docs/cli.md, like a missing key: a script can tell "you typed it
wrong" from "it is not there".
"""

from __future__ import annotations

import os
from typing import Any

import click

from kvstored.cli.errors import QuietError
from kvstored.cli.exitcodes import ExitCode


class ExistingPath(click.Path):
    """A file or directory that must exist. One of the wrong kind is bad usage; nothing
    there is NOT_FOUND, with ``missing_hint`` (``{path}`` is filled in) saying what to do.
    ``-`` (stdin) passes when ``allow_dash``."""

    def __init__(self, *, directory: bool, missing_hint: str = "", **path_options: Any):
        super().__init__(file_okay=not directory, dir_okay=directory, **path_options)
        self.missing_hint = missing_hint

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        path = super().convert(value, param, ctx)
        if self.allow_dash and value == "-":
            return path
        if not os.path.exists(os.fsdecode(path)):
            if isinstance(param, click.Option):
                what = f" ({param.opts[0]})"
            else:
                what = f" ({param.human_readable_name})" if param is not None else ""
            hint = f"; {self.missing_hint.format(path=path)}" if self.missing_hint else ""
            raise QuietError(f"{path} does not exist{what}{hint}", ExitCode.NOT_FOUND)
        return path


class ExistingDirectory(ExistingPath):
    """A directory that must exist."""

    def __init__(self, missing_hint: str = "", **path_options: Any) -> None:
        super().__init__(directory=True, missing_hint=missing_hint, **path_options)


class ExistingFile(ExistingPath):
    """A file that must exist."""

    def __init__(self, missing_hint: str = "", **path_options: Any) -> None:
        super().__init__(directory=False, missing_hint=missing_hint, **path_options)


class SettingOption(click.Option):
    """An option that sets a configuration key; :func:`setting_option` makes them."""

    def __init__(self, *args: Any, setting_key: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: The configuration key this option overrides (``node.dram``).
        self.setting_key = setting_key


def shown_default(key: str) -> str:
    """The default of configuration ``key`` as help texts show it: from the settings
    table (kvstored/config.py), so that a changed default is never shown stale."""
    from kvstored.config import SCHEMA, Address, describe_default

    setting = SCHEMA[key]
    text = describe_default(setting)
    if text == '""':
        return "off" if isinstance(setting.kind, Address) else "empty"
    return text


def setting_option(*decls: str, key: str, help: str, **attrs: Any) -> Any:
    """A click option for configuration key ``key`` (given, it wins over the file and the
    environment). Its help ends with ``[key; default ...]``, the default read from the
    settings table. The option's own default is None: "not given"."""
    return click.option(*decls, cls=SettingOption, setting_key=key,
                        help=f"{help} [{key}; default {shown_default(key)}]", **attrs)

"""click options that set a configuration key: each one's help names the key and shows
its default, read from the settings table (:data:`kvstored.config.SCHEMA`), so that
``--help`` never shows a default that has changed. The file and the environment are read
by :func:`kvstored.config.load_config`; an option given wins over both.
"""

from __future__ import annotations

from typing import Any

import click

from kvstored.config import SCHEMA, Address, describe_default


class SettingOption(click.Option):
    """An option that sets a configuration key; :func:`setting_option` makes them."""

    def __init__(self, *args: Any, setting_key: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: The configuration key this option overrides (``node.dram``).
        self.setting_key = setting_key


def shown_default(key: str) -> str:
    """The default of configuration ``key`` as help texts show it: from the settings
    table (kvstored/config.py), so that a changed default is never shown stale."""
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

"""``kvstored config``: show the effective configuration, and list every setting."""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from kvstored.cli.lazy import LazyGroup
from kvstored.cli.program import debug_option
from kvstored.config import (
    CONFIG_ENV,
    SCHEMA,
    SECTIONS,
    SETTINGS,
    describe_default,
    load_config,
    to_plain,
)


def _console() -> Console:
    console = Console()
    if not console.is_terminal:
        # Piped or captured: never wrap a row, so `| grep node.dram` sees the whole line.
        console = Console(width=1000)
    return console


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
def config() -> None:
    """Show the effective configuration, or list every setting.

    Values come from the defaults < a TOML file < KVSTORED_* environment variables <
    flags; docs/configuration.md describes every key.
    """


@config.command()
@click.option("--config", "config_file", type=click.Path(dir_okay=False, path_type=Path),
              help=f"The TOML file to read (default: ${CONFIG_ENV}, else none).")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON document {key: {value, source}} instead of a table.")
@debug_option
def show(config_file: Path | None, as_json: bool) -> None:
    """Print the effective configuration and where each value came from."""
    cfg = load_config(config_file)
    if as_json:
        document = {key: {"value": to_plain(value), "source": source}
                    for key, value, source in cfg.items()}
        click.echo(json.dumps(document, indent=1))
        return
    console = _console()
    if cfg.file is None:
        console.print(f"no configuration file (pass --config FILE or set ${CONFIG_ENV})",
                      highlight=False, markup=False)
    else:
        console.print(f"configuration file: {cfg.file}", highlight=False, markup=False)
    table = Table(show_edge=False)
    table.add_column("key", no_wrap=True)
    table.add_column("value")
    table.add_column("source", no_wrap=True)
    section = None
    for key, value, source in cfg.items():
        if section is not None and key.partition(".")[0] != section:
            table.add_section()
        section = key.partition(".")[0]
        # Text, not markup: "[::1]:7700" must not be read as a style tag.
        style = "dim" if source == "default" else "bold"
        table.add_row(key, Text(SCHEMA[key].kind.show(value)), Text(source, style=style))
    console.print(table)


@config.command()
@click.option("--markdown", is_flag=True, help="Print the Markdown table docs use.")
def keys(markdown: bool) -> None:
    """List every setting: type, default, environment variable and meaning."""
    if markdown:
        click.echo(reference_markdown(), nl=False)
        return
    table = Table(show_edge=False)
    for column in ("key", "type", "default", "environment", "meaning"):
        table.add_column(column, no_wrap=column != "meaning")
    for setting in SETTINGS:
        table.add_row(setting.key, setting.kind.label, Text(describe_default(setting)),
                      setting.env, Text(setting.help))
    _console().print(table)


def reference_markdown() -> str:
    """One Markdown table per section; docs/configuration.md embeds this verbatim (a test
    keeps them equal), so regenerate with `kvstored config keys --markdown`."""
    lines: list[str] = []
    for section in SECTIONS:
        lines += [f"### [{section}]", "",
                  "| key | type | default | environment | meaning |", "|---|---|---|---|---|"]
        for setting in SETTINGS:
            if setting.section == section:
                cells = (f"`{setting.key}`", setting.kind.label.replace("|", " \\| "),
                         f"`{describe_default(setting)}`", f"`{setting.env}`",
                         setting.help.replace("|", "\\|"))
                lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)

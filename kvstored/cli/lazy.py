"""A click group whose subcommands are imported only when they are used.

``kvstore --help`` must stay fast, and a subcommand whose optional dependency is missing
(matplotlib, pyfuse3) must not break the others. Every group of the two programs is one,
so each records the command about to run (``kvstore bench sim``) in the program's state
(:class:`kvstored.cli.program.CliState`), for the first words of its error messages.
"""

from __future__ import annotations

import importlib

import click


class LazyGroup(click.Group):
    """A group built from ``{name: "module:attribute"}``, each imported on first use."""

    def __init__(self, *args, lazy_commands: dict[str, str] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.lazy_commands = dict(lazy_commands or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy_commands})

    def resolve_command(self, ctx: click.Context, args: list[str]):
        name, command, rest = super().resolve_command(ctx, args)
        run = ctx.find_root().obj
        if name and hasattr(run, "command"):
            run.command = f"{ctx.command_path} {name}"
        return name, command, rest

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.lazy_commands:
            return self._load(cmd_name)
        return super().get_command(ctx, cmd_name)

    def _load(self, cmd_name: str) -> click.Command:
        module_name, _, attribute = self.lazy_commands[cmd_name].partition(":")
        command = getattr(importlib.import_module(module_name), attribute)
        if not isinstance(command, click.Command):
            raise TypeError(f"{self.lazy_commands[cmd_name]} is not a click command")
        return command

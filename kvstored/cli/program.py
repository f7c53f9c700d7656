"""The top level of both programs: the click group that every command runs under, the
state its options share with the commands, and the one place where a command's failure
becomes a message and an exit code (:func:`kvstored.cli.errors.report`).

Options that belong to the whole program (``--debug``; for ``kvstore`` also ``--master``,
``--token-file``, ``--timeout``, ``--config`` and ``--json``) work before the command
name and after it: each writes into the one :class:`CliState`, and a command's own
options are parsed after the group's, so they win.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import click

from kvstored import __version__
from kvstored.cli.errors import report
from kvstored.cli.lazy import LazyGroup
from kvstored.config import debug_requested


@dataclass
class CliState:
    """What the options given so far asked for; ``ctx.obj`` of every command."""

    debug: bool = field(default_factory=debug_requested)
    #: "kvstore put": how error messages start.
    command: str = ""
    master: str | None = None
    token_file: str | None = None
    timeout: str | None = None
    config_file: str | None = None
    json: bool = False


def state(ctx: click.Context | None = None) -> CliState:
    """The state of the running program (a fresh one for a command run on its own)."""
    ctx = ctx or click.get_current_context()
    return ctx.ensure_object(CliState)


def _set_debug(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value:
        state(ctx).debug = True


debug_option = click.option(
    "--debug", is_flag=True, expose_value=False, is_eager=True, callback=_set_debug,
    help="Print the traceback of an error, not only its message (also KVSTORED_DEBUG=1).")


class Program(LazyGroup):
    """A lazily loaded group that ends every run through :func:`report`."""

    def main(self, args: Any = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True,
             **extra: Any) -> Any:
        if not standalone_mode:  # a caller that handles errors itself
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        run = extra.pop("obj", None)
        run = run if isinstance(run, CliState) else CliState()
        try:
            result = super().main(args, prog_name, complete_var, standalone_mode=False,
                                  obj=run, **extra)
        except SystemExit:
            raise
        except BaseException as exc:  # the top level: everything ends here
            sys.exit(report(exc, command=run.command or prog_name or self.name or "kvstore",
                            debug=run.debug))
        # click returns the code of a ctx.exit(code) here; a command's return value is not
        # an exit code.
        sys.exit(result if type(result) is int else 0)


def program(name: str, commands: Mapping[str, str]) -> Callable[[Callable], Program]:
    """Make a function the top-level group of program ``name``: its ``commands``
    (name: ``module:attribute``) loaded when used, ``-h`` as well as ``--help``, and
    ``--version`` after the options the function's own decorators add."""
    def make(function: Callable) -> Program:
        group = click.group(name, cls=Program, lazy_commands=commands,
                            context_settings={"help_option_names": ["-h", "--help"]})(function)
        # Given the group itself, click appends the option: it is listed last.
        click.version_option(__version__, prog_name=name)(group)
        return group
    return make

"""click parameter types whose failures are not bad usage, for every command line of the
package: the CLI's commands, the benchmarks' and the simulator's.

click reports every bad parameter as usage (exit 2), but a path that does not exist is
NOT_FOUND (exit 3) in docs/cli.md, like a missing key: a script can tell "you typed it
wrong" from "it is not there". So a missing path raises :class:`FileNotFoundError`,
which the CLI's one table (:mod:`kvstored.cli.errors`) ends with NOT_FOUND like any
other; this module knows no exit code and imports nothing of kvstored.
"""

from __future__ import annotations

import errno
import os
from typing import Any

import click


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
            # No filename: the message already names the path, as the user wrote it.
            raise FileNotFoundError(errno.ENOENT, f"{path} does not exist{what}{hint}")
        return path


class ExistingDirectory(ExistingPath):
    """A directory that must exist."""

    def __init__(self, missing_hint: str = "", **path_options: Any) -> None:
        super().__init__(directory=True, missing_hint=missing_hint, **path_options)


class ExistingFile(ExistingPath):
    """A file that must exist."""

    def __init__(self, missing_hint: str = "", **path_options: Any) -> None:
        super().__init__(directory=False, missing_hint=missing_hint, **path_options)

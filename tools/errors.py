"""Errors of the trace tools, each with the exit code the CLI turns it into.

A bad trace is reported by file and line with what to do, never as a traceback.
"""

from __future__ import annotations

from pathlib import Path

from kvstored.cli.exitcodes import ExitCode

#: How a file is named to the user when its path is not what they typed: the spooled
#: copy of standard input is "-", a built-in trace is "builtin:NAME".
SHOWN_AS: dict[str, str] = {}


def shown(path: str | Path) -> str:
    """The name of a trace file as the user gave it."""
    return SHOWN_AS.get(str(path), str(path))


class ToolError(Exception):
    """Base: ``str(error)`` is the whole message for the user."""

    exit_code = ExitCode.FAILURE


class TraceError(ToolError):
    """A trace file is malformed: a line that is not JSON, a field of the wrong type."""

    exit_code = ExitCode.CORRUPT

    def __init__(self, path: str | Path, message: str, *, line: int | None = None):
        self.path = shown(path)
        self.line = line
        self.message = message
        where = f"{self.path}:{line}" if line is not None else self.path
        super().__init__(f"{where}: {message}")


class TraceNotFoundError(ToolError):
    """A trace path that does not exist or holds no trace."""

    exit_code = ExitCode.NOT_FOUND


class UsageProblem(ToolError):
    """Options that do not fit together or name nothing known (an unknown model...)."""

    exit_code = ExitCode.USAGE


class UnavailableError(ToolError):
    """Something the request needs is not installed: the compiled replay core, matplotlib."""

    exit_code = ExitCode.UNAVAILABLE

"""The simulator's and trace tools' errors: a bad trace, a missing one, options that do
not fit together.

A bad trace is reported by file and line with what to do, never as a traceback. These
know no exit codes: :mod:`kvstored.cli.errors` maps each class to one. What this machine
lacks (the compiled replay core, matplotlib) is the core's
:class:`~kvstored.errors.UnavailableError`.
"""

from __future__ import annotations

from pathlib import Path

#: How a file is named to the user when its path is not what they typed: the spooled
#: copy of standard input is "-", a built-in trace is "builtin:NAME".
SHOWN_AS: dict[str, str] = {}


def shown(path: str | Path) -> str:
    """The name of a trace file as the user gave it."""
    return SHOWN_AS.get(str(path), str(path))


class ToolError(Exception):
    """Base: ``str(error)`` is the whole message for the user."""


class TraceError(ToolError):
    """A trace file is malformed: a line that is not JSON, a field of the wrong type."""

    def __init__(self, path: str | Path, message: str, *, line: int | None = None):
        self.path = shown(path)
        self.line = line
        self.message = message
        where = f"{self.path}:{line}" if line is not None else self.path
        super().__init__(f"{where}: {message}")


class TraceNotFoundError(ToolError):
    """An input that does not exist or holds nothing: a trace path, standard input
    empty, a models file."""


class UsageProblem(ToolError):
    """Options that do not fit together or name nothing known (an unknown model...)."""

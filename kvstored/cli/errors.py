"""How the two programs fail: one CLI error type, and one table from errors to exit codes.

Every command of ``kvstored`` and ``kvstore`` ends through :func:`report` (called by
:class:`kvstored.cli.program.Program`, the programs' top level), so a failure is always
one or two lines on stderr naming the thing and what to do, and an exit code from
docs/cli.md. A traceback is printed only with ``--debug`` or ``KVSTORED_DEBUG=1``.

- A command that knows what went wrong raises :class:`QuietError` (message, exit code).
- Anything else is looked up in :data:`EXIT_CODES` by type (the first match wins, so
  subclasses come before their bases), then, for an :class:`OSError`, in
  :data:`ERRNO_EXIT_CODES`. The layers below the CLI raise their own errors and never
  know an exit code; this module is the only place that maps one to the other.
- An error in neither table is a bug: it is reported as "unexpected", exit 1.
"""

from __future__ import annotations

import errno
import sys
import traceback
from collections.abc import Iterator
from typing import IO

import click

from kvstored.bench import BenchError
from kvstored.cli.exitcodes import ExitCode
from kvstored.config import DEBUG_ENV
from kvstored.errors import (
    BadRequestError,
    ConfigError,
    CorruptDataError,
    NoSpaceError,
    NotFoundError,
    StoreError,
    UnauthorizedError,
    UnavailableError,
    UnreachableError,
)
from kvstored.fuse.errors import MountError
from kvstored.native.errors import EngineUnavailableError
from kvstored.sdk.errors import (
    BackendBusyError,
    BackendError,
    CapacityError,
    CorruptionError,
    InvalidRequestError,
    MissingStoreError,
    UnknownBackendError,
)
from kvstored.tools.errors import ToolError, TraceError, TraceNotFoundError, UsageProblem


class QuietError(click.ClickException):
    """A failure the user can act on: ``message`` (what happened, what to do) and the
    exit code to end with. Printed as one line, never with a traceback."""

    def __init__(self, message: str, exit_code: ExitCode = ExitCode.FAILURE) -> None:
        super().__init__(message)
        self.exit_code = int(exit_code)

    def show(self, file: IO[str] | None = None) -> None:
        ctx = click.get_current_context(silent=True)
        click.echo(f"{ctx.command_path if ctx else 'kvstore'}: {self.message}",
                   file=file, err=file is None)


#: Exception type -> exit code; the first ``isinstance`` match wins.
EXIT_CODES: tuple[tuple[type[BaseException], ExitCode], ...] = (
    # The core's errors (kvstored.errors): the store's, as the client library raises
    # them; the configuration (a bad file, variable, flag value or token file); a
    # capability this machine lacks.
    (NotFoundError, ExitCode.NOT_FOUND),
    (UnreachableError, ExitCode.UNREACHABLE),
    (CorruptDataError, ExitCode.CORRUPT),
    (NoSpaceError, ExitCode.NO_SPACE),
    (BadRequestError, ExitCode.USAGE),
    (UnauthorizedError, ExitCode.USAGE),
    (StoreError, ExitCode.FAILURE),
    (ConfigError, ExitCode.USAGE),
    (UnavailableError, ExitCode.UNAVAILABLE),
    # The backend SDK's (kvstored.sdk.errors): a node starting, the offline tools.
    (BackendBusyError, ExitCode.IN_USE),
    (MissingStoreError, ExitCode.NOT_FOUND),
    (UnknownBackendError, ExitCode.USAGE),
    (InvalidRequestError, ExitCode.USAGE),
    (CapacityError, ExitCode.NO_SPACE),
    (CorruptionError, ExitCode.CORRUPT),
    (BackendError, ExitCode.FAILURE),  # BackendIOError is an OSError: by errno first
    # The io engine's (kvstored.native.errors); its IoError is an OSError (below).
    (EngineUnavailableError, ExitCode.UNAVAILABLE),
    # The simulator and trace tools (kvstored.tools.errors).
    (TraceError, ExitCode.CORRUPT),
    (TraceNotFoundError, ExitCode.NOT_FOUND),
    (UsageProblem, ExitCode.USAGE),
    (ToolError, ExitCode.FAILURE),
    # The applications': a mount the kernel refused, a benchmark whose subject failed.
    (MountError, ExitCode.FAILURE),
    (BenchError, ExitCode.FAILURE),
)

#: errno -> exit code, for an OSError (BackendIOError and ListenError included) that the
#: type table does not name; any other errno is a FAILURE.
ERRNO_EXIT_CODES: dict[int, ExitCode] = {
    errno.ENOENT: ExitCode.NOT_FOUND,
    errno.ENOTDIR: ExitCode.NOT_FOUND,
    errno.ENOSPC: ExitCode.NO_SPACE,
    errno.EDQUOT: ExitCode.NO_SPACE,
    errno.EADDRINUSE: ExitCode.IN_USE,
    errno.EBUSY: ExitCode.IN_USE,
    errno.EADDRNOTAVAIL: ExitCode.USAGE,
    errno.EISDIR: ExitCode.USAGE,
    errno.ECONNREFUSED: ExitCode.UNREACHABLE,
    errno.ETIMEDOUT: ExitCode.UNREACHABLE,
}


def exit_code_of(exc: BaseException) -> ExitCode | None:
    """The exit code ``exc`` ends a command with; None for an unexpected error (a bug)."""
    if isinstance(exc, QuietError):
        return ExitCode(exc.exit_code)
    if isinstance(exc, OSError) and exc.errno in ERRNO_EXIT_CODES:
        return ERRNO_EXIT_CODES[exc.errno]
    for cls, code in EXIT_CODES:
        if isinstance(exc, cls):
            return code
    if isinstance(exc, OSError):
        return ExitCode.FAILURE
    return None


def message_of(exc: BaseException) -> str:
    """What to print for ``exc``: its own message, without Python's decorations."""
    if isinstance(exc, QuietError):
        return exc.message
    if isinstance(exc, OSError) and type(exc).__str__ is OSError.__str__ and exc.strerror:
        # "[Errno 2] No such file or directory: 'x'" -> "x: No such file or directory"
        name = f"{exc.filename}: " if exc.filename is not None else ""
        return f"{name}{exc.strerror}"
    return str(exc) or type(exc).__name__


def leaves(exc: BaseException) -> Iterator[BaseException]:
    """The exceptions inside (nested) exception groups, in order; trio's nurseries wrap
    a task's error in one."""
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from leaves(inner)
    else:
        yield exc


def _principal(exc: BaseException) -> BaseException:
    """The one error to report from a group: an interrupt, else the first the tables
    know, else the first."""
    found = [e for e in leaves(exc) if type(e).__name__ != "Cancelled"] or [exc]
    for candidate in found:
        if isinstance(candidate, KeyboardInterrupt | click.Abort):
            return candidate
    return next((e for e in found if exit_code_of(e) is not None), found[0])


def describe(exc: BaseException) -> tuple[int, str]:
    """The exit code and the message to end with for an error that is not click's own:
    an interrupt, a known error (the tables), or a bug ("unexpected", with a hint)."""
    if isinstance(exc, BaseExceptionGroup):
        exc = _principal(exc)
    if isinstance(exc, KeyboardInterrupt | click.Abort):
        return ExitCode.INTERRUPTED, "interrupted"
    code = exit_code_of(exc)
    if code is None:
        return ExitCode.FAILURE, (f"unexpected error: {type(exc).__name__}: {exc}\n"
                                  f"this is a bug; run again with --debug (or {DEBUG_ENV}=1) "
                                  "for the traceback, and report it")
    return code, message_of(exc)


def report(exc: BaseException, *, command: str, debug: bool) -> int:
    """Print ``exc`` the way every command fails, and return the exit code to end with.

    ``command`` (``"kvstore put"``) starts each line; ``debug`` adds the traceback.
    """
    if debug and not isinstance(exc, click.exceptions.Exit | click.UsageError):
        traceback.print_exception(exc, file=sys.stderr)
    principal = _principal(exc) if isinstance(exc, BaseExceptionGroup) else exc
    if isinstance(principal, click.exceptions.Exit):
        return principal.exit_code
    if isinstance(principal, click.ClickException) and not isinstance(principal, QuietError):
        principal.show()  # usage errors: click's own form, with the usage line
        return principal.exit_code
    code, message = describe(principal)
    for line in message.splitlines():
        click.echo(f"{command}: {line}", err=True)
    return code

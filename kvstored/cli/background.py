"""Run a command's work in a detached child process, for ``--background``.

The parent forks first (before any thread or connection exists), waits on a pipe, and
returns once the child says it is ready, or ends with the child's error: the same
message and exit code the command would have given in the foreground. The child gets
its own session (a terminal hangup does not stop it) and, once ready, lets go of the
terminal.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable

from kvstored.cli.errors import QuietError, describe
from kvstored.cli.exitcodes import ExitCode

#: ``work(ready)``: do the work; call ``ready(message)`` once serving.
Work = Callable[[Callable[[str], None]], None]


def run_in_background(work: Work, *, debug: bool = False) -> str:
    """Run ``work`` in a detached child; return its ready message, or raise its error as
    a :class:`QuietError`. ``debug`` prints the child's traceback before it detaches."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid:
        os.close(write_end)
        with os.fdopen(read_end, "rb") as status:
            news = status.read().decode("utf-8", "replace")
        code, _, message = news.partition("\t")
        if not code:
            raise QuietError(f"the background process ({pid}) died before it was ready",
                             ExitCode.FAILURE)
        if int(code) != ExitCode.OK:
            raise QuietError(message, ExitCode(int(code)))
        return message
    os.close(read_end)
    os.setsid()
    status_fd: list[int] = [write_end]  # emptied once the parent has its answer

    def ready(message: str) -> None:
        _tell(status_fd, f"{ExitCode.OK}\t{message}")
        _detach_stdio()

    code = ExitCode.OK
    try:
        work(ready)
    except BaseException as exc:  # the child's top level: it reports, then exits
        code, message = describe(exc)
        if debug and status_fd:
            traceback.print_exception(exc, file=sys.stderr)
        _tell(status_fd, f"{int(code)}\t{message}")
    finally:
        os._exit(code)


def _tell(status_fd: list[int], news: str) -> None:
    """Tell the waiting parent how it went (once; later news is for the log only)."""
    if status_fd:
        fd = status_fd.pop()
        os.write(fd, news.encode())
        os.close(fd)


def _detach_stdio() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)

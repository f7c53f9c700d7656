"""Progress on a terminal for the commands that take a while: a bar on standard error,
drawn only when standard error is a terminal, only once the work has lasted half a
second, and never for a command asked for ``--json`` (on a terminal standard output and
standard error are one screen, and the document must stay whole).

:func:`progress_bar` is the bar; :func:`wait_showing` runs a request that blocks (a
``flush --wait``, a ``recover``) while the bar shows what another connection polls.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

#: ``update(done, total, label)``; a ``total`` of 0 or less means "not known": the bar
#: pulses and the label says what is going on.
ProgressFn = Callable[[float, float, str], None]
#: The bar appears once the work has lasted this long (a quick command draws nothing).
SHOW_AFTER = 0.5
#: How often :func:`wait_showing` polls.
POLL_INTERVAL = 0.5

T = TypeVar("T")


@contextlib.contextmanager
def progress_bar(enabled: bool) -> Iterator[ProgressFn | None]:
    """A progress callback drawing on stderr, or None when there is nothing to draw on
    (not a terminal, or ``enabled`` is false): callers skip their progress work then."""
    if not enabled or not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console  # only on a terminal: --json runs never load rich
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    bar = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn(
        "{task.percentage:>3.0f}%"), TimeElapsedColumn(), console=console, transient=True)
    started = time.monotonic()
    task = bar.add_task("starting", total=1.0)
    shown = False
    phase = ""

    def update(done: float, total: float, label: str) -> None:
        nonlocal shown, phase
        if not shown and time.monotonic() - started > SHOW_AFTER:
            bar.start()
            shown = True
        # The bar redraws ten times a second on its own; a new phase ("reading the
        # trace: ...", then "replaying") is drawn at once, so a short one is seen too.
        new_phase = label.partition(":")[0] != phase
        phase = label.partition(":")[0]
        bar.update(task, total=1.0 if total > 0 else None,
                   completed=done / total if total > 0 else 0.0, description=label,
                   refresh=shown and new_phase)

    try:
        yield update
    finally:
        if shown:
            bar.stop()


def wait_showing(work: Callable[[], T], poll: Callable[[], tuple[float, float, str]],
                 enabled: bool) -> T:
    """``work()``'s result. On a terminal, ``poll()`` (which must use its own
    connection) is asked every :data:`POLL_INTERVAL` for ``(done, total, label)`` while
    ``work`` runs on a thread. A poll that fails only leaves the bar as it was: the
    work's own outcome is what the command reports."""
    with progress_bar(enabled) as update:
        if update is None:
            return work()
        outcome: list[T] = []
        failure: list[BaseException] = []
        finished = threading.Event()

        def run() -> None:
            try:
                outcome.append(work())
            except BaseException as exc:  # handed to the caller's thread below
                failure.append(exc)
            finally:
                finished.set()

        # A daemon thread: Ctrl-C ends the command at once instead of waiting for it.
        threading.Thread(target=run, name="kvstore-wait", daemon=True).start()
        while not finished.wait(POLL_INTERVAL):
            try:
                update(*poll())
            except Exception:
                pass
        if failure:
            raise failure[0]
        return outcome[0]

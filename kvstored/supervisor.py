"""Supervision of the daemon's background tasks: a failure in one is logged, counted and
survived, so that one bad object or one I/O error never takes the daemon down.

Every background task of the node (master session, offloader, drops, promotions,
recoveries, quarantine, reaper) and of the master (housekeeping) runs under one
:class:`Supervisor`:

- :meth:`Supervisor.guard` wraps one unit of work: an exception is logged (one line naming
  the task and what it worked on), counted in ``kvstored_background_errors_total{task}``,
  handed to an ``on_error`` callback (which reports it, to the master for instance), and
  swallowed;
- :meth:`Supervisor.forever` runs a loop body again and again under a guard, waiting with
  exponential :class:`Backoff` after each failure;
- :meth:`Supervisor.spawn` starts a one-shot task in a nursery under a guard, optionally
  retried with backoff.

Logging happens once per state change, not once per failure: the first failure of a
task (or a failure with a different message) is a warning, repeats are debug lines, and
the first success after failures says how many there were. The traceback is logged at
debug level (``-v``), or with every warning when ``KVSTORED_DEBUG=1``.

This is not a retry policy for requests (clients retry their own), and it never catches
cancellation or ``KeyboardInterrupt``: shutting down still stops every task.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import trio
from prometheus_client import Counter

from kvstored.config import debug_requested

log = logging.getLogger(__name__)


class Backoff:
    """An exponential delay: ``initial`` after the first failure, multiplied by ``factor``
    after each further one, never above ``maximum``; :meth:`reset` after a success."""

    def __init__(self, initial: float = 0.1, maximum: float = 30.0, factor: float = 2.0):
        self.initial = initial
        self.maximum = maximum
        self.factor = factor
        self._next = initial

    def failed(self) -> float:
        """Record a failure; returns how long to wait before the next attempt."""
        delay = self._next
        self._next = min(self.maximum, self._next * self.factor)
        return delay

    def reset(self) -> None:
        self._next = self.initial

    @property
    def next_delay(self) -> float:
        return self._next


@dataclass(slots=True)
class _Failing:
    message: str
    count: int


class Supervisor:
    """Error boundaries for the background tasks of one daemon role (see the module
    docstring). ``owner`` names the role in log lines (``node n1``, ``master``);
    ``errors`` is the labelled counter failures are counted in."""

    def __init__(self, owner: str, errors: Counter) -> None:
        self.owner = owner
        self.errors = errors
        self._failing: dict[str, _Failing] = {}

    def failures(self, task: str) -> int:
        """Consecutive failures of ``task`` so far (0 when it last succeeded)."""
        failing = self._failing.get(task)
        return failing.count if failing else 0

    @contextmanager
    def guard(self, task: str, *, subject: str = "",
              on_error: Callable[[Exception], None] | None = None) -> Iterator[None]:
        """Run the block as one unit of ``task``: an ``Exception`` escaping it is logged,
        counted and passed to ``on_error``, and does not propagate. ``subject`` says what
        the unit worked on (``3 keys: 'a', 'b', …``) for the log line."""
        try:
            yield
        except Exception as exc:  # the boundary: anything a backend or a bug raises
            self._record(task, subject, exc)
            if on_error is not None:
                try:
                    on_error(exc)
                except Exception:
                    log.exception("%s: the error handler of %s failed", self.owner, task)
        else:
            self.succeeded(task)

    def succeeded(self, task: str) -> None:
        failing = self._failing.pop(task, None)
        if failing is not None:
            log.info("%s: %s works again after %d failure(s)", self.owner, task,
                     failing.count)

    def _record(self, task: str, subject: str, exc: Exception) -> None:
        self.errors.labels(task=task).inc()
        message = f"{type(exc).__name__}: {exc}"
        failing = self._failing.get(task)
        where = f" ({subject})" if subject else ""
        if failing is None or failing.message != message:
            self._failing[task] = _Failing(message, (failing.count if failing else 0) + 1)
            log.warning("%s: %s failed%s: %s; it carries on", self.owner, task, where,
                        message, exc_info=exc if debug_requested() else None)
            if not debug_requested():
                log.debug("%s: %s traceback", self.owner, task, exc_info=exc)
        else:
            failing.count += 1
            log.debug("%s: %s failed again%s (%d in a row): %s", self.owner, task, where,
                      failing.count, message)

    async def forever(self, task: str, step: Callable[[], Awaitable[Any]], *,
                      backoff: Backoff | None = None) -> None:
        """Run ``step`` in a loop until cancelled. A failed step is followed by a wait
        that doubles with each consecutive failure; a step that returns resets it."""
        backoff = backoff or Backoff()
        while True:
            ok = False
            with self.guard(task):
                await step()
                ok = True
            if ok:
                backoff.reset()
            else:
                await trio.sleep(backoff.failed())

    def spawn(self, nursery: trio.Nursery, task: str, fn: Callable[..., Awaitable[Any]],
              *args: Any, subject: str = "", on_error: Callable[[Exception], None] | None = None,
              attempts: int = 1, backoff: Backoff | None = None) -> None:
        """Start ``fn(*args)`` in ``nursery`` under a guard. With ``attempts`` above 1 a
        failed run is tried again after a backoff; ``on_error`` sees only the last
        failure."""

        async def run() -> None:
            delays = backoff or Backoff(0.2, 10.0)
            for attempt in range(1, attempts + 1):
                last = attempt == attempts
                with self.guard(task, subject=subject, on_error=on_error if last else None):
                    await fn(*args)
                    return
                if not last:
                    await trio.sleep(delays.failed())

        nursery.start_soon(run, name=f"{self.owner}: {task}")


def describe_keys(keys: list[str], limit: int = 3) -> str:
    """``3 keys: 'a', 'b', 'c'`` / ``40 keys: 'a', 'b', 'c', …`` for log lines."""
    shown = ", ".join(repr(k) for k in keys[:limit])
    more = ", …" if len(keys) > limit else ""
    return f"{len(keys)} key{'s' if len(keys) != 1 else ''}: {shown}{more}"

"""How far a starting node has got, said in its log while it works.

A node with many objects is busy for seconds before it serves: its backend recovers
(reads its indexes, tidies what a crash left), then the node sends the master every
object it holds. Until then commands that need it fail, so its log says what it is doing
and how far it got ("recovering: registering with the master: 50,000 of 200,000
objects"), and the master shows it as *starting* in ``kvstore status``
(:class:`kvstored.protocol.enums.NodePhase`).

This module is the progress record and the log lines; it is not the start-up itself
(:func:`kvstored.node.service.open_node`, :meth:`kvstored.node.service.Node.run`).
"""

from __future__ import annotations

import enum
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import trio

#: The first line comes once a step has taken this long (a quick start logs nothing
#: more than it did), then one line every ``INTERVAL``.
FIRST_AFTER = 1.0
INTERVAL = 2.0


class StartupStep(enum.Enum):
    RECOVERING_SSD = "reading the SSD tier"
    LISTING = "listing the objects it holds"
    REGISTERING = "registering with the master"


@dataclass(frozen=True)
class _Count:
    done: int
    total: int
    unit: str


class StartupProgress:
    """The current step and its count. :meth:`update` may be called from any thread
    (the backend recovers on a worker thread): it replaces one immutable record."""

    def __init__(self) -> None:
        self.step: StartupStep | None = None
        self._count: _Count | None = None

    def begin(self, step: StartupStep) -> None:
        self.step = step
        self._count = None

    def update(self, done: int, total: int, unit: str) -> None:
        self._count = _Count(done, total, unit)

    def line(self) -> str:
        """``recovering: reading the SSD tier: 120 of 400 buckets``."""
        step = self.step.value if self.step else "starting"
        count = self._count
        if count is None:
            return f"recovering: {step}"
        return f"recovering: {step}: {count.done:,} of {count.total:,} {count.unit}"

    @asynccontextmanager
    async def logged(self, step: StartupStep, logger: logging.Logger,
                     who: Callable[[], str]) -> AsyncIterator[StartupProgress]:
        """Run ``step`` (the body), logging ``who(): line()`` while it lasts longer than
        :data:`FIRST_AFTER`, and a last line saying how long it took if any was logged."""
        self.begin(step)
        started = trio.current_time()
        said = False

        async def tick() -> None:
            nonlocal said
            await trio.sleep(FIRST_AFTER)
            while True:
                logger.info("%s: %s", who(), self.line())
                said = True
                await trio.sleep(INTERVAL)

        # The body's error leaves as itself, not inside the ticker nursery's exception
        # group: callers (the supervisor's log line, the master session's retry) must see
        # "node name 'n1' belongs to a live node", not "ExceptionGroup: ...".
        failure: Exception | None = None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(tick)
            try:
                yield self
            except Exception as exc:
                failure = exc
            finally:
                nursery.cancel_scope.cancel()
        if failure is not None:
            raise failure
        if said:
            logger.info("%s: %s: done in %.1fs", who(), self.line(),
                        trio.current_time() - started)

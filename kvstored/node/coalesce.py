"""Coalescing: requests from many connections that arrive while a call is in flight are
joined into the next call.

The node answers a put after the master has committed it, over one master connection
that carries one request at a time. Done once per request, commits made concurrent
clients queue behind each other's round trips (the store's bottleneck under mixed load
from 8 threads, see docs/benchmarks.md). (SSD reads are joined the same way, streamed:
kvstored.node.ssdreads.)
:class:`Coalescer` gathers what concurrent requests want while a call runs and sends all
of it as the next call; a request waits only for the call that carries its items.

Not here: what a call does (the node's commit and SSD read), or retries.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import trio

from kvstored.errors import InternalError, StoreError

Item = TypeVar("Item")
Result = TypeVar("Result")


@dataclass(slots=True)
class _Waiting(Generic[Item, Result]):
    items: list[Item]
    done: trio.Event = field(default_factory=trio.Event)
    results: list[Result] = field(default_factory=list)
    error: StoreError | None = None


class Coalescer(Generic[Item, Result]):
    """``call(items)`` returns one result per item. :meth:`run` (a background task) makes
    the calls, at most ``in_flight`` at a time; :meth:`submit` waits for its results.

    A call that raises fails every request it carried: with its :class:`StoreError`,
    or an :class:`InternalError` for anything else, which :meth:`run` then re-raises
    (so that the node's supervisor logs and counts it)."""

    def __init__(self, call: Callable[[list[Item]], Awaitable[list[Result]]], *,
                 in_flight: int = 1) -> None:
        self.call = call
        self.in_flight = in_flight
        self._waiting: list[_Waiting[Item, Result]] = []
        self._ready = trio.Event()

    async def submit(self, items: list[Item]) -> list[Result]:
        if not items:
            return []
        waiting: _Waiting[Item, Result] = _Waiting(items)
        self._waiting.append(waiting)
        self._ready.set()
        await waiting.done.wait()
        if waiting.error is not None:
            raise waiting.error
        return waiting.results

    async def run(self) -> None:
        """Make the calls until cancelled."""
        async with trio.open_nursery() as nursery:
            for _ in range(self.in_flight):
                nursery.start_soon(self._caller)

    async def _caller(self) -> None:
        while True:
            while not self._waiting:
                self._ready = trio.Event()
                await self._ready.wait()
            batch, self._waiting = self._waiting, []
            items = [item for w in batch for item in w.items]
            try:
                results = await self.call(items)
            except BaseException as exc:  # the requests must hear of it, whatever it was
                error = exc if isinstance(exc, StoreError) else InternalError(
                    f"a call for {len(items)} item(s) failed: {exc!r}")
                for waiting in batch:
                    waiting.error = error
                    waiting.done.set()
                if isinstance(exc, StoreError):
                    continue
                raise
            cursor = 0
            for waiting in batch:
                waiting.results = results[cursor:cursor + len(waiting.items)]
                cursor += len(waiting.items)
                waiting.done.set()

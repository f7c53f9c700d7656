"""The node's offloader: committed DRAM objects to the SSD tier, in batches, surviving a
full or failing disk.

- **Batching**: keys the master asks for are queued and written with ``batch_write``
  once the backend's write hint (bytes, keys, age) says a batch is due, or at once when
  the request is urgent (a flush, or an eviction waiting on it).
- **Verification**: each object's bytes are checked against its CRC-32C before they are
  written (a same-host writer may change its mapping after its seal); a bad copy is
  dropped and counted, never written.
- **Per-item results**: every key's outcome is reported to the master in the next
  heartbeat (``offloaded`` only once ``batch_write`` returned, so the SSD copy is
  durable; ``offload_failed`` with an :class:`~kvstored.protocol.OffloadFailure`). When
  the SSD is short of room, what fits is written: the items a batch could not place
  are tried again one at a time, smallest first, until one does not fit (a bucket
  backend places a batch all or nothing).
- **Retries**: items that failed for lack of space or an I/O error wait, and are tried
  again after an exponential backoff (0.5 s doubling to 30 s), or at once when the
  master names them again (``kvstore flush``). A full SSD is logged once when it fills
  and once when it has room again, naming the backend, its path and the space free and
  needed; attempts are counted in ``kvstored_offload_failures_total{reason}``.
- **Shutdown**: :meth:`Offloader.flush_all` writes every DRAM object that has no SSD
  copy (the node bounds it by ``node.shutdown_flush_timeout``).

Not here: which objects to offload and when to drop their DRAM copies (the master's
policies), and the backend's own batching and durability.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

import trio

from kvstored.checksum import crc32c
from kvstored.metrics import NodeMetrics
from kvstored.node.dram import DramObject, DramTier
from kvstored.node.report import Outcomes
from kvstored.protocol import OffloadFailed, OffloadFailure, Tier
from kvstored.sdk import (
    BackendError,
    CapacityError,
    StorageBackend,
    ValueTooLargeError,
    WriteOutcome,
)
from kvstored.sdk.units import format_size
from kvstored.supervisor import Backoff, Supervisor, describe_keys

log = logging.getLogger(__name__)

#: Retry delays of failed offloads: the first retry after 0.5 s, then doubling.
RETRY_INITIAL = 0.5
RETRY_MAXIMUM = 30.0


def classify(error: BaseException | None) -> OffloadFailure:
    """The failure kind of a backend error (per item, or raised for a whole batch)."""
    if isinstance(error, CapacityError):
        return OffloadFailure.NO_SPACE
    if isinstance(error, ValueTooLargeError):
        return OffloadFailure.TOO_LARGE
    return OffloadFailure.IO_ERROR


class Offloader:
    """See the module docstring. ``outcomes`` collects outcomes for the next heartbeat,
    ``wake`` sends that heartbeat now, ``on_corrupt(key, tier)`` counts a DRAM copy that
    failed its checksum."""

    def __init__(self, *, node: str, backend: StorageBackend, dram: DramTier,
                 outcomes: Outcomes, metrics: NodeMetrics, supervisor: Supervisor,
                 wake: Callable[[], None], on_corrupt: Callable[[str, Tier], None]) -> None:
        self.node = node
        self.backend = backend
        self.dram = dram
        self.outcomes = outcomes
        self.metrics = metrics
        self.supervisor = supervisor
        self.wake = wake
        self.on_corrupt = on_corrupt
        self.hint = backend.write_batch_hint()
        self.max_value_size = backend.capabilities.max_value_size
        #: Keys to write, with the time each was queued (the batch's age bound).
        self.queue: dict[str, float] = {}
        self.urgent = False
        #: Keys whose last attempt failed and that wait for ``retry_at``.
        self.waiting: dict[str, OffloadFailure] = {}
        self.retry_at: float | None = None
        self.backoff = Backoff(RETRY_INITIAL, RETRY_MAXIMUM)
        #: Why the SSD refuses offloads right now (shown in status and put errors).
        self.problem: str | None = None
        self._problem_kind: OffloadFailure | None = None
        self._ready = trio.Event()

    # -- requests ----------------------------------------------------------------------

    def request(self, keys: list[str], urgent: bool = False) -> None:
        """Queue ``keys``. A key that waits for a retry is tried at once: the master asked
        for it again (a flush), so space may be back."""
        now = time.monotonic()
        for key in keys:
            self.waiting.pop(key, None)
            self.queue.setdefault(key, now)
        self.urgent |= urgent
        self.metrics.offload_waiting.set(len(self.waiting))
        self._ready.set()

    # -- the loop ----------------------------------------------------------------------

    async def step(self) -> None:
        """One turn of the offloader's loop: wait for work, or write one batch."""
        if self.retry_at is not None and time.monotonic() >= self.retry_at:
            self._retry_waiting()
        if not self.queue:
            await self._wait_until(self.retry_at)
            return
        oldest = min(self.queue.values())
        queued_bytes = sum(o.size for k in self.queue if (o := self.dram.get(k)) is not None)
        due = (self.urgent or len(self.queue) >= self.hint.max_keys
               or queued_bytes >= self.hint.max_bytes
               or time.monotonic() - oldest >= self.hint.max_age)
        if not due:
            # Wait for the age bound, or for more work (which may fill a batch).
            deadline = oldest + self.hint.max_age
            await self._wait_until(deadline if self.retry_at is None
                                   else min(deadline, self.retry_at))
            return
        await self.write(self._take_batch())
        if not self.queue:
            self.urgent = False

    async def _wait_until(self, deadline: float | None) -> None:
        self._ready = trio.Event()
        if deadline is None:
            await self._ready.wait()
            return
        # trio's clock is not time.monotonic(): turn the deadline into a timeout.
        with trio.move_on_after(max(0.0, deadline - time.monotonic())):
            await self._ready.wait()

    def _retry_waiting(self) -> None:
        keys = list(self.waiting)
        self.waiting.clear()
        self.retry_at = None
        self.request(keys, urgent=True)

    def _take_batch(self) -> list[str]:
        batch = self._batches(list(self.queue))[0]
        for key in batch:
            del self.queue[key]
        return batch

    def _batches(self, keys: list[str]) -> list[list[str]]:
        """``keys`` cut into batches of the backend's write hint (keys and bytes)."""
        batches: list[list[str]] = [[]]
        total = 0
        for key in keys:
            if len(batches[-1]) >= self.hint.max_keys or (
                    batches[-1] and total >= self.hint.max_bytes):
                batches.append([])
                total = 0
            batches[-1].append(key)
            obj = self.dram.get(key)
            total += obj.size if obj else 0
        return batches

    # -- one batch ---------------------------------------------------------------------

    async def write(self, batch: list[str]) -> int:
        """Write ``batch`` to the SSD and report each key's outcome; returns how many are
        on SSD now. A backend that raises for the whole batch fails every item of it
        (reported, and retried if the error may clear); nothing propagates."""
        written = 0
        with self.supervisor.guard("offload", subject=describe_keys(batch),
                                   on_error=lambda exc: self._settle([], [
                                       OffloadFailed(k, classify(exc), str(exc))
                                       for k in batch])):
            pinned = self.dram.pin(batch)
            failed = [OffloadFailed(k, OffloadFailure.GONE, "no longer in DRAM")
                      for k in batch if k not in pinned]
            done: list[tuple[str, int]] = []
            if pinned:
                started = time.perf_counter()
                try:
                    done, more = await trio.to_thread.run_sync(self._write_to_ssd, pinned)
                finally:
                    self.dram.unpin(pinned.values())
                self.metrics.io_seconds.labels(op="offload").observe(
                    time.perf_counter() - started)
                failed += more
            self._settle(done, failed)
            written = len(done)
        return written

    def _write_to_ssd(self, objects: dict[str, DramObject]
                      ) -> tuple[list[tuple[str, int]], list[OffloadFailed]]:
        """Write pinned DRAM objects to the backend (on a worker thread): ``(key,
        checksum)`` of each now on SSD, and the failures."""
        failed: list[OffloadFailed] = []
        todo: dict[str, DramObject] = {}
        for key, obj in objects.items():
            if obj.size > self.max_value_size:
                failed.append(OffloadFailed(key, OffloadFailure.TOO_LARGE, (
                    f"{format_size(obj.size)} is larger than the {self.backend.name} "
                    f"backend's max_value_size ({format_size(self.max_value_size)})")))
            elif crc32c(self.dram.view(obj)) != obj.checksum:
                self.on_corrupt(key, Tier.DRAM)
                if self.dram.free(key, obj.offset):
                    self.outcomes.dropped([(key, Tier.DRAM, obj.offset)])
                failed.append(OffloadFailed(key, OffloadFailure.CORRUPT,
                                            "its DRAM copy failed its checksum; dropped"))
            else:
                todo[key] = obj
        if not todo:
            return [], failed
        results = self._batch_write(todo)
        no_room = [k for k, error in results.items()
                   if error is not None and classify(error) is OffloadFailure.NO_SPACE]
        if len(todo) > 1 and no_room:
            # Offload what fits: a backend may place a batch all or nothing.
            for key in sorted(no_room, key=lambda k: todo[k].size):
                error = self._batch_write({key: todo[key]})[key]
                results[key] = error
                if error is not None and classify(error) is OffloadFailure.NO_SPACE:
                    break
        done = [(k, todo[k].checksum) for k, error in results.items() if error is None]
        failed += [OffloadFailed(k, classify(error), str(error))
                   for k, error in results.items() if error is not None]
        return done, failed

    def _batch_write(self, objects: dict[str, DramObject]) -> dict[str, BackendError | None]:
        """One ``batch_write``: per key None (on SSD now) or the error. An older version
        of a key left on SSD (removed, then written again) is replaced, never reported as
        the new one's copy."""
        results = {r.key: r for r in self.backend.batch_write(
            [(k, self.dram.view(o)) for k, o in objects.items()])}
        stale = [k for k, r in results.items() if r.outcome is WriteOutcome.EXISTS
                 and (rec := self.backend.stat(k)) is not None
                 and rec.checksum != objects[k].checksum]
        if stale:
            self.backend.batch_delete(stale)
            results.update((r.key, r) for r in self.backend.batch_write(
                [(k, self.dram.view(objects[k])) for k in stale]))
        return {k: (None if r.ok else r.error or BackendError("the write failed", key=k))
                for k, r in results.items()}

    # -- outcomes ----------------------------------------------------------------------

    def _settle(self, done: list[tuple[str, int]], failed: list[OffloadFailed]) -> None:
        """Report a batch's outcomes, schedule retries, and log state changes."""
        self.outcomes.offloaded(done)
        self.outcomes.offload_failed(failed)
        for failure in failed:
            self.metrics.offload_failures.labels(reason=failure.reason.value).inc()
            if failure.retrying:
                self.waiting[failure.key] = failure.reason
        retrying = [f for f in failed if f.retrying]
        if retrying:
            delay = self.backoff.failed()
            self.retry_at = time.monotonic() + delay
        elif done:
            self.backoff.reset()
        self._log_state(done, retrying)
        for failure in failed:
            # An object removed before its offload is routine (a debug line); one that
            # can never be offloaded, or was found corrupt, is worth a warning each.
            if failure.reason in (OffloadFailure.TOO_LARGE, OffloadFailure.CORRUPT):
                log.warning("node %s: offload of %r failed: %s", self.node, failure.key,
                            failure.message)
            elif not failure.retrying:
                log.debug("node %s: offload of %r skipped: %s", self.node, failure.key,
                          failure.message)
        self.metrics.offload_waiting.set(len(self.waiting))
        if done or failed:
            self.wake()

    def _log_state(self, done: list[tuple[str, int]], retrying: list[OffloadFailed]) -> None:
        """One line when offloads start failing (or fail differently), one when they
        work again; nothing per retry."""
        if retrying:
            kind = retrying[0].reason
            if kind is OffloadFailure.NO_SPACE:
                problem = self.describe_full(retrying)
            else:
                problem = f"offloads to its SSD fail: {retrying[0].message}"
            if kind is not self._problem_kind:
                log.warning("node %s: %s; %d object(s) wait in DRAM and are retried with "
                            "backoff (up to %.0fs)", self.node, problem, len(self.waiting),
                            RETRY_MAXIMUM)
            self.problem, self._problem_kind = problem, kind
        elif done and self.problem is not None:
            log.info("node %s: offloads to its SSD work again (%d written)", self.node,
                     len(done))
            self.problem, self._problem_kind = None, None

    def describe_full(self, failures: list[OffloadFailed]) -> str:
        """``its SSD is full: bucket at /data/ssd has 1.2 MiB free of 16.0 GiB, 8.0 MiB
        needed for 8 object(s); free space there or lower node.ssd``."""
        needed = sum(o.size for f in failures if (o := self.dram.get(f.key)) is not None)
        try:
            stat = os.statvfs(self.backend.path)
            free = f"{format_size(stat.f_bavail * stat.f_frsize)} free on its file system"
        except OSError:
            free = "unknown free space"
        capacity = self.backend.capacity
        used = ""
        if capacity:
            usage = self.backend.usage()
            used = f", {format_size(usage.physical_bytes)} of its {format_size(capacity)} " \
                   "capacity used"
        return (f"its SSD is full: the {self.backend.name} backend at {self.backend.path} "
                f"has {free}{used}, {format_size(needed)} needed for {len(failures)} "
                "object(s); free space there or lower node.ssd")

    # -- shutdown ----------------------------------------------------------------------

    def not_on_ssd(self) -> list[str]:
        """Keys of committed DRAM objects with no SSD copy of that version here (blocking:
        call from a worker thread)."""
        return [o.key for o in self.dram.committed()
                if (r := self.backend.stat(o.key)) is None or r.checksum != o.checksum]

    async def flush_all(self) -> None:
        """Write every DRAM object that has no SSD copy, each tried once. Cancel it to
        stop (a batch being written finishes first)."""
        tried: set[str] = set()
        while True:
            todo = [k for k in await trio.to_thread.run_sync(self.not_on_ssd)
                    if k not in tried]
            if not todo:
                return
            for batch in self._batches(todo):
                tried.update(batch)
                await self.write(batch)

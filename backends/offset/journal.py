"""The journal gate and the checkpoints of an open offset-layout volume.

Every operation a crash must not undo (a write batch, a delete, an eviction) passes
through the gate:

1. :meth:`JournalGate.enter` reserves the journal blocks the operation will write. When
   the journal has no room, a checkpoint runs first and restarts it.
2. The operation takes its sequence numbers (after entering, so they exceed the seq of
   any checkpoint that ran for the room), writes its records, and
   :meth:`JournalGate.append` writes its journal entries and fdatasyncs.
3. :meth:`JournalGate.leave` lets checkpoints proceed again.

A checkpoint waits until no operation is inside the gate, so its seq covers everything
acknowledged, blocks new operations while it writes the index to the idle slot and
fdatasyncs, and only then restarts the journal at its first block. Reads never wait for
it: the backend's lock is released while it writes.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from kvstored.backends.offset.layout import ALIGN, Geometry, encode_checkpoint, encode_journal
from kvstored.native import IoEngine, IoError, IoFile, write_synced
from kvstored.sdk.errors import BackendError, from_oserror

log = logging.getLogger(__name__)

#: Called with the backend's lock held: the seq the index is current to, and the index's
#: checkpoint entries in eviction order.
Snapshot = Callable[[], tuple[int, list[bytes]]]


def write_sync(engine: IoEngine, file: IoFile, items: list, action: str) -> None:
    """Write ``items`` and fdatasync ``file``, or raise the translated error (ENOSPC and
    EDQUOT become CapacityError, the rest BackendIOError)."""
    for result in write_synced(engine, items):
        if isinstance(result, IoError):
            raise from_oserror(result, path=file.path, action=action)


class JournalGate:
    """The journal's write position and the checkpoints, under the backend's lock.

    ``generation`` is the generation of the newest durable checkpoint; checkpoint
    ``g`` lives in slot ``g % 2``. A checkpoint is due after ``checkpoint_bytes`` of
    records were journalled since the last one.
    """

    def __init__(self, engine: IoEngine, file: IoFile, geometry: Geometry,
                 lock: threading.Lock, snapshot: Snapshot, *, generation: int,
                 checkpoint_bytes: int) -> None:
        self._engine, self._file, self._geometry = engine, file, geometry
        self._lock = lock
        self._cond = threading.Condition(lock)
        self._snapshot = snapshot
        self.generation = generation
        self.checkpoint_bytes = checkpoint_bytes
        self._active = 0            # operations inside the gate
        self._checkpointing = False
        self._next = 0              # the next free journal block
        self._since = 0             # bytes of records journalled since the last checkpoint

    def enter(self, nblocks: int) -> int:
        """Reserve ``nblocks`` journal blocks; return the first. Raises the checkpoint's
        error if one was needed for room and failed. The caller must :meth:`leave`, and
        must not enter again before it has."""
        with self._cond:
            while True:
                while self._checkpointing:
                    self._cond.wait()
                if self._next + nblocks <= self._geometry.journal_blocks:
                    break
                self.checkpoint_locked()
            block = self._next
            self._next += nblocks
            self._active += 1
            return block

    def append(self, block: int, seq: int, puts: list[tuple[int, int, int]],
               tombstones: list[bytes]) -> None:
        """Write one operation's journal entries at its reserved blocks, then fdatasync
        (which also makes the operation's records durable). Called inside the gate,
        without the lock."""
        at = self._geometry.journal_offset + block * ALIGN
        items = []
        for entry in encode_journal(self._geometry, seq, puts, tombstones):
            items.append((self._file, at, entry))
            at += len(entry)
        write_sync(self._engine, self._file, items, "writing the journal")

    def leave(self, written: int = 0) -> None:
        """End an operation that journalled ``written`` bytes of records; run a
        checkpoint if one is due (a failure is logged: the operation itself is done)."""
        with self._cond:
            self._active -= 1
            self._since += written
            due = self._since >= self.checkpoint_bytes and not self._checkpointing
            self._cond.notify_all()
            if due:
                try:
                    self.checkpoint_locked()
                except BackendError as exc:
                    log.error("%s: a checkpoint failed (%s); the journal still holds "
                              "everything, it is retried later", self._file.path, exc)

    def checkpoint(self) -> None:
        with self._cond:
            self.checkpoint_locked()

    def checkpoint_locked(self) -> None:
        """Write the index to the idle slot and restart the journal. Called with the
        lock held; releases it while waiting and writing."""
        if self._checkpointing:
            while self._checkpointing:  # someone else is writing one: that will do
                self._cond.wait()
            return
        self._checkpointing = True
        try:
            while self._active:
                self._cond.wait()
            seq, entries = self._snapshot()
            generation = self.generation + 1
            self._lock.release()
            try:
                image = encode_checkpoint(self._geometry, generation, seq, entries)
                slot = self._geometry.slot_offsets[generation % 2]
                write_sync(self._engine, self._file, [(self._file, slot, image)],
                           "writing a checkpoint")
            finally:
                self._lock.acquire()
            self.generation = generation
            self._next = 0
            self._since = 0
        finally:
            self._checkpointing = False
            self._cond.notify_all()

    def close(self) -> None:
        """Wait for operations in flight, then checkpoint if anything was journalled
        since the last checkpoint (so the next open replays nothing)."""
        with self._cond:
            while self._active or self._checkpointing:
                self._cond.wait()
            if self._next or self._since:
                self.checkpoint_locked()

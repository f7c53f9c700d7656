"""Shard files of the ``3fs`` backend: a bounded cache of open handles, and verified reads.

Both the owning node and nodes reading its shards read records the same way: one engine
submission for the whole batch, then every record checked against what the journal said
(key, length, sequence number, value CRC-32C) by the SDK's one verification
(:func:`kvstored.sdk.record.verified_read`) before its value is handed out.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict, deque
from concurrent.futures import Executor, Future, wait
from dataclasses import dataclass

from kvstored.backends.threefs.index import Slot
from kvstored.native import IoEngine, IoError, IoFile, ScratchMemory
from kvstored.sdk.files import PRIVATE_FILE
from kvstored.sdk.record import VALUE_OFFSET, ReadOutcome, record_size, verified_read

#: Values up to this size are read together with their header in one request, into
#: scratch memory, and copied out: one I/O instead of two costs less than the copy.
#: Larger values are read straight into the caller's buffer, the header apart.
COMBINED_READ_MAX = 128 * 1024
#: With an executor, batches move in chunks of about this many bytes (see read_records).
PIPELINE_CHUNK = 2 << 20
#: Chunks of a read kept in flight ahead of the one being checked.
READ_AHEAD = 2


class HandleCache:
    """Open shard files by path, at most ``limit`` of them idle at once.

    A handle is held between :meth:`acquire` and :meth:`release`; only idle handles are
    closed, so a read never loses its descriptor underneath it. :meth:`forget` closes a
    handle as soon as it is idle (its file was dropped).
    """

    def __init__(self, engine: IoEngine, *, direct: bool | None, limit: int = 256) -> None:
        self.engine = engine
        self.direct = direct
        self.limit = limit
        self._lock = threading.Lock()
        self._files: OrderedDict[str, list] = OrderedDict()  # path -> [IoFile, users, doomed]

    def acquire(self, path: str, flags: int = os.O_RDONLY) -> IoFile:
        """The open handle of ``path`` (opened with ``flags`` if it is not open yet).
        Raises OSError, FileNotFoundError included, when it cannot be opened."""
        with self._lock:
            held = self._files.get(path)
            if held is not None and not held[2]:
                held[1] += 1
                self._files.move_to_end(path)
                return held[0]
        file = self.engine.open(path, flags, PRIVATE_FILE, direct=self.direct)
        with self._lock:
            held = self._files.get(path)
            if held is not None and not held[2]:  # another thread opened it meanwhile
                held[1] += 1
                spare = file
            else:
                self._files[path] = [file, 1, False]
                spare = None
            result = self._files[path][0]
            idle = self._trim_locked()
        if spare is not None:
            spare.close()
        for f in idle:
            f.close()
        return result

    def release(self, file: IoFile) -> None:
        closing = None
        with self._lock:
            held = self._files.get(file.path)
            if held is None or held[0] is not file:
                closing = file  # forgotten while in use: we were the last user
            else:
                held[1] -= 1
                if held[1] == 0 and held[2]:
                    del self._files[file.path]
                    closing = file
            idle = self._trim_locked()
        if closing is not None:
            closing.close()
        for f in idle:
            f.close()

    def forget(self, path: str) -> None:
        """Close ``path``'s handle now if idle, else when its last user releases it."""
        with self._lock:
            held = self._files.get(path)
            if held is None:
                return
            if held[1] > 0:
                held[2] = True
                return
            del self._files[path]
        held[0].close()

    def close_all(self) -> None:
        with self._lock:
            files = [held[0] for held in self._files.values()]
            self._files.clear()
        for f in files:
            f.close()

    def _trim_locked(self) -> list[IoFile]:
        idle = []
        if len(self._files) <= self.limit:
            return idle
        for path in list(self._files):
            if len(self._files) - len(idle) <= self.limit:
                break
            held = self._files[path]
            if held[1] == 0:
                idle.append(held[0])
                del self._files[path]
        return idle


#: The scratch memory of reads: headers, and small values read with them.
_scratch = ScratchMemory()


@dataclass(slots=True)
class ReadRequest:
    key: str
    slot: Slot
    file: IoFile
    #: The caller's buffer, at least ``slot.size`` bytes; the value lands in its start.
    dest: memoryview


def read_records(engine: IoEngine, requests: list[ReadRequest],
                 executor: Executor | None = None) -> list[ReadOutcome]:
    """Read and verify every request's record.

    Without ``executor`` the batch is one engine submission. With one, a big batch goes
    in chunks of at least :data:`PIPELINE_CHUNK` bytes and a queue depth of requests:
    while the executor reads the next :data:`READ_AHEAD` chunks, this thread checks the
    one that arrived, so checksums and copies overlap the I/O.
    """
    if not requests:
        return []
    total = sum(_arena_bytes(r.slot.size) for r in requests)
    arena = _scratch.take(total)
    plans = []  # per request: (first item, header block, value in the arena or None)
    chunks: list[tuple[int, int, list]] = []  # (first request, end request, items)
    items: list = []
    first, pos, chunk_bytes = 0, 0, 0
    for n, r in enumerate(requests):
        length = _arena_bytes(r.slot.size)
        block = arena[pos:pos + length]
        plans.append((len(items), block, block[VALUE_OFFSET:VALUE_OFFSET + r.slot.size]
                      if r.slot.size <= COMBINED_READ_MAX else None))
        items.append((r.file, r.slot.offset, block))
        if r.slot.size > COMBINED_READ_MAX:
            items.append((r.file, r.slot.offset + VALUE_OFFSET, r.dest[:r.slot.size]))
        pos += length
        chunk_bytes += record_size(r.slot.size)
        if (executor is not None and chunk_bytes >= PIPELINE_CHUNK
                and len(items) >= engine.queue_depth):
            chunks.append((first, n + 1, items))
            first, items, chunk_bytes = n + 1, [], 0
    if items:
        chunks.append((first, len(requests), items))
    outcomes: list[ReadOutcome] = []
    if executor is None or len(chunks) == 1:
        for first, end, chunk in chunks:
            outcomes.extend(_check(requests[first:end], plans[first:end], engine.read(chunk)))
        return outcomes
    pending: deque[Future] = deque()
    submitted = 0
    try:
        for first, end, _chunk in chunks:
            while submitted < len(chunks) and len(pending) < READ_AHEAD:
                pending.append(executor.submit(engine.read, chunks[submitted][2]))
                submitted += 1
            results = pending.popleft().result()
            outcomes.extend(_check(requests[first:end], plans[first:end], results))
    finally:
        wait(pending)  # the scratch memory must outlive every read into it
    return outcomes


def _arena_bytes(size: int) -> int:
    """Scratch a record's read needs: the whole record when it is read in one piece,
    else its header block."""
    return record_size(size) if size <= COMBINED_READ_MAX else VALUE_OFFSET


def _check(requests: list[ReadRequest], plans: list, results: list) -> list[ReadOutcome]:
    outcomes = []
    base = plans[0][0] if plans else 0
    for r, (at, block, value) in zip(requests, plans):
        at -= base
        got_head = results[at]
        got_value = results[at + 1] if value is None else None
        error = next((g for g in (got_head, got_value) if isinstance(g, IoError)), None)
        if error is not None:
            complete = False
        elif value is not None:
            complete = got_head >= VALUE_OFFSET + r.slot.size
        else:
            complete = got_head == VALUE_OFFSET and got_value == r.slot.size
        slot = r.slot
        outcomes.append(verified_read(r.dest, block[:VALUE_OFFSET], value, key=r.key,
                                      size=slot.size, seq=slot.seq, checksum=slot.checksum,
                                      complete=complete, error=error))
    return outcomes

"""What one node of the ``3fs`` backend knows about the other nodes of its cluster.

Every other node's objects are found through that node's journal, which this node only
reads. :class:`ClusterView` keeps one :class:`NodeIndex` per other node and brings them up
to date on demand by reading the bytes appended since the last look (a whole re-read only
when the journal was rewritten, which its header's generation tells).

Visibility rule: a read that misses refreshes the view before it reports MISSING, and a
refresh that began after the read began counts. So an object whose ``batch_write``
returned on any node before a ``batch_read`` began on this one is found by that read.
Deletes and evictions on the other node become visible here at the next refresh; until
then this node may still read a deleted object's (immutable, checksummed) value, or find
that its shard file is gone and report it missing.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path

from kvstored.backends.threefs.files import HandleCache, ReadRequest, read_records
from kvstored.backends.threefs.index import NodeIndex, Slot
from kvstored.backends.threefs.journal import (
    HEADER_SIZE,
    JOURNAL_NAME,
    JournalFormatError,
    Kind,
    parse,
    read_file,
)
from kvstored.backends.threefs.layout import check_name, shard_path
from kvstored.native import IoEngine
from kvstored.native.errors import log_once
from kvstored.sdk.errors import InvalidRequestError
from kvstored.sdk.types import ReadStatus

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Found:
    """An object of another node: whose, where, and what its record must say."""

    node_id: str
    key: str
    slot: Slot
    path: str


class NodeView:
    """Another node's index, as of the journal bytes read so far."""

    def __init__(self, node_id: str, node_dir: Path) -> None:
        self.node_id = node_id
        self.node_dir = node_dir
        self.journal = node_dir / JOURNAL_NAME
        self.index = NodeIndex(node_dir)
        self.generation: int | None = None
        self.consumed = HEADER_SIZE

    def refresh(self) -> list[int]:
        """Read what the node appended since last time; return the shards it dropped."""
        try:
            header, base, data = read_file(self.journal, self.consumed)
            if header.generation != self.generation:
                if self.consumed != HEADER_SIZE:
                    header, base, data = read_file(self.journal)
                self.index = NodeIndex(self.node_dir)
                self.generation = header.generation
        except FileNotFoundError:
            return []  # a node that has not written its journal yet
        except (OSError, JournalFormatError) as exc:
            log_once(("3fs-view", str(self.journal), str(exc)), logging.WARNING,
                     "3fs: cannot read the journal of node %s (%s); its objects stay "
                     "invisible until it is readable", self.node_id, exc)
            return []
        parsed = parse(data, base)
        for start, stop in parsed.damaged:
            log_once(("3fs-damage", str(self.journal), start), logging.WARNING,
                     "3fs: bytes %d..%d of %s are damaged; objects listed there are "
                     "invisible from this node until %s repairs it", start, stop,
                     self.journal, self.node_id)
        dropped = []
        for entry in parsed.entries:
            self.index.apply(entry)
            if entry.kind is Kind.SHARD_DROP:
                dropped.append(entry.shard)
        self.consumed = parsed.end
        return dropped


class ClusterView:
    """Every other node of the cluster, read through their journals. Thread-safe."""

    def __init__(self, cluster_dir: Path, own_node: str, engine: IoEngine,
                 files: HandleCache, executor: Executor | None = None) -> None:
        self.cluster_dir = cluster_dir
        self.executor = executor
        self.own_node = own_node
        self.engine = engine
        self.files = files
        self._lock = threading.Lock()  # guards _views
        self._refresh_lock = threading.Lock()
        self._views: dict[str, NodeView] = {}
        self._last_refresh_began = float("-inf")
        #: Reads of other nodes' records that failed their checks.
        self.corrupt_reads = 0

    # -- keeping up ---------------------------------------------------------------------

    def refresh(self, asked_at: float | None = None) -> None:
        """Bring every node's view up to date. With ``asked_at`` (a ``time.monotonic()``
        taken when the caller's operation began), a refresh that began after it already
        satisfies the caller and this one returns at once."""
        with self._refresh_lock:
            if asked_at is not None and self._last_refresh_began > asked_at:
                return
            began = time.monotonic()
            names = self._node_names()
            with self._lock:
                views = {name: self._views.get(name) or NodeView(name, self.cluster_dir / name)
                         for name in names}
            for view in views.values():
                for shard in view.refresh():
                    self.files.forget(str(shard_path(view.node_dir, shard)))
            with self._lock:
                self._views = views
            self._last_refresh_began = began

    def _node_names(self) -> list[str]:
        names = []
        try:
            entries = list(os.scandir(self.cluster_dir))
        except OSError as exc:
            log_once(("3fs-cluster", str(self.cluster_dir)), logging.WARNING,
                     "3fs: cannot list %s (%s)", self.cluster_dir, exc)
            return names
        for entry in entries:
            if entry.name == self.own_node or not entry.is_dir():
                continue
            try:
                names.append(check_name("node_id", entry.name))
            except InvalidRequestError:
                continue  # not a node directory (quarantine copies, editor files, …)
        return sorted(names)

    def nodes(self) -> list[str]:
        with self._lock:
            return sorted(name for name, v in self._views.items() if v.generation is not None)

    # -- finding and reading ------------------------------------------------------------

    def find(self, key: str) -> Found | None:
        """The freshest copy of ``key`` on another node, from what is known now."""
        best = None
        with self._lock:
            for view in self._views.values():
                slot = view.index.objects.get(key)
                if slot is not None and (best is None or slot.write_ns > best[1].write_ns):
                    best = (view, slot)
        if best is None:
            return None
        view, slot = best
        return Found(view.node_id, key, slot, str(shard_path(view.node_dir, slot.shard)))

    def find_fresh(self, key: str, asked_at: float) -> Found | None:
        found = self.find(key)
        if found is None:
            self.refresh(asked_at)
            found = self.find(key)
        return found

    def read(self, keys: Sequence[str], buffers: Sequence[memoryview],
             asked_at: float) -> list[int]:
        """Read ``keys`` from other nodes; MISSING where no node has them."""
        results = [int(ReadStatus.MISSING)] * len(keys)
        found = [self.find(key) for key in keys]
        if any(f is None for f in found):
            self.refresh(asked_at)
            found = [f or self.find(key) for f, key in zip(found, keys)]
        retry = self._read_found(found, buffers, results, final=False)
        if retry:
            # A shard gone or a record not the one expected: the view may be stale.
            self.refresh()
            again = [self.find(keys[i]) if i in retry else None for i in range(len(keys))]
            self._read_found(again, buffers, results, final=True)
        return results

    def _read_found(self, found: list[Found | None], buffers: Sequence[memoryview],
                    results: list[int], *, final: bool) -> set[int]:
        requests, where, held, retry = [], [], [], set()
        try:
            for i, f in enumerate(found):
                if f is None:
                    continue
                if len(buffers[i]) < f.slot.size:
                    results[i] = ReadStatus.BUFFER_TOO_SMALL
                    continue
                try:
                    file = self.files.acquire(f.path)
                except FileNotFoundError:
                    if final:
                        results[i] = ReadStatus.MISSING
                    else:
                        retry.add(i)
                    continue
                except OSError:
                    results[i] = ReadStatus.IO_ERROR
                    continue
                held.append(file)
                requests.append(ReadRequest(f.key, f.slot, file, buffers[i]))
                where.append(i)
            outcomes = read_records(self.engine, requests, self.executor)
            for i, request, outcome in zip(where, requests, outcomes):
                if outcome.status == ReadStatus.CORRUPT and not final:
                    retry.add(i)
                    continue
                if outcome.status == ReadStatus.CORRUPT:
                    self.corrupt_reads += 1
                    log.warning("3fs: %r on node %s (%s) failed its check: %s; reported as "
                                "corrupt", request.key, found[i].node_id, request.file.path,
                                outcome.reason)
                results[i] = outcome.status
        finally:
            for file in held:
                self.files.release(file)
        return retry

    def objects(self) -> Iterator[Found]:
        """Every object of every other node, as of the last refresh."""
        with self._lock:
            views = list(self._views.values())
        for view in views:
            for key, slot in list(view.index.objects.items()):
                yield Found(view.node_id, key, slot, str(shard_path(view.node_dir, slot.shard)))

"""A client's mappings of the DRAM segments of nodes on its own host.

A node on this host (same host id) is mapped on first use, after checking the segment's
token; a node that cannot be mapped (another host, another user, gone) is remembered so
that the client does not try again on every read. Thread-safe.
"""

from __future__ import annotations

import logging
import threading

from kvstored.hostid import host_id
from kvstored.protocol.master_api import NodeContact
from kvstored.shm import SegmentMapping, SegmentUnavailable

log = logging.getLogger(__name__)

#: How a client moves bytes: shared memory where it can, else TCP; TCP only; shm only.
TRANSPORTS = ("auto", "tcp", "shm")


class Segments:
    def __init__(self, transport: str) -> None:
        self.transport = transport
        self._maps: dict[str, tuple[tuple[str, str], SegmentMapping]] = {}
        self._refused: set[str] = set()
        self._lock = threading.Lock()

    def mapping(self, node: str, contact: NodeContact) -> SegmentMapping | None:
        """``node``'s segment mapped here, or None: use TCP."""
        if self.transport == "tcp" or node in self._refused:
            return None
        identity = (contact.segment, contact.segment_token)
        with self._lock:
            existing = self._maps.get(node)
            if existing is not None:
                if existing[0] == identity:
                    return existing[1]
                # The node restarted with a new segment under the same name: the old
                # mapping shows freed memory, never read through it again.
                self._maps.pop(node)[1].close()
            if contact.host_id != host_id():
                self._refused.add(node)
                return None
            try:
                mapping = SegmentMapping.attach(contact.segment,
                                                bytes.fromhex(contact.segment_token))
            except (SegmentUnavailable, OSError, ValueError) as exc:
                log.info("node %s: shared memory unavailable (%s); using TCP", node, exc)
                self._refused.add(node)
                return None
            self._maps[node] = (identity, mapping)
            return mapping

    def forget(self, node: str) -> None:
        with self._lock:
            entry = self._maps.pop(node, None)
        if entry is not None:
            entry[1].close()

    def close(self) -> None:
        for node in list(self._maps):
            self.forget(node)

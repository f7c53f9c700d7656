"""What the blocking and the trio clients share: request checks, result types, read
planning, and the same-host segment mappings."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

from crc32c import crc32c

from kvstored.config import ConfigError
from kvstored.errors import BadRequestError
from kvstored.hostid import host_id
from kvstored.sdk.errors import InvalidKeyError
from kvstored.sdk.types import encode_key
from kvstored.security import ClientToken, find_client_token

log = logging.getLogger(__name__)

TRANSPORTS = ("auto", "tcp", "shm")
#: Missing: the value ``get_into`` and ``batch_get_into`` report for an absent key.
MISSING = -1


@dataclass(frozen=True, slots=True)
class ReplicaInfo:
    node: str
    tier: str
    state: str


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """What ``stat`` reports: the size, the CRC-32C of the value, and where it lives."""

    key: str
    size: int
    checksum: int
    replicas: tuple[ReplicaInfo, ...]
    reads: int = 0

    @classmethod
    def from_wire(cls, obj: dict[str, Any]) -> ObjectInfo:
        return cls(obj["key"], obj["size"], obj["checksum"],
                   tuple(ReplicaInfo(r["node"], r["tier"], r["state"]) for r in obj["replicas"]),
                   obj.get("reads", 0))


def check_keys(keys: list[str]) -> None:
    for key in keys:
        try:
            encode_key(key)
        except InvalidKeyError as exc:
            raise BadRequestError(exc.message, key=exc.key) from None


def prepare_values(keys: list[str], values: list[Any]) -> tuple[list[memoryview], list[int],
                                                                list[int]]:
    if len(keys) != len(values):
        raise BadRequestError(f"{len(keys)} keys but {len(values)} values")
    check_keys(keys)
    views = [memoryview(v).cast("B") for v in values]
    return views, [v.nbytes for v in views], [crc32c(v) for v in views]


def parse_address(text: str) -> tuple[str, int]:
    from kvstored.config import split_address

    try:
        return split_address(text)
    except ValueError as exc:
        raise BadRequestError(f"bad address {text!r}: {exc}") from None


@dataclass(slots=True)
class ReadPlan:
    """How to serve a batch read: copies from mapped segments, and per-node TCP gets."""

    shm: list[tuple[int, str, int, int]]  # (index, node, offset, size)
    tcp: dict[str, list[int]]             # node -> indexes
    sizes: list[int]                      # from the lookup; MISSING where absent
    checksums: list[int | None]           # which version the lookup found


class Segments:
    """Same-host segment mappings, attached on first use; nodes that cannot be mapped
    are remembered so the client does not retry on every read."""

    def __init__(self, transport: str) -> None:
        self.transport = transport
        self._maps: dict[str, Any] = {}
        self._refused: set[str] = set()
        self._lock = threading.Lock()

    def mapping(self, node: str, info: dict[str, Any]):
        if self.transport == "tcp" or node in self._refused:
            return None
        with self._lock:
            existing = self._maps.get(node)
            if existing is not None:
                if existing[0] == (info["segment"], info["token"]):
                    return existing[1]
                # The node restarted with a new segment under the same name: the old
                # mapping shows freed memory, never read through it again.
                self._maps.pop(node)[1].close()
            if info.get("host") != host_id():
                self._refused.add(node)
                return None
            from kvstored.node.segment import SegmentMapping, SegmentUnavailable

            try:
                mapping = SegmentMapping.attach(info["segment"], bytes.fromhex(info["token"]))
            except (SegmentUnavailable, OSError) as exc:
                log.info("node %s: shared memory unavailable (%s); using TCP", node, exc)
                self._refused.add(node)
                return None
            self._maps[node] = ((info["segment"], info["token"]), mapping)
            return mapping

    def forget(self, node: str) -> None:
        with self._lock:
            entry = self._maps.pop(node, None)
        if entry is not None:
            entry[1].close()

    def close(self) -> None:
        for node in list(self._maps):
            self.forget(node)


def plan_reads(reply: dict[str, Any], buffers: list[memoryview], keys: list[str],
               segments: Segments) -> ReadPlan:
    plan = ReadPlan([], {}, [], [])
    nodes = reply["nodes"]
    for i, found in enumerate(reply["objects"]):
        if found is None:
            plan.sizes.append(MISSING)
            plan.checksums.append(None)
            continue
        size, checksum, replicas = found
        if len(buffers[i]) < size:
            raise BadRequestError(f"the buffer holds {len(buffers[i])} bytes but the object "
                                  f"is {size}; pass a buffer of at least {size}", key=keys[i])
        plan.sizes.append(size)
        plan.checksums.append(checksum)
        node, tier, offset = replicas[0]
        if tier == "dram" and segments.mapping(node, nodes[node]) is not None:
            plan.shm.append((i, node, offset, size))
        else:
            plan.tcp.setdefault(node, []).append(i)
    if segments.transport == "shm" and plan.tcp:
        raise BadRequestError("transport='shm' but some objects are not in a DRAM segment on "
                              "this host; use transport='auto'")
    return plan


def client_token(token: str | None, token_file: str | None) -> ClientToken:
    """The token a client presents (see :func:`kvstored.security.find_client_token`)."""
    try:
        return find_client_token(token, token_file)
    except ConfigError as exc:
        raise BadRequestError(str(exc)) from None


def split_by_bytes(sizes: list[int], limit: int | None) -> list[list[int]]:
    """Indexes of ``sizes`` in order, cut into runs of at most ``limit`` bytes each (an
    item larger than ``limit`` alone in its run): the requests one node get becomes."""
    if not limit or sum(sizes) <= limit:
        return [list(range(len(sizes)))]
    runs: list[list[int]] = [[]]
    total = 0
    for i, size in enumerate(sizes):
        if runs[-1] and total + size > limit:
            runs.append([])
            total = 0
        runs[-1].append(i)
        total += size
    return runs


def client_host() -> str:
    return host_id()

"""The blocking client: thread-safe, with batch calls as the fast path.

Each thread gets its own connections (to the master and to each node it talks to), so
threads never wait on each other's requests. A batch costs one round trip to the
master, then one request per node holding data (or none, for objects in a DRAM segment
on this host, which are copied straight out of shared memory).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Sequence
from typing import Any

from kvstored.client.common import (
    TRANSPORTS,
    BatchRead,
    NodeHealth,
    ObjectInfo,
    ReadStats,
    Segments,
    check_keys,
    client_host,
    client_token,
    no_room_error,
    parse_address,
    prepare_values,
    split_by_bytes,
)
from kvstored.errors import (
    BadRequestError,
    CorruptDataError,
    StoreError,
    UnauthorizedError,
    UnreachableError,
    from_wire,
)
from kvstored.protocol import Hello, Role
from kvstored.security import ClientToken
from kvstored.wire import (
    ConnectionClosed,
    FrameError,
    FrameReader,
    send_frame,
)

#: How long puts keep retrying when the target node is momentarily out of DRAM (the
#: master frees room by evicting offloaded objects within a heartbeat or two).
NO_SPACE_RETRY_SECONDS = 5.0


class _Connection:
    """One socket to the master or a node. Connecting and the hello are bounded by
    ``connect_timeout`` (a peer that accepts and never answers, or answers something that
    is not kvstored, fails fast); every later request by ``timeout``."""

    def __init__(self, address: tuple[str, int], token: ClientToken, timeout: float,
                 connect_timeout: float) -> None:
        self.address = address
        where = f"{address[0]}:{address[1]}"
        try:
            self.sock = socket.create_connection(address, timeout=connect_timeout)
        except OSError as exc:
            raise UnreachableError(f"cannot reach {where} ({exc.strerror or exc}); "
                                   "is kvstored running?") from None
        try:
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.reader = FrameReader(self.sock)
            self.hello = self._exchange(Hello(Role.CLIENT, token.token).to_wire())
        except (OSError, ConnectionClosed, FrameError) as exc:
            self.close()
            raise UnreachableError(f"{where} did not answer as kvstored does within "
                                   f"{connect_timeout:g} s ({str(exc) or type(exc).__name__}); "
                                   "is that a kvstored master's or node's address?") from None
        except UnauthorizedError as exc:
            self.close()
            raise token.explain(exc) from None
        except BaseException:  # refused (another protocol version), or interrupted
            self.close()  # nothing stays open when the hello fails
            raise
        self.sock.settimeout(timeout)

    def request(self, header: dict[str, Any], payload: Sequence = ()) -> dict[str, Any]:
        """Send a request, return its response header; the caller reads any payload."""
        try:
            return self._exchange(header, payload)
        except (OSError, ConnectionClosed, FrameError) as exc:
            self.close()
            raise UnreachableError(f"{header.get('op')}: connection to "
                                   f"{self.address[0]}:{self.address[1]} failed: {exc}") from None

    def _exchange(self, header: dict[str, Any], payload: Sequence = ()) -> dict[str, Any]:
        send_frame(self.sock, header, payload)
        reply = self.reader.recv_header()
        if not reply.get("ok"):
            self.reader.discard_payload()
            raise from_wire(reply.get("error") or {})
        return reply

    def close(self) -> None:
        self.sock.close()


class Client:
    """A connection to a kvstored cluster. Use :func:`connect`."""

    def __init__(self, master: str, *, transport: str = "auto", token: str | None = None,
                 token_file: str | None = None, timeout: float = 30.0,
                 connect_timeout: float | None = None) -> None:
        if transport not in TRANSPORTS:
            raise BadRequestError(f"transport must be one of {', '.join(TRANSPORTS)}")
        self.master_address = parse_address(master)
        self.transport = transport
        self.token = client_token(token, token_file)
        self.timeout = timeout
        self.connect_timeout = timeout if connect_timeout is None else connect_timeout
        self.segments = Segments(transport)
        #: What reads ran into: checksum failures, nodes that could not serve.
        self.stats = ReadStats()
        self._health = NodeHealth()
        self._local = threading.local()
        self._all: list[_Connection] = []
        self._all_lock = threading.Lock()
        self._nodes: dict[str, dict[str, Any]] = {}
        self._closed = False
        self._master()  # fail now, not on first use, if the master is unreachable

    # -- connections -------------------------------------------------------------------

    def _conn(self, name: str, address: tuple[str, int]) -> _Connection:
        if self._closed:
            raise BadRequestError("the client is closed")
        conns = self._local.__dict__.setdefault("conns", {})
        conn = conns.get(name)
        if conn is None or conn.sock.fileno() < 0:
            conn = conns[name] = _Connection(address, self.token, self.timeout,
                                             self.connect_timeout)
            with self._all_lock:
                self._all.append(conn)
        return conn

    def _master(self) -> _Connection:
        return self._conn("master", self.master_address)

    def _call(self, op: str, **args: Any) -> dict[str, Any]:
        return self._master().request({"op": op, **args})

    def _node_conn(self, node: str) -> _Connection:
        info = self._nodes[node]
        return self._conn(f"node:{node}", (info["addr"][0], int(info["addr"][1])))

    # -- writes ------------------------------------------------------------------------

    def put(self, key: str, data: Any) -> bool:
        """Store ``data`` under ``key``. False if the key already existed (write-once)."""
        return self.batch_put([key], [data])[0]

    def batch_put(self, keys: Sequence[str], values: Sequence[Any]) -> list[bool]:
        """Store many objects; True for each stored now, False for each that existed."""
        keys = list(keys)
        views, sizes, checksums = prepare_values(keys, list(values))
        results: list[bool | None] = [None] * len(keys)
        todo = list(range(len(keys)))
        deadline = time.monotonic() + NO_SPACE_RETRY_SECONDS
        while todo:
            retry, why = self._put_round(keys, views, sizes, checksums, todo, results)
            if not retry:
                break
            if time.monotonic() > deadline:
                raise no_room_error(len(retry), NO_SPACE_RETRY_SECONDS, why, keys[retry[0]])
            time.sleep(0.05)
            todo = retry
        return [bool(r) for r in results]

    def _put_round(self, keys, views, sizes, checksums, todo, results
                   ) -> tuple[list[int], str | None]:
        """One placement and one request per node; the indexes to try again (no room
        yet) and the node's reason for that."""
        reply = self._call("put_target", keys=[keys[i] for i in todo],
                           sizes=[sizes[i] for i in todo], host=client_host())
        self._nodes.update(reply["nodes"])
        by_node: dict[str, list[int]] = {}
        for i, target in zip(todo, reply["targets"]):
            if target is None:
                results[i] = False
            else:
                by_node.setdefault(target, []).append(i)
        retry: list[int] = []
        why = None
        for node, idx in by_node.items():
            try:
                outcome, no_space = self._put_on_node(node, keys, views, sizes, checksums, idx)
                why = no_space or why
            except StoreError:
                self._call("put_abort", keys=[keys[i] for i in idx])
                raise
            abort = []
            for i, status in zip(idx, outcome):
                if status == "ok":
                    results[i] = True
                elif status == "exists":
                    results[i] = False
                elif status == "no_space":
                    retry.append(i)
                    abort.append(keys[i])
                elif status == "corrupt":
                    self._call("put_abort", keys=[keys[i]])
                    raise CorruptDataError("the node received bytes that fail their checksum",
                                           key=keys[i])
                else:
                    raise StoreError(f"unexpected put result {status!r}", key=keys[i])
            if abort:
                self._call("put_abort", keys=abort)
        return retry, why

    def _put_on_node(self, node, keys, views, sizes, checksums, idx
                     ) -> tuple[list[str], str | None]:
        """Per index the node's status, and why it had no room (if it said)."""
        conn = self._node_conn(node)
        mapping = self.segments.mapping(node, self._nodes[node])
        batch = {"keys": [keys[i] for i in idx], "sizes": [sizes[i] for i in idx],
                 "checksums": [checksums[i] for i in idx]}
        if mapping is None:
            reply = conn.request({"op": "put", **batch}, [views[i] for i in idx])
            return reply["results"], reply.get("no_space")
        allocated = conn.request({"op": "alloc", **batch})
        offsets = allocated["offsets"]
        sealed = []
        status = {}
        for i, offset in zip(idx, offsets):
            if offset is None:
                status[i] = "no_space"
                continue
            mapping.view(offset, sizes[i])[:] = views[i]
            sealed.append(i)
        if sealed:
            outcome = conn.request({"op": "seal", "keys": [keys[i] for i in sealed]})["results"]
            status.update(zip(sealed, outcome))
        return [status[i] for i in idx], allocated.get("no_space")

    # -- reads -------------------------------------------------------------------------

    def get(self, key: str) -> bytes | None:
        """The value of ``key``, or None."""
        return self.batch_get([key])[0]

    def batch_get(self, keys: Sequence[str]) -> list[bytes | None]:
        """The values of ``keys`` (None where missing), in one master round trip."""
        keys = list(keys)
        bufs: list[Any] = []
        results = self._read(keys, bufs)
        return [bytes(memoryview(b)[:n]) if n >= 0 else None for b, n in zip(bufs, results)]

    def get_into(self, key: str, buf: Any) -> int:
        """Read ``key`` into ``buf``; the number of bytes written, or -1 if missing."""
        return self.batch_get_into([key], [buf])[0]

    def batch_get_into(self, keys: Sequence[str], buffers: Sequence[Any]) -> list[int]:
        """Read many objects into caller buffers; per key the length, or -1 if missing."""
        keys = list(keys)
        if len(keys) != len(buffers):
            raise BadRequestError(f"{len(keys)} keys but {len(buffers)} buffers")
        return self._read(keys, list(buffers))

    def _read(self, keys: list[str], buffers: list[Any]) -> list[int]:
        """Look ``keys`` up (one master round trip), then copy each from a mapped segment
        or fetch it from its node, falling back to other replicas (see BatchRead). An
        empty ``buffers`` is filled with new bytearrays."""
        check_keys(keys)
        started = time.monotonic()
        reply = self._call("lookup", keys=keys)
        self._nodes.update(reply["nodes"])
        read = BatchRead(keys, reply, buffers, self.segments, self._health, self.stats)
        while read.pending:
            read.copy_from_segments(started, time.monotonic)
            self._report_corrupt(read)
            for node, idx in read.tcp_requests().items():
                self._get_from_node(read, node, idx)
            self._report_corrupt(read)
        return read.results

    def _get_from_node(self, read: BatchRead, node: str, idx: list[int]) -> None:
        """Fetch ``idx`` from ``node`` into their buffers; whatever it cannot deliver is
        handed back to ``read`` as failed (never raised: a read falls back or misses)."""
        try:
            conn = self._node_conn(node)
        except StoreError:
            read.failed(node, idx)
            return
        # A node stages at most max_read_staging bytes of SSD reads for one request.
        parts = split_by_bytes([max(read.sizes[i], 0) for i in idx],
                               conn.hello.get("max_read_staging"))
        for n, part in enumerate(parts):
            if not self._get_part(read, node, conn, [idx[j] for j in part]):
                read.failed(node, [idx[j] for later in parts[n + 1:] for j in later])
                return

    def _get_part(self, read: BatchRead, node: str, conn: _Connection, idx: list[int]
                  ) -> bool:
        """One node get; False (its undelivered items failed) if the node could not
        serve it, and the connection is then closed."""
        try:
            reply = conn.request(read.node_get(idx))
        except StoreError:
            read.failed(node, idx)
            return False
        for n, (i, size) in enumerate(zip(idx, reply["sizes"])):
            if 0 <= size <= len(read.buffers[i]):
                try:
                    conn.reader.recv_payload_into(read.buffers[i][:size])
                except (OSError, ConnectionClosed, FrameError):
                    conn.close()
                    read.failed(node, idx[n:])
                    return False
            elif size > len(read.buffers[i]):  # not the version asked for: never served
                conn.close()
                read.failed(node, idx[n:])
                return False
            read.received(i, size)
        return True

    def _report_corrupt(self, read: BatchRead) -> None:
        """Tell nodes which of their copies failed the checksum here; each checks its
        own copy and drops it if bad (best effort: a read never fails over this)."""
        for node, (keys, checksums) in read.take_corrupt().items():
            try:
                self._node_conn(node).request({"op": "report_corrupt", "keys": keys,
                                               "checksums": checksums})
            except StoreError:
                pass

    # -- metadata ----------------------------------------------------------------------

    def exists(self, key: str) -> bool:
        return self.batch_exists([key])[0]

    def batch_exists(self, keys: Sequence[str]) -> list[bool]:
        return self._call("exists", keys=list(keys))["exists"]

    def prefix_hits(self, keys: Sequence[str]) -> int:
        """How many leading keys exist (the prefix-cache rule of HiCache and LMCache)."""
        return self._call("prefix_hits", keys=list(keys))["hits"]

    def remove(self, key: str) -> bool:
        return self.batch_remove([key])[0]

    def batch_remove(self, keys: Sequence[str]) -> list[bool]:
        return self._call("remove", keys=list(keys))["removed"]

    def stat(self, key: str) -> ObjectInfo | None:
        try:
            return ObjectInfo.from_wire(self._call("stat", key=key)["object"])
        except StoreError as exc:
            if exc.code == "not_found":
                return None
            raise

    def locate(self, key: str) -> dict[str, dict[str, Any]]:
        """Where each node holding ``key`` keeps its bytes, for debugging: node name ->
        ``{"dram": {"segment", "offset", "size"} | None, "ssd": {"path", "offset",
        "length", "record_offset", "device"} | None}``, or ``{"error": message}`` for a
        node that could not be asked. Empty if there is no such object. Costs a stat and
        one request per node (plus a status if this client never talked to the node).
        """
        info = self.stat(key)
        if info is None:
            return {}
        holders = sorted({r.node for r in info.replicas})
        addresses = {n: tuple(self._nodes[n]["addr"]) for n in holders if n in self._nodes}
        if len(addresses) < len(holders):
            for entry in self._call("status")["nodes"]:
                addresses.setdefault(entry["node"], parse_address(entry["address"]))
        out: dict[str, dict[str, Any]] = {}
        for node in holders:
            try:
                conn = self._conn(f"node:{node}", (addresses[node][0], int(addresses[node][1])))
                out[node] = conn.request({"op": "locate", "keys": [key]})["locations"][0]
            except (KeyError, StoreError) as exc:
                out[node] = {"error": f"node {node} could not be asked: {exc}"}
        return out

    def call(self, op: str, **args: Any) -> dict[str, Any]:
        """A raw master request, for admin tools (status, flush, evict, recover, list)."""
        return self._call(op, **args)

    # -- lifecycle ---------------------------------------------------------------------

    def close(self) -> None:
        self._closed = True
        with self._all_lock:
            for conn in self._all:
                conn.close()
            self._all.clear()
        self.segments.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def connect(master: str = "127.0.0.1:7700", *, transport: str = "auto",
            token: str | None = None, token_file: str | None = None,
            timeout: float = 30.0, connect_timeout: float | None = None) -> Client:
    """Connect to the cluster whose master listens at ``master``.

    ``transport`` is ``auto`` (shared memory for DRAM objects on this host, TCP
    otherwise), ``tcp``, or ``shm`` (shared memory only; an error for anything else).
    ``timeout`` bounds each request; ``connect_timeout`` (default: ``timeout``) bounds
    connecting to the master or a node and the hello that follows.

    The client token is ``token``, else the first line of ``token_file``, else the file
    ``security.token_file`` of the configuration names (by default
    ``~/.config/kvstored/token``, which the master creates for its user); see
    docs/security.md.
    """
    return Client(master, transport=transport, token=token, token_file=token_file,
                  timeout=timeout, connect_timeout=connect_timeout)

"""The trio client: the same calls as :func:`kvstored.connect`, as coroutines.

::

    async with kvstored.aio.connect("127.0.0.1:7700") as c:
        await c.put("k", b"v")
        n = await c.get_into("k", buf)

One instance may be shared by many tasks: each request holds its connection's lock
for the length of one round trip.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import trio

from kvstored.client.common import (
    MISSING,
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
from kvstored.rpc import RpcClient
from kvstored.wire import ConnectionClosed, FrameError

NO_SPACE_RETRY_SECONDS = 5.0

__all__ = ["MISSING", "AsyncClient", "ObjectInfo", "connect"]


class AsyncClient:
    def __init__(self, master: str, *, transport: str = "auto", token: str | None = None,
                 token_file: str | None = None, timeout: float = 30.0) -> None:
        if transport not in TRANSPORTS:
            raise BadRequestError(f"transport must be one of {', '.join(TRANSPORTS)}")
        self.token = client_token(token, token_file)
        self.master = RpcClient(parse_address(master), token=self.token.token)
        self.timeout = timeout
        self.segments = Segments(transport)
        #: What reads ran into: checksum failures, nodes that could not serve.
        self.stats = ReadStats()
        self._health = NodeHealth()
        self._nodes: dict[str, dict[str, Any]] = {}
        self._node_clients: dict[str, RpcClient] = {}

    async def _call(self, op: str, **args: Any) -> dict[str, Any]:
        with trio.fail_after(self.timeout):
            try:
                return await self.master.call(op, **args)
            except UnauthorizedError as exc:
                raise self.token.explain(exc) from None

    def _node(self, node: str) -> RpcClient:
        client = self._node_clients.get(node)
        if client is None:
            addr = self._nodes[node]["addr"]
            client = self._node_clients[node] = RpcClient((addr[0], int(addr[1])),
                                                          token=self.token.token)
        return client

    async def _node_request(self, node: str, header: dict[str, Any], payload=(),
                            into: list[memoryview] | None = None) -> dict[str, Any]:
        """One request to a node, within the client's timeout; response payload items
        are received into ``into`` (an item larger than its view fails the request)."""
        client = self._node(node)
        async with client._lock:
            try:
                with trio.fail_after(self.timeout):
                    conn = await client._ready()
                    await conn.send_frame(header, payload)
                    reply = await conn.recv_header()
                    if reply.get("ok") and into is not None:
                        for view, size in zip(into, reply["sizes"]):
                            if size > len(view):
                                raise FrameError(f"an item of {size} bytes for a "
                                                 f"{len(view)}-byte buffer")
                            if size >= 0:
                                await conn.recv_payload_into(view[:size])
                    await conn.discard_payload()
            except (OSError, ConnectionClosed, FrameError, trio.BrokenResourceError,
                    trio.TooSlowError) as exc:
                client.close()
                raise UnreachableError(f"{header['op']} on node {node} failed: "
                                       f"{exc or 'timed out'}") from None
        if not reply.get("ok"):
            raise from_wire(reply.get("error") or {})
        return reply

    # -- writes ------------------------------------------------------------------------

    async def put(self, key: str, data: Any) -> bool:
        return (await self.batch_put([key], [data]))[0]

    async def batch_put(self, keys: Sequence[str], values: Sequence[Any]) -> list[bool]:
        keys = list(keys)
        views, sizes, checksums = prepare_values(keys, list(values))
        results: list[bool | None] = [None] * len(keys)
        todo = list(range(len(keys)))
        deadline = trio.current_time() + NO_SPACE_RETRY_SECONDS
        while todo:
            reply = await self._call("put_target", keys=[keys[i] for i in todo],
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
                    outcome, no_space = await self._put_on_node(node, keys, views, sizes,
                                                                checksums, idx)
                    why = no_space or why
                except StoreError:
                    await self._call("put_abort", keys=[keys[i] for i in idx])
                    raise
                for i, status in zip(idx, outcome):
                    if status in ("ok", "exists"):
                        results[i] = status == "ok"
                    elif status == "no_space":
                        retry.append(i)
                    else:
                        await self._call("put_abort", keys=[keys[i]])
                        raise CorruptDataError(f"put failed: {status}", key=keys[i])
            if retry:
                await self._call("put_abort", keys=[keys[i] for i in retry])
                if trio.current_time() > deadline:
                    raise no_room_error(len(retry), NO_SPACE_RETRY_SECONDS, why,
                                        keys[retry[0]])
                await trio.sleep(0.05)
            todo = retry
        return [bool(r) for r in results]

    async def _put_on_node(self, node, keys, views, sizes, checksums, idx
                           ) -> tuple[list[str], str | None]:
        batch = {"keys": [keys[i] for i in idx], "sizes": [sizes[i] for i in idx],
                 "checksums": [checksums[i] for i in idx]}
        mapping = self.segments.mapping(node, self._nodes[node])
        if mapping is None:
            reply = await self._node_request(node, {"op": "put", **batch},
                                             [views[i] for i in idx])
            return reply["results"], reply.get("no_space")
        allocated = await self._node_request(node, {"op": "alloc", **batch})
        offsets = allocated["offsets"]
        status, sealed = {}, []
        for i, offset in zip(idx, offsets):
            if offset is None:
                status[i] = "no_space"
            else:
                mapping.view(offset, sizes[i])[:] = views[i]
                sealed.append(i)
        if sealed:
            reply = await self._node_request(node, {"op": "seal",
                                                    "keys": [keys[i] for i in sealed]})
            status.update(zip(sealed, reply["results"]))
        return [status[i] for i in idx], allocated.get("no_space")

    # -- reads -------------------------------------------------------------------------

    async def get(self, key: str) -> bytes | None:
        return (await self.batch_get([key]))[0]

    async def batch_get(self, keys: Sequence[str]) -> list[bytes | None]:
        bufs: list[Any] = []
        results = await self._read(list(keys), bufs)
        return [bytes(memoryview(b)[:n]) if n >= 0 else None for b, n in zip(bufs, results)]

    async def get_into(self, key: str, buf: Any) -> int:
        return (await self.batch_get_into([key], [buf]))[0]

    async def batch_get_into(self, keys: Sequence[str], buffers: Sequence[Any]) -> list[int]:
        keys = list(keys)
        if len(keys) != len(buffers):
            raise BadRequestError(f"{len(keys)} keys but {len(buffers)} buffers")
        return await self._read(keys, list(buffers))

    async def _read(self, keys: list[str], buffers: list[Any]) -> list[int]:
        """The blocking client's read, as coroutines (see BatchRead): replicas are tried in
        turn, and a node that cannot serve makes a clean miss, never an error."""
        check_keys(keys)
        started = trio.current_time()
        reply = await self._call("lookup", keys=keys)
        self._nodes.update(reply["nodes"])
        read = BatchRead(keys, reply, buffers, self.segments, self._health, self.stats)
        while read.pending:
            read.copy_from_segments(started, trio.current_time)
            await self._report_corrupt(read)
            for node, idx in read.tcp_requests().items():
                await self._get_from_node(read, node, idx)
            await self._report_corrupt(read)
        return read.results

    async def _get_from_node(self, read: BatchRead, node: str, idx: list[int]) -> None:
        """Fetch ``idx`` from ``node``; what it cannot deliver is failed in ``read``."""
        try:
            with trio.fail_after(self.timeout):
                hello = await self._node(node).hello()
        except (StoreError, trio.TooSlowError):
            read.failed(node, idx)
            return
        # A node stages at most max_read_staging bytes of SSD reads for one request.
        parts = split_by_bytes([max(read.sizes[i], 0) for i in idx],
                               hello.get("max_read_staging"))
        for n, part in enumerate(parts):
            chunk = [idx[j] for j in part]
            try:
                got = await self._node_request(node, read.node_get(chunk),
                                               into=[read.buffers[i] for i in chunk])
            except StoreError:
                read.failed(node, [idx[j] for later in parts[n:] for j in later])
                return
            for i, size in zip(chunk, got["sizes"]):
                read.received(i, size)

    async def _report_corrupt(self, read: BatchRead) -> None:
        for node, (keys, checksums) in read.take_corrupt().items():
            try:
                await self._node_request(node, {"op": "report_corrupt", "keys": keys,
                                                "checksums": checksums})
            except StoreError:
                pass  # best effort: the read itself already moved on

    # -- metadata ----------------------------------------------------------------------

    async def exists(self, key: str) -> bool:
        return (await self.batch_exists([key]))[0]

    async def batch_exists(self, keys: Sequence[str]) -> list[bool]:
        return (await self._call("exists", keys=list(keys)))["exists"]

    async def prefix_hits(self, keys: Sequence[str]) -> int:
        return (await self._call("prefix_hits", keys=list(keys)))["hits"]

    async def remove(self, key: str) -> bool:
        return (await self._call("remove", keys=[key]))["removed"][0]

    async def stat(self, key: str) -> ObjectInfo | None:
        try:
            return ObjectInfo.from_wire((await self._call("stat", key=key))["object"])
        except StoreError as exc:
            if exc.code == "not_found":
                return None
            raise

    async def aclose(self) -> None:
        self.master.close()
        for client in self._node_clients.values():
            client.close()
        self.segments.close()


@asynccontextmanager
async def connect(master: str = "127.0.0.1:7700", *, transport: str = "auto",
                  token: str | None = None, token_file: str | None = None,
                  timeout: float = 30.0) -> AsyncIterator[AsyncClient]:
    """The trio client; the token is found as :func:`kvstored.connect` finds it."""
    client = AsyncClient(master, transport=transport, token=token, token_file=token_file,
                         timeout=timeout)
    try:
        try:
            await client.master.connect()
        except UnauthorizedError as exc:
            raise client.token.explain(exc) from None
        yield client
    finally:
        await client.aclose()

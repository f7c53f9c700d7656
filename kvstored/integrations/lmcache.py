"""kvstored as an LMCache remote storage plugin (and so as vLLM's, via LMCacheConnectorV1).

LMCache loads it from its own configuration::

    chunk_size: 256
    local_cpu: true
    max_local_cpu_size: 5
    remote_serde: naive
    remote_storage_plugins: ["kvstored"]
    extra_config:
      remote_storage_plugin.kvstored.module_path: kvstored.integrations.lmcache
      remote_storage_plugin.kvstored.class_name: KvstoredConnectorAdapter
      remote_storage_plugin.kvstored.master: 127.0.0.1:7700

(``remote_url: kvstored://HOST:PORT`` works too, for LMCache's legacy single-remote
setting.) One kvstored object per chunk. With ``save_chunk_meta`` (LMCache's default) the
object is LMCache's own ``RemoteMetadata`` header followed by the chunk's bytes, as its file
connector writes them; without it, the chunk's bytes alone. A last chunk shorter than
``chunk_size`` is stored short and read back with LMCache's ``reshape_partial_chunk``.

Keys: ``lmcache/MODEL/DTYPE/wWORKERofWORLD/chunkN/FORMAT/`` followed by LMCache's own key
string (``model@world@worker@hash@dtype``, with a layer and tags where LMCache adds them).
The worker is the global rank (TP x PP) LMCache puts in the key, so ranks never collide,
and LMCache's MLA mode that rewrites every rank's keys to worker 0 shares one copy.

The connector's calls are LMCache's coroutines, run on LMCache's event loop over
kvstored's asyncio client: no thread per call, and the loop never blocks. LMCache's few
synchronous calls (``exists_sync``, ``batched_contains``, ``remove_sync``), made from the
engine's threads, hand their coroutine to that loop and wait for it.
``pin`` in ``batched_async_contains`` is kvstored's lookup-and-lock: the leading chunks
found are held against eviction for ``lock_ttl`` seconds (default 10), until this
connector reads them; LMCache's remote ``unpin`` does not reach connectors, so a pinned
chunk that is never read is let go at its expiry.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

from lmcache.utils import CacheEngineKey
from lmcache.v1.memory_management import MemoryObj
from lmcache.v1.protocol import RemoteMetadata
from lmcache.v1.storage_backend.connector import (
    ConnectorAdapter,
    ConnectorContext,
    extract_plugin_type,
    parse_remote_url,
)
from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector

from kvstored.client import MISSING
from kvstored.errors import StoreError
from kvstored.integrations.namespace import Namespace, dtype_name
from kvstored.integrations.objects import AsyncObjectIO, StoreSettings, byte_view

log = logging.getLogger(__name__)

ENGINE = "lmcache"
#: The plugin type: ``remote_storage_plugins: ["kvstored"]`` (or ``kvstored.NAME``).
PLUGIN_TYPE = "kvstored"
URL_SCHEME = "kvstored://"

T = TypeVar("T")


class KvstoredConnectorAdapter(ConnectorAdapter):
    """What ``remote_storage_plugin.kvstored.class_name`` names: LMCache instantiates it
    with no arguments and asks it for a connector for ``plugin://kvstored``."""

    def __init__(self) -> None:
        super().__init__(URL_SCHEME)

    def can_parse(self, url: str) -> bool:
        if url.startswith(URL_SCHEME):
            return True
        return (url.startswith("plugin://")
                and extract_plugin_type(url[len("plugin://"):]) == PLUGIN_TYPE)

    def create_connector(self, context: ConnectorContext) -> RemoteConnector:
        return KvstoredConnector(context)


def settings_for(context: ConnectorContext) -> StoreSettings:
    """Plugin options from ``extra_config`` (``remote_storage_plugin.NAME.master`` and
    the rest), or the master from a ``kvstored://HOST:PORT`` URL."""
    extra = dict((context.config.extra_config if context.config else None) or {})
    plugin = context.plugin_name
    if plugin is None and context.url.startswith("plugin://"):
        plugin = context.url[len("plugin://"):]
    if plugin:
        return StoreSettings.from_options(extra, prefix=f"remote_storage_plugin.{plugin}.")
    parsed = parse_remote_url(context.url)
    return StoreSettings.from_options({**extra, "master": f"{parsed.host}:{parsed.port}"})


class KvstoredConnector(RemoteConnector):
    """LMCache's RemoteConnector over kvstored: exists/get/put, their batched and
    prefix-count forms, list and remove."""

    def __init__(self, context: ConnectorContext) -> None:
        backend = context.local_cpu_backend
        config = context.config or backend.config
        metadata = context.metadata or backend.metadata
        super().__init__(config, metadata)
        self.local_cpu_backend = backend
        self.chunk_size = config.chunk_size
        self.settings = settings_for(context)
        #: LMCache's event loop: every store call runs on it.
        self.loop = context.loop
        self._format = "meta" if self.save_chunk_meta else "raw"
        self._namespaces: dict[tuple[str, int, int, str], Namespace] = {}
        self._registered: set[str] = set()
        # Connect now: a wrong master fails LMCache's start-up, with the address.
        self.io = AsyncObjectIO(self._wait(self.settings.connect_asyncio()))
        log.info("kvstored LMCache connector connected to %s (%s chunks of %d tokens)",
                 self.settings.master, self._format, self.chunk_size)

    def _wait(self, step: Coroutine[Any, Any, T]) -> T:
        """Run ``step`` on LMCache's loop from a thread that is not the loop's (LMCache's
        synchronous calls, and start-up), and wait for it; on a loop not running yet,
        run it there now."""
        if not self.loop.is_running():
            return self.loop.run_until_complete(step)
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            step.close()
            raise RuntimeError("a synchronous kvstored call on LMCache's event loop would "
                               "block it; use the connector's coroutine instead")
        return asyncio.run_coroutine_threadsafe(step, self.loop).result()

    # -- keys ----------------------------------------------------------------------------

    def namespace(self, key: CacheEngineKey) -> Namespace:
        """The namespace of ``key``: from the key's own model, dtype and worker, so a key
        LMCache rewrote (MLA's worker 0) lands where the writer put it."""
        ident = (key.model_name, key.world_size, key.worker_id, dtype_name(key.dtype))
        ns = self._namespaces.get(ident)
        if ns is None:
            ns = self._namespaces[ident] = Namespace.of(ENGINE, [
                key.model_name, dtype_name(key.dtype), f"w{key.worker_id}of{key.world_size}",
                f"chunk{self.chunk_size}", self._format])
        return ns

    def store_key(self, key: CacheEngineKey) -> str:
        return self.namespace(key).key(key.to_string())

    async def _store_keys(self, keys: Sequence[CacheEngineKey]) -> list[str]:
        """The store keys of ``keys``, their namespaces registered with the master the
        first time this connector meets them."""
        for key in keys:
            prefix = self.namespace(key).prefix
            if prefix not in self._registered:
                self._registered.add(prefix)
                await self.io.register_namespace(prefix)
        return [self.store_key(k) for k in keys]

    # -- objects -------------------------------------------------------------------------

    def _pieces_of(self, memory_obj: MemoryObj) -> list[memoryview]:
        data = byte_view(memory_obj.byte_array, writable=False)
        if not self.save_chunk_meta:
            return [data]
        header = RemoteMetadata(data.nbytes, memory_obj.get_shapes(), memory_obj.get_dtypes(),
                                memory_obj.get_memory_format()).serialize()
        return [memoryview(header), data]

    async def _put_many(self, keys: Sequence[CacheEngineKey], objs: Sequence[MemoryObj]
                        ) -> None:
        stored = await self.io.put(await self._store_keys(keys),
                                   [self._pieces_of(obj) for obj in objs])
        if not all(stored):
            log.warning("kvstored LMCache: %d of %d chunk(s) not stored", stored.count(False),
                        len(stored))

    async def _get_many(self, keys: Sequence[CacheEngineKey]) -> list[MemoryObj | None]:
        objs: list[MemoryObj | None] = []
        for _ in keys:
            obj = self.local_cpu_backend.allocate(self.meta_shapes, self.meta_dtypes,
                                                  self.meta_fmt)
            if obj is None:
                log.debug("kvstored LMCache: no local CPU memory for a chunk")
            objs.append(obj)
        wanted = [i for i, obj in enumerate(objs) if obj is not None]
        headers = {i: bytearray(self.remote_metadata_bytes) for i in wanted} \
            if self.save_chunk_meta else {}
        pieces = [([memoryview(headers[i])] if i in headers else [])
                  + [byte_view(objs[i].byte_array)] for i in wanted]
        lengths = await self.io.get_upto(await self._store_keys([keys[i] for i in wanted]),
                                         pieces)
        for i, length in zip(wanted, lengths):
            objs[i] = self._finish(keys[i], objs[i], length, headers.get(i))
        return objs

    def _finish(self, key: CacheEngineKey, obj: MemoryObj, length: int,
                header: bytearray | None) -> MemoryObj | None:
        """The chunk as LMCache expects it, or None (and its memory released) for a miss
        or an object that does not describe a chunk of this engine."""
        data_length = length - (len(header) if header is not None else 0)
        problem = None
        if length == MISSING:
            problem = ""
        elif data_length <= 0:
            problem = f"holds {length} bytes, no chunk"
        elif header is not None:
            meta = RemoteMetadata.deserialize(header)
            if meta.length != data_length or meta.fmt != self.meta_fmt:
                problem = (f"its header says {meta.length} bytes of {meta.fmt.name}, the "
                           f"object holds {data_length} and this engine uses "
                           f"{self.meta_fmt.name}")
        if problem is None:
            try:
                return self.reshape_partial_chunk(obj, data_length)
            except ValueError as exc:
                problem = str(exc)
        if problem:
            log.warning("kvstored LMCache: %s is not a chunk of this engine (%s); treated "
                        "as a miss", self.store_key(key), problem)
        obj.ref_count_down()
        return None

    # -- RemoteConnector -----------------------------------------------------------------

    async def exists(self, key: CacheEngineKey) -> bool:
        return (await self.io.present(await self._store_keys([key])))[0]

    def exists_sync(self, key: CacheEngineKey) -> bool:
        return self._wait(self.exists(key))

    async def get(self, key: CacheEngineKey) -> MemoryObj | None:
        return (await self._get_many([key]))[0]

    async def put(self, key: CacheEngineKey, memory_obj: MemoryObj) -> None:
        await self._put_many([key], [memory_obj])

    def support_batched_get(self) -> bool:
        return True

    async def batched_get(self, keys: list[CacheEngineKey]) -> list[MemoryObj | None]:
        return await self._get_many(keys)

    def support_batched_put(self) -> bool:
        return True

    async def batched_put(self, keys: list[CacheEngineKey],
                          memory_objs: list[MemoryObj]) -> None:
        await self._put_many(keys, memory_objs)

    def support_batched_contains(self) -> bool:
        return True

    def batched_contains(self, keys: list[CacheEngineKey], pin: bool = False) -> int:
        """How many leading chunks are present (one master round trip); with ``pin``,
        they are locked for ``lock_ttl`` seconds, until this connector reads them.
        Called from the engine's threads: run on LMCache's loop, waited for."""
        return self._wait(self.batched_async_contains("", keys, pin))

    def support_batched_async_contains(self) -> bool:
        return True

    async def batched_async_contains(self, lookup_id: str, keys: list[CacheEngineKey],
                                     pin: bool = False) -> int:
        return await self.io.leading_present(
            await self._store_keys(keys), lock_for=self.settings.lock_ttl if pin else 0.0)

    def support_batched_get_non_blocking(self) -> bool:
        return True

    async def batched_get_non_blocking(self, lookup_id: str,
                                       keys: list[CacheEngineKey]) -> list[MemoryObj]:
        """The leading chunks that arrived; those after the first miss are released."""
        objs = await self._get_many(keys)
        prefix: list[MemoryObj] = []
        broken = False
        for obj in objs:
            broken = broken or obj is None
            if not broken:
                prefix.append(obj)
            elif obj is not None:
                obj.ref_count_down()
        return prefix

    def remove_sync(self, key: CacheEngineKey) -> bool:
        return self._wait(self._remove(key))

    async def _remove(self, key: CacheEngineKey) -> bool:
        return (await self.io.remove([self.store_key(key)]))[0]

    def support_ping(self) -> bool:
        return True

    async def ping(self) -> int:
        """0 when the master answers a lookup, 1 otherwise."""
        try:
            await self.io.client.batch_exists([f"{ENGINE}/ping"])
        except StoreError as exc:
            log.warning("kvstored LMCache: ping of %s failed: %s", self.settings.master, exc)
            return 1
        return 0

    async def list(self) -> list[str]:
        """LMCache's key strings of every chunk stored under ``lmcache/``."""
        keys = await self.io.list_keys(Namespace.of(ENGINE, []).prefix)
        # A key is NAMESPACE/LMCACHE_KEY: the namespace has five parts after the engine,
        # and LMCache's key string holds no '/' but inside the model name.
        return [key.split("/", 6)[6] for key in keys if key.count("/") >= 6]

    async def close(self) -> None:
        await self.io.aclose()

    def __repr__(self) -> str:
        return f"<KvstoredConnector {self.settings.master}>"

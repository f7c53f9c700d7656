"""LMCache's own storage manager with kvstored configured as its remote storage plugin:
LMCache loads the plugin from extra_config, puts chunks through its RemoteBackend, and a
second storage manager (another engine instance) reads them back; every byte compared."""

from __future__ import annotations

import asyncio

import pytest

from tests.daemon.harness import kvstore_ok, wait_for
from tests.integrations.conftest import engine

torch, lm_utils, lm_config, lm_metadata, lm_events, lm_memory, lm_storage, lm_connector = engine(
    "lmcache", "torch", "lmcache.utils", "lmcache.v1.config", "lmcache.v1.metadata",
    "lmcache.v1.event_manager", "lmcache.v1.memory_management",
    "lmcache.v1.storage_backend.storage_manager", "lmcache.v1.storage_backend.connector")

import kvstored  # noqa: E402
import kvstored.asyncio  # noqa: E402
from kvstored.client.metrics import CallKind  # noqa: E402
from kvstored.integrations.lmcache import KvstoredConnector  # noqa: E402

CHUNK = 16
LAYERS, HEADS, DIM = 2, 2, 8
REMOTE = "RemoteBackend-kvstored"
MODEL = "org/test-model"


def engine_config(master: str, *, save_chunk_meta: bool = True):
    config = lm_config.LMCacheEngineConfig.from_defaults(
        chunk_size=CHUNK, local_cpu=True, max_local_cpu_size=0.05, remote_serde="naive",
        lmcache_instance_id="kvstored-test")
    config.remote_storage_plugins = ["kvstored"]
    config.extra_config = {
        "remote_storage_plugin.kvstored.module_path": "kvstored.integrations.lmcache",
        "remote_storage_plugin.kvstored.class_name": "KvstoredConnectorAdapter",
        "remote_storage_plugin.kvstored.master": master,
        "save_chunk_meta": save_chunk_meta,
    }
    return config


def engine_metadata(worker: int = 0, world: int = 1):
    return lm_metadata.LMCacheMetadata(
        model_name=MODEL, world_size=world, local_world_size=world, worker_id=worker,
        local_worker_id=worker, kv_dtype=torch.bfloat16,
        kv_shape=(LAYERS, 2, CHUNK, HEADS, DIM), role="worker")


@pytest.fixture
def managers():
    """Storage managers built as LMCache's engine builds them; closed after the test."""
    made = []

    def make(master: str, **kwargs):
        worker, world = kwargs.pop("worker", 0), kwargs.pop("world", 1)
        manager = lm_storage.StorageManager(
            config=engine_config(master, **kwargs), metadata=engine_metadata(worker, world),
            event_manager=lm_events.EventManager())
        made.append(manager)
        assert REMOTE in manager.storage_backends, manager.storage_backends
        return manager

    yield make
    for manager in made:
        manager.close()


def chunk_keys(rng, n: int, worker: int = 0, world: int = 1):
    return [lm_utils.CacheEngineKey(MODEL, world, worker, rng.getrandbits(63), torch.bfloat16)
            for _ in range(n)]


def chunks(manager, rng, n: int, tokens: int = CHUNK):
    """Memory objects from LMCache's allocator, filled with seeded random bytes."""
    shape = torch.Size((2, LAYERS, tokens, HEADS * DIM))
    objs = []
    for _ in range(n):
        obj = manager.allocate(shape, torch.bfloat16, lm_memory.MemoryFormat.KV_2LTD)
        gen = torch.Generator().manual_seed(rng.randrange(2**31))
        raw = obj.tensor.view(torch.uint8).reshape(-1)
        raw[:] = torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=gen)
        objs.append(obj)
    return objs


def data(obj) -> bytes:
    return bytes(obj.byte_array)


def kvstored_connector(manager) -> KvstoredConnector:
    """The plugin's connector inside LMCache's InstrumentedRemoteConnector wrapper."""
    connector = manager.storage_backends[REMOTE].connection._connector
    assert isinstance(connector, KvstoredConnector)
    return connector


def put_remote(manager, keys, objs) -> list[bytes]:
    """Put through the storage manager, and wait until the remote backend has them."""
    sent = [data(o) for o in objs]
    manager.batched_put(keys, objs)
    remote = manager.storage_backends[REMOTE]
    wait_for(lambda: remote.batched_contains(keys) == len(keys), what="chunks in kvstored")
    return sent


def test_chunks_round_trip_between_two_engine_instances(store, rng, managers):
    writer = managers(store.addr)
    keys = chunk_keys(rng, 4)
    sent = put_remote(writer, keys, chunks(writer, rng, 4))

    reader = managers(store.addr)  # another instance: nothing in its local CPU tier
    assert reader.contains(keys[0], search_range=["LocalCPUBackend"]) is None
    hits, mapping = reader.batched_contains(keys)
    assert hits == 4 and list(mapping) == [REMOTE]
    got = reader.batched_get(keys, location=REMOTE)
    assert [data(o) for o in got] == sent
    one = reader.get(keys[2], location=REMOTE)
    assert data(one) == sent[2]
    # On the asyncio client, inside LMCache's loop; its metrics count what LMCache read.
    client = kvstored_connector(reader).io.client
    assert isinstance(client, kvstored.asyncio.AsyncioClient)
    gets = client.metrics()[CallKind.GET]
    assert (gets.hits, gets.misses, gets.errors) == (5, 0, 0)


def test_prefix_count_stops_at_the_first_missing_chunk(store, rng, managers):
    manager = managers(store.addr)
    keys = chunk_keys(rng, 5)
    objs = chunks(manager, rng, 5)
    put_remote(manager, [keys[i] for i in (0, 1, 3, 4)], [objs[i] for i in (0, 1, 3, 4)])
    remote = manager.storage_backends[REMOTE]
    assert remote.batched_contains(keys) == 2
    connector = remote.connection
    ours = kvstored_connector(manager)
    stored = [ours.store_key(k) for k in keys]

    observer = kvstored.connect(store.addr)  # a blocking client of its own, to look

    def locked(key: str) -> bool:
        return observer.call("stat", key=key)["object"]["locked_seconds"] > 0

    assert not any(locked(stored[i]) for i in (0, 1, 3, 4))  # a lookup without pin
    loop = asyncio.new_event_loop()
    try:
        # LMCache's pin is kvstored's lookup-and-lock: the two leading chunks, not the
        # ones after the hole, are held until the retrieval reads them.
        assert loop.run_until_complete(
            connector.batched_async_contains("lookup", keys, pin=True)) == 2
        assert [locked(stored[i]) for i in (0, 1, 3, 4)] == [True, True, False, False]
        got = loop.run_until_complete(connector.batched_get_non_blocking("lookup", keys))
        assert len(got) == 2
        assert not any(locked(stored[i]) for i in (0, 1))
    finally:
        loop.close()
    namespace = ours.namespace(keys[0]).prefix
    assert observer.call("status")["namespaces"][namespace]["objects"] >= 4
    observer.close()


@pytest.mark.parametrize("save_chunk_meta", [True, False])
def test_a_short_last_chunk_comes_back_short(store, rng, managers, save_chunk_meta):
    writer = managers(store.addr, save_chunk_meta=save_chunk_meta)
    keys = chunk_keys(rng, 1)
    sent = put_remote(writer, keys, chunks(writer, rng, 1, tokens=5))
    reader = managers(store.addr, save_chunk_meta=save_chunk_meta)
    [got] = reader.batched_get(keys, location=REMOTE)
    assert data(got) == sent[0]
    assert got.get_shape()[2] == 5


def test_workers_keep_apart_and_keys_show_the_rank(store, rng, managers):
    worker0 = managers(store.addr, worker=0, world=2)
    worker1 = managers(store.addr, worker=1, world=2)
    keys0 = chunk_keys(rng, 2, worker=0, world=2)
    put_remote(worker0, keys0, chunks(worker0, rng, 2))
    # Worker 1 asks for the same chunks under its own rank: a different KV slice.
    keys1 = [lm_utils.CacheEngineKey(MODEL, 2, 1, k.chunk_hash, torch.bfloat16) for k in keys0]
    assert worker1.storage_backends[REMOTE].batched_contains(keys1) == 0
    connector = kvstored_connector(worker0)
    store_key = connector.store_key(keys0[0])
    assert store_key.startswith("lmcache/org%2Ftest-model/bfloat16/w0of2/chunk16/meta/")
    assert store_key.endswith(keys0[0].to_string())
    assert store_key in kvstore_ok("ls", "lmcache/org%2Ftest-model/bfloat16/w0of2/",
                                   master=store.addr)


def test_a_chunk_of_another_geometry_is_a_miss(store, rng, managers):
    manager = managers(store.addr)
    keys = chunk_keys(rng, 1)
    connector = kvstored_connector(manager)
    with kvstored.connect(store.addr) as c:
        c.put(connector.store_key(keys[0]), b"\0" * 100)
    assert manager.batched_get(keys, location=REMOTE) == [None]


def test_the_plugin_loads_through_lmcaches_connector_manager(store):
    """LMCache's own plugin launcher (the path test_remote_storage_plugin.py covers with a
    mock) finds the adapter by module path and builds a kvstored connector."""
    config = engine_config(store.addr)
    manager = lm_connector.ConnectorManager(
        url="plugin://kvstored", loop=asyncio.new_event_loop(), local_cpu_backend=None,
        config=config, metadata=engine_metadata())
    assert any(type(a).__name__ == "KvstoredConnectorAdapter" for a in manager.adapters)
    connector = manager.create_connector()
    assert isinstance(connector, KvstoredConnector)
    assert connector.exists_sync(lm_utils.CacheEngineKey(MODEL, 1, 0, 1, torch.bfloat16)) is False

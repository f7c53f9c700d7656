"""vLLM's own tiering manager with kvstored as its secondary tier: blocks written into
vLLM's CPU tier (its /dev/shm region) cascade to kvstored; a second engine instance with
an empty CPU tier finds them by lookup, promotes them back, and every byte matches."""

from __future__ import annotations

import itertools
import os
import types

import pytest

from tests.daemon.harness import kvstore_ok, wait_for
from tests.integrations.conftest import engine

np, kv_base, kv_config, tiering, tier_factory, region_mod = engine(
    "vllm", "numpy", "vllm.v1.kv_offload.base", "vllm.v1.kv_offload.config",
    "vllm.v1.kv_offload.tiering.manager", "vllm.v1.kv_offload.tiering.factory",
    "vllm.v1.kv_offload.cpu.shared_offload_region")

from kvstored.integrations.vllm import KvstoredTier  # noqa: E402

CHUNKS = 8
CHUNK_BYTES = 2 * 4096
_engines = itertools.count()


def offloading_spec(*, rank: int = 0, tp: int = 1, agnostic: bool = False):
    """The parts of an OffloadingSpec a secondary tier reads, with vLLM's real config."""
    config = kv_config.OffloadingConfig(
        groups=(kv_config.OffloadingGroupConfig(16, ("layer.0", "layer.1"), 0),),
        worker_kv_bytes_per_block=CHUNK_BYTES, enable_kv_cache_events=False,
        extra_config={}, engine_id="kvstored-test",
        model=kv_config.OffloadingModelConfig(name="org/test-model", dtype="bfloat16"),
        cache=kv_config.OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=1),
        parallel=kv_config.OffloadingParallelConfig(
            rank=rank, world_size=tp, tp_size=tp, pp_size=1, pcp_size=1, dcp_size=1,
            data_parallel_index=0, data_parallel_size=1, data_parallel_rank_local=None,
            is_parallelism_agnostic=agnostic))
    return types.SimpleNamespace(
        config=config, blocks_per_chunk=1,
        kv_events_config=kv_base.OffloadingKVEventsConfig(False, False))


@pytest.fixture
def instances(store):
    """Engine instances: vLLM's CPU primary tier (a /dev/shm region) plus the kvstored
    tier built by vLLM's SecondaryTierFactory from its module path."""
    made = []

    def make(**spec_args):
        engine_id = f"kvstored-test-{os.getpid()}-{next(_engines)}"
        region = region_mod.SharedOffloadRegion(engine_id=engine_id, num_chunks=CHUNKS,
                                                rank=None, kv_bytes_per_chunk=CHUNK_BYTES,
                                                cpu_page_size=CHUNK_BYTES)
        primary = tiering.CPUPrimaryTierOffloadingManager(num_chunks=CHUNKS,
                                                          mmap_region=region)
        tier = tier_factory.SecondaryTierFactory.create_secondary_tier(
            {"type": "KvstoredTier", "module_path": "kvstored.integrations.vllm",
             "master": store.addr},
            primary.get_kv_memoryview(), offloading_spec(**spec_args))
        assert isinstance(tier, KvstoredTier)
        manager = tiering.TieringOffloadingManager(primary, [tier], tier_poll_interval_s=0)
        made.append(manager)
        return manager, tier, np.frombuffer(primary.get_kv_memoryview(), dtype=np.uint8)

    yield make
    for manager in made:
        manager.shutdown()


def block_keys(rng, n: int):
    return [kv_base.make_offload_key(rng.randbytes(16), 0) for _ in range(n)]


def end_step(manager) -> None:
    manager.on_schedule_end(kv_base.ScheduleEndContext(new_req_ids=(), preempted_req_ids=()))


def offload(manager, tier, cpu, keys, rng) -> dict:
    """What the GPU side does: prepare_store, copy into the CPU slots, complete_store;
    then the cascade to kvstored runs to its end. Returns each key's bytes."""
    ctx = kv_base.ReqContext(req_id=f"store-{rng.random()}")
    manager.on_new_request(ctx)
    out = manager.prepare_store(keys, ctx)
    written = {}
    for key, chunk in zip(out.keys_to_store, out.store_spec.chunk_ids):
        data = rng.randbytes(CHUNK_BYTES)
        cpu.reshape(CHUNKS, CHUNK_BYTES)[int(chunk)] = np.frombuffer(data, dtype=np.uint8)
        written[key] = data
    manager.complete_store(keys, ctx)
    end_step(manager)
    tier.drain_jobs()
    end_step(manager)
    manager.on_request_finished(ctx)
    return written


def look_up(manager, tier, keys, ctx):
    """One engine step of lookups, then another once kvstored has answered."""
    first = [manager.lookup(k, ctx) for k in keys]
    end_step(manager)
    wait_for(lambda: not tier._lookups._pending_results.empty(), what="kvstored lookups")
    return first, [manager.lookup(k, ctx) for k in keys]


def test_blocks_cascade_to_kvstored_and_promote_into_another_instance(instances, rng):
    writer, writer_tier, writer_cpu = instances()
    keys = block_keys(rng, 3)
    written = offload(writer, writer_tier, writer_cpu, keys, rng)
    assert writer_tier.io.present([writer_tier.store_key(k) for k in keys]) == [True] * 3

    reader, tier, cpu = instances()
    ctx = kv_base.ReqContext(req_id="read")
    reader.on_new_request(ctx)
    first, second = look_up(reader, tier, keys, ctx)
    assert first == [kv_base.LookupResult.RETRY] * 3
    assert second == [kv_base.LookupResult.HIT_PENDING] * 3  # promotions started
    end_step(reader)  # submits the batched promotion
    tier.drain_jobs()
    wait_for(lambda: all(reader.lookup(k, ctx) is kv_base.LookupResult.HIT for k in keys),
             what="promoted blocks")
    spec = reader.prepare_load(keys, ctx)
    rows = cpu.reshape(CHUNKS, CHUNK_BYTES)
    for key, chunk in zip(keys, spec.chunk_ids):
        assert rows[int(chunk)].tobytes() == written[key]
    reader.complete_load(keys, ctx)
    reader.on_request_finished(ctx)


def test_a_block_kvstored_lacks_is_a_miss(instances, rng):
    manager, tier, _ = instances()
    ctx = kv_base.ReqContext(req_id="miss")
    manager.on_new_request(ctx)
    _, second = look_up(manager, tier, block_keys(rng, 2), ctx)
    assert second == [kv_base.LookupResult.MISS] * 2
    manager.on_request_finished(ctx)


def test_a_failed_promotion_keeps_what_loaded_and_misses_the_rest(instances, rng):
    writer, writer_tier, cpu = instances()
    keys = block_keys(rng, 2)
    offload(writer, writer_tier, cpu, keys, rng)
    # The second block vanishes between lookup and load (evicted, or removed).
    reader, tier, _ = instances()
    ctx = kv_base.ReqContext(req_id="evicted")
    reader.on_new_request(ctx)
    _, second = look_up(reader, tier, keys, ctx)
    assert second == [kv_base.LookupResult.HIT_PENDING] * 2
    tier.io.remove([tier.store_key(keys[1])])
    end_step(reader)
    tier.drain_jobs()
    wait_for(lambda: reader.lookup(keys[0], ctx) is kv_base.LookupResult.HIT,
             what="the block that loaded")
    assert reader.lookup(keys[1], ctx) is kv_base.LookupResult.MISS
    reader.on_request_finished(ctx)


def test_keys_carry_model_dtype_parallelism_and_rank(instances, store, rng):
    _, rank0, _ = instances(rank=0, tp=2)
    _, rank1, _ = instances(rank=1, tp=2)
    key = block_keys(rng, 1)[0]
    name0, name1 = rank0.store_key(key), rank1.store_key(key)
    assert name0.startswith("vllm/org%2Ftest-model/bfloat16/tp2-pp1-pcp1-dcp1/rank0/cfg")
    assert "/rank1/" in name1 and name0 != name1
    assert name0.endswith(f"/g0-{kv_base.get_offload_block_hash(key).hex()}")
    # Where vLLM declares blocks portable across parallelism, every rank shares one copy.
    _, shared0, _ = instances(rank=0, tp=2, agnostic=True)
    _, shared1, _ = instances(rank=1, tp=2, agnostic=True)
    assert shared0.store_key(key) == shared1.store_key(key)
    assert "/tp1-pp1-pcp1-dcp1/rank0/" in shared0.store_key(key)
    rank0.io.put([name0], [[memoryview(bytearray(CHUNK_BYTES))]])
    assert name0 in kvstore_ok("ls", rank0.namespace.prefix, master=store.addr)

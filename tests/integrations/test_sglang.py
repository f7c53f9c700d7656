"""SGLang's own HiCache code storing pages in kvstored: its host pools (MHA and MLA, both
layouts), its storage backend factory loading the backend by module path, and its page
hashes; every byte that comes back is compared with what went in."""

from __future__ import annotations

import pytest

from tests.integrations.conftest import engine

torch, hicache_storage, backend_factory, memory_pool, pool_host_mha, pool_host_mla, mem_utils = (
    engine("sglang", "torch", "sglang.srt.mem_cache.hicache_storage",
           "sglang.srt.mem_cache.storage.backend_factory", "sglang.srt.mem_cache.memory_pool",
           "sglang.srt.mem_cache.pool_host.mha", "sglang.srt.mem_cache.pool_host.mla",
           "sglang.srt.mem_cache.utils"))

from kvstored.client import connect  # noqa: E402
from kvstored.integrations.sglang import KvstoredStorage  # noqa: E402
from tests.daemon.harness import kvstore_ok  # noqa: E402

PAGE = 4
LAYERS = 3


def make_host_pool(kind: str, layout: str, allocator_type: str = "default"):
    """A device pool on the CPU and its host mirror, as SGLang's scheduler builds them
    (``allocator_type`` "shm": the host pool in memfds, SGLang's shm allocator)."""
    if kind == "mha":
        device = memory_pool.MHATokenToKVPool(512, PAGE, torch.bfloat16, 2, 8, LAYERS, "cpu",
                                              False, start_layer=0, end_layer=LAYERS)
        return pool_host_mha.MHATokenToKVPoolHost(
            device.get_device_pool_infos()[0].buffer_info, 2, 0, PAGE, layout,
            pin_memory=False, device_capacity_tokens=device.size,
            start_layer=device.start_layer, end_layer=device.end_layer,
            allocator_type=allocator_type)
    device = memory_pool.MLATokenToKVPool(512, PAGE, torch.bfloat16, 16, 4, LAYERS, "cpu",
                                          False, start_layer=0, end_layer=LAYERS)
    return pool_host_mla.MLATokenToKVPoolHost(
        device.get_device_pool_infos()[0].buffer_info, 2, 0, PAGE, layout, pin_memory=False,
        device_capacity_tokens=device.size, start_layer=device.start_layer,
        end_layer=device.end_layer, target_layer_num=LAYERS)


def storage_config(master: str, *, mla: bool, layout: str, tp_rank: int = 0, tp_size: int = 1,
                   interface_v1: int = 1, model: str = "org/test-model", **options):
    extra = {"backend_name": "kvstored", "module_path": "kvstored.integrations.sglang",
             "class_name": "KvstoredStorage", "interface_v1": interface_v1, "master": master,
             **options}
    return hicache_storage.HiCacheStorageConfig(
        tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0,
        attn_cp_size=1, is_mla_model=mla, enable_storage_metrics=False,
        is_page_first_layout=layout == "page_first", model_name=model, extra_config=extra)


def attach(master: str, pool, *, mla: bool, layout: str, **config):
    """The backend as SGLang's cache controller attaches it: the factory's ``dynamic``
    path, then the host pool registration."""
    cfg = storage_config(master, mla=mla, layout=layout, **config)
    backend = backend_factory.StorageBackendFactory.create_backend("dynamic", cfg, pool)
    backend.register_mem_pool_host(pool)
    return backend


def page_hashes(rng, pages: int) -> list[str]:
    """Page keys as SGLang's radix cache chains them, over random token ids."""
    tokens = [rng.randrange(32000) for _ in range(pages * PAGE)]
    keys, prior = [], None
    for i in range(pages):
        prior = mem_utils.get_hash_str(tokens[i * PAGE:(i + 1) * PAGE], prior)
        keys.append(prior)
    return keys


def fill_random(pool, indices, rng) -> None:
    """Random bytes into every buffer of the given pages (bf16 NaNs included)."""
    pointers, sizes = pool.get_page_buffer_meta(indices)
    for tensor in [pool.kv_buffer]:
        flat = tensor.reshape(-1).view(torch.uint8)
        base = tensor.data_ptr()
        for p, s in zip(pointers, sizes):
            if base <= p < base + flat.numel():
                seed = rng.randrange(2**31)
                gen = torch.Generator().manual_seed(seed)
                flat[p - base:p - base + s] = torch.randint(0, 256, (s,), dtype=torch.uint8,
                                                            generator=gen)


def page_bytes(pool, index: int) -> bytes:
    """One page's bytes as SGLang itself reads them out (its flat data page)."""
    return pool.get_data_page(index, flat=True).contiguous().view(torch.uint8).numpy().tobytes()


LAYOUTS = [("mha", "page_first"), ("mha", "layer_first"), ("mla", "page_first"),
           ("mla", "layer_first")]


@pytest.mark.parametrize(("kind", "layout"), LAYOUTS)
def test_zero_copy_pages_round_trip_through_the_factory(store, rng, kind, layout):
    pool = make_host_pool(kind, layout)
    backend = attach(store.addr, pool, mla=kind == "mla", layout=layout)
    assert isinstance(backend, KvstoredStorage)
    pages = 6
    src = pool.alloc(pages * PAGE)
    fill_random(pool, src, rng)
    keys = page_hashes(rng, pages)

    assert backend.batch_exists(keys) == 0
    assert backend.batch_set_v1(keys, src) == [True] * pages
    assert backend.batch_exists(keys) == pages
    # A second backup of the same pages is a success, not an error (write-once keys).
    assert backend.batch_set_v1(keys, src) == [True] * pages

    dst = pool.alloc(pages * PAGE)
    assert backend.batch_get_v1(keys, dst) == [True] * pages
    for i in range(pages):
        assert page_bytes(pool, int(dst[i * PAGE])) == page_bytes(pool, int(src[i * PAGE]))
    # The pages went from and into the pool's own buffers: the adapter copied nothing.
    assert backend.io.copies.gathered_bytes == backend.io.copies.scattered_bytes == 0
    backend.close()


@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
def test_a_pool_in_shared_memory_is_moved_by_the_node_itself(store, rng, layout):
    """SGLang's shm allocator puts the host pool in memfds; the backend registers them,
    and the node on this host reads and writes the pages there, no copy by SGLang's
    process (neither in the adapter nor in the client)."""
    pool = make_host_pool("mha", layout, allocator_type="shm")
    assert pool.allocator.fds, "SGLang's shm allocator made no memfd"
    backend = attach(store.addr, pool, mla=False, layout=layout)
    pages = 4
    src = pool.alloc(pages * PAGE)
    fill_random(pool, src, rng)
    keys = page_hashes(rng, pages)
    assert backend.batch_set_v1(keys, src) == [True] * pages
    dst = pool.alloc(pages * PAGE)
    assert backend.batch_get_v1(keys, dst) == [True] * pages
    for i in range(pages):
        assert page_bytes(pool, int(dst[i * PAGE])) == page_bytes(pool, int(src[i * PAGE]))
    memory = backend.io.client.memory
    assert memory.stats.moved_objects == 2 * pages and memory.stats.fallback_objects == 0
    assert backend.io.copies.gathered_bytes == backend.io.copies.scattered_bytes == 0
    backend.close()


def test_an_operator_can_keep_a_shared_memory_pool_unregistered(store, rng):
    """``"register_memory": 0`` in the extra config: the pool stays in SGLang's memfds,
    but this process copies the pages (the node is never handed the files)."""
    pool = make_host_pool("mha", "page_first", allocator_type="shm")
    backend = attach(store.addr, pool, mla=False, layout="page_first", register_memory=0)
    src = pool.alloc(2 * PAGE)
    fill_random(pool, src, rng)
    keys = page_hashes(rng, 2)
    assert backend.batch_set_v1(keys, src) == [True, True]
    dst = pool.alloc(2 * PAGE)
    assert backend.batch_get_v1(keys, dst) == [True, True]
    for i in range(2):
        assert page_bytes(pool, int(dst[i * PAGE])) == page_bytes(pool, int(src[i * PAGE]))
    memory = backend.io.client.memory
    assert not memory.buffers and memory.stats.moved_objects == 0
    backend.close()
    with pytest.raises(ValueError, match="register_memory must be true or false"):
        attach(store.addr, pool, mla=False, layout="page_first", register_memory="maybe")


def test_batch_exists_counts_only_the_leading_pages(store, rng):
    pool = make_host_pool("mha", "page_first")
    backend = attach(store.addr, pool, mla=False, layout="page_first")
    keys = page_hashes(rng, 5)
    src = pool.alloc(5 * PAGE)
    fill_random(pool, src, rng)
    held = [0, 1, 3, 4]
    indices = torch.cat([src[i * PAGE:(i + 1) * PAGE] for i in held])
    assert backend.batch_set_v1([keys[i] for i in held], indices) == [True] * 4
    assert backend.batch_exists(keys) == 2
    assert backend.batch_exists(keys[3:]) == 2
    # A prefetch of the first three reads two pages and stops at the hole.
    dst = pool.alloc(3 * PAGE)
    assert backend.batch_get_v1(keys[:3], dst) == [True, True, False]
    backend.close()


def _locked(client, key: str) -> float:
    return client.call("stat", key=key)["object"]["locked_seconds"]


def test_batch_exists_locks_the_pages_it_counts_until_the_prefetch_reads_them(store, rng):
    """The gap between SGLang's batch_exists and its prefetch's batch_get: the pages
    counted are locked against eviction, those after the first hole are not, and the
    read ends the locks. Namespaces are registered, so status counts the pages."""
    pool = make_host_pool("mha", "page_first")
    backend = attach(store.addr, pool, mla=False, layout="page_first",
                     model="org/lock-model")
    keys = page_hashes(rng, 4)
    src = pool.alloc(4 * PAGE)
    fill_random(pool, src, rng)
    held = [0, 1, 3]
    indices = torch.cat([src[i * PAGE:(i + 1) * PAGE] for i in held])
    assert backend.batch_set_v1([keys[i] for i in held], indices) == [True] * 3
    stored = backend.namespace.keys(keys)
    with connect(store.addr) as c:
        assert backend.batch_exists(keys) == 2
        ttl = backend.settings.lock_ttl
        assert [_locked(c, k) > 0 for k in (stored[0], stored[1], stored[3])] == \
            [True, True, False]
        assert _locked(c, stored[0]) <= ttl
        dst = pool.alloc(2 * PAGE)
        assert backend.batch_get_v1(keys[:2], dst) == [True, True]
        assert [_locked(c, k) for k in stored[:2]] == [0.0, 0.0]
        status = c.call("status")["namespaces"]
        assert status[backend.namespace.prefix]["objects"] == 3
        backend.clear()
        assert c.call("status")["namespaces"][backend.namespace.prefix]["objects"] == 0
    backend.close()


def test_tensor_parallel_ranks_never_share_mha_pages_but_share_mla(store, rng):
    keys = page_hashes(rng, 2)
    for kind, shared in (("mha", False), ("mla", True)):
        pools = [make_host_pool(kind, "page_first") for _ in range(2)]
        ranks = [attach(store.addr, pools[r], mla=kind == "mla", layout="page_first",
                        tp_rank=r, tp_size=2) for r in range(2)]
        src = pools[0].alloc(2 * PAGE)
        fill_random(pools[0], src, rng)
        assert ranks[0].batch_set_v1(keys, src) == [True, True]
        assert ranks[1].batch_exists(keys) == (2 if shared else 0)
        if shared:
            dst = pools[1].alloc(2 * PAGE)
            assert ranks[1].batch_get_v1(keys, dst) == [True, True]
            assert page_bytes(pools[1], int(dst[0])) == page_bytes(pools[0], int(src[0]))
        for backend in ranks:
            backend.close()


def test_keys_name_model_dtype_layout_and_rank(store, rng):
    pool = make_host_pool("mha", "layer_first")
    backend = attach(store.addr, pool, mla=False, layout="layer_first", tp_rank=1, tp_size=2)
    keys = page_hashes(rng, 1)
    src = pool.alloc(PAGE)
    fill_random(pool, src, rng)
    assert backend.batch_set_v1(keys, src) == [True]
    prefix = "sglang/org%2Ftest-model/bfloat16/mha-layer_first/page4/tp1of2/pages/"
    assert backend.namespace.prefix == prefix
    listed = kvstore_ok("ls", prefix, master=store.addr)
    assert prefix + keys[0] in listed
    # The same page hash under another layout is another object: its bytes are laid out
    # differently, so a page_first pool must not see it.
    other = attach(store.addr, make_host_pool("mha", "page_first"), mla=False,
                   layout="page_first", tp_rank=1, tp_size=2)
    assert other.batch_exists(keys) == 0
    backend.close()
    other.close()


def test_an_object_of_the_wrong_size_is_a_miss(store, rng):
    pool = make_host_pool("mha", "page_first")
    backend = attach(store.addr, pool, mla=False, layout="page_first")
    keys = page_hashes(rng, 3)
    src = pool.alloc(PAGE)
    fill_random(pool, src, rng)
    assert backend.batch_set_v1(keys[:1], src) == [True]
    with connect(store.addr) as client:
        # Too short and too long for a page of this pool.
        client.batch_put(backend.namespace.keys(keys[1:]), [b"x" * 100, b"y" * 10**6])
    dst = pool.alloc(3 * PAGE)
    fill_random(pool, dst, rng)
    untouched = page_bytes(pool, int(dst[2 * PAGE]))
    assert backend.batch_get_v1(keys, dst) == [True, False, False]
    assert page_bytes(pool, int(dst[0])) == page_bytes(pool, int(src[0]))
    # The oversized object is refused before any of its bytes land.
    assert page_bytes(pool, int(dst[2 * PAGE])) == untouched
    backend.close()


def test_legacy_calls_move_sglangs_flat_pages(store, rng):
    """Without interface_v1 the controller moves get_data_page() tensors and writes them
    back with set_from_flat_data_page(); both halves are SGLang's."""
    pool = make_host_pool("mha", "layer_first")
    backend = attach(store.addr, pool, mla=False, layout="layer_first", interface_v1=0)
    keys = page_hashes(rng, 3)
    src = pool.alloc(3 * PAGE)
    fill_random(pool, src, rng)
    values = [pool.get_data_page(int(src[i * PAGE]), flat=True) for i in range(3)]
    assert backend.batch_set(keys, values)
    assert backend.batch_exists(keys) == 3 and backend.exists(keys[2])
    targets = [pool.get_dummy_flat_data_page() for _ in keys]
    got = backend.batch_get(keys, targets)
    assert all(t is not None for t in got)
    dst = pool.alloc(3 * PAGE)
    for i, page in enumerate(got):
        pool.set_from_flat_data_page(int(dst[i * PAGE]), page)
        assert page_bytes(pool, int(dst[i * PAGE])) == page_bytes(pool, int(src[i * PAGE]))
    assert backend.io.copies.gathered_bytes == 0  # SGLang's flat pages are contiguous
    # A strided value is the one copy this adapter makes itself, and it is counted.
    strided = torch.arange(64, dtype=torch.uint8).reshape(8, 8).t()
    assert backend.batch_set([keys[0] + "-strided"], [strided])
    assert backend.io.copies.gathered_bytes == 64
    # The flat format and the v1 page format never alias.
    v1 = attach(store.addr, pool, mla=False, layout="layer_first")
    assert v1.batch_exists(keys) == 0
    assert backend.get("absent-page", pool.get_dummy_flat_data_page()) is None
    backend.clear()
    assert backend.batch_exists(keys) == 0
    backend.close()
    v1.close()


@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
def test_the_stored_object_is_the_page_buffers_in_meta_order(store, rng, layout):
    """The documented format, pinned against the pool's own tensors: K then V of the
    page (page_first), or K and V of each layer in turn (layer_first)."""
    pool = make_host_pool("mha", layout)
    backend = attach(store.addr, pool, mla=False, layout=layout)
    keys = page_hashes(rng, 1)
    src = pool.alloc(PAGE)
    fill_random(pool, src, rng)
    assert backend.batch_set_v1(keys, src) == [True]
    first = int(src[0])
    kv = pool.kv_buffer
    if layout == "page_first":
        parts = [kv[0, first:first + PAGE], kv[1, first:first + PAGE]]
    else:
        parts = [kv[kv_index, layer, first:first + PAGE] for layer in range(LAYERS)
                 for kv_index in (0, 1)]
    expected = b"".join(p.contiguous().view(torch.uint8).numpy().tobytes() for p in parts)
    with connect(store.addr) as client:
        assert client.get(backend.namespace.key(keys[0])) == expected
    backend.close()


@pytest.fixture
def controller(store):
    """SGLang's own HiCacheController attaching the backend the way the scheduler does
    (a one-rank gloo group for its rank reductions, SGLang's test override of the
    parallel widths), with its prefetch and backup threads running."""
    import contextlib
    import socket
    import threading

    dist = torch.distributed
    allocator_mod, cc = engine("sglang", "sglang.srt.mem_cache.allocator.paged",
                               "sglang.srt.managers.cache_controller")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                            world_size=1)
    with contextlib.ExitStack() as stack:
        stack.enter_context(cc.get_parallel().override(
            attn_dcp_size=1, attn_dcp_rank=0, tp_rank=0, tp_size=1, pp_rank=0, pp_size=1))
        device = memory_pool.MHATokenToKVPool(1024, PAGE, torch.bfloat16, 2, 8, LAYERS, "cpu",
                                              False, start_layer=0, end_layer=LAYERS)
        host = pool_host_mha.MHATokenToKVPoolHost(
            device.get_device_pool_infos()[0].buffer_info, 2, 0, PAGE, "page_first",
            pin_memory=False, device_capacity_tokens=device.size, start_layer=0,
            end_layer=LAYERS)
        allocator = allocator_mod.PagedTokenToKVPoolAllocator(1024, PAGE, torch.bfloat16,
                                                              "cpu", device, False)
        ctrl = cc.HiCacheController(
            allocator, host, PAGE, dist.group.WORLD, threading.Event(),
            storage_backend="dynamic", model_name="org/test-model",
            storage_backend_extra_config={
                "backend_name": "kvstored", "module_path": "kvstored.integrations.sglang",
                "class_name": "KvstoredStorage", "interface_v1": 1, "master": store.addr})
        try:
            yield ctrl, host
        finally:
            ctrl.detach_storage_backend()
            dist.destroy_process_group()


def test_the_cache_controller_backs_up_and_prefetches_through_kvstored(controller, rng):
    """Backup and prefetch run on the controller's own threads, in its batches of
    STORAGE_BATCH_SIZE pages, with its page hashes and its rank reductions; the test
    plays only the radix cache's part (allocate host pages for the hit)."""
    ctrl, host = controller
    assert isinstance(ctrl.storage_backend, KvstoredStorage)
    assert ctrl.page_get_func == ctrl._page_get_zero_copy
    pages = hicache_storage.STORAGE_BATCH_SIZE + 2
    tokens = [rng.randrange(32000) for _ in range(pages * PAGE)]
    hashes = mem_utils.get_storage_hash_str(tokens, None, page_size=PAGE)
    src = host.alloc(pages * PAGE)
    fill_random(host, src, rng)

    ctrl.write_storage(src, tokens, hash_value=hashes)
    backed_up = ctrl.ack_backup_queue.get(timeout=60)
    assert backed_up.completed_tokens == pages * PAGE

    operation = ctrl.prefetch("request-1", tokens)
    hit = ctrl.prefetch_hit_queue.get(timeout=60)
    assert hit is operation and operation.storage_hit_count == pages * PAGE
    operation.host_indices = host.alloc(operation.storage_hit_count)
    ctrl.prefetch_buffer.put(operation)
    progress = []
    while True:  # the acks the radix cache reads: progress per batch, then completion
        ack = ctrl.ack_prefetch_queue.get(timeout=60)
        if ack.completed_req:
            break
        if ack.completed_tokens is not None:
            progress.append(ack.completed_tokens)
    assert progress == [hicache_storage.STORAGE_BATCH_SIZE * PAGE, pages * PAGE]
    for i in range(pages):
        got = int(operation.host_indices[i * PAGE])
        assert page_bytes(host, got) == page_bytes(host, int(src[i * PAGE]))


# -- hybrid models: side pools through the v2 calls ---------------------------------------

def make_mamba_pool(slots: int = 16):
    """SGLang's Mamba state host pool (page_first, the layout its zero-copy path takes)
    over CPU state tensors: a temporal state and one conv state per layer."""
    device_info, pool_host_mamba = engine("sglang", "sglang.srt.mem_cache.device_pool_info",
                                          "sglang.srt.mem_cache.pool_host.mamba")
    info = device_info.MambaStateBufferInfo(
        temporal=torch.zeros(LAYERS, slots, 4, 8, dtype=torch.float32),
        conv=(torch.zeros(LAYERS, slots, 3, 16, dtype=torch.bfloat16),))
    return pool_host_mamba.MambaPoolHost(info, 2.0, 0, device_capacity=slots,
                                         pin_memory=False, layout="page_first")


def fill_pool(pool, rng) -> None:
    """Random bytes into every tensor a hybrid pool exposes for storage."""
    for tensor in pool.get_hybrid_pool_buffer():
        flat = tensor.reshape(-1).view(torch.uint8)
        gen = torch.Generator().manual_seed(rng.randrange(2**31))
        flat[:] = torch.randint(0, 256, (flat.numel(),), dtype=torch.uint8, generator=gen)


def state_bytes(pool, slot: int) -> bytes:
    return pool.get_data_page(slot, flat=True).contiguous().view(torch.uint8).numpy().tobytes()


def transfer(name, keys, indices, policy=None):
    names = hicache_storage
    return names.PoolTransfer(name=name, host_indices=indices, keys=keys,
                              hit_policy=policy or names.PoolHitPolicy.ALL_PAGES)


def test_mamba_states_ride_beside_the_kv_pages_and_gate_the_prefix(store, rng):
    """A hybrid model's Mamba pool, registered as SGLang's hybrid controller registers it:
    its per-page states are stored zero-copy through batch_set_v2 and come back byte for
    byte through batch_get_v2; batch_exists_v2 restores only the prefixes whose trailing
    state is stored, with the holes SGLang's contract allows."""
    names = hicache_storage
    kv_pool, mamba = make_host_pool("mha", "page_first"), make_mamba_pool()
    backend = attach(store.addr, kv_pool, mla=False, layout="page_first",
                     model="org/hybrid-model")
    backend.register_mem_host_pool_v2(kv_pool, names.PoolName.KV)
    backend.register_mem_host_pool_v2(mamba, names.PoolName.MAMBA)
    pages = 4
    keys = page_hashes(rng, pages)
    src = kv_pool.alloc(pages * PAGE)
    fill_random(kv_pool, src, rng)
    fill_pool(mamba, rng)
    states = mamba.alloc(pages)
    assert backend.batch_set_v1(keys, src) == [True] * pages
    # States exist at the ends of prefixes 2 and 4 only (the radix cache stores the
    # state of the pages where a request ended).
    stored = backend.batch_set_v2([transfer(names.PoolName.MAMBA, [keys[1], keys[3]],
                                            states[[1, 3]])])
    assert stored == {"mamba": [True, True]}

    trailing = names.PoolHitPolicy.TRAILING_PAGES
    found = backend.batch_exists_v2(keys, [transfer(names.PoolName.MAMBA, keys[-1:], None,
                                                    trailing)])
    assert found.kv_hit_pages == 4
    assert found.restorable_prefix_pages == [2, 4]
    assert found.extra_pool_hit_pages == {"kv": 4, "mamba": 4}
    # One page whose state is missing cuts the prefix to the stop before it.
    assert backend.batch_exists_v2(keys[:3], [transfer(names.PoolName.MAMBA, keys[2:3], None,
                                                       trailing)]).kv_hit_pages == 2

    slots = mamba.alloc(2)
    got = backend.batch_get_v2([transfer(names.PoolName.MAMBA, [keys[3], keys[2]], slots)])
    assert got == {"mamba": [True, False]}
    assert state_bytes(mamba, int(slots[0])) == state_bytes(mamba, int(states[3]))
    with connect(store.addr) as client:
        listed = client.call("list", prefix=backend._side_pools["mamba"].namespace.prefix,
                             after=None, limit=10)["keys"]
    assert [k.rsplit("/", 1)[1] for k in listed] == sorted([keys[1], keys[3]])
    assert "/tp0of1/pages/pool-mamba/" in listed[0]
    backend.close()


def test_an_all_pages_side_pool_cuts_the_prefix_at_its_first_hole(store, rng):
    """A side pool every page needs (as a DSA indexer or draft pool is): its hole ends the
    prefix; its pages move in the same batch as the KV pages, each pool in its own
    namespace, and a pool SGLang never registered is a clean miss."""
    names = hicache_storage
    kv_pool, draft = make_host_pool("mha", "page_first"), make_host_pool("mha", "page_first")
    backend = attach(store.addr, kv_pool, mla=False, layout="page_first",
                     model="org/draft-model")
    backend.register_mem_host_pool_v2(draft, names.PoolName.DRAFT)
    keys = page_hashes(rng, 3)
    kv_src, draft_src = kv_pool.alloc(3 * PAGE), draft.alloc(3 * PAGE)
    fill_random(kv_pool, kv_src, rng)
    fill_random(draft, draft_src, rng)
    held = torch.cat([draft_src[:PAGE], draft_src[2 * PAGE:]])
    result = backend.batch_set_v2([transfer(names.PoolName.KV, keys, kv_src),
                                   transfer(names.PoolName.DRAFT, [keys[0], keys[2]], held)])
    assert result == {"kv": [True] * 3, "draft": [True, True]}
    found = backend.batch_exists_v2(keys, [transfer(names.PoolName.DRAFT, keys, None)])
    assert (found.kv_hit_pages, found.extra_pool_hit_pages) == (1, {"kv": 3, "draft": 1})

    dst = draft.alloc(PAGE)
    assert backend.batch_get_v2([transfer(names.PoolName.DRAFT, keys[:1], dst)]) == \
        {"draft": [True]}
    assert page_bytes(draft, int(dst[0])) == page_bytes(draft, int(draft_src[0]))
    # Never registered, and indices that do not cover the pages: misses, not errors.
    assert backend.batch_get_v2([transfer(names.PoolName.SWA, keys[:1], dst)]) == \
        {"swa": [False]}
    assert backend.batch_get_v2([transfer(names.PoolName.DRAFT, keys[:2], dst)]) == \
        {"draft": [False, False]}
    backend.close()


def test_mamba_states_of_an_mla_model_stay_per_rank(store, rng):
    """An MLA model's KV pages are shared by the TP ranks, but its Mamba states are each
    rank's own: their keys carry the rank."""
    names = hicache_storage
    backend = attach(store.addr, make_host_pool("mla", "page_first"), mla=True,
                     layout="page_first", tp_rank=1, tp_size=2, model="org/mla-hybrid")
    backend.register_mem_host_pool_v2(make_mamba_pool(), names.PoolName.MAMBA)
    assert "/tp-shared/pages/" in backend.namespace.prefix
    assert backend._side_pools["mamba"].namespace.prefix.endswith("/tp1of2/pages/pool-mamba/")
    backend.close()

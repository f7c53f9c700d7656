"""kvstored as SGLang's HiCache L3 storage: a ``HiCacheStorage`` that SGLang loads itself.

::

    python -m sglang.launch_server ... --enable-hierarchical-cache \\
        --hicache-storage-backend dynamic \\
        --hicache-storage-backend-extra-config '{"backend_name": "kvstored",
            "module_path": "kvstored.integrations.sglang", "class_name": "KvstoredStorage",
            "interface_v1": 1, "master": "127.0.0.1:7700", "allocator": "shm"}'

One kvstored object per page and rank. With ``interface_v1`` (the zero-copy path) SGLang's
cache controller calls :meth:`KvstoredStorage.batch_set_v1` / ``batch_get_v1`` with host
pool indices; the object is the page's buffers as ``get_page_buffer_meta()`` lists them,
concatenated: K then V for an MHA page in ``page_first`` (two pieces), K and V of each layer
in turn in ``layer_first`` (two per layer), the latent rows for MLA (one piece in
``page_first``, one per layer in ``layer_first``). Without it, the legacy ``get``/``set``
calls move SGLang's flat data page, a different byte order, so the two live in different
namespaces (``pages`` and ``flat``).

Keys: ``sglang/MODEL/DTYPE/KIND-LAYOUT/pagePAGE/SHARD/FORMAT/HASH``, where SHARD is
``tpRofS`` for MHA (each rank holds its heads) and ``tp-shared`` for MLA (every rank holds
the same latent cache, so one object serves all, and SGLang lets only the first rank
write), followed by ``-ppRofS``, ``-cpRofS`` and ``-dcpRofS`` when those are in use.

Hybrid models' side pools (Mamba states, SWA windows, the DSA indexer, draft pools) come
through the v2 calls: SGLang registers each host pool by name
(``register_mem_host_pool_v2``) and moves it with ``batch_set_v2``/``batch_get_v2``, one
object per page and pool under ``.../pages/pool-NAME/HASH``, zero-copy like the KV pages;
``batch_exists_v2`` folds the pools' hit policies (every page, or the trailing window) into
the prefix every pool can restore, as SGLang's own file backend does. A side pool is
shared by the TP ranks only where SGLang shares it (an MLA model's latent-like pools), so
per-rank state (Mamba, MHA-shaped pools) carries the rank.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorage,
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
    PoolHitPolicy,
    PoolName,
    PoolTransfer,
    PoolTransferResult,
)

from kvstored.integrations.namespace import Namespace, dtype_name
from kvstored.integrations.objects import ObjectIO, StoreSettings, byte_view

log = logging.getLogger(__name__)

ENGINE = "sglang"
#: The namespace part of objects laid out as get_page_buffer_meta() lists a page.
PAGES_FORMAT = "pages"
#: The namespace part of objects holding SGLang's flat data page (the legacy calls).
FLAT_FORMAT = "flat"


def shard_part(config: HiCacheStorageConfig, *, rank_shared: bool | None = None) -> str:
    """Which slice of a page this rank holds, as one namespace part. ``rank_shared``
    (default: the model is MLA) says whether every TP rank holds the same bytes."""
    if rank_shared is None:
        rank_shared = config.is_mla_model
    shard = "tp-shared" if rank_shared else f"tp{config.tp_rank}of{config.tp_size}"
    if config.pp_size > 1:
        shard += f"-pp{config.pp_rank}of{config.pp_size}"
    if config.attn_cp_size > 1:
        shard += f"-cp{config.attn_cp_rank}of{config.attn_cp_size}"
    if config.dcp_size > 1:
        shard += f"-dcp{config.dcp_rank}of{config.dcp_size}"
    return shard


class _PoolBuffers:
    """Byte views of a host pool's tensors, to turn get_page_buffer_meta() pointers into
    bounds-checked views (a pointer outside every tensor is refused, never followed)."""

    #: Where SGLang's host pools keep page bytes (MLA's split layouts use the last three).
    ATTRIBUTES = ("kv_buffer", "k_buffer", "v_buffer", "index_k_buffer",
                  "index_k_scale_buffer")

    def __init__(self, pool: Any) -> None:
        get = getattr(pool, "get_hybrid_pool_buffer", None)
        tensors = list(get()) if get else []
        tensors += [getattr(pool, name, None) for name in self.ATTRIBUTES]
        self._spans: list[tuple[int, int, memoryview]] = []
        seen: set[int] = set()
        for tensor in tensors:
            if not isinstance(tensor, torch.Tensor) or tensor.data_ptr() in seen:
                continue
            seen.add(tensor.data_ptr())
            if tensor.device.type != "cpu" or not tensor.is_contiguous():
                raise ValueError(f"host pool buffer {tuple(tensor.shape)} is not a "
                                 "contiguous CPU tensor")
            flat = tensor.reshape(-1).view(torch.uint8)
            self._spans.append((tensor.data_ptr(), flat.numel(), byte_view(flat.numpy())))

    def view(self, address: int, size: int) -> memoryview:
        for base, nbytes, view in self._spans:
            if base <= address and address + size <= base + nbytes:
                return view[address - base:address - base + size]
        raise ValueError(f"page buffer at {address:#x}+{size} lies outside the host pool")


@dataclass(frozen=True, slots=True)
class _SidePool:
    """A hybrid model's host pool other than the KV anchor, and where its pages go."""

    host_pool: Any
    buffers: _PoolBuffers
    namespace: Namespace

    @property
    def page_size(self) -> int:
        return int(getattr(self.host_pool, "page_size", 1) or 1)


class KvstoredStorage(HiCacheStorage):
    """HiCache L3 storage in kvstored. Built by SGLang's backend factory as
    ``KvstoredStorage(storage_config, kwargs)``; options come from
    ``--hicache-storage-backend-extra-config``: ``master``, ``transport``, ``timeout``,
    ``token_file``, ``lock_ttl``, ``register_memory`` (see
    :class:`~kvstored.integrations.objects.StoreSettings`)."""

    def __init__(self, storage_config: HiCacheStorageConfig,
                 kwargs: dict[str, Any] | None = None) -> None:
        self.storage_config = storage_config
        extra = storage_config.extra_config or {}
        self.interface_v1 = bool(extra.get("interface_v1", 0))
        self.settings = StoreSettings.from_options(extra)
        # Connect now: a wrong master fails the engine's start-up, with the address.
        self.io = ObjectIO(self.settings.connect())
        self.mem_pool_host: Any = None
        self._buffers: _PoolBuffers | None = None
        self._pages: Namespace | None = None
        self._flat: Namespace | None = None
        self._side_pools: dict[str, _SidePool] = {}
        log.info("kvstored HiCache storage connected to %s (interface_v1=%s)",
                 self.settings.master, self.interface_v1)

    # -- set-up ------------------------------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        super().register_mem_pool_host(mem_pool_host)
        parts = self._namespace_parts(shard_part(self.storage_config))
        self._pages = Namespace.of(ENGINE, [*parts, PAGES_FORMAT])
        self._flat = Namespace.of(ENGINE, [*parts, FLAT_FORMAT])
        for ns in (self._pages, self._flat):
            self.io.register_namespace(ns.prefix)
        if getattr(mem_pool_host, "kv_buffer", None) is not None:
            self._buffers = _PoolBuffers(mem_pool_host)
        # SGLang's shm allocator ("allocator": "shm" in the extra config) puts the pool
        # in memfds: registered, the node on this host moves pages in and out of them
        # itself, with no copy by this process (unless the operator turned it off).
        allocator = getattr(mem_pool_host, "allocator", None)
        fds = getattr(allocator, "fds", ()) if self.settings.register_memory else ()
        for fd, mapping in zip(fds, getattr(allocator, "mms", ())):
            self.io.register_memory(mapping, fd)
        log.info("kvstored HiCache keys: %s", self.namespace.prefix)

    def _namespace_parts(self, shard: str) -> list[str]:
        """The namespace parts every object of this engine shares, with ``shard``."""
        config, pool = self.storage_config, self.mem_pool_host
        kind = "mla" if config.is_mla_model else "mha"
        return [config.model_name or "unnamed", dtype_name(pool.dtype),
                f"{kind}-{pool.layout}", f"page{pool.page_size}", shard]

    def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
        """A hybrid model's host pool, by name; the KV pool is the anchor registered by
        :meth:`register_mem_pool_host`, the others get a namespace of their own."""
        super().register_mem_host_pool_v2(host_pool, host_pool_name)
        name = str(host_pool_name)
        if name == str(PoolName.KV) or self.mem_pool_host is None:
            return
        # Latent-like pools of an MLA model are the same on every rank (SGLang lets only
        # the first rank write them); Mamba states and K/V-shaped pools are per rank.
        rank_shared = (self.storage_config.is_mla_model and name != str(PoolName.MAMBA)
                       and getattr(host_pool, "v_buffer", None) is None)
        parts = self._namespace_parts(shard_part(self.storage_config, rank_shared=rank_shared))
        namespace = Namespace.of(ENGINE, [*parts, PAGES_FORMAT, f"pool-{name}"])
        self.io.register_namespace(namespace.prefix)
        self._side_pools[name] = _SidePool(host_pool, _PoolBuffers(host_pool), namespace)
        log.info("kvstored HiCache %s pool keys: %s", name, namespace.prefix)

    @property
    def namespace(self) -> Namespace:
        """The namespace batch_exists answers for: the one the controller reads from."""
        ns = self._pages if self.interface_v1 else self._flat
        if ns is None:
            raise RuntimeError("kvstored HiCache storage: no host pool registered yet")
        return ns

    # -- the zero-copy path (interface_v1) ---------------------------------------------

    def _page_objects(self, keys: list[str], host_indices: torch.Tensor,
                      ) -> tuple[list[str], list[list[memoryview]]]:
        """The objects of the pages at ``host_indices``: their store keys and pieces."""
        if self._buffers is None or self._pages is None:
            raise RuntimeError("the host pool has no kv_buffer to read pages from")
        return _split_pages(self.mem_pool_host, self._buffers, host_indices,
                            self._pages.keys(keys))

    def batch_get_v1(self, keys: list[str], host_indices: torch.Tensor,
                     extra_info: HiCacheStorageExtraInfo | None = None) -> list[bool]:
        return self._move_pages(self.io.get, keys, host_indices)

    def batch_set_v1(self, keys: list[str], host_indices: torch.Tensor,
                     extra_info: HiCacheStorageExtraInfo | None = None) -> list[bool]:
        return self._move_pages(self.io.put, keys, host_indices)

    def _move_pages(self, move: Callable[[list[str], list[list[memoryview]]], list[bool]],
                    keys: list[str], host_indices: torch.Tensor) -> list[bool]:
        """``move`` (the object IO's get or put) the pages at ``host_indices``; pages whose
        buffers cannot be mapped all fail, logged, since SGLang only reads the flags."""
        if not keys:
            return []
        try:
            store_keys, pieces = self._page_objects(keys, host_indices)
        except (ValueError, RuntimeError) as exc:
            log.error("kvstored HiCache: cannot map %d page(s) from %s: %s", len(keys),
                      keys[0], exc)
            return [False] * len(keys)
        return move(store_keys, pieces)

    # -- lookups -------------------------------------------------------------------------

    def batch_exists(self, keys: list[str],
                     extra_info: HiCacheStorageExtraInfo | None = None) -> int:
        """How many leading pages are present: the prefix SGLang may prefetch. They are
        locked for ``lock_ttl`` seconds, so that the batch_get of the prefetch that
        follows finds them (it ends the locks); the rest of the batch is not locked."""
        return self.io.leading_present(self.namespace.keys(keys),
                                       lock_for=self.settings.lock_ttl)

    def exists(self, key: str) -> bool:
        return self.io.present([self.namespace.key(key)])[0]

    # -- hybrid models' side pools (the v2 calls) -----------------------------------------

    def batch_exists_v2(self, keys: list[str], pool_transfers: list[PoolTransfer] | None = None,
                        extra_info: HiCacheStorageExtraInfo | None = None,
                        ) -> PoolTransferResult:
        """The KV prefix present, cut to where every side pool can restore it: a pool of
        ``all_pages`` needs each page of the prefix, one of ``trailing_pages`` the window
        that ends there (so a prefix may be restorable where a shorter one is not). Found
        objects are locked for ``lock_ttl``, like :meth:`batch_exists`'s."""
        # A logical anchor (no kv_buffer) stores no KV pages: the side pools alone decide.
        kv_pages = len(keys) if self._buffers is None else self.batch_exists(keys, extra_info)
        hits: dict[str, int] = {str(PoolName.KV): kv_pages} if kv_pages else {}
        restorable = list(range(1, kv_pages + 1))
        transfers = [t for t in pool_transfers or [] if kv_pages]
        pools = [self._side_pool(t.name) for t in transfers]
        asked = [pool.namespace.keys(keys[:kv_pages]) if pool else [] for pool in pools]
        found = iter(self.io.present([k for ks in asked for k in ks],
                                     lock_for=self.settings.lock_ttl))
        for transfer, pool, pool_keys in zip(transfers, pools, asked):
            present = [next(found) for _ in pool_keys] if pool else [False] * kv_pages
            boundary, stops = _pool_verdict(transfer, present)
            if boundary:
                hits[str(transfer.name)] = boundary
            if stops is not None:
                restorable = [p for p in restorable if p in stops]
        return PoolTransferResult(restorable[-1] if restorable else 0, hits, restorable)

    def batch_get_v2(self, transfers: list[PoolTransfer],
                     extra_info: HiCacheStorageExtraInfo | None = None) -> dict[str, list[bool]]:
        return self._move_pools(self.io.get, transfers)

    def batch_set_v2(self, transfers: list[PoolTransfer],
                     extra_info: HiCacheStorageExtraInfo | None = None) -> dict[str, list[bool]]:
        return self._move_pools(self.io.put, transfers)

    def _side_pool(self, name: Any) -> _SidePool | None:
        pool = self._side_pools.get(str(name))
        if pool is None:
            log.error("kvstored HiCache: pool %s was never registered "
                      "(register_mem_host_pool_v2); its pages are misses", name)
        return pool

    def _move_pools(self, move: Callable[[list[str], list[list[memoryview]]], list[bool]],
                    transfers: list[PoolTransfer]) -> dict[str, list[bool]]:
        """``move`` every transfer's pages in one call of the object IO; per pool name, a
        flag per key. The KV pool's transfers go where the v1 calls put them."""
        results: dict[str, list[bool]] = {}
        keys: list[str] = []
        objects: list[list[memoryview]] = []
        spans: list[tuple[str, int, int]] = []
        for transfer in transfers:
            name, page_keys = str(transfer.name), list(transfer.keys or [])
            try:
                store_keys, pieces = self._transfer_objects(transfer, page_keys)
            except (ValueError, RuntimeError, NotImplementedError) as exc:
                log.error("kvstored HiCache: cannot map %d page(s) of pool %s: %s",
                          len(page_keys), name, exc)
                results[name] = [False] * len(page_keys)
                continue
            spans.append((name, len(keys), len(keys) + len(store_keys)))
            keys += store_keys
            objects += pieces
        moved = move(keys, objects) if keys else []
        for name, start, end in spans:
            results[name] = moved[start:end]
        return results

    def _transfer_objects(self, transfer: PoolTransfer, page_keys: list[str],
                          ) -> tuple[list[str], list[list[memoryview]]]:
        """The store keys and pieces of one transfer's pages."""
        if transfer.host_indices is None:
            raise ValueError("no host indices")
        if str(transfer.name) == str(PoolName.KV):
            return self._page_objects(page_keys, transfer.host_indices)
        pool = self._side_pools.get(str(transfer.name))
        if pool is None:
            raise ValueError("the pool was never registered (register_mem_host_pool_v2)")
        if not page_keys or transfer.host_indices.numel() != len(page_keys) * pool.page_size:
            raise ValueError(f"{transfer.host_indices.numel()} host indices for "
                             f"{len(page_keys)} page(s) of {pool.page_size} slot(s)")
        return _split_pages(pool.host_pool, pool.buffers, transfer.host_indices,
                            pool.namespace.keys(page_keys))

    # -- the legacy calls: SGLang's flat data page as one tensor --------------------------

    def get(self, key: str, target_location: Any = None,
            target_sizes: Any = None) -> torch.Tensor | None:
        return self.batch_get([key], [target_location])[0]

    def batch_get(self, keys: list[str], target_locations: Any = None,
                  target_sizes: Any = None) -> list[torch.Tensor | None]:
        if not keys:
            return []
        if target_locations is None or len(target_locations) != len(keys):
            log.error("kvstored HiCache: batch_get needs one target tensor per key")
            return [None] * len(keys)
        try:
            pieces = [[_tensor_bytes(t)] for t in target_locations]
        except ValueError as exc:
            log.error("kvstored HiCache: cannot read into the target tensors: %s", exc)
            return [None] * len(keys)
        found = self.io.get(self._flat.keys(keys), pieces)
        return [t if ok else None for t, ok in zip(target_locations, found)]

    def set(self, key: str, value: Any = None, target_location: Any = None,
            target_sizes: Any = None) -> bool:
        return self.batch_set([key], [value])

    def batch_set(self, keys: list[str], values: Any = None, target_locations: Any = None,
                  target_sizes: Any = None) -> bool:
        if not keys:
            return True
        if values is None or len(values) != len(keys):
            log.error("kvstored HiCache: batch_set needs one value tensor per key")
            return False
        # contiguous() copies only a strided value (counted: a copy this adapter makes);
        # it is read, never written.
        self.io.copies.add(gathered=sum(v.nbytes for v in values if not v.is_contiguous()))
        pieces = [[_tensor_bytes(v.contiguous())] for v in values]
        return all(self.io.put(self._flat.keys(keys), pieces))

    # -- lifecycle -----------------------------------------------------------------------

    def clear(self) -> None:
        """Drop this rank's objects (both formats), as SGLang's flush_cache asks."""
        for ns in (self._pages, self._flat):
            if ns is not None:
                removed = self.io.remove_prefix(ns.prefix)
                log.info("kvstored HiCache: cleared %d object(s) under %s", removed, ns.prefix)

    def close(self) -> None:
        self.io.close()


def _split_pages(pool: Any, buffers: _PoolBuffers, host_indices: torch.Tensor,
                 store_keys: list[str]) -> tuple[list[str], list[list[memoryview]]]:
    """Each page's pieces, as ``pool.get_page_buffer_meta()`` lists them, beside its key."""
    pointers, sizes = pool.get_page_buffer_meta(host_indices)
    if pointers and isinstance(pointers[0], (list, tuple)):
        pointers = [p for group in pointers for p in group]
        sizes = [s for group in sizes for s in group]
    if not store_keys or len(pointers) % len(store_keys):
        raise ValueError(f"{len(pointers)} page buffers for {len(store_keys)} pages")
    per_page = len(pointers) // len(store_keys)
    views = [buffers.view(int(p), int(s)) for p, s in zip(pointers, sizes)]
    return store_keys, [views[i * per_page:(i + 1) * per_page] for i in range(len(store_keys))]


def _pool_verdict(transfer: PoolTransfer, present: list[bool]) -> tuple[int, set[int] | None]:
    """For a side pool whose pages ``present`` says are there (over the KV prefix): the
    pages it reports as its hit, and the prefix lengths it can restore (None: it does
    not gate the prefix)."""
    pages = len(present)
    leading = present.index(False) if False in present else pages
    if transfer.hit_policy == PoolHitPolicy.TRAILING_PAGES:
        window = max(1, len(transfer.keys or ()))
        stops = {n for n in range(1, pages + 1) if all(present[max(0, n - window):n])}
        return max(stops, default=0), stops
    if transfer.hit_policy == PoolHitPolicy.BLOCK_GROUPS:
        group = max(1, transfer.group_pages)
        return leading - leading % group, None
    return leading, set(range(1, leading + 1))


def _tensor_bytes(tensor: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor, shared with it (no copy)."""
    if tensor.device.type != "cpu" or not tensor.is_contiguous():
        raise ValueError(f"tensor {tuple(tensor.shape)} is not a contiguous CPU tensor")
    return byte_view(tensor.reshape(-1).view(torch.uint8).numpy())

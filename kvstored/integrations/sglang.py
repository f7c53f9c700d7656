"""kvstored as SGLang's HiCache L3 storage: a ``HiCacheStorage`` that SGLang loads itself.

::

    python -m sglang.launch_server ... --enable-hierarchical-cache \\
        --hicache-storage-backend dynamic \\
        --hicache-storage-backend-extra-config '{"backend_name": "kvstored",
            "module_path": "kvstored.integrations.sglang", "class_name": "KvstoredStorage",
            "interface_v1": 1, "master": "127.0.0.1:7700"}'

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

Not served yet: the v2 calls for hybrid models' side pools (Mamba, SWA, DSA indexer),
which raise NotImplementedError as in SGLang's own base class.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorage,
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
)

from kvstored.integrations.namespace import Namespace, dtype_name
from kvstored.integrations.objects import ObjectIO, StoreSettings, byte_view

log = logging.getLogger(__name__)

ENGINE = "sglang"
#: The namespace part of objects laid out as get_page_buffer_meta() lists a page.
PAGES_FORMAT = "pages"
#: The namespace part of objects holding SGLang's flat data page (the legacy calls).
FLAT_FORMAT = "flat"


def shard_part(config: HiCacheStorageConfig) -> str:
    """Which slice of a page this rank holds, as one namespace part."""
    shard = "tp-shared" if config.is_mla_model else f"tp{config.tp_rank}of{config.tp_size}"
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


class KvstoredStorage(HiCacheStorage):
    """HiCache L3 storage in kvstored. Built by SGLang's backend factory as
    ``KvstoredStorage(storage_config, kwargs)``; options come from
    ``--hicache-storage-backend-extra-config``: ``master``, ``transport``, ``timeout``,
    ``token_file``, ``lock_ttl`` (see :class:`~kvstored.integrations.objects.StoreSettings`)."""

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
        log.info("kvstored HiCache storage connected to %s (interface_v1=%s)",
                 self.settings.master, self.interface_v1)

    # -- set-up ------------------------------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        super().register_mem_pool_host(mem_pool_host)
        config = self.storage_config
        kind = "mla" if config.is_mla_model else "mha"
        parts = [config.model_name or "unnamed", dtype_name(mem_pool_host.dtype),
                 f"{kind}-{mem_pool_host.layout}", f"page{mem_pool_host.page_size}",
                 shard_part(config)]
        self._pages = Namespace.of(ENGINE, [*parts, PAGES_FORMAT])
        self._flat = Namespace.of(ENGINE, [*parts, FLAT_FORMAT])
        for ns in (self._pages, self._flat):
            self.io.register_namespace(ns.prefix)
        if getattr(mem_pool_host, "kv_buffer", None) is not None:
            self._buffers = _PoolBuffers(mem_pool_host)
        log.info("kvstored HiCache keys: %s", self.namespace.prefix)

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
        pointers, sizes = self.mem_pool_host.get_page_buffer_meta(host_indices)
        if pointers and isinstance(pointers[0], (list, tuple)):
            pointers = [p for group in pointers for p in group]
            sizes = [s for group in sizes for s in group]
        if not keys or len(pointers) % len(keys):
            raise ValueError(f"{len(pointers)} page buffers for {len(keys)} pages")
        per_page = len(pointers) // len(keys)
        views = [self._buffers.view(int(p), int(s)) for p, s in zip(pointers, sizes)]
        return self._pages.keys(keys), [views[i * per_page:(i + 1) * per_page]
                                        for i in range(len(keys))]

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


def _tensor_bytes(tensor: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor, shared with it (no copy)."""
    if tensor.device.type != "cpu" or not tensor.is_contiguous():
        raise ValueError(f"tensor {tuple(tensor.shape)} is not a contiguous CPU tensor")
    return byte_view(tensor.reshape(-1).view(torch.uint8).numpy())

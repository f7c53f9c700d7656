"""One engine storage backend measured through SGLang's own HiCache storage path, in a
process of its own (``python -m kvstored.bench.engines_peer``), for ``kvstore bench
engines``. It prints one JSON document.

What it drives is SGLang's, not a reproduction: the host KV pool
(``MHATokenToKVPoolHost``, the memory the cache controller backs up from and prefetches
into), the backend as ``StorageBackendFactory.create_backend`` builds it, the page hashes
of ``get_hash_str``, and the two ways the cache controller moves pages. It picks them by
backend exactly as ``HiCacheController`` does:

- the zero-copy calls, ``batch_set_v1`` / ``batch_get_v1`` with host indices, for
  Mooncake and for a ``dynamic`` backend with ``interface_v1`` (kvstored);
- the generic calls for the rest (the built-in ``file`` backend): ``get_data_page`` then
  ``batch_set`` on backup; ``get_dummy_flat_data_page``, ``batch_get`` and
  ``set_from_flat_data_page`` on prefetch.

:func:`backup` and :func:`prefetch` walk the pages in batches of SGLang's
``STORAGE_BATCH_SIZE`` as ``_page_backup`` and ``_page_transfer`` do; the controller
itself is not built (it needs a device, a scheduler and their process groups), only the
three attributes its page functions read. On a CPU-only machine SGLang imports with the
torchvision stand-in ``make engines`` installs.

Each round uses pages of fresh random tokens: backup of every page, a ``batch_exists``
(the controller's query before a prefetch), the host pool zeroed, prefetch of every page,
then every page's bytes are compared with what was backed up (CRC-32C per page); a
mismatch or a missing page fails the run.

A separate process per backend, so that Mooncake's native threads and SGLang's imports
stay out of the parent and one backend's crash cannot take the benchmark down.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
import traceback
from typing import Any

import torch
from crc32c import crc32c
from sglang.srt.managers.cache_controller import HiCacheController
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory
from sglang.srt.mem_cache.utils import get_hash_str

from kvstored.bench.store_workload import drop_page_cache

#: The runners and what SGLang calls each backend.
RUNNERS = {
    "kvstored-shm": "dynamic",
    "kvstored-tcp": "dynamic",
    "sglang-file": "file",
    "sglang-file-cold": "file",
    "mooncake-embedded": "mooncake",
    "mooncake-remote": "mooncake",
}


def _host_pool(args: argparse.Namespace) -> Any:
    """SGLang's MHA host pool on the CPU, ``page_first`` (the layout the zero-copy
    backends want), holding ``args.pages`` pages and its device pool half that."""
    device_tokens = args.pages * args.page_tokens // 2
    device = MHATokenToKVPool(device_tokens, args.page_tokens, torch.bfloat16, args.heads,
                              args.head_dim, args.layers, "cpu", False,
                              start_layer=0, end_layer=args.layers)
    info: Any = device.get_device_pool_infos()[0].buffer_info  # MHA's, for an MHA pool
    return MHATokenToKVPoolHost(
        info, 2.0, 0, args.page_tokens,
        "page_first", pin_memory=False, device_capacity_tokens=device.size,
        start_layer=0, end_layer=args.layers)


def _storage_config(args: argparse.Namespace, model: str) -> Any:
    if args.runner.startswith("kvstored"):
        extra: dict[str, Any] = {
            "backend_name": "kvstored", "module_path": "kvstored.integrations.sglang",
            "class_name": "KvstoredStorage", "interface_v1": 1, "master": args.master,
            "transport": args.runner.removeprefix("kvstored-")}
    elif args.runner.startswith("mooncake"):
        # The engine's own segment (SGLang's usual set-up) or none: a pure client of the
        # mooncake_client process that holds the data, as kvstored's daemon does.
        segment = args.segment if args.runner == "mooncake-embedded" else 0
        extra = {"master_server_address": args.mooncake_master,
                 "metadata_server": args.mooncake_metadata, "protocol": "tcp",
                 "device_name": "", "local_hostname": "127.0.0.1",
                 "global_segment_size": segment, "check_server": False}
    else:
        extra = {}  # HiCacheFile's directory: the environment, set in run()
    return HiCacheStorageConfig(
        tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True,
        model_name=model, extra_config=extra)


def _page_hashes(rng: random.Random, pages: int, page_tokens: int) -> list[str]:
    """Page keys as SGLang's radix cache chains them, over random token ids."""
    keys: list[str] = []
    prior: Any = None  # a str here: the list form is for multi-component pages
    for _ in range(pages):
        prior = get_hash_str([rng.randrange(32000) for _ in range(page_tokens)], prior)
        keys.append(prior)
    return keys


class _Controller:
    """The state of ``HiCacheController`` its page functions read: the backend, the host
    pool and the page size. Building a whole controller needs a device, a scheduler and
    their process groups; these methods need only this."""

    def __init__(self, backend: Any, pool: Any) -> None:
        self.storage_backend = backend
        self.storage_host_pool = pool
        self.page_size = pool.page_size


class _Operation:
    """A prefetch operation as the page functions see it: an id for their log lines,
    never terminated."""

    request_id = "kvstore-bench-engines"

    @staticmethod
    def is_terminated() -> bool:
        return False


def page_functions(zero_copy: bool) -> tuple[Any, Any]:
    """The controller's own (set, get) page functions, chosen as it chooses them."""
    controller = HiCacheController
    if zero_copy:
        return controller._page_set_zero_copy, controller._page_get_zero_copy
    return controller._generic_page_set, controller._generic_page_get


def _batches(hashes: list[str], indices: Any, page_tokens: int, batch: int):
    for start in range(0, len(hashes), batch):
        chunk = hashes[start:start + batch]
        yield chunk, indices[start * page_tokens:(start + len(chunk)) * page_tokens]


def backup(controller: _Controller, page_set: Any, hashes: list[str], indices: Any,
           batch: int) -> bool:
    """Every page backed up, batch by batch, as ``_page_backup`` does."""
    return all(page_set(controller, chunk, chunk_indices)
               for chunk, chunk_indices in _batches(hashes, indices, controller.page_size,
                                                    batch))


def prefetch(controller: _Controller, page_get: Any, hashes: list[str], indices: Any,
             batch: int) -> int:
    """The number of leading pages that arrived, batch by batch, as
    ``_page_transfer`` counts them."""
    arrived = 0
    for chunk, chunk_indices in _batches(hashes, indices, controller.page_size, batch):
        got = page_get(controller, _Operation(), chunk, chunk_indices)
        arrived += got
        if got < len(chunk):
            break
    return arrived


def _digests(pool: Any, indices: Any, pages: int) -> list[int]:
    return [crc32c(pool.get_data_page(indices[i * pool.page_size]).view(torch.uint8)
                   .numpy()) for i in range(pages)]


def _round(controller: _Controller, functions: tuple[Any, Any], indices: Any, number: int,
           args: argparse.Namespace, rng: random.Random) -> dict[str, Any]:
    backend, pool = controller.storage_backend, controller.storage_host_pool
    page_set, page_get = functions
    pool.kv_buffer.view(torch.uint8).random_(0, 256)
    hashes = _page_hashes(rng, args.pages, args.page_tokens)
    expected = _digests(pool, indices, args.pages)
    page_bytes = pool.get_size_per_token() * args.page_tokens
    started = time.perf_counter()
    if not backup(controller, page_set, hashes, indices, args.batch):
        raise RuntimeError(f"round {number}: backup of {len(hashes)} pages failed")
    backup_s = time.perf_counter() - started
    cache = drop_page_cache() if args.runner == "sglang-file-cold" else None
    started = time.perf_counter()
    present = backend.batch_exists(hashes)
    exists_s = time.perf_counter() - started
    if present != len(hashes):
        raise RuntimeError(f"round {number}: batch_exists found {present} of "
                           f"{len(hashes)} pages just backed up")
    pool.kv_buffer.zero_()
    started = time.perf_counter()
    arrived = prefetch(controller, page_get, hashes, indices, args.batch)
    prefetch_s = time.perf_counter() - started
    if arrived != len(hashes):
        raise RuntimeError(f"round {number}: prefetch brought {arrived} of {len(hashes)} "
                           "pages back")
    wrong = [i for i, (a, b) in enumerate(zip(expected, _digests(pool, indices, args.pages)))
             if a != b]
    if wrong:
        raise RuntimeError(f"round {number}: {len(wrong)} pages came back with other bytes "
                           f"(first: page {wrong[0]}, key {hashes[wrong[0]]})")
    total = page_bytes * len(hashes)
    return {"backup_gbps": total / backup_s / 1e9, "prefetch_gbps": total / prefetch_s / 1e9,
            "backup_s": backup_s, "prefetch_s": prefetch_s, "exists_ms": exists_s * 1e3,
            "page_cache": cache or ("dropped" if args.runner == "sglang-file-cold" else "warm")}


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.runner == "mooncake-remote":
        # The wheel's local-memcpy shortcut assumes one address space; across processes
        # every get then fails (see kvstored.bench.mooncake_peer).
        os.environ["MC_STORE_MEMCPY"] = "0"
    if args.runner.startswith("sglang-file"):
        # HiCacheFile prefers this variable to its extra_config, so setting it is the one
        # way a caller's own setting cannot send the run elsewhere.
        os.environ["SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"] = args.file_dir
    pool = _host_pool(args)
    backend_name = RUNNERS[args.runner]
    config = _storage_config(args, f"bench/{args.runner}-{os.getpid()}")
    backend = StorageBackendFactory.create_backend(backend_name, config, pool)
    backend.register_mem_pool_host(pool)
    # As HiCacheController.attach_storage_backend chooses its page functions.
    zero_copy = backend_name == "mooncake" or (
        backend_name == "dynamic" and bool(config.extra_config.get("interface_v1", 0)))
    indices = pool.alloc(args.pages * args.page_tokens)
    if indices is None:
        raise RuntimeError(f"the host pool has no room for {args.pages} pages")
    rng = random.Random(args.seed)
    controller, functions = _Controller(backend, pool), page_functions(zero_copy)
    rounds = [_round(controller, functions, indices, n, args, rng)
              for n in range(1, args.rounds + 1)]
    document: dict[str, Any] = {
        "runner": args.runner, "backend": backend_name, "zero_copy_path": zero_copy,
        "page_bytes": pool.get_size_per_token() * args.page_tokens, "rounds": rounds}
    io = getattr(backend, "io", None)
    if io is not None:  # kvstored's adapter counts the copies it makes itself
        document["adapter_copies"] = {"gathered_bytes": io.copies.gathered_bytes,
                                      "scattered_bytes": io.copies.scattered_bytes}
    return document


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="One engine backend measured, as JSON.")
    parser.add_argument("--runner", choices=sorted(RUNNERS), required=True)
    parser.add_argument("--pages", type=int, required=True)
    parser.add_argument("--page-tokens", type=int, required=True)
    parser.add_argument("--layers", type=int, required=True)
    parser.add_argument("--heads", type=int, required=True)
    parser.add_argument("--head-dim", type=int, required=True)
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--rounds", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--master", default="")
    parser.add_argument("--mooncake-master", default="")
    parser.add_argument("--mooncake-metadata", default="")
    parser.add_argument("--segment", type=int, default=0)
    parser.add_argument("--file-dir", default="")
    args = parser.parse_args(argv)
    try:
        document = run(args)
    except Exception as exc:  # reported in the JSON; the parent carries on
        traceback.print_exc()  # into the peer's log, which the error names
        document = {"error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(document), flush=True)
    # Mooncake's native threads can hang interpreter shutdown; the answer is out.
    os._exit(0)


if __name__ == "__main__":
    main()

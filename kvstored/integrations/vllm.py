"""kvstored as a secondary tier of vLLM's native KV offloading (``OffloadingConnector``).

vLLM loads it by module path from ``kv_connector_extra_config``::

    --kv-transfer-config '{"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
      "kv_connector_extra_config": {"spec_name": "TieringOffloadingSpec",
        "cpu_bytes_to_use": 8589934592,
        "secondary_tiers": [{"type": "KvstoredTier",
                             "module_path": "kvstored.integrations.vllm",
                             "master": "127.0.0.1:7700"}]}}'

The CPU tier is vLLM's primary: blocks reach kvstored from it (a cascade, after the GPU
wrote them) and come back into it (a promotion, when a lookup misses the CPU tier but hits
here). One kvstored object per offloaded chunk: its slot in the CPU tier, byte for byte,
so both directions are a single piece and need no staging copy.

Keys: ``vllm/MODEL/DTYPE/tpT-ppP-pcpC-dcpD/rankR/cfgDIGEST/gGROUP-HASH``. DIGEST is the
hash vLLM's own ``FileMapper`` computes over everything that decides a block's bytes
(model, dtype, tokens per hash, blocks per chunk, parallel sizes, KV cache groups, layout);
for parallelism-agnostic layouts vLLM collapses the parallel part and the rank, so every
rank shares one copy, as its file tier does.

Tier options: ``master``, ``transport``, ``timeout``, ``token_file`` (see
:class:`~kvstored.integrations.objects.StoreSettings`), ``io_threads`` (default 2) and
``locality`` (LOCAL or REMOTE, vLLM's own label).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import TYPE_CHECKING, Any, ClassVar

from vllm.v1.kv_offload.base import (
    Locality,
    LookupResult,
    Medium,
    OffloadKey,
    ReqContext,
    get_offload_block_hash,
    get_offload_group_idx,
)
from vllm.v1.kv_offload.file_mapper import FileMapper
from vllm.v1.kv_offload.tiering.async_lookup import AsyncLookupManager
from vllm.v1.kv_offload.tiering.base import (
    JobResult,
    RequestOffloadingContext,
    ScheduleEndContext,
    SecondaryTierManager,
    TransferJob,
)

from kvstored.integrations.namespace import Namespace
from kvstored.integrations.objects import ObjectIO, StoreSettings

if TYPE_CHECKING:
    from vllm.v1.kv_offload.base import OffloadingSpec
    from vllm.v1.kv_offload.tiering.backpressure import BackpressureDetector

log = logging.getLogger(__name__)

ENGINE = "vllm"


def namespace_for(offloading_spec: OffloadingSpec) -> Namespace:
    """The namespace of one vLLM worker's blocks, decided as vLLM's file tier decides
    which blocks are interchangeable (FileMapper, parallelism-agnostic where vLLM allows)."""
    mapper = FileMapper.from_offloading_spec("", offloading_spec,
                                             blocks_per_file=offloading_spec.blocks_per_chunk,
                                             parallel_agnostic=True)
    fields = mapper.get_run_config()
    digest = mapper.base_path.rsplit("_", 1)[-1]
    parallel = (f"tp{fields['tp_size']}-pp{fields['pp_size']}-pcp{fields['pcp_size']}"
                f"-dcp{fields['dcp_size']}")
    return Namespace.of(ENGINE, [fields["model_name"], fields["dtype"], parallel,
                                 f"rank{mapper.rank}", f"cfg{digest}"])


def block_name(key: OffloadKey) -> str:
    """The engine half of a kvstored key: the KV cache group and the block hash."""
    return f"g{get_offload_group_idx(key)}-{get_offload_block_hash(key).hex()}"


class _Lookups(AsyncLookupManager):
    """vLLM's batched, off-thread existence checks, one kvstored call per request."""

    def __init__(self, tier: KvstoredTier) -> None:
        super().__init__(tier_type=tier.tier_type)
        self._tier = tier

    def batch_lookup(self, keys: list[OffloadKey], req_context: ReqContext) -> Iterable[bool]:
        return self._tier.io.present([self._tier.store_key(k) for k in keys])


class KvstoredTier(SecondaryTierManager):
    """A vLLM secondary tier in kvstored. Transfers run on a small thread pool; vLLM polls
    them through get_finished_jobs(), as it does its file-system tier."""

    medium: ClassVar[Medium] = Medium.STORAGE

    def __init__(self, offloading_spec: OffloadingSpec, primary_kv_view: memoryview,
                 tier_type: str, master: str | None = None, transport: str | None = None,
                 timeout: float | None = None, token_file: str | None = None,
                 io_threads: int = 2,
                 locality: str | None = None,
                 backpressure_detector: BackpressureDetector | None = None) -> None:
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector)
        self.locality = Locality(locality) if locality is not None else None
        options: dict[str, Any] = {"master": master, "transport": transport,
                                   "timeout": timeout, "token_file": token_file}
        self.settings = StoreSettings.from_options(options)
        # Connect now: a wrong master fails vLLM's start-up, with the address.
        self.io = ObjectIO(self.settings.connect())
        self.namespace = namespace_for(offloading_spec)
        self.io.register_namespace(self.namespace.prefix)
        flat = primary_kv_view if primary_kv_view.ndim == 1 else primary_kv_view.cast("B")
        self._primary = flat.cast("B") if flat.format != "B" else flat
        self._pool = ThreadPoolExecutor(max(1, int(io_threads)),
                                        thread_name_prefix=f"kvstored-{tier_type}")
        self._finished: queue.SimpleQueue[tuple[JobResult, list[OffloadKey]]] = \
            queue.SimpleQueue()
        self._in_flight: set[Future] = set()
        self._in_flight_lock = threading.Lock()
        self._lookups = _Lookups(self)
        log.info("kvstored vLLM tier connected to %s; keys under %s", self.settings.master,
                 self.namespace.prefix)

    def store_key(self, key: OffloadKey) -> str:
        return self.namespace.key(block_name(key))

    def _slot(self, chunk_id: int) -> memoryview:
        size = self.block_size_bytes
        return self._primary[chunk_id * size:(chunk_id + 1) * size]

    # -- transfers (pool threads) ------------------------------------------------------

    def _submit(self, job: TransferJob, run) -> None:
        future = self._pool.submit(run, job)
        with self._in_flight_lock:
            self._in_flight.add(future)
        future.add_done_callback(self._done)

    def _done(self, future: Future) -> None:
        with self._in_flight_lock:
            self._in_flight.discard(future)

    def _store(self, job: TransferJob) -> None:
        keys = list(job.keys)
        started = time.monotonic()
        stored = self.io.put([self.store_key(k) for k in keys],
                             [[self._slot(int(c))] for c in job.chunk_ids])
        self._finished.put((JobResult(job.job_id, all(stored),
                                      transfer_time=time.monotonic() - started,
                                      transfer_bytes=len(keys) * self.block_size_bytes), []))

    def _load(self, job: TransferJob) -> None:
        keys = list(job.keys)
        started = time.monotonic()
        loaded = self.io.get([self.store_key(k) for k in keys],
                             [[self._slot(int(c))] for c in job.chunk_ids])
        ok = [k for k, hit in zip(keys, loaded) if hit]
        failed = [k for k, hit in zip(keys, loaded) if not hit]
        result = JobResult(job.job_id, not failed,
                           successful_keys=tuple(ok) if failed and ok else None,
                           transfer_time=time.monotonic() - started,
                           transfer_bytes=len(ok) * self.block_size_bytes)
        self._finished.put((result, failed))

    # -- SecondaryTierManager ----------------------------------------------------------

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        found = self._lookups.lookup(key, req_context)
        if found is None:
            return LookupResult.RETRY
        return LookupResult.HIT if found else LookupResult.MISS

    def submit_store(self, job_metadata: TransferJob) -> None:
        self._submit(job_metadata, self._store)

    def submit_load(self, job_metadata: TransferJob) -> None:
        self._submit(job_metadata, self._load)

    def get_finished_jobs(self) -> Iterable[JobResult]:
        results = []
        while True:
            try:
                result, failed = self._finished.get_nowait()
            except queue.Empty:
                return results
            if failed:
                # Scheduler thread: stop re-promoting blocks that did not load.
                self._lookups.mark_miss(failed)
            results.append(result)

    def has_pending_work(self) -> bool:
        with self._in_flight_lock:
            return bool(self._in_flight)

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def on_request_finished(self, req_context: ReqContext) -> None:
        self._lookups.cleanup(req_context.req_id)

    def on_schedule_end(self, context: ScheduleEndContext) -> None:
        self._lookups.flush()

    def drain_jobs(self) -> None:
        with self._in_flight_lock:
            pending = list(self._in_flight)
        wait(pending)

    def shutdown(self) -> None:
        self._lookups.shutdown()
        self._pool.shutdown(wait=True)
        self.io.close()

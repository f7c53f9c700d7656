"""The replay engine: a trace prepared once, then replayed per policy and capacity.

``Replay`` builds the prefix trie (node of every event, parent of every node) and, when
optimal is asked for, the next-use index. Each ``run`` replays every request against one
policy and capacity in the compiled core (``_simcore``). Runs on different threads do not
share state: each thread keeps its own workspace, and cffi releases the GIL during a run.

When the compiled core is missing (a build without a C compiler), ``Replay`` falls back to
the pure-Python replay of ``refsim``: the same numbers for fifo, lru and optimal, far
slower; ``s3fifo`` and ``tiered`` then raise UnavailableError.
"""

from __future__ import annotations

import ctypes
import threading

import numpy as np

from kvstored.errors import UnavailableError
from kvstored.tools import refsim
from kvstored.tools.events import EventTrace
from kvstored.tools.runs import PolicySpec, RunResult

try:
    from kvstored.tools._simcore import ffi, lib
except ImportError as exc:  # pragma: no cover - exercised by the fallback test via flag
    ffi = lib = None
    CORE_IMPORT_ERROR: str | None = str(exc)
else:
    CORE_IMPORT_ERROR = None

POLICIES = ("fifo", "lru", "optimal", "s3fifo", "tiered")
REFERENCE_POLICIES = ("fifo", "lru", "optimal")
_POLICY_CODES = {"fifo": 0, "lru": 1, "optimal": 2, "s3fifo": 3, "tiered": 4}
_STATUS = {-1: "out of memory", -2: "invalid arguments", -3: "cancelled"}


def core_available() -> bool:
    """Whether the compiled replay core imported."""
    return lib is not None


class Replay:
    """A trace prepared for replay with a fixed warm-up.

    ``warmup_requests = floor(requests * warmup_fraction)``; those requests only warm the
    cache. ``engine`` is "auto" (the compiled core when present), "c" or "python".
    """

    def __init__(self, trace: EventTrace, warmup_fraction: float = 0.5, *,
                 next_use: bool = True, engine: str = "auto"):
        if engine == "auto":
            engine = "c" if core_available() else "python"
        if engine == "c" and not core_available():
            raise UnavailableError(
                f"the compiled simulator core is missing ({CORE_IMPORT_ERROR}); reinstall "
                "kvstored with a C compiler present (pip install -e .)")
        self.engine = engine
        self.requests = trace.requests
        self.events = trace.events
        self.warmup_requests = max(0, min(self.requests,
                                          int(np.floor(self.requests * warmup_fraction))))
        self.offsets = np.ascontiguousarray(trace.offsets, dtype=np.int64)
        self.tokens = np.ascontiguousarray(trace.tokens, dtype=np.uint32)
        self.node_of_event, self.parent = build_trie(trace.ids, self.offsets, engine)
        self.unique_blocks = len(self.parent) - 1
        self.next_use = self._next_use() if next_use else None
        self._local = threading.local()
        self._workspaces: list = []

    def _next_use(self) -> np.ndarray:
        if self.engine == "python":
            return refsim.next_use(self.node_of_event, self.offsets)
        out = np.empty(self.events, dtype=np.uint32)
        rc = lib.sim_next_use(_u32(self.node_of_event), _i64(self.offsets), self.requests,
                              len(self.parent), _u32(out))
        _check(rc)
        return out

    def measured_tokens(self) -> int:
        start = self.offsets[self.warmup_requests]
        return int(self.tokens[start:].sum(dtype=np.uint64))

    def _trace_struct(self):
        trace = ffi.new("sim_trace *")
        keep = [_u32(self.node_of_event), _u32(self.parent),
                _u32(self.next_use) if self.next_use is not None else ffi.NULL,
                _u32(self.tokens), _i64(self.offsets)]
        (trace.node_of_event, trace.parent, trace.next_use, trace.tokens,
         trace.req_off) = keep
        trace.n_req = self.requests
        trace.n_nodes = len(self.parent)
        trace.warmup_requests = self.warmup_requests
        return trace, keep

    def ceiling(self) -> RunResult:
        """An infinite cache: the best any policy can do."""
        if self.engine == "python":
            return refsim.ceiling(self)
        trace, _keep = self._trace_struct()
        out = ffi.new("sim_result *")
        _check(lib.sim_ceiling(trace, out))
        return RunResult(out.hit_tokens, out.total_tokens, False)

    def run(self, spec: PolicySpec, *, progress=None, cancel=None,
            per_request: bool = False) -> RunResult:
        """Replay every request against ``spec``. ``progress`` and ``cancel`` are optional
        one-element int64/int32 numpy arrays the core updates and polls. ``per_request``
        (tiered only) also returns the hit tokens of every request by tier."""
        if per_request and spec.policy != "tiered":
            raise ValueError("per-request hits are kept for the tiered policy only")
        if spec.policy not in _POLICY_CODES:
            raise ValueError(f"unknown policy {spec.policy!r}")
        if spec.policy == "optimal" and self.next_use is None:
            raise ValueError("this Replay was prepared without next_use; optimal needs it")
        if self.engine == "python":
            if spec.policy not in REFERENCE_POLICIES:
                raise UnavailableError(
                    f"policy {spec.policy} needs the compiled simulator core "
                    f"({CORE_IMPORT_ERROR}); reinstall kvstored with a C compiler present")
            return refsim.run(self, spec)
        trace, _keep = self._trace_struct()
        params = ffi.new("sim_params *")
        params.policy = _POLICY_CODES[spec.policy]
        params.capacity = spec.capacity
        params.ssd_capacity = spec.ssd_capacity
        params.write_through = int(spec.write_through)
        params.promote = int(spec.promote)
        params.promote_reads = spec.promote_reads
        params.ssd_fifo = int(spec.ssd_fifo)
        params.small_capacity = spec.small_capacity
        params.progress = ffi.cast("int64_t *", progress.ctypes.data) \
            if progress is not None else ffi.NULL
        params.cancel = ffi.cast("int32_t *", cancel.ctypes.data) \
            if cancel is not None else ffi.NULL
        params.full_run = int(spec.full_run)
        hits = ssd_hits = None
        if per_request:
            hits = np.zeros(self.requests, dtype=np.uint64)
            ssd_hits = np.zeros(self.requests, dtype=np.uint64)
            params.request_hit_tokens = ffi.cast("uint64_t *", hits.ctypes.data)
            params.request_ssd_hit_tokens = ffi.cast("uint64_t *", ssd_hits.ctypes.data)
        out = ffi.new("sim_result *")
        _check(lib.sim_run(self._workspace(), trace, params, out))
        return RunResult(out.hit_tokens, out.total_tokens, bool(out.underfilled),
                         out.ssd_hit_tokens, out.evictions, out.promotions, out.ssd_writes,
                         hits, ssd_hits)

    def _workspace(self):
        ws = getattr(self._local, "ws", None)
        if ws is None:
            ws = ffi.gc(lib.sim_workspace_new(), lib.sim_workspace_free)
            if ws == ffi.NULL:
                raise MemoryError("cannot allocate a simulator workspace")
            self._local.ws = ws
            self._workspaces.append(ws)
        return ws

    def memory_bytes(self) -> dict:
        """What the replay holds beyond the trace's input arrays, in bytes: the trie (the
        node of each event, the parent of each node), the next-use index, and the
        workspaces of the threads that ran replays (their largest use so far)."""
        trie = self.node_of_event.nbytes + len(self.parent) * 4
        next_use = self.next_use.nbytes if self.next_use is not None else 0
        workspaces = sum(lib.sim_workspace_bytes(ws) for ws in self._workspaces) \
            if lib is not None else 0
        total = trie + next_use + workspaces
        return {"trieBytes": trie, "nextUseBytes": next_use, "workspaceBytes": workspaces,
                "totalBytes": total, "bytesPerEvent": total / max(1, self.events)}


def trim_heap() -> None:
    """Hand the C heap's free memory back to the system (glibc's ``malloc_trim``; nothing
    elsewhere). Reading a JSON trace frees millions of small objects; without this the
    replay would start on top of their pages, and the peak would be their sum."""
    global _MALLOC_TRIM
    if _MALLOC_TRIM is None:
        try:
            _MALLOC_TRIM = ctypes.CDLL(None).malloc_trim
        except (AttributeError, OSError):
            _MALLOC_TRIM = False
    if _MALLOC_TRIM:
        _MALLOC_TRIM(0)


_MALLOC_TRIM = None


def build_trie(ids: np.ndarray, offsets: np.ndarray, engine: str = "c"
               ) -> tuple[np.ndarray, np.ndarray]:
    """``(node_of_event, parent)`` of the prefix trie; nodes are numbered in the order they
    are first seen, the root being 0."""
    if engine == "python":
        return refsim.build_trie(ids, offsets)
    ids = np.ascontiguousarray(ids, dtype=np.int64)
    n = int(offsets[-1])
    node_of_event = np.empty(n, dtype=np.uint32)
    parent = np.empty(n + 1, dtype=np.uint32)  # pages past the last node stay untouched
    nodes = lib.sim_build_trie(_i64(ids), _i64(offsets), len(offsets) - 1,
                               _u32(node_of_event), _u32(parent))
    _check(nodes)
    return node_of_event, parent[:nodes]


def _check(rc: int) -> None:
    if rc < 0:
        if rc == -1:
            raise MemoryError("the simulator core ran out of memory")
        if rc == -3:
            raise KeyboardInterrupt
        raise ValueError(f"the simulator core refused the input ({_STATUS.get(rc, rc)})")


def _u32(array: np.ndarray):
    return ffi.from_buffer("uint32_t[]", array)


def _i64(array: np.ndarray):
    return ffi.from_buffer("int64_t[]", array)

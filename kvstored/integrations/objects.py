"""Where bytes move between an engine's KV buffers and kvstored: the adapters' one seam.

Every adapter describes an object as the list of its *pieces*, in order: byte views into
the engine's own memory (SGLang: one piece per K or V buffer of a page, or per layer in
``layer_first``; LMCache: the header and the chunk; vLLM: the block's slot in the CPU
tier). The object's bytes are the pieces concatenated. :class:`ObjectIO` stores and loads
such objects over kvstored's blocking client, :class:`AsyncObjectIO` over its asyncio
client (both run :class:`ObjectSteps`, the logic once, as steps of the client core), and
nothing else touches the store's data path.

The pieces go to the client as they are (its scatter/gather calls, ``batch_put_parts``
and ``batch_get_into_parts``): sent from and received into the engine's memory over TCP,
copied piece by piece to and from a node's segment on this host. So this module copies
no byte itself; :class:`CopyCounters` counts the bytes an adapter still copies on its
own (SGLang's legacy calls given a strided tensor), which ``kvstore bench engines``
reports against its zero-copy goal.

What this module does not do: decide keys (see :mod:`~kvstored.integrations.namespace`),
or know any engine. It never raises a store error at an engine: engines treat a failed
store or load as a miss and recompute, so every failure is logged with the key and what
to do, and reported as ``False``.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from kvstored.asyncio import AsyncioClient
from kvstored.asyncio import connect as connect_asyncio
from kvstored.client import MISSING, Client, connect
from kvstored.client.core import ClientCore, Step
from kvstored.config import ClientSettings, load_config
from kvstored.errors import BadRequestError, StoreError
from kvstored.sdk.units import parse_bool

log = logging.getLogger(__name__)
_T = TypeVar("_T")

#: An object as the engine lays it out: byte views, concatenated in this order.
Pieces = Sequence[memoryview]

#: How long an adapter's lookup locks what it finds (seconds), unless the engine's
#: configuration says otherwise (``lock_ttl``; 0: no locks). Long enough for a prefetch
#: queued behind others to read; the master cuts it to its master.max_lock_ttl.
DEFAULT_LOCK_TTL = 10.0


@dataclass(frozen=True, slots=True)
class StoreSettings:
    """How an adapter reaches kvstored, read from the engine's own configuration."""

    master: str
    transport: str
    timeout: float
    token_file: str | None = None
    #: Seconds a lookup locks its hits for the read that follows (0: none).
    lock_ttl: float = DEFAULT_LOCK_TTL
    #: Whether an engine's host memory in shared files is registered with the node on
    #: this host (it then moves the bytes itself); off, this process copies them, which
    #: is faster where the kernel's file copy is slower than a memcpy (docs/integrations.md).
    register_memory: bool = True

    @classmethod
    def from_options(cls, options: Mapping[str, Any], *, prefix: str = "",
                     defaults: ClientSettings | None = None) -> StoreSettings:
        """Settings from an engine's option mapping: ``{prefix}master``,
        ``{prefix}transport`` (auto|tcp|shm), ``{prefix}timeout`` (seconds),
        ``{prefix}token_file`` (default: the client's own, see docs/security.md) and
        ``{prefix}lock_ttl`` (seconds a lookup locks its hits; 0: no locks) and
        ``{prefix}register_memory`` (true/false: see the field). An
        option the engine does not set is the client setting of the same name, from
        kvstored's configuration (``KVSTORE_MASTER``, ``KVSTORED_CLIENT_*``, the file of
        ``KVSTORED_CONFIG``): ``defaults`` when given, else loaded now."""
        client = defaults or load_config().client

        def option(name: str, default: Any) -> Any:
            value = options.get(prefix + name)
            return default if value is None else value

        def seconds(name: str, default: float) -> float:
            try:
                value = float(option(name, default))
            except (TypeError, ValueError):
                value = -1.0
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{prefix}{name} must be a number of seconds, not "
                                 f"{option(name, None)!r}")
            return value

        def boolean(name: str, default: bool) -> bool:
            value = option(name, default)
            try:
                return parse_bool(value if isinstance(value, bool | str) else str(value))
            except ValueError:
                raise ValueError(f"{prefix}{name} must be true or false (or 1/0), not "
                                 f"{value!r}") from None

        token_file = option("token_file", None)
        return cls(master=str(option("master", "") or client.master),
                   transport=str(option("transport", client.transport)),
                   timeout=seconds("timeout", client.timeout),
                   token_file=str(token_file) if token_file else None,
                   lock_ttl=seconds("lock_ttl", DEFAULT_LOCK_TTL),
                   register_memory=boolean("register_memory", True))

    def connect(self) -> Client:
        return connect(self.master, transport=self.transport, token_file=self.token_file,
                       timeout=self.timeout)

    async def connect_asyncio(self) -> AsyncioClient:
        """The asyncio client with these settings, once the master has answered."""
        return await connect_asyncio(self.master, transport=self.transport,
                                     token_file=self.token_file, timeout=self.timeout)


@dataclass(slots=True)
class CopyCounters:
    """Bytes an adapter copied itself, beside the client's own transfer: ``gathered``
    on the way to the store, ``scattered`` on the way back. Zero on every path that hands
    the engine's memory to the client as pieces."""

    gathered_bytes: int = 0
    scattered_bytes: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, gathered: int = 0, scattered: int = 0) -> None:
        with self._lock:
            self.gathered_bytes += gathered
            self.scattered_bytes += scattered


class ObjectSteps:
    """What :class:`ObjectIO` and :class:`AsyncObjectIO` do, once: each call is a step
    composed of the client core's own operations (see :mod:`kvstored.client.core`),
    which the blocking client or the asyncio one drives (``client.run``). A store error
    thrown into a step is caught here, logged, and turned into a miss."""

    def __init__(self, core: ClientCore) -> None:
        self.core = core

    def put(self, keys: Sequence[str], objects: Sequence[Pieces]) -> Step[list[bool]]:
        _one_object_per_key(keys, objects)

        def store(ks: list[str]) -> Step[list[bool]]:
            yield from self.core.batch_put_parts(ks, objects)
            return [True] * len(ks)
        return (yield from self._ask(store, keys, [False] * len(keys), "storing",
                                     "; the engine recomputes them on a later miss"))

    def get(self, keys: Sequence[str], objects: Sequence[Pieces]) -> Step[list[bool]]:
        sizes = [_size(obj) for obj in objects]
        found = []
        lengths = yield from self.get_upto(keys, objects)
        for key, size, length in zip(keys, sizes, lengths):
            if length not in (MISSING, size):
                log.warning("kvstored: %s holds %d bytes but the engine expects %d; a "
                            "different model geometry under the same namespace? Treated as "
                            "a miss", key, length, size)
            found.append(length == size)
        return found

    def get_upto(self, keys: Sequence[str], objects: Sequence[Pieces]) -> Step[list[int]]:
        _one_object_per_key(keys, objects)
        return (yield from self._ask(lambda ks: self._read(ks, objects), keys,
                                     [MISSING] * len(keys), "loading", "; treated as a miss"))

    def leading_present(self, keys: Sequence[str], lock_for: float = 0.0) -> Step[int]:
        return (yield from self._ask(
            lambda ks: self.core.prefix_hits(ks, lock_for or None), keys, 0,
            "looking up", "; treated as a miss"))

    def present(self, keys: Sequence[str], lock_for: float = 0.0) -> Step[list[bool]]:
        def ask(ks: list[str]) -> Step[list[bool]]:
            if lock_for:
                return self.core.batch_lookup_and_lock(ks, lock_for)
            return self.core.batch_exists(ks)
        return (yield from self._ask(ask, keys, [False] * len(keys), "looking up",
                                     "; treated as misses"))

    def remove(self, keys: Sequence[str]) -> Step[list[bool]]:
        return (yield from self._ask(self.core.batch_remove, keys, [False] * len(keys),
                                     "removing"))

    def _ask(self, call: Callable[[list[str]], Step[_T]], keys: Sequence[str], failed: _T,
             doing: str, then: str = "") -> Step[_T]:
        """``call`` the store with ``keys``; ``failed`` when there are none or the store
        fails (logged: an engine treats a failed call as a miss, never as an error)."""
        if not keys:
            return failed
        try:
            return (yield from call(list(keys)))
        except StoreError as exc:
            log.warning("kvstored: %s %d key(s) from %s failed: %s%s", doing, len(keys),
                        keys[0], exc, then)
            return failed

    def list_keys(self, prefix: str, limit: int | None = None) -> Step[list[str]]:
        keys: list[str] = []
        after = None
        try:
            while limit is None or len(keys) < limit:
                page = yield from self.core.raw("list", {"prefix": prefix, "after": after,
                                                         "limit": 1000})
                keys.extend(page["keys"])
                if not page["more"]:
                    break
                after = page["after"]
        except StoreError as exc:
            log.warning("kvstored: listing %s failed: %s", prefix, exc)
        return keys if limit is None else keys[:limit]

    def remove_prefix(self, prefix: str) -> Step[int]:
        try:
            return (yield from self.core.batch_remove_prefix(prefix))
        except StoreError as exc:
            log.warning("kvstored: removing the objects under %s failed: %s", prefix, exc)
            return 0

    def register_namespace(self, prefix: str) -> Step[None]:
        try:
            yield from self.core.register_namespace(prefix)
        except StoreError as exc:
            log.warning("kvstored: registering the namespace %s failed: %s; its usage is "
                        "not shown apart", prefix, exc)

    # -- the seam: the only code that hands bytes to the client ------------------------

    def _read(self, keys: list[str], objects: Sequence[Pieces]) -> Step[list[int]]:
        """Read each object into its pieces; an object larger than its pieces reports
        its own size (so the caller sees the mismatch) and writes nothing."""
        try:
            return (yield from self.core.read_into_parts(keys, objects))
        except BadRequestError:
            # The client refuses a batch (before any byte lands) when an object is larger
            # than its pieces: look the sizes up, and read only the objects that fit.
            pass
        sizes = [_size(obj) for obj in objects]
        lengths = []
        for key in keys:
            info = yield from self.core.stat(key)
            lengths.append(MISSING if info is None else info.size)
        fits = [i for i, (n, size) in enumerate(zip(lengths, sizes)) if 0 <= n <= size]
        if fits:
            got = yield from self.core.read_into_parts([keys[i] for i in fits],
                                                       [objects[i] for i in fits])
            for i, n in zip(fits, got):
                lengths[i] = n
        for key, n, size in zip(keys, lengths, sizes):
            if n > size:
                log.warning("kvstored: %s holds %d bytes, more than the engine's %d; "
                            "treated as a miss", key, n, size)
        return [MISSING if n > size else n for n, size in zip(lengths, sizes)]


class ObjectIO:
    """Puts and gets objects made of pieces over the blocking client; thread-safe (as
    the client is). Never raises a store error (see the module docstring)."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.steps = ObjectSteps(client.core)
        self.copies = CopyCounters()

    def put(self, keys: Sequence[str], objects: Sequence[Pieces]) -> list[bool]:
        """Store each object; per key True if it is in the store now (stored, or already
        there: objects are write-once and a key names its bytes), False on failure."""
        return self.client.run(self.steps.put(keys, objects))

    def get(self, keys: Sequence[str], objects: Sequence[Pieces]) -> list[bool]:
        """Load each object into its pieces; per key True if every byte arrived. An
        object whose size differs from its pieces' total is a miss: its bytes were laid
        out for something else. (A larger one writes nothing; a shorter one may have
        landed in pieces reported False, which engines never read.)"""
        return self.client.run(self.steps.get(keys, objects))

    def get_upto(self, keys: Sequence[str], objects: Sequence[Pieces]) -> list[int]:
        """Load each object into the start of its pieces (for engines whose last chunk
        may be short); per key the bytes it holds, or MISSING. An object larger than its
        pieces is a miss, and no byte of it reaches them."""
        return self.client.run(self.steps.get_upto(keys, objects))

    def leading_present(self, keys: Sequence[str], *, lock_for: float = 0.0) -> int:
        """How many leading keys are present (prefix caches hit a prefix); 0 on failure.
        ``lock_for`` > 0: those are locked against eviction for that many seconds, until
        this process reads them (or the time is up), so the load that follows the
        lookup finds them."""
        return self.client.run(self.steps.leading_present(keys, lock_for))

    def present(self, keys: Sequence[str], *, lock_for: float = 0.0) -> list[bool]:
        """Which keys are present; all False on failure. ``lock_for`` as for
        :meth:`leading_present`, for every key found."""
        return self.client.run(self.steps.present(keys, lock_for))

    def remove(self, keys: Sequence[str]) -> list[bool]:
        """Remove each key; per key True if it was removed, all False on failure."""
        return self.client.run(self.steps.remove(keys))

    def list_keys(self, prefix: str, *, limit: int | None = None) -> list[str]:
        """The keys under ``prefix``, in order (at most ``limit``); [] on failure."""
        return self.client.run(self.steps.list_keys(prefix, limit))

    def remove_prefix(self, prefix: str) -> int:
        """Remove every key under ``prefix`` in one master call; how many went (0 on
        failure, logged)."""
        return self.client.run(self.steps.remove_prefix(prefix))

    def register_namespace(self, prefix: str) -> None:
        """Have the master count ``prefix`` as a namespace (usage in ``kvstore status``
        and the metrics); a failure only costs that view, so it is logged, not raised."""
        self.client.run(self.steps.register_namespace(prefix))

    def register_memory(self, buffer: Any, fd: int) -> bool:
        """Register the engine's shared-memory pool (``buffer`` maps the file ``fd``)
        with the client: see ``Client.register_memory``. False, logged, if it cannot be
        (the engine then moves its bytes as before)."""
        try:
            self.client.register_memory(buffer, fd)
        except StoreError as exc:
            log.warning("kvstored: the engine's pool (descriptor %d) cannot be registered: "
                        "%s; the client copies its bytes", fd, exc)
            return False
        return True

    def close(self) -> None:
        self.client.close()


class AsyncObjectIO:
    """:class:`ObjectIO`'s calls as coroutines over the asyncio client (LMCache's
    connector, inside LMCache's event loop): the same steps, no thread per call."""

    def __init__(self, client: AsyncioClient) -> None:
        self.client = client
        self.steps = ObjectSteps(client.core)
        self.copies = CopyCounters()

    async def put(self, keys: Sequence[str], objects: Sequence[Pieces]) -> list[bool]:
        return await self.client.run(self.steps.put(keys, objects))

    async def get(self, keys: Sequence[str], objects: Sequence[Pieces]) -> list[bool]:
        return await self.client.run(self.steps.get(keys, objects))

    async def get_upto(self, keys: Sequence[str], objects: Sequence[Pieces]) -> list[int]:
        return await self.client.run(self.steps.get_upto(keys, objects))

    async def leading_present(self, keys: Sequence[str], *, lock_for: float = 0.0) -> int:
        return await self.client.run(self.steps.leading_present(keys, lock_for))

    async def present(self, keys: Sequence[str], *, lock_for: float = 0.0) -> list[bool]:
        return await self.client.run(self.steps.present(keys, lock_for))

    async def remove(self, keys: Sequence[str]) -> list[bool]:
        return await self.client.run(self.steps.remove(keys))

    async def list_keys(self, prefix: str, *, limit: int | None = None) -> list[str]:
        return await self.client.run(self.steps.list_keys(prefix, limit))

    async def remove_prefix(self, prefix: str) -> int:
        return await self.client.run(self.steps.remove_prefix(prefix))

    async def register_namespace(self, prefix: str) -> None:
        await self.client.run(self.steps.register_namespace(prefix))

    async def aclose(self) -> None:
        await self.client.aclose()


def _one_object_per_key(keys: Sequence[str], objects: Sequence[Pieces]) -> None:
    """A put or get pairs each key with its object: a count that differs is a caller's bug."""
    if len(keys) != len(objects):
        raise ValueError(f"{len(keys)} keys but {len(objects)} objects")


def _size(obj: Pieces) -> int:
    return sum(piece.nbytes for piece in obj)


def byte_view(buffer: Any, *, writable: bool = True) -> memoryview:
    """A flat byte view of a buffer-protocol object (a numpy array, a bytearray, a
    mmap), sharing its memory. Raises ValueError for a non-contiguous buffer, or a
    read-only one when ``writable`` (gets write into their pieces; puts only read)."""
    view = memoryview(buffer)
    if writable and view.readonly:
        raise ValueError("a piece to load into must be writable")
    if not view.c_contiguous:
        raise ValueError("a piece must be contiguous")
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view

"""The blocking client: thread-safe, with batch calls as the fast path.

A shell over :mod:`kvstored.client.core`, which decides everything; this module only
moves bytes. Each thread gets its own connections (to the master and to each node it
talks to), so threads never wait on each other's requests. A batch costs one round trip
to the master, then one request per node holding data (or none, for objects in a DRAM
segment on this host, which are copied straight out of shared memory).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any, TypeVar

from kvstored.client.connection import Connection, default_reply_spin
from kvstored.client.core import Call, Effect, Greet, ObjectInfo, Pause, Step, drive
from kvstored.client.shell import CoreShell
from kvstored.errors import BadRequestError, StoreError
from kvstored.protocol import Tier
from kvstored.protocol.node_api import GetReply
from kvstored.protocol.ops import GET_HELD

T = TypeVar("T")


class Client(CoreShell):
    """A connection to a kvstored cluster. Use :func:`connect`."""

    def __init__(self, master: str, *, transport: str = "auto", token: str | None = None,
                 token_file: str | None = None, timeout: float = 30.0,
                 connect_timeout: float | None = None,
                 reply_spin: float | None = None) -> None:
        self._start_core(master, transport, token, token_file, timeout, connect_timeout)
        #: Seconds a call polls for its reply before it blocks (0: block at once).
        self.reply_spin = default_reply_spin() if reply_spin is None else reply_spin
        self._local = threading.local()
        self._all: list[Connection] = []
        self._all_lock = threading.Lock()
        self._closed = False
        self._connection(None)  # fail now, not on first use, if the master is unreachable

    # -- the shell ---------------------------------------------------------------------

    def _connection(self, node: str | None) -> Connection:
        if self._closed:
            raise BadRequestError("the client is closed")
        conns: dict[str | None, Connection] = self._local.__dict__.setdefault("conns", {})
        conn = conns.get(node)
        if conn is None or conn.closed:
            conn = conns[node] = Connection(self.core.endpoint(node), self.core.token,
                                            timeout=self.timeout,
                                            connect_timeout=self.connect_timeout,
                                            reply_spin=self.reply_spin)
            with self._all_lock:
                self._all.append(conn)
        return conn

    def _perform(self, effect: Effect) -> Any:
        if type(effect) is Call:  # the usual effect first, without matching
            return self._connection(effect.node).call(effect.spec, effect.request,
                                                      effect.payload, effect.into,
                                                      effect.sums)
        match effect:
            case Greet(node):
                return self._connection(node).hello
            case Pause(seconds):
                time.sleep(seconds)

    def _run(self, step: Step[T]) -> T:
        return drive(step, self._perform)

    def run(self, step: Step[T]) -> T:
        """Drive ``step``, one composed of the core's operations (``client.core``): how
        kvstored.integrations.objects runs its logic on this client or the asyncio one."""
        return drive(step, self._perform)

    # -- writes ------------------------------------------------------------------------

    def put(self, key: str, data: Any) -> bool:
        """Store ``data`` under ``key``. False if the key already existed (write-once)."""
        return self.batch_put([key], [data])[0]

    def batch_put(self, keys: Sequence[str], values: Sequence[Any]) -> list[bool]:
        """Store many objects; True for each stored now, False for each that existed."""
        return self._run(self.core.batch_put(keys, values))

    def put_parts(self, key: str, pieces: Sequence[Any]) -> bool:
        """Store the object made of ``pieces`` (buffers, concatenated in order) under
        ``key``, without joining them: see :meth:`batch_put_parts`."""
        return self.batch_put_parts([key], [pieces])[0]

    def batch_put_parts(self, keys: Sequence[str], objects: Sequence[Sequence[Any]]
                        ) -> list[bool]:
        """Store many objects, each given as its list of pieces (buffers, concatenated
        in order: the pages of an engine's KV pool). No copy joins them: over TCP they go
        out in one scatter list, into a node's segment on this host one copy per piece.
        As :meth:`batch_put` otherwise."""
        return self._run(self.core.batch_put_parts(keys, objects))

    # -- reads -------------------------------------------------------------------------

    def get(self, key: str) -> bytes | None:
        """The value of ``key``, or None."""
        return self.batch_get([key])[0]

    def batch_get(self, keys: Sequence[str]) -> list[bytes | None]:
        """The values of ``keys`` (None where missing), in one master round trip."""
        return self._run(self.core.read_values(keys))

    def get_into(self, key: str, buf: Any) -> int:
        """Read ``key`` into ``buf``; the number of bytes written, or -1 if missing."""
        read = self.core.plan_held_read(key, buf)
        if read is not None:  # one trip, without the step machinery (see the core)
            try:
                reply: GetReply | StoreError = self._connection(read.node).call(
                    GET_HELD, read.request, into=read.into, sums=read.sums)
            except StoreError as exc:
                reply = exc
            size = self.core.finish_held_read(read, reply)
            if size is not None:
                return size
        return self.batch_get_into([key], [buf])[0]

    def batch_get_into(self, keys: Sequence[str], buffers: Sequence[Any], *,
                       tiers: list[Tier | None] | None = None) -> list[int]:
        """Read many objects into caller buffers; per key the length, or -1 if missing.
        ``tiers``, if given, is filled with the tier each key was read from (None where
        missing)."""
        return self._run(self.core.read_into(keys, buffers, tiers))

    def get_into_parts(self, key: str, pieces: Sequence[Any]) -> int:
        """Read ``key`` into ``pieces`` (writable buffers, filled in order); the number
        of bytes written, or -1 if missing. See :meth:`batch_get_into_parts`."""
        return self.batch_get_into_parts([key], [pieces])[0]

    def batch_get_into_parts(self, keys: Sequence[str], objects: Sequence[Sequence[Any]],
                             *, tiers: list[Tier | None] | None = None) -> list[int]:
        """Read many objects, each into its list of pieces, with no staging copy: over
        TCP the bytes are received straight into the pieces, from a segment on this host
        copied piece by piece. Per key the length, or -1 if missing (a copy that fails
        the object's checksum is never a hit). Pieces holding fewer bytes than their
        object raise BadRequestError before any byte lands; a shorter object fills the
        start of its pieces. ``tiers`` as in :meth:`batch_get_into`."""
        return self._run(self.core.read_into_parts(keys, objects, tiers))

    # -- metadata ----------------------------------------------------------------------

    def exists(self, key: str) -> bool:
        return self.batch_exists([key])[0]

    def batch_exists(self, keys: Sequence[str]) -> list[bool]:
        return self._run(self.core.batch_exists(keys))

    def prefix_hits(self, keys: Sequence[str], *, lock_for: float | None = None) -> int:
        """How many leading keys exist (the prefix-cache rule of HiCache and LMCache).
        With ``lock_for`` (seconds), those leading keys are also locked against eviction
        until this client reads them, unlocks them or the time is up (as
        :meth:`batch_lookup_and_lock`); no key after the first miss is locked."""
        return self._run(self.core.prefix_hits(keys, lock_for))

    def batch_lookup_and_lock(self, keys: Sequence[str], ttl: float) -> list[bool]:
        """Which keys exist, each one found locked against eviction for ``ttl`` seconds
        (cut to the master's ``master.max_lock_ttl``). A lock ends at this client's next
        read of the key, at :meth:`batch_unlock`, or at its expiry; so a prefetch that
        saw a hit finds the object when it reads it (docs/client.md)."""
        return self._run(self.core.batch_lookup_and_lock(keys, ttl))

    def batch_unlock(self, keys: Sequence[str]) -> list[bool]:
        """End this client's locks on ``keys``; True where one was still running."""
        return self._run(self.core.batch_unlock(keys))

    def remove(self, key: str) -> bool:
        return self.batch_remove([key])[0]

    def batch_remove(self, keys: Sequence[str]) -> list[bool]:
        return self._run(self.core.batch_remove(keys))

    def batch_remove_prefix(self, prefix: str) -> int:
        """Remove every object whose key starts with ``prefix`` (not empty); how many
        went. A put under it in flight when this runs does not land (it reports the
        object as not stored); one that starts afterwards does (docs/client.md)."""
        return self._run(self.core.batch_remove_prefix(prefix))

    def register_namespace(self, prefix: str) -> int:
        """Have the master count ``prefix`` (a key prefix ending in ``/``) as a
        namespace: its objects and bytes per tier in ``status`` and the metrics. How
        many objects it holds now. Idempotent."""
        return self._run(self.core.register_namespace(prefix))

    def stat(self, key: str) -> ObjectInfo | None:
        return self._run(self.core.stat(key))

    def locate(self, key: str) -> dict[str, dict[str, Any]]:
        """Where each node holding ``key`` keeps its bytes, for debugging: node name ->
        ``{"dram": {"segment", "offset", "size"} | None, "ssd": {"path", "offset",
        "length", "record_offset", "device"} | None}``, or ``{"error": message}`` for a
        node that could not be asked. Empty if there is no such object. Costs a stat and
        one request per node (plus a status if this client never talked to the node).
        """
        return self._run(self.core.locate(key))

    def call(self, op: str, **args: Any) -> dict[str, Any]:
        """A raw master request, for admin tools (status, flush, evict, recover, list):
        its reply as a map (see kvstored.protocol.master_api for the fields)."""
        return self._run(self.core.raw(op, args))

    # -- lifecycle ---------------------------------------------------------------------

    def close(self) -> None:
        self._closed = True
        with self._all_lock:
            for conn in self._all:
                conn.close()
            self._all.clear()
        self.core.segments.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def connect(master: str = "127.0.0.1:7700", *, transport: str = "auto",
            token: str | None = None, token_file: str | None = None,
            timeout: float = 30.0, connect_timeout: float | None = None,
            reply_spin: float | None = None) -> Client:
    """Connect to the cluster whose master listens at ``master``.

    ``transport`` is ``auto`` (shared memory for DRAM objects on this host, TCP
    otherwise), ``tcp``, or ``shm`` (shared memory only; an error for anything else).
    ``timeout`` bounds each request; ``connect_timeout`` (default: ``timeout``) bounds
    connecting to the master or a node and the hello that follows. ``reply_spin`` is
    how long a call polls for its reply before its thread blocks (0: block at once; by
    default 200 µs on a virtual machine whose idle vCPUs halt at once, where waking one
    costs more than a loopback round trip, else 0; docs/client.md).

    The client token is ``token``, else the first line of ``token_file``, else the file
    ``security.token_file`` of the configuration names (by default
    ``~/.config/kvstored/token``, which the master creates for its user); see
    docs/security.md.
    """
    return Client(master, transport=transport, token=token, token_file=token_file,
                  timeout=timeout, connect_timeout=connect_timeout, reply_spin=reply_spin)


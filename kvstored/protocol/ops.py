"""Every op, once: who may call it, the message its request carries and the one its reply
carries, and whether either has a payload; and the hello that opens every connection.

:class:`OpSpec` is also the codec of one op's exchange, without I/O: ``request_header``
and ``check`` (the server checks every request against its declaration before the
handler runs, so a handler only ever sees the types it was written for, and a wrong type,
a negative size, a missing field or garbage nested inside gets a ``bad_request`` naming
the field), ``reply_header`` and ``decode_reply``. What a field *means* (a key that does
not exist, a node that is not registered) is the handler's business.
"""

from __future__ import annotations

import dataclasses
import os
import socket
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Generic, TypeVar

from kvstored.errors import BadRequestError, StoreError, UnreachableError, from_wire
from kvstored.protocol.compiled import Compiled
from kvstored.protocol.enums import Op, Role
from kvstored.protocol.master_api import (
    CommitReply,
    CommitRequest,
    Empty,
    EvictReply,
    EvictRequest,
    ExistsReply,
    FlushReply,
    FlushRequest,
    HeartbeatReply,
    HeartbeatRequest,
    KeysRequest,
    ListReply,
    ListRequest,
    LockReply,
    LockRequest,
    LookupReply,
    LookupRequest,
    NamespaceReply,
    NamespaceRequest,
    NodeKeysRequest,
    NodeRequest,
    PrefixHitsReply,
    PutTargetReply,
    PutTargetRequest,
    RecoverReply,
    RecoverRequest,
    RegisterObjectsReply,
    RegisterObjectsRequest,
    RegisterReply,
    RegisterRequest,
    RemovePrefixReply,
    RemovePrefixRequest,
    RemoveReply,
    StatReply,
    StatRequest,
    StatusReply,
    UnlockReply,
    UnlockRequest,
    UnregisterReply,
)
from kvstored.protocol.messages import Message, message
from kvstored.protocol.node_api import (
    AllocReply,
    CopyOutReply,
    GetReply,
    GetRequest,
    GetTrailer,
    HeldGetRequest,
    LocateReply,
    PutReply,
    PutRequest,
    RegionRequest,
    RegisterMemoryReply,
    RegisterMemoryRequest,
    ReportCorruptReply,
    ReportCorruptRequest,
    RevokeRequest,
)
from kvstored.protocol.shapes import Fields
from kvstored.wire import ConnectionClosed, FrameError, Into, Parts

#: Version 2: typed messages, batches as columns, tasks with a ``kind``. Version 3: reads
#: in one trip (``get_held``, the master's ``revoke``, the permit, ``held_reads``). Version
#: 4: a ``get`` reply with SSD items streams them as they are read, then a trailer.
#: Version 5: ``get_held`` serves SSD copies of held versions the same way.
PROTOCOL_VERSION = 5

Req = TypeVar("Req", bound=Message)
Rep = TypeVar("Rep", bound=Message)


@dataclass(frozen=True, eq=False)
class OpSpec(Generic[Req, Rep]):
    """One op: its name, who may call it, its request and reply messages, and whether
    the request (``payload``) or the reply (``reply_payload``: one item per entry of the
    reply's ``sizes`` that is not negative) carries bytes after the header."""

    op: Op
    role: Role
    request: type[Req]
    reply: type[Rep]
    payload: bool = False
    reply_payload: bool = False
    #: The frame that follows the payload of a reply whose ``trailer`` field is set: the
    #: final ``sizes`` (see :meth:`with_trailer`). None: this op's replies have none.
    trailer: type[Message] | None = None

    @cached_property
    def name(self) -> str:
        return self.op.value

    def _fields(self) -> Fields:
        return self.request.shape()

    # The generated check, decode and encode of the two messages (see
    # kvstored.protocol.compiled): a request and its reply go through them on every call.

    @cached_property
    def _request_codec(self) -> Compiled:
        return _codec(self.request)

    @cached_property
    def _reply_codec(self) -> Compiled:
        return _codec(self.reply)

    def request_header(self, request: Req) -> dict[str, Any]:
        return self._request_codec.encode_into(request, {"op": self.name})

    def check(self, header: Mapping[str, Any]) -> Req:
        """The request in ``header``; :class:`BadRequestError` naming the field if it
        does not fit this op."""
        request = self._request_codec.parse(header)
        if request is None:
            where, message = self._fields().explain_fields(dict(header))
            raise BadRequestError(f"malformed {self.name} request: "
                                  + " ".join(filter(None, (where, message))))
        return request

    @staticmethod
    def reply_header(reply: Message) -> dict[str, Any]:
        return _codec(type(reply)).encode_into(reply, {"ok": True})

    def decode_reply(self, header: Mapping[str, Any]) -> Rep:
        """The reply in ``header``, or the error it carries raised. A reply that is not
        this op's raises :class:`~kvstored.wire.FrameError`: the peer is not speaking
        this protocol, and the connection cannot be trusted any more."""
        if header.get("ok") is not True:
            error = header.get("error")
            raise from_wire(error if isinstance(error, dict) else {})
        codec = self._reply_codec
        if self.reply_payload:
            # Its sizes say how to read the bytes that follow: check them (cheap).
            reply = codec.parse(header)
            if reply is None:
                where, message = self.reply.shape().explain_fields(dict(header))
                raise FrameError(f"malformed {self.name} reply: {where} {message}")
        else:
            try:
                reply = codec.decode(header)
            except (KeyError, TypeError, ValueError) as exc:
                raise FrameError(f"malformed {self.name} reply: {exc!r:.200}") from None
        if getattr(reply, "trailer", False) and self.trailer is None:
            raise FrameError(f"a {self.name} reply announces a trailer; this op has none")
        return reply

    def trailer_follows(self, reply: Rep) -> bool:
        """Whether a trailer frame follows ``reply``'s payload (read it with
        :meth:`with_trailer` once the payload is in)."""
        return self.trailer is not None and getattr(reply, "trailer", False) is True

    def trailer_header(self, sizes: list[int]) -> dict[str, Any]:
        """The trailer frame's header, with the final ``sizes``."""
        assert self.trailer is not None, f"{self.name} replies have no trailer"
        return self.reply_header(self.trailer(sizes=sizes))  # pyright: ignore[reportCallIssue]

    def with_trailer(self, reply: Rep, header: Mapping[str, Any]) -> Rep:
        """``reply`` with the final sizes of its trailer frame (``header``). A final size
        either equals the one the reply announced (the item is good) or is negative: the
        item's bytes, already received, are not the object's. Anything else is a
        :class:`~kvstored.wire.FrameError` (the peer does not speak this protocol)."""
        assert self.trailer is not None, f"{self.name} replies have no trailer"
        shape = self.trailer.shape()
        if header.get("ok") is not True or not shape.ok(header):
            where, message = shape.explain_fields(dict(header))
            raise FrameError(f"malformed {self.name} trailer: {where} {message}".strip())
        final: list[int] = shape.decode(header).sizes  # pyright: ignore[reportAttributeAccessIssue]
        planned: list[int] = reply.sizes  # pyright: ignore[reportAttributeAccessIssue]
        if len(final) != len(planned) or any(
                f != p and (f >= 0 or p < 0) for f, p in zip(final, planned)):
            raise FrameError(f"a {self.name} trailer's sizes {final[:8]!r:.200} do not "
                             f"follow its reply's {planned[:8]!r:.200}")
        return dataclasses.replace(reply, sizes=final)  # pyright: ignore[reportArgumentType]

    def payload_items(self, reply: Rep, into: Sequence[Into]
                      ) -> list[tuple[int, list[memoryview]]]:
        """Where the items of ``reply``'s payload go, in order, each as ``(i, views)``:
        ``into[i][:size]`` for each entry of its ``sizes`` that is not negative (no item:
        the peer does not have it), or the first ``size`` bytes of its pieces when
        ``into[i]`` is :class:`Parts`. An item larger than its buffer raises FrameError
        before anything is read."""
        sizes = getattr(reply, "sizes", None)
        if not self.reply_payload or not isinstance(sizes, list) or len(sizes) != len(into):
            raise FrameError(f"a {self.name} reply carries no payload for {len(into)} "
                             "buffers")
        items = []
        for i, (view, size) in enumerate(zip(into, sizes)):
            if size > len(view):
                raise FrameError(f"an item of {size} bytes for a {len(view)}-byte buffer")
            if size >= 0:
                items.append((i, view.head(size) if isinstance(view, Parts)
                              else [view[:size]]))
        return items


def _codec(message_type: type[Message]) -> Compiled:
    compiled = message_type.shape().compiled()
    assert compiled is not None, "a message type's shape builds it"
    return compiled


# The errors of a connection, worded once: every client (blocking, trio, asyncio) and the
# nodes' caller raise these, so the same failure reads the same whichever met it.

def no_answer(seconds: float) -> str:
    """Why, when a peer was given ``seconds`` and said nothing."""
    return f"no answer within {seconds:g}s"


def _reason(why: BaseException | str) -> str:
    """``why`` in the system's words (``Connection refused``), however the event loop
    wrapped it: asyncio's ``Connect call failed (...)`` carries the errno, trio's "all
    attempts failed" the error of each address it tried (the last one is said, as
    :func:`socket.create_connection` raises the last)."""
    if isinstance(why, str):
        return why
    if isinstance(why, OSError):
        tried = why.__cause__
        if why.errno is None and isinstance(tried, BaseExceptionGroup) and tried.exceptions:
            return _reason(tried.exceptions[-1])
        if why.errno and why.errno > 0 and not isinstance(why, socket.gaierror):
            return os.strerror(why.errno)
    return getattr(why, "strerror", None) or str(why) or type(why).__name__


def cannot_reach(where: str, why: BaseException | str) -> UnreachableError:
    """Connecting to ``where`` failed (refused, no route, no answer in time)."""
    return UnreachableError(f"cannot reach {where} ({_reason(why)}); is kvstored running?")


def no_hello(where: str, why: BaseException | str) -> UnreachableError:
    """``where`` accepted the connection but did not answer the hello as kvstored does
    (said nothing in time, or something that is not a frame)."""
    return UnreachableError(f"{where} did not answer the hello as kvstored does "
                            f"({_reason(why)}); is that a kvstored master's or node's "
                            "address?")


def lost_connection(op: str, where: str, why: BaseException | str) -> UnreachableError:
    """The error of a call whose exchange broke off (the connection failed or timed out,
    or the peer answered something that is not the op's reply); the caller has closed
    the connection."""
    text = why if isinstance(why, str) else str(why) or type(why).__name__
    # The op last: the CLI already starts the line with its command (often the same
    # word), so "kvstore status: the connection to ... failed during status: ...".
    return UnreachableError(f"the connection to {where} failed during {op}: {text}")


#: What breaks an exchange off, whatever the loop: the socket failed, the peer closed, or
#: it sent something that is not a frame.
BROKEN: tuple[type[BaseException], ...] = (OSError, ConnectionClosed, FrameError)


@contextmanager
def connect_failures(where: str, timeout: float, *,
                     timeouts: tuple[type[BaseException], ...] = (TimeoutError,)
                     ) -> Iterator[None]:
    """Connecting to ``where`` failed: refused, unresolvable, or no answer within
    ``timeout`` (``timeouts``: the loop's own), in the words every client uses."""
    try:
        yield
    except timeouts:
        raise cannot_reach(where, no_answer(timeout)) from None
    except OSError as exc:
        raise cannot_reach(where, exc) from None


class exchange_failures:  # lower case: used as a function, ``with exchange_failures(...)``
    """How an exchange with ``where`` fails, in the words every client uses (wrap the
    hello with ``op`` None, a call with its op's name). One that breaks off (``broken``)
    or takes longer than ``timeout`` (``timeouts``: the loop's own) closes the connection
    with ``close`` and raises :class:`UnreachableError`. An error the peer answered is
    raised as it is; it closes the connection only at the hello (a refused hello ends
    it). Anything else (cancelled, interrupted) closes it too: the stream is out of step.
    A plain ``with``, so blocking and async code alike use it; a class, not a generator,
    since it wraps every call (entering and leaving cost a tenth as much)."""

    __slots__ = ("broken", "close", "op", "timeout", "timeouts", "where")

    def __init__(self, where: str, timeout: float, close: Callable[[], None], *,
                 op: str | None = None,
                 timeouts: tuple[type[BaseException], ...] = (TimeoutError,),
                 broken: tuple[type[BaseException], ...] = BROKEN) -> None:
        self.where, self.timeout, self.close, self.op = where, timeout, close, op
        self.timeouts, self.broken = timeouts, broken

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: object) -> None:
        if exc is None:
            return
        op, where = self.op, self.where
        if isinstance(exc, StoreError):
            if op is None:
                self.close()
            return
        self.close()
        if isinstance(exc, self.timeouts):
            why: BaseException | str = no_answer(self.timeout)
        elif isinstance(exc, self.broken):
            why = exc
        else:
            return
        raise (no_hello(where, why) if op is None else lost_connection(op, where, why)) from None


def _table(*specs: OpSpec[Any, Any]) -> dict[str, OpSpec[Any, Any]]:
    return {spec.name: spec for spec in specs}


# -- the hello -----------------------------------------------------------------------------

@message
class Hello(Message):
    """The first frame of every connection: who the peer is and what it can prove."""

    role: Role = Role.CLIENT
    token: str | None = None
    version: int = PROTOCOL_VERSION

    @classmethod
    def parse(cls, header: Mapping[str, Any]) -> Hello:
        """The hello in ``header``; :class:`BadRequestError` if it is not one."""
        if header.get("op") != Op.HELLO:
            raise BadRequestError("the first frame must be hello")
        if "version" not in header:
            raise BadRequestError("malformed hello request: version is missing")
        return HELLO.check(header)


@message
class HelloReply(Message):
    """A server's answer to a hello. Clients need none of its fields to work (a peer may
    answer with ``ok`` alone); each says something about the server."""

    service: str = ""
    role: Role = Role.CLIENT
    #: The master's: how often nodes send heartbeats.
    heartbeat_interval: float | None = None
    #: A node's: the most bytes of SSD reads one get may need staged
    #: (security.max_read_staging); clients split their gets below it.
    max_read_staging: int | None = None


HELLO = OpSpec(Op.HELLO, Role.CLIENT, Hello, HelloReply)

# -- the master ------------------------------------------------------------------------------
# Node ops change what the cluster believes is stored where, so only a connection holding
# the node token may send them.

REGISTER = OpSpec(Op.REGISTER, Role.NODE, RegisterRequest, RegisterReply)
REGISTER_OBJECTS = OpSpec(Op.REGISTER_OBJECTS, Role.NODE, RegisterObjectsRequest,
                          RegisterObjectsReply)
REGISTER_DONE = OpSpec(Op.REGISTER_DONE, Role.NODE, NodeRequest, Empty)
COMMIT = OpSpec(Op.COMMIT, Role.NODE, CommitRequest, CommitReply)
HEARTBEAT = OpSpec(Op.HEARTBEAT, Role.NODE, HeartbeatRequest, HeartbeatReply)
SSD_EVICTED = OpSpec(Op.SSD_EVICTED, Role.NODE, NodeKeysRequest, Empty)
# A node shutting down: first no more puts there, then (once it has written its DRAM-only
# objects to SSD) gone, its replicas dropped at once.
LEAVING = OpSpec(Op.LEAVING, Role.NODE, NodeRequest, Empty)
UNREGISTER = OpSpec(Op.UNREGISTER, Role.NODE, NodeRequest, UnregisterReply)

PUT_TARGET = OpSpec(Op.PUT_TARGET, Role.CLIENT, PutTargetRequest, PutTargetReply)
PUT_ABORT = OpSpec(Op.PUT_ABORT, Role.CLIENT, KeysRequest, Empty)
LOOKUP = OpSpec(Op.LOOKUP, Role.CLIENT, LookupRequest, LookupReply)
EXISTS = OpSpec(Op.EXISTS, Role.CLIENT, KeysRequest, ExistsReply)
PREFIX_HITS = OpSpec(Op.PREFIX_HITS, Role.CLIENT, KeysRequest, PrefixHitsReply)
STAT = OpSpec(Op.STAT, Role.CLIENT, StatRequest, StatReply)
REMOVE = OpSpec(Op.REMOVE, Role.CLIENT, KeysRequest, RemoveReply)
LIST = OpSpec(Op.LIST, Role.CLIENT, ListRequest, ListReply)
STATUS = OpSpec(Op.STATUS, Role.CLIENT, Empty, StatusReply)
FLUSH = OpSpec(Op.FLUSH, Role.CLIENT, FlushRequest, FlushReply)
EVICT = OpSpec(Op.EVICT, Role.CLIENT, EvictRequest, EvictReply)
RECOVER = OpSpec(Op.RECOVER, Role.CLIENT, RecoverRequest, RecoverReply)
# Lookup-and-lock: what a lookup finds is held against eviction until the lock's read,
# its unlock or its expiry (a prefetch that saw a hit can still read it).
LOCK = OpSpec(Op.LOCK, Role.CLIENT, LockRequest, LockReply)
UNLOCK = OpSpec(Op.UNLOCK, Role.CLIENT, UnlockRequest, UnlockReply)
# Every object under a prefix, and every put under it still in flight, in one call.
REMOVE_PREFIX = OpSpec(Op.REMOVE_PREFIX, Role.CLIENT, RemovePrefixRequest, RemovePrefixReply)
ADD_NAMESPACE = OpSpec(Op.ADD_NAMESPACE, Role.CLIENT, NamespaceRequest, NamespaceReply)

MASTER_OPS = _table(REGISTER, REGISTER_OBJECTS, REGISTER_DONE, COMMIT, HEARTBEAT, SSD_EVICTED,
                    LEAVING, UNREGISTER, PUT_TARGET, PUT_ABORT, LOOKUP, EXISTS, PREFIX_HITS,
                    STAT, REMOVE, LIST, STATUS, FLUSH, EVICT, RECOVER, LOCK, UNLOCK,
                    REMOVE_PREFIX, ADD_NAMESPACE)

# -- a node's data server ----------------------------------------------------------------------
# Clients put and get bytes here; the master revokes what get_held may serve.

PUT = OpSpec(Op.PUT, Role.CLIENT, PutRequest, PutReply, payload=True)
ALLOC = OpSpec(Op.ALLOC, Role.CLIENT, PutRequest, AllocReply)
SEAL = OpSpec(Op.SEAL, Role.CLIENT, KeysRequest, PutReply)
ABORT = OpSpec(Op.ABORT, Role.CLIENT, KeysRequest, Empty)
GET = OpSpec(Op.GET, Role.CLIENT, GetRequest, GetReply, reply_payload=True,
             trailer=GetTrailer)
# A get of keys the client knows this node holds, without a master lookup first: what the
# node serves is a version the master has not removed (it revokes before a remove returns).
GET_HELD = OpSpec(Op.GET_HELD, Role.CLIENT, HeldGetRequest, GetReply, reply_payload=True,
                  trailer=GetTrailer)
LOCATE = OpSpec(Op.LOCATE, Role.CLIENT, KeysRequest, LocateReply)
# A client read bytes of a DRAM copy here that failed the object's checksum; the node
# checks its own copy (so a client cannot make it drop a good one).
REPORT_CORRUPT = OpSpec(Op.REPORT_CORRUPT, Role.CLIENT, ReportCorruptRequest,
                        ReportCorruptReply)

# Registered host memory: a same-host client's shared-memory KV pool, which the node
# reads from (copy_in, after an alloc) and writes to (copy_out) itself.
REGISTER_MEMORY = OpSpec(Op.REGISTER_MEMORY, Role.CLIENT, RegisterMemoryRequest,
                         RegisterMemoryReply)
COPY_IN = OpSpec(Op.COPY_IN, Role.CLIENT, RegionRequest, PutReply)
COPY_OUT = OpSpec(Op.COPY_OUT, Role.CLIENT, RegionRequest, CopyOutReply)

# The master, before a remove returns: the node stops serving those keys to get_held.
REVOKE = OpSpec(Op.REVOKE, Role.NODE, RevokeRequest, Empty)

NODE_OPS = _table(PUT, ALLOC, SEAL, ABORT, GET, GET_HELD, LOCATE, REPORT_CORRUPT,
                  REGISTER_MEMORY, COPY_IN, COPY_OUT, REVOKE)

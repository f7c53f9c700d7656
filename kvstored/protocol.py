"""The control protocol's vocabulary: roles, the hello, and the shape of every request.

Each op the master or a node serves is declared here once, with the :class:`Role` a
connection needs to call it and the fields its request carries. :mod:`kvstored.rpc`
checks every request against its declaration before the handler runs, so a handler only
ever sees the types it was written for, and a request with a wrong type, a negative
size, a missing field or garbage nested inside gets a ``bad_request`` naming the field.
Extra fields are ignored (an older server talking to a newer peer). What a field *means*
(a key that does not exist, a node that is not registered) is still the handler's
business.

It also holds the typed messages master and node share beyond request shapes: what a
node reports about an offload that did not land (:class:`OffloadFailure`,
:class:`OffloadFailed`).

This module is not the wire format (that is :mod:`kvstored.wire`) and not the server
loop (:mod:`kvstored.rpc`); it does no I/O.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvstored.errors import BadRequestError
from kvstored.sdk.types import MAX_KEY_BYTES

PROTOCOL_VERSION = 1
#: Keys in one batch request (lookup, put_target, get, ...).
MAX_BATCH = 65536
#: The longest wait a client may ask the master for (flush, recover).
MAX_WAIT_SECONDS = 24 * 3600.0


class Role(enum.Enum):
    """Who a connection speaks for, established by its hello.

    A client reads and writes objects and runs the admin ops (status, flush, evict,
    recover). A node also registers, commits and reports; it holds the node token.
    A node may call client ops too.
    """

    CLIENT = "client"
    NODE = "node"

    def may_call(self, required: Role) -> bool:
        return self is Role.NODE or required is Role.CLIENT


# -- field shapes -------------------------------------------------------------------------
# Each shape answers ``ok(value)``, and ``all_ok(values)`` for every item of a list at
# once (batches of thousands of keys are checked on every call, so that path runs in C:
# set(map(type, ...)), min, max); only for a value that is not ok, ``explain(value)``
# says where inside it the problem is and what was expected, for the error message.

def _kind(value: Any) -> str:
    if value is None:
        return "nil"
    return {bool: "a boolean", int: "an integer", float: "a float", str: "a string",
            bytes: "binary", list: "a list", dict: "a map"}.get(type(value), type(value).__name__)


class Shape:
    """What one field must be."""

    expected = "?"

    def ok(self, value: Any) -> bool:
        raise NotImplementedError

    def all_ok(self, values: list[Any]) -> bool:
        """``ok`` for every one of ``values`` (a non-empty list)."""
        return all(map(self.ok, values))

    def explain(self, value: Any) -> tuple[str, str]:
        """``(path inside value, message)`` for a value that is not ok."""
        return "", f"must be {self.expected}, not {_kind(value)}"


def _all_of_type(values: list[Any], kind: type) -> bool:
    return set(map(type, values)) == {kind}


class Str(Shape):
    expected = "a string"

    def ok(self, value: Any) -> bool:
        return type(value) is str

    def all_ok(self, values: list[Any]) -> bool:
        return _all_of_type(values, str)


class KeyStr(Shape):
    """An object key: a non-empty string of at most MAX_KEY_BYTES bytes of UTF-8 (what
    every backend accepts; see :func:`kvstored.sdk.types.encode_key`)."""

    expected = f"a key (a non-empty string of at most {MAX_KEY_BYTES} bytes)"

    def ok(self, value: Any) -> bool:
        # A UTF-8 character is at most 4 bytes: most keys need no encoding to tell.
        return type(value) is str and (0 < len(value) <= MAX_KEY_BYTES // 4 or (
            len(value) > 0 and len(value.encode()) <= MAX_KEY_BYTES))

    def all_ok(self, values: list[Any]) -> bool:
        if not _all_of_type(values, str):
            return False
        lengths = list(map(len, values))
        return (min(lengths) > 0 and max(lengths) <= MAX_KEY_BYTES // 4) or all(
            map(self.ok, values))

    def explain(self, value: Any) -> tuple[str, str]:
        if type(value) is str:
            return "", f"must be {self.expected}; this one has {len(value.encode())} bytes"
        return super().explain(value)


class Int(Shape):
    """An integer in ``[lo, hi]`` (booleans are not integers here)."""

    def __init__(self, lo: int | None = None, hi: int | None = None) -> None:
        self.lo: float = -math.inf if lo is None else lo
        self.hi: float = math.inf if hi is None else hi
        self.expected = "an integer" + (
            f" from {lo} to {hi}" if lo is not None and hi is not None
            else f" >= {lo}" if lo is not None else f" <= {hi}" if hi is not None else "")

    def ok(self, value: Any) -> bool:
        return type(value) is int and self.lo <= value <= self.hi

    def all_ok(self, values: list[Any]) -> bool:
        return _all_of_type(values, int) and self.lo <= min(values) and max(values) <= self.hi

    def explain(self, value: Any) -> tuple[str, str]:
        if type(value) is int:
            return "", f"must be {self.expected}, not {value}"
        return super().explain(value)


class Seconds(Shape):
    """A finite, non-negative number of seconds, at most ``hi``."""

    def __init__(self, hi: float) -> None:
        self.hi = hi
        self.expected = f"a number of seconds from 0 to {hi:g}"

    def ok(self, value: Any) -> bool:
        return type(value) in (int, float) and math.isfinite(value) and 0 <= value <= self.hi

    def explain(self, value: Any) -> tuple[str, str]:
        if type(value) in (int, float):
            return "", f"must be {self.expected}, not {value!r}"
        return super().explain(value)


class Bool(Shape):
    expected = "a boolean"

    def ok(self, value: Any) -> bool:
        return type(value) is bool

    def all_ok(self, values: list[Any]) -> bool:
        return _all_of_type(values, bool)


class OneOf(Shape):
    def __init__(self, *choices: str) -> None:
        self.choices = choices
        self.expected = " or ".join(repr(c) for c in choices)

    def ok(self, value: Any) -> bool:
        return type(value) is str and value in self.choices

    def all_ok(self, values: list[Any]) -> bool:
        return _all_of_type(values, str) and set(values) <= set(self.choices)

    def explain(self, value: Any) -> tuple[str, str]:
        return "", f"must be {self.expected}, not {value!r:.40}"


class Opt(Shape):
    """``inner``, or nil; as a field of a request or a :class:`Record`, also absent."""

    def __init__(self, inner: Shape) -> None:
        self.inner = inner
        self.expected = f"{inner.expected} or nil"

    def ok(self, value: Any) -> bool:
        return value is None or self.inner.ok(value)

    def all_ok(self, values: list[Any]) -> bool:
        present = [v for v in values if v is not None]
        return not present or self.inner.all_ok(present)

    def explain(self, value: Any) -> tuple[str, str]:
        return self.inner.explain(value)


class List(Shape):
    def __init__(self, item: Shape, max_len: int = MAX_BATCH) -> None:
        self.item, self.max_len = item, max_len
        self.expected = f"a list of {item.expected}"

    def ok(self, value: Any) -> bool:
        if type(value) is not list or len(value) > self.max_len:
            return False
        # Item by item is cheaper for a few items; all_ok's C passes win beyond.
        return all(map(self.item.ok, value)) if len(value) <= 16 else self.item.all_ok(value)

    def explain(self, value: Any) -> tuple[str, str]:
        if type(value) is not list:
            return super().explain(value)
        if len(value) > self.max_len:
            return "", f"has {len(value)} items, more than {self.max_len}"
        for i, item in enumerate(value):
            if not self.item.ok(item):
                where, message = self.item.explain(item)
                return f"[{i}]{where}", message
        return "", "is fine"  # not reached: ok() said otherwise


class Tuple(Shape):
    """A list of fixed length with one shape per position."""

    def __init__(self, *items: Shape) -> None:
        self.items = items
        self.expected = f"a list of {len(items)} ({', '.join(i.expected for i in items)})"

    def ok(self, value: Any) -> bool:
        return type(value) is list and len(value) == len(self.items) and all(
            shape.ok(item) for shape, item in zip(self.items, value))

    def all_ok(self, values: list[Any]) -> bool:
        # Column by column: one C-level pass per position instead of a call per item.
        return (_all_of_type(values, list) and set(map(len, values)) == {len(self.items)}
                and all(shape.all_ok(list(column))
                        for shape, column in zip(self.items, zip(*values))))

    def explain(self, value: Any) -> tuple[str, str]:
        if type(value) is not list or len(value) != len(self.items):
            return super().explain(value)
        for i, (shape, item) in enumerate(zip(self.items, value)):
            if not shape.ok(item):
                where, message = shape.explain(item)
                return f"[{i}]{where}", message
        return "", "is fine"


class Record(Shape):
    """A map with these fields (an :class:`Opt` field may be absent); others are ignored."""

    def __init__(self, **fields: Shape) -> None:
        self.fields = fields
        self.expected = "a map"

    def ok(self, value: Any) -> bool:
        return type(value) is dict and _fields_ok(self.fields, value)

    def explain(self, value: Any) -> tuple[str, str]:
        if type(value) is not dict:
            return super().explain(value)
        where, message = _explain_fields(self.fields, value)
        return f".{where}", message


def _fields_ok(fields: Mapping[str, Shape], value: dict[str, Any]) -> bool:
    for name, shape in fields.items():
        if name in value:
            if not shape.ok(value[name]):
                return False
        elif not isinstance(shape, Opt):
            return False
    return True


def _explain_fields(fields: Mapping[str, Shape], value: dict[str, Any]) -> tuple[str, str]:
    for name, shape in fields.items():
        if name not in value:
            if not isinstance(shape, Opt):
                return name, "is missing"
        elif not shape.ok(value[name]):
            where, message = shape.explain(value[name])
            return name + where, message
    return "", "is fine"


class AnyValue(Shape):
    expected = "anything"

    def ok(self, value: Any) -> bool:
        return True


# -- typed reports ------------------------------------------------------------------------

class OffloadFailure(enum.Enum):
    """Why an object did not reach the node's SSD tier."""

    #: The SSD (its capacity, or the file system under it) is full. Retried with backoff.
    NO_SPACE = "no_space"
    #: Larger than the backend's ``max_value_size``: it can never be offloaded.
    TOO_LARGE = "too_large"
    #: The backend or the operating system refused. Retried with backoff.
    IO_ERROR = "io_error"
    #: The object left DRAM (removed or evicted) before it was written.
    GONE = "gone"
    #: Its DRAM copy failed its checksum (a same-host writer changed it after its seal);
    #: the copy was dropped, never written.
    CORRUPT = "corrupt"

    @property
    def retried(self) -> bool:
        """The node tries again by itself (the condition may clear)."""
        return self in (OffloadFailure.NO_SPACE, OffloadFailure.IO_ERROR)


@dataclass(frozen=True, slots=True)
class OffloadFailed:
    """One object's failed offload attempt, as the node reports it in a heartbeat."""

    key: str
    reason: OffloadFailure
    message: str

    @property
    def retrying(self) -> bool:
        return self.reason.retried

    def to_wire(self) -> list[Any]:
        return [self.key, self.reason.value, self.message]

    @classmethod
    def from_wire(cls, item: list[Any]) -> OffloadFailed:
        key, reason, message = item
        return cls(str(key), OffloadFailure(reason), str(message))


# -- ops ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class OpSpec:
    """One op: its name, who may call it, its request fields, and whether it takes a
    payload. ``same_length`` names list fields that hold one entry per key."""

    name: str
    role: Role
    fields: Mapping[str, Shape]
    payload: bool = False
    same_length: tuple[str, ...] = ()

    def check(self, header: dict[str, Any]) -> None:
        """Raise :class:`BadRequestError` if ``header`` does not fit this op."""
        if not _fields_ok(self.fields, header):
            where, message = _explain_fields(self.fields, header)
            raise BadRequestError(f"malformed {self.name} request: {where} {message}")
        if self.same_length:
            lengths = {name: len(header[name]) for name in self.same_length
                       if header.get(name) is not None}
            if len(set(lengths.values())) > 1:
                shown = ", ".join(f"{n} has {k}" for n, k in lengths.items())
                raise BadRequestError(f"malformed {self.name} request: one entry per key "
                                      f"expected, but {shown}")


Key = KeyStr()
Keys = List(Key)
Size = Int(0, 2**63 - 1)
Checksum = Int(0, 2**32 - 1)
Tier = OneOf("dram", "ssd")
NodeName = Str()
Port = Int(0, 65535)


def _ops(*specs: OpSpec) -> dict[str, OpSpec]:
    return {spec.name: spec for spec in specs}


#: The master's ops. Node ops change what the cluster believes is stored where, so only
#: a connection holding the node token may send them.
MASTER_OPS = _ops(
    OpSpec("register", Role.NODE, {"info": Record(
        node=NodeName, address=Tuple(Str(), Port), host=Str(), segment=Str(), token=Str(),
        dram_capacity=Size, ssd_capacity=Size, backend=Opt(Str()), shared=Opt(Bool()),
        max_value_size=Opt(Size),
        # How many objects register_objects will send (start-up progress in status).
        objects=Opt(Size))}),
    OpSpec("register_objects", Role.NODE, {
        "node": NodeName,
        "objects": List(Tuple(Key, Size, Checksum, Tier, Int(-1, 2**63 - 1)))}),
    OpSpec("register_done", Role.NODE, {"node": NodeName}),
    OpSpec("commit", Role.NODE, {"node": NodeName,
                                 "objects": List(Tuple(Key, Size, Checksum, Size))}),
    OpSpec("heartbeat", Role.NODE, {
        "node": NodeName,
        "stats": Opt(Record(dram_used=Opt(Size), ssd_used=Opt(Size), ssd_objects=Opt(Size),
                            corrupt_reads=Opt(Size), quarantined=Opt(Size),
                            offload_problem=Opt(Str()))),
        "done": Opt(Record(
            offloaded=Opt(List(Tuple(Key, Checksum))),
            offload_failed=Opt(List(Tuple(Key, OneOf(*(r.value for r in OffloadFailure)),
                                          Str()))),
            dropped=Opt(List(Tuple(Key, Tier, Opt(Int(-1, 2**63 - 1))))),
            ssd_evicted=Opt(Keys),
            promoted=Opt(List(Tuple(Key, Size, Checksum))),
            recovered=Opt(List(Record(id=Int(), problems=Opt(List(AnyValue())))))))}),
    OpSpec("ssd_evicted", Role.NODE, {"node": NodeName, "keys": Keys}),
    # A node shutting down: first no more puts there, then (once it has written its
    # DRAM-only objects to SSD) gone, its replicas dropped at once.
    OpSpec("leaving", Role.NODE, {"node": NodeName}),
    OpSpec("unregister", Role.NODE, {"node": NodeName}),
    OpSpec("put_target", Role.CLIENT, {"keys": Keys, "sizes": List(Size), "host": Opt(Str())},
           same_length=("keys", "sizes")),
    OpSpec("put_abort", Role.CLIENT, {"keys": Keys}),
    OpSpec("lookup", Role.CLIENT, {"keys": Keys, "lease": Opt(Bool())}),
    OpSpec("exists", Role.CLIENT, {"keys": Keys}),
    OpSpec("prefix_hits", Role.CLIENT, {"keys": Keys}),
    OpSpec("stat", Role.CLIENT, {"key": Key}),
    OpSpec("remove", Role.CLIENT, {"keys": Keys}),
    OpSpec("list", Role.CLIENT, {"prefix": Opt(Str()), "after": Opt(Str()),
                                 "limit": Opt(Int(1, 2**31)), "node": Opt(NodeName),
                                 "tier": Opt(Tier)}),
    OpSpec("status", Role.CLIENT, {}),
    OpSpec("flush", Role.CLIENT, {"node": Opt(NodeName), "wait": Opt(Bool()),
                                  "timeout": Opt(Seconds(MAX_WAIT_SECONDS))}),
    OpSpec("evict", Role.CLIENT, {"tier": Tier, "drop": Opt(Bool()), "dry_run": Opt(Bool()),
                                  "keys": Opt(Keys), "prefix": Opt(Str()),
                                  "bytes": Opt(Size)}),
    OpSpec("recover", Role.CLIENT, {"node": Opt(NodeName), "repair": Opt(Bool()),
                                    "timeout": Opt(Seconds(MAX_WAIT_SECONDS))}),
)

#: A node's data server. Every op is a client op: clients put and get bytes here.
NODE_OPS = _ops(
    OpSpec("put", Role.CLIENT, {"keys": Keys, "sizes": List(Size), "checksums": List(Checksum)},
           payload=True, same_length=("keys", "sizes", "checksums")),
    OpSpec("alloc", Role.CLIENT, {"keys": Keys, "sizes": List(Size),
                                  "checksums": List(Checksum)},
           same_length=("keys", "sizes", "checksums")),
    OpSpec("seal", Role.CLIENT, {"keys": Keys}),
    OpSpec("abort", Role.CLIENT, {"keys": Keys}),
    OpSpec("get", Role.CLIENT, {"keys": Keys, "checksums": Opt(List(Opt(Checksum)))},
           same_length=("keys", "checksums")),
    OpSpec("locate", Role.CLIENT, {"keys": Keys}),
    # A client read bytes of a DRAM copy here that failed the object's checksum; the
    # node checks its own copy (so a client cannot make it drop a good one).
    OpSpec("report_corrupt", Role.CLIENT, {"keys": Keys, "checksums": List(Checksum)},
           same_length=("keys", "checksums")),
)


# -- the hello ----------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Hello:
    """The first frame of every connection: who the peer is and what it can prove."""

    role: Role
    token: str | None
    version: int = PROTOCOL_VERSION

    _SPEC = OpSpec("hello", Role.CLIENT, {"version": Int(), "role": Opt(OneOf("client", "node")),
                                          "token": Opt(Str())})

    @classmethod
    def parse(cls, header: dict[str, Any]) -> Hello:
        """The hello in ``header``; :class:`BadRequestError` if it is not one."""
        if header.get("op") != "hello":
            raise BadRequestError("the first frame must be hello")
        cls._SPEC.check(header)
        return cls(role=Role(header.get("role") or "client"), token=header.get("token"),
                   version=header["version"])

    def to_wire(self) -> dict[str, Any]:
        return {"op": "hello", "version": self.version, "role": self.role.value,
                "token": self.token}

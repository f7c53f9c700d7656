"""The control protocol's vocabulary: roles, the hello, and the shape of every request.

Each op the master or a node serves is declared here once, with the :class:`Role` a
connection needs to call it and the fields its request carries. :mod:`kvstored.rpc`
checks every request against its declaration before the handler runs, so a handler only
ever sees the types it was written for, and a request with a wrong type, a negative
size, a missing field or garbage nested inside gets a ``bad_request`` naming the field.
Extra fields are ignored (an older server talking to a newer peer). What a field *means*
(a key that does not exist, a node that is not registered) is still the handler's
business.

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
# Each shape checks one decoded msgpack value and raises _Mismatch saying what it expected;
# OpSpec.check turns that into a BadRequestError naming the op and the field's path.

class _Mismatch(Exception):
    def __init__(self, path: str, message: str) -> None:
        self.path = path
        self.message = message


def _kind(value: Any) -> str:
    if value is None:
        return "nil"
    return {bool: "a boolean", int: "an integer", float: "a float", str: "a string",
            bytes: "binary", list: "a list", dict: "a map"}.get(type(value), type(value).__name__)


class Shape:
    """What one field must be."""

    expected = "?"

    def check(self, value: Any, path: str) -> None:
        raise NotImplementedError

    def fail(self, value: Any, path: str, why: str = "") -> _Mismatch:
        return _Mismatch(path, why or f"must be {self.expected}, not {_kind(value)}")


class Str(Shape):
    expected = "a string"

    def check(self, value: Any, path: str) -> None:
        if type(value) is not str:
            raise self.fail(value, path)


class KeyStr(Shape):
    """An object key: a non-empty string of at most MAX_KEY_BYTES bytes of UTF-8 (what
    every backend accepts; see :func:`kvstored.sdk.types.encode_key`)."""

    expected = f"a key (a non-empty string of at most {MAX_KEY_BYTES} bytes)"

    def check(self, value: Any, path: str) -> None:
        if type(value) is not str:
            raise self.fail(value, path)
        if not _short_key(value) and not (value and len(value.encode()) <= MAX_KEY_BYTES):
            raise self.fail(value, path, f"must be {self.expected}; this one has "
                                         f"{len(value.encode())} bytes")


def _short_key(value: str) -> bool:
    # A UTF-8 character is at most 4 bytes, so this many characters always fit.
    return 0 < len(value) <= MAX_KEY_BYTES // 4


class Int(Shape):
    """An integer in ``[lo, hi]`` (booleans are not integers here)."""

    def __init__(self, lo: int | None = None, hi: int | None = None) -> None:
        self.lo, self.hi = lo, hi
        self.expected = "an integer" + (
            f" from {lo} to {hi}" if lo is not None and hi is not None
            else f" >= {lo}" if lo is not None else f" <= {hi}" if hi is not None else "")

    def check(self, value: Any, path: str) -> None:
        if type(value) is not int:
            raise self.fail(value, path)
        if (self.lo is not None and value < self.lo) or (self.hi is not None and value > self.hi):
            raise self.fail(value, path, f"must be {self.expected}, not {value}")


class Seconds(Shape):
    """A finite, non-negative number of seconds, at most ``hi``."""

    def __init__(self, hi: float) -> None:
        self.hi = hi
        self.expected = f"a number of seconds from 0 to {hi:g}"

    def check(self, value: Any, path: str) -> None:
        if type(value) not in (int, float):
            raise self.fail(value, path)
        if not (math.isfinite(value) and 0 <= value <= self.hi):
            raise self.fail(value, path, f"must be {self.expected}, not {value!r}")


class Bool(Shape):
    expected = "a boolean"

    def check(self, value: Any, path: str) -> None:
        if type(value) is not bool:
            raise self.fail(value, path)


class OneOf(Shape):
    def __init__(self, *choices: str) -> None:
        self.choices = choices
        self.expected = " or ".join(repr(c) for c in choices)

    def check(self, value: Any, path: str) -> None:
        if type(value) is not str or value not in self.choices:
            raise self.fail(value, path, f"must be {self.expected}, not {value!r:.40}")


class Opt(Shape):
    """``inner``, or nil; as a field of a request or a :class:`Record`, also absent."""

    def __init__(self, inner: Shape) -> None:
        self.inner = inner
        self.expected = f"{inner.expected} or nil"

    def check(self, value: Any, path: str) -> None:
        if value is not None:
            self.inner.check(value, path)


class List(Shape):
    def __init__(self, item: Shape, max_len: int = MAX_BATCH) -> None:
        self.item, self.max_len = item, max_len
        self.expected = f"a list of {item.expected}"

    def check(self, value: Any, path: str) -> None:
        if type(value) is not list:
            raise self.fail(value, path)
        if len(value) > self.max_len:
            raise self.fail(value, path, f"has {len(value)} items, more than {self.max_len}")
        item = self.item
        # The common case (keys), kept cheap for big batches.
        if type(item) is KeyStr and all(type(v) is str and _short_key(v) for v in value):
            return
        for i, v in enumerate(value):
            item.check(v, f"{path}[{i}]")


class Tuple(Shape):
    """A list of fixed length with one shape per position."""

    def __init__(self, *items: Shape) -> None:
        self.items = items
        self.expected = f"a list of {len(items)} ({', '.join(i.expected for i in items)})"

    def check(self, value: Any, path: str) -> None:
        if type(value) is not list or len(value) != len(self.items):
            raise self.fail(value, path)
        for i, (shape, v) in enumerate(zip(self.items, value)):
            shape.check(v, f"{path}[{i}]")


class Record(Shape):
    """A map with these fields (an :class:`Opt` field may be absent); others are ignored."""

    def __init__(self, **fields: Shape) -> None:
        self.fields = fields
        self.expected = "a map"

    def check(self, value: Any, path: str) -> None:
        if type(value) is not dict:
            raise self.fail(value, path)
        _check_fields(self.fields, value, path + ".")


def _check_fields(fields: Mapping[str, Shape], value: dict[str, Any], prefix: str) -> None:
    for name, shape in fields.items():
        if name in value:
            shape.check(value[name], prefix + name)
        elif not isinstance(shape, Opt):
            raise _Mismatch(prefix + name, "is missing")


class AnyValue(Shape):
    expected = "anything"

    def check(self, value: Any, path: str) -> None:
        pass


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
        try:
            _check_fields(self.fields, header, "")
        except _Mismatch as bad:
            raise BadRequestError(f"malformed {self.name} request: {bad.path} {bad.message}"
                                  ) from None
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
        dram_capacity=Size, ssd_capacity=Size, backend=Opt(Str()), shared=Opt(Bool()))}),
    OpSpec("register_objects", Role.NODE, {
        "node": NodeName,
        "objects": List(Tuple(Key, Size, Checksum, Tier, Int(-1, 2**63 - 1)))}),
    OpSpec("register_done", Role.NODE, {"node": NodeName}),
    OpSpec("commit", Role.NODE, {"node": NodeName,
                                 "objects": List(Tuple(Key, Size, Checksum, Size))}),
    OpSpec("heartbeat", Role.NODE, {
        "node": NodeName,
        "stats": Opt(Record(dram_used=Opt(Size), ssd_used=Opt(Size), ssd_objects=Opt(Size),
                            corrupt_reads=Opt(Size), quarantined=Opt(Size))),
        "done": Opt(Record(
            offloaded=Opt(List(Tuple(Key, Checksum))),
            offload_failed=Opt(List(Tuple(Key, Str()))),
            dropped=Opt(List(Tuple(Key, Tier, Opt(Int(-1, 2**63 - 1))))),
            ssd_evicted=Opt(Keys),
            promoted=Opt(List(Tuple(Key, Size, Checksum))),
            recovered=Opt(List(Record(id=Int(), problems=Opt(List(AnyValue())))))))}),
    OpSpec("ssd_evicted", Role.NODE, {"node": NodeName, "keys": Keys}),
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

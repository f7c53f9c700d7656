"""Field shapes: what one value of a message may be on the wire, and how it becomes the
Python value a handler sees.

A :class:`Shape` answers three questions about a decoded msgpack value:

- ``ok(value)``: does it fit? ``all_ok(values)`` asks it of every item of a list at once,
  because batches of thousands of keys are checked on every call, so that path runs in
  C (``set(map(type, ...))``, ``min``, ``max``);
- ``explain(value)``: for a value that does not fit, where inside it the problem is and
  what was expected (the error message names the field: ``sizes[0] must be ...``);
- ``decode(value)`` / ``encode(value)``: the Python value of a wire value that fits, and
  back. Most shapes are the identity (``identity`` is then true, and a list of them is
  passed through untouched); enums become their members, maps become messages.

``ok_source`` gives ``ok`` as a Python expression, from which
:mod:`kvstored.protocol.compiled` generates each message's check and decode (a message's
``Fields`` runs those); ``explain`` stays generic, since it only runs on a bad value.

Shapes are built by :mod:`kvstored.protocol.messages` from a message's field types; a
field whose type says too little (a key, a size, a checksum) names its shape with
``Annotated`` (:data:`Key`, :data:`Size`, ...).

This module does no I/O and knows no op.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Mapping
from typing import Annotated, Any

from kvstored.protocol.compiled import Compiled, Source, compile_fields
from kvstored.sdk.types import MAX_KEY_BYTES

#: Items in one list field (keys of a batch, ...).
MAX_BATCH = 65536


def _kind(value: Any) -> str:
    if value is None:
        return "nil"
    return {bool: "a boolean", int: "an integer", float: "a float", str: "a string",
            bytes: "binary", list: "a list", dict: "a map"}.get(type(value), type(value).__name__)


def _all_of_type(values: list[Any], kind: type) -> bool:
    return set(map(type, values)) == {kind}


class Shape:
    """What one field must be, and how its wire value becomes a Python value."""

    expected = "?"
    #: ``decode`` and ``encode`` return their argument.
    identity = True

    def ok(self, value: Any) -> bool:
        raise NotImplementedError

    def all_ok(self, values: list[Any]) -> bool:
        """``ok`` for every one of ``values`` (a non-empty list)."""
        return all(map(self.ok, values))

    def ok_source(self, var: str, source: Source) -> str | None:
        """``ok`` of the value named ``var`` as a Python expression (names it needs
        bound in ``source``), or None: generated code calls ``ok``."""
        return None

    def explain(self, value: Any) -> tuple[str, str]:
        """``(path inside value, message)`` for a value that is not ok."""
        return "", f"must be {self.expected}, not {_kind(value)}"

    def decode(self, value: Any) -> Any:
        return value

    def encode(self, value: Any) -> Any:
        return value


class _Exactly(Shape):
    """A value of exactly the type ``kind``: no subclass (a boolean is not an integer)."""

    kind: type

    def ok(self, value: Any) -> bool:
        return type(value) is self.kind

    def all_ok(self, values: list[Any]) -> bool:
        return _all_of_type(values, self.kind)

    def ok_source(self, var: str, source: Source) -> str | None:
        return f"type({var}) is {source.bind(self.kind, 'type')}"


class Str(_Exactly):
    expected = "a string"
    kind = str


class KeyStr(Shape):
    """An object key: a non-empty string of at most MAX_KEY_BYTES bytes of UTF-8 (what
    every backend accepts; see :func:`kvstored.sdk.types.encode_key`)."""

    expected = f"a key (a non-empty string of at most {MAX_KEY_BYTES} bytes)"

    def ok(self, value: Any) -> bool:
        # A UTF-8 character is at most 4 bytes: most keys need no encoding to tell.
        return type(value) is str and (0 < len(value) <= MAX_KEY_BYTES // 4 or (
            len(value) > 0 and len(value.encode()) <= MAX_KEY_BYTES))

    def ok_source(self, var: str, source: Source) -> str | None:
        return (f"(type({var}) is _str and (0 < _len({var}) <= {MAX_KEY_BYTES // 4} "
                f"or {source.bind(self.ok, 'key')}({var})))")

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


class Name(Shape):
    """A non-empty string of at most ``max_len`` characters (an identifier a client
    makes up, such as the holder of a lock)."""

    def __init__(self, max_len: int) -> None:
        self.max_len = max_len
        self.expected = f"a non-empty string of at most {max_len} characters"

    def ok(self, value: Any) -> bool:
        return type(value) is str and 0 < len(value) <= self.max_len

    def ok_source(self, var: str, source: Source) -> str | None:
        return f"(type({var}) is _str and 0 < _len({var}) <= {self.max_len})"

    def explain(self, value: Any) -> tuple[str, str]:
        if type(value) is str:
            return "", f"must be {self.expected}; this one has {len(value)}"
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

    def ok_source(self, var: str, source: Source) -> str | None:
        lo = "" if math.isinf(self.lo) else f" and {int(self.lo)} <= {var}"
        hi = "" if math.isinf(self.hi) else f" and {var} <= {int(self.hi)}"
        return f"(type({var}) is _int{lo}{hi})"

    def explain(self, value: Any) -> tuple[str, str]:
        if type(value) is int:
            return "", f"must be {self.expected}, not {value}"
        return super().explain(value)


class Number(Shape):
    """A finite number in ``[lo, hi]`` (an integer or a float, not a boolean)."""

    def __init__(self, lo: float = -math.inf, hi: float = math.inf, *,
                 unit: str = "a number") -> None:
        self.lo, self.hi = lo, hi
        bounds = "" if math.isinf(lo) and math.isinf(hi) else f" from {lo:g} to {hi:g}"
        self.expected = unit + bounds

    def ok(self, value: Any) -> bool:
        return type(value) in (int, float) and math.isfinite(value) \
            and self.lo <= value <= self.hi

    def explain(self, value: Any) -> tuple[str, str]:
        if type(value) in (int, float):
            return "", f"must be {self.expected}, not {value!r}"
        return super().explain(value)


def Seconds(hi: float) -> Number:
    """A finite, non-negative number of seconds, at most ``hi``."""
    return Number(0, hi, unit="a number of seconds")


class Bool(_Exactly):
    expected = "a boolean"
    kind = bool


class EnumOf(Shape):
    """A member of a string enum, by its value."""

    identity = False

    def __init__(self, enum_type: type[enum.StrEnum]) -> None:
        self.enum_type = enum_type
        self.members: Mapping[str, enum.StrEnum] = {m.value: m for m in enum_type}
        self.expected = " or ".join(repr(v) for v in self.members)

    def ok(self, value: Any) -> bool:
        return type(value) is str and value in self.members

    def all_ok(self, values: list[Any]) -> bool:
        return _all_of_type(values, str) and set(values) <= self.members.keys()

    def ok_source(self, var: str, source: Source) -> str | None:
        return f"(type({var}) is _str and {var} in {source.bind(self.members, 'members')})"

    def explain(self, value: Any) -> tuple[str, str]:
        return "", f"must be {self.expected}, not {value!r:.40}"

    def decode(self, value: Any) -> Any:
        return self.members[value]

    def encode(self, value: Any) -> Any:
        return str(value)  # msgpack packs a StrEnum as a str, but a plain one is faster


class Opt(Shape):
    """``inner``, or nil; as a field of a message, also absent."""

    def __init__(self, inner: Shape) -> None:
        self.inner = inner
        self.expected = f"{inner.expected} or nil"
        self.identity = inner.identity

    def ok(self, value: Any) -> bool:
        return value is None or self.inner.ok(value)

    def all_ok(self, values: list[Any]) -> bool:
        present = [v for v in values if v is not None]
        return not present or self.inner.all_ok(present)

    def ok_source(self, var: str, source: Source) -> str | None:
        return f"({var} is None or {source.ok(self.inner, var)})"

    def explain(self, value: Any) -> tuple[str, str]:
        return self.inner.explain(value)

    def decode(self, value: Any) -> Any:
        return None if value is None else self.inner.decode(value)

    def encode(self, value: Any) -> Any:
        return None if value is None else self.inner.encode(value)


class _Collection(Shape):
    """A list or a map of at most ``max_len`` entries, each of the shape ``inner``."""

    kind: type
    noun: str
    #: What the entries are called when there are too many.
    entries: str

    def __init__(self, inner: Shape, max_len: int = MAX_BATCH) -> None:
        self.inner, self.max_len = inner, max_len
        self.expected = f"a {self.noun} of {inner.expected}"
        self.identity = inner.identity

    def explain(self, value: Any) -> tuple[str, str]:
        if type(value) is not self.kind:
            return super().explain(value)
        if len(value) > self.max_len:
            return "", f"has {len(value)} {self.entries}, more than {self.max_len}"
        return self._explain_entries(value)

    def _explain_entries(self, value: Any) -> tuple[str, str]:
        raise NotImplementedError


class List(_Collection):
    kind, noun, entries = list, "list", "items"

    def ok(self, value: Any) -> bool:
        if type(value) is not list or len(value) > self.max_len:
            return False
        # Item by item is cheaper for a few items; all_ok's C passes win beyond.
        return all(map(self.inner.ok, value)) if len(value) <= 16 else self.inner.all_ok(value)

    def ok_source(self, var: str, source: Source) -> str | None:
        # A function of its own: a loop over the items, as ok() (which it must equal).
        name = source.fresh("list")
        source.helpers.append("\n".join((
            f"def {name}(v):",
            f"    if type(v) is not _list or _len(v) > {self.max_len}:",
            "        return False",
            "    if _len(v) <= 16:",
            "        for x in v:",
            f"            if not {source.ok(self.inner, 'x')}:",
            "                return False",
            "        return True",
            f"    return {source.bind(self.inner.all_ok, 'all')}(v)")))
        return f"{name}({var})"

    def _explain_entries(self, value: list[Any]) -> tuple[str, str]:
        for i, item in enumerate(value):
            if not self.inner.ok(item):
                where, message = self.inner.explain(item)
                return f"[{i}]{where}", message
        return "", "is fine"  # not reached: ok() said otherwise

    def decode(self, value: Any) -> Any:
        return value if self.identity else list(map(self.inner.decode, value))

    def encode(self, value: Any) -> Any:
        return value if self.identity else list(map(self.inner.encode, value))


class Map(_Collection):
    """A map from strings to ``inner`` shapes (nodes by name, tiers by name)."""

    kind, noun, entries = dict, "map", "entries"

    def ok(self, value: Any) -> bool:
        return (type(value) is dict and len(value) <= self.max_len
                and all(type(k) is str for k in value)
                and all(map(self.inner.ok, value.values())))

    def _explain_entries(self, value: dict[Any, Any]) -> tuple[str, str]:
        for name, item in value.items():
            if type(name) is not str:
                return "", f"must have string keys, not {_kind(name)}"
            if not self.inner.ok(item):
                where, message = self.inner.explain(item)
                return f"[{name!r:.40}]{where}", message
        return "", "is fine"

    def decode(self, value: Any) -> Any:
        if self.identity:
            return value
        return {name: self.inner.decode(item) for name, item in value.items()}

    def encode(self, value: Any) -> Any:
        if self.identity:
            return value
        return {name: self.inner.encode(item) for name, item in value.items()}


class AnyValue(Shape):
    expected = "anything"

    def ok(self, value: Any) -> bool:
        return True

    def ok_source(self, var: str, source: Source) -> str | None:
        return "True"


class Fields(Shape):
    """A map with named fields, each of its own shape (a message; see
    :mod:`kvstored.protocol.messages`, which builds one per message type).

    A field in ``optional`` may be absent; other fields the map carries are ignored (an
    older receiver of a newer sender). ``same_length`` names list fields that hold one
    entry per key. ``build`` turns the decoded fields into the message.

    The shape of a message type (``message_type``) checks, decodes and encodes through
    the functions :mod:`kvstored.protocol.compiled` generates from it (:meth:`compiled`);
    the ``walk_*`` methods are the same, generically (the reference the generated code
    is tested against, and the way of a ``Fields`` that builds no message type)."""

    identity = False

    def __init__(self, name: str, fields: Mapping[str, Shape], optional: frozenset[str],
                 same_length: tuple[str, ...],
                 build: Callable[[dict[str, Any]], Any],
                 message_type: type | None = None) -> None:
        self.name = name
        self.fields = dict(fields)
        self.optional = optional
        self.same_length = same_length
        self.build = build
        self.message_type = message_type
        self.expected = "a map"
        self._plain = [n for n, s in self.fields.items() if s.identity]
        self._converted = [(n, s) for n, s in self.fields.items() if not s.identity]
        self._compiled: Compiled | None = None

    def compiled(self) -> Compiled | None:
        """The generated functions of this shape (made on first use: the fields may name
        messages defined after this one), or None if it builds no message type."""
        if self._compiled is None and self.message_type is not None:
            self._compiled = compile_fields(self, self.message_type)
        return self._compiled

    def ok(self, value: Any) -> bool:
        compiled = self.compiled()
        return self.walk_ok(value) if compiled is None else compiled.check(value)

    def parse(self, value: Any) -> Any | None:
        """The message of ``value`` if it is ok, else None (``explain_fields`` says why)."""
        compiled = self.compiled()
        if compiled is None:
            return self.walk_decode(value) if self.walk_ok(value) else None
        return compiled.parse(value)

    def decode(self, value: Any) -> Any:
        """The message of a map that is ok. Absent fields take the message's defaults; a
        required one that is absent raises KeyError or TypeError (a malformed reply)."""
        compiled = self.compiled()
        return self.walk_decode(value) if compiled is None else compiled.decode(value)

    def encode(self, value: Any) -> Any:
        compiled = self.compiled()
        return self.walk_encode(value) if compiled is None else compiled.encode_into(value, {})

    def walk_ok(self, value: Any) -> bool:
        if type(value) is not dict:
            return False
        for name, shape in self.fields.items():
            if name in value:
                if not shape.ok(value[name]):
                    return False
            elif name not in self.optional:
                return False
        return not self.same_length or self._lengths_agree(value)

    def _lengths_agree(self, value: dict[str, Any]) -> bool:
        return len({len(value[n]) for n in self.same_length if value.get(n) is not None}) <= 1

    def explain(self, value: Any) -> tuple[str, str]:
        if type(value) is not dict:
            return super().explain(value)
        where, message = self.explain_fields(value)
        return (f".{where}" if where else ""), message

    def explain_fields(self, value: dict[str, Any]) -> tuple[str, str]:
        """``(field path, message)`` for a map that is not ok (no leading dot)."""
        for name, shape in self.fields.items():
            if name not in value:
                if name not in self.optional:
                    return name, "is missing"
            elif not shape.ok(value[name]):
                where, message = shape.explain(value[name])
                return name + where, message
        lengths = {n: len(value[n]) for n in self.same_length if value.get(n) is not None}
        shown = ", ".join(f"{n} has {k}" for n, k in lengths.items())
        return "", f"one entry per key expected, but {shown}"

    def walk_decode(self, value: Any) -> Any:
        args = {n: value[n] for n in self._plain if n in value}
        for name, shape in self._converted:
            item = value.get(name)
            if item is not None:
                args[name] = shape.decode(item)
            elif name in value:
                args[name] = None
        return self.build(args)

    def walk_encode(self, value: Any) -> Any:
        out = {n: getattr(value, n) for n in self._plain}
        for name, shape in self._converted:
            out[name] = shape.encode(getattr(value, name))
        return out


class Tagged(Shape):
    """One of several messages, told apart by the value of their ``tag`` field (a task's
    ``kind``)."""

    identity = False

    def __init__(self, tag: str, variants: Mapping[str, Fields]) -> None:
        self.tag = tag
        self.variants = dict(variants)
        self.expected = f"a map whose {tag} is " + " or ".join(map(repr, self.variants))

    def _variant(self, value: Any) -> Fields | None:
        if type(value) is not dict:
            return None
        tag = value.get(self.tag)
        return self.variants.get(tag) if type(tag) is str else None

    def ok(self, value: Any) -> bool:
        variant = self._variant(value)
        return variant is not None and variant.ok(value)

    def explain(self, value: Any) -> tuple[str, str]:
        variant = self._variant(value)
        if variant is None:
            return super().explain(value)
        return variant.explain(value)

    def decode(self, value: Any) -> Any:
        return self.variants[value[self.tag]].decode(value)

    def encode(self, value: Any) -> Any:
        return value.to_wire()


# -- the shapes fields name with Annotated -------------------------------------------------

Key = Annotated[str, KeyStr()]
Keys = Annotated[list[str], List(KeyStr())]
Size = Annotated[int, Int(0, 2**63 - 1)]
Sizes = Annotated[list[int], List(Int(0, 2**63 - 1))]
Checksum = Annotated[int, Int(0, 2**32 - 1)]
Checksums = Annotated[list[int], List(Int(0, 2**32 - 1))]
#: A DRAM offset in a node's segment (-1: none, for an SSD copy).
Offset = Annotated[int, Int(-1, 2**63 - 1)]
Offsets = Annotated[list[int], List(Int(-1, 2**63 - 1))]
Port = Annotated[int, Int(0, 65535)]
OptKeys = Annotated[list[str] | None, Opt(List(KeyStr()))]
OptSize = Annotated[int | None, Opt(Int(0, 2**63 - 1))]

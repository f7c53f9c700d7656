"""Messages: the typed requests, replies, tasks and reports the master, the nodes and the
clients exchange.

A message is a frozen dataclass made with :func:`message` over :class:`Message`. Its
fields' types say what it carries, and from them each message gets a
:class:`~kvstored.protocol.shapes.Fields` shape that checks a wire map against them
(naming the field that is wrong), decodes it into the message, and encodes the message
back into a map that msgpack packs: ``to_wire`` and ``from_wire``. A field's type maps to
its shape so::

    str, bool, int, float        a string, a boolean, an integer, a finite number
    X | None                      X or nil (the field must default to None)
    list[X], dict[str, X]         a list of X, a map from strings to X
    a StrEnum                     one of its values; decoded into the member
    a Message                     a map of that message's fields
    A | B | ... (messages)        one of them, told apart by their ``kind`` field
    Annotated[T, shape]           that shape (keys, sizes, checksums: see shapes.py)

A field with a default may be absent on the wire. ``SAME_LENGTH`` names list fields
that hold one entry per key. Batches travel as columns (``keys``, ``sizes``, ...): one
list per field, checked in C, rather than one map per item, which costs five times as
much to unpack.

Not here: which op carries which message (:mod:`kvstored.protocol.ops`), and I/O.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Self, TypeVar, dataclass_transform

from kvstored.protocol.shapes import (
    AnyValue,
    Bool,
    EnumOf,
    Fields,
    Int,
    List,
    Map,
    Number,
    Opt,
    Shape,
    Str,
    Tagged,
)

M = TypeVar("M", bound="Message")


class Message:
    """Base of every message (see the module docstring)."""

    __slots__ = ()

    #: List fields that hold one entry per key and must have one length.
    SAME_LENGTH: ClassVar[tuple[str, ...]] = ()

    def to_wire(self) -> dict[str, Any]:
        """The message as a map of msgpack-friendly values."""
        return fields_of(type(self)).encode(self)

    @classmethod
    def from_wire(cls, value: Mapping[str, Any]) -> Self:
        """The message in ``value`` (a map that :meth:`shape` accepts). A value that
        does not fit raises TypeError, KeyError or ValueError."""
        return fields_of(cls).decode(value)

    @classmethod
    def shape(cls) -> Fields:
        """The shape that checks, decodes and encodes this message."""
        return fields_of(cls)


@dataclass_transform(frozen_default=True, field_specifiers=(dataclasses.field,))
def message(cls: type[M]) -> type[M]:
    """Make ``cls`` (a :class:`Message` subclass) a frozen, slotted dataclass."""
    if not issubclass(cls, Message):
        raise TypeError(f"{cls.__name__} must derive from Message")
    return dataclasses.dataclass(frozen=True, slots=True)(cls)


_FIELDS: dict[type, Fields] = {}


def fields_of(cls: type[Message]) -> Fields:
    """The shape of message type ``cls``, built on first use (its fields may name
    messages defined after it)."""
    shape = _FIELDS.get(cls)
    if shape is None:
        shape = _FIELDS[cls] = _build(cls)
    return shape


def _build(cls: type[Message]) -> Fields:
    hints = typing.get_type_hints(cls, include_extras=True)
    shapes: dict[str, Shape] = {}
    optional = set()
    for field in dataclasses.fields(cls):  # type: ignore[arg-type]  # a @message class
        shape = shapes[field.name] = shape_of(hints[field.name])
        defaulted = field.default is not dataclasses.MISSING \
            or field.default_factory is not dataclasses.MISSING
        if defaulted:
            optional.add(field.name)
        elif isinstance(shape, Opt):
            raise TypeError(f"{cls.__name__}.{field.name} may be nil, so it needs a default")
    for name in cls.SAME_LENGTH:
        if not isinstance(shapes.get(name), List | Opt):
            raise TypeError(f"{cls.__name__}.SAME_LENGTH names {name!r}, not a list field")
    build: Callable[[dict[str, Any]], Any] = lambda args: cls(**args)  # noqa: E731
    return Fields(cls.__name__, shapes, frozenset(optional), cls.SAME_LENGTH, build, cls)


_SCALARS: dict[Any, Callable[[], Shape]] = {str: Str, bool: Bool, int: Int, float: Number,
                                            Any: AnyValue}


def shape_of(kind: Any) -> Shape:
    """The shape of a field of type ``kind`` (see the module docstring)."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin is typing.Annotated:
        named = [m for m in kind.__metadata__ if isinstance(m, Shape)]
        return named[0] if named else shape_of(args[0])
    if origin in (typing.Union, types.UnionType):
        present = [a for a in args if a is not type(None)]
        inner = shape_of(present[0]) if len(present) == 1 else _tagged(present)
        return Opt(inner) if len(present) < len(args) else inner
    if origin is list:
        return List(shape_of(args[0]))
    if origin is dict and args[0] is str:
        return Map(shape_of(args[1]))
    if isinstance(kind, type) and issubclass(kind, Message):
        return fields_of(kind)
    if isinstance(kind, type) and issubclass(kind, enum.StrEnum):
        return EnumOf(kind)
    if kind in _SCALARS:
        return _SCALARS[kind]()
    raise TypeError(f"no wire shape for {kind!r}")


def _tagged(variants: list[Any]) -> Tagged:
    """Messages told apart by the default of their ``kind`` field."""
    by_kind: dict[str, Fields] = {}
    for variant in variants:
        kinds = [f.default for f in dataclasses.fields(variant) if f.name == "kind"]
        if not (isinstance(variant, type) and issubclass(variant, Message)) or not kinds:
            raise TypeError(f"{variant!r} in a union of messages needs a 'kind' field")
        by_kind[str(kinds[0])] = fields_of(variant)
    return Tagged("kind", by_kind)

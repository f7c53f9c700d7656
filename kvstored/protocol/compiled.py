"""Compiled shapes: each message type's check, decode and encode as generated Python
functions, instead of the generic walk over its fields.

:class:`~kvstored.protocol.shapes.Fields` describes a message generically, and walking
that description costs a call per field and per shape on every frame (about 4 µs for a
one-key ``get_held`` request, as much again for its reply, on both ends of every
trip). :func:`compile_fields` turns one description into straight-line code: the type
and range tests of the fields inline, lists of up to 16 items tested item by item in a
loop of their own, the message built positionally. The generated functions say only
*whether* a map fits; why one does not is still worded by the generic
``Fields.explain_fields``, which is only reached for a map that does not fit. So the
errors read as before, and a test checks the two agree on every message type
(tests/test_protocol.py).

A shape takes part by its ``ok_source``: a Python expression over a variable that is
true exactly when ``ok`` is. Shapes without one (rare, off the hot paths) are called.

This module does no I/O and knows no op.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the shapes call this module: it must not import them
    from kvstored.protocol.shapes import Fields, Shape

#: Marks an absent field in generated code (None may be a value).
_ABSENT = object()


@dataclass(frozen=True, slots=True)
class Compiled:
    """One message type's generated functions.

    ``parse(value)``: the message of a wire map that fits the shape, else None (ask
    ``Fields.explain_fields`` why). ``decode(value)``: the message of a map without
    checking it (a reply whose shape is trusted); a missing required field raises
    KeyError. ``encode_into(message, out)``: the message's fields added to the dict
    ``out`` (a header started with ``op`` or ``ok``), which it returns. ``check(value)``:
    whether a value fits, as ``Fields.ok``."""

    parse: Callable[[Any], Any]
    decode: Callable[[Any], Any]
    encode_into: Callable[[Any, dict[str, Any]], dict[str, Any]]
    check: Callable[[Any], bool]


class Source:
    """Generated code being written: names bound into its namespace, helper functions."""

    def __init__(self) -> None:
        self.env: dict[str, Any] = {"_ABSENT": _ABSENT, "_str": str, "_int": int,
                                    "_list": list, "_dict": dict, "_len": len}
        self.helpers: list[str] = []
        self._count = 0

    def bind(self, value: Any, hint: str = "v") -> str:
        """A name for ``value`` in the generated code's namespace."""
        self._count += 1
        name = f"_{hint}{self._count}"
        self.env[name] = value
        return name

    def fresh(self, hint: str = "f") -> str:
        self._count += 1
        return f"_{hint}{self._count}"

    def ok(self, shape: Shape, var: str) -> str:
        """An expression over ``var`` (a plain name) true exactly when ``shape.ok``."""
        expr = shape.ok_source(var, self)
        if expr is not None:
            return expr
        return f"{self.bind(shape.ok, 'ok')}({var})"

    def run(self) -> dict[str, Any]:
        code = "\n\n".join(self.helpers)
        exec(compile(code, "<kvstored.protocol.compiled>", "exec"), self.env)
        return self.env


def _default(source: Source, field: dataclasses.Field[Any]) -> str | None:
    """An expression for ``field``'s default, or None if it has none."""
    if field.default is not dataclasses.MISSING:
        return source.bind(field.default, "d")
    if field.default_factory is not dataclasses.MISSING:
        return f"{source.bind(field.default_factory, 'mk')}()"
    return None


def compile_fields(shape: Fields, cls: type) -> Compiled:
    """The generated functions of ``shape``, the shape of message type ``cls``."""
    source = Source()
    build = source.bind(cls, "cls")
    fields = dataclasses.fields(cls)
    parse = ["def parse(v):", "    if type(v) is not _dict:", "        return None"]
    check = ["def check(v):", "    if type(v) is not _dict:", "        return False"]
    decode = ["def decode(v):", "    if type(v) is not _dict:",
              f"        raise TypeError('a {cls.__name__} must be a map')"]
    args = []
    raw: dict[str, str] = {}
    for n, field in enumerate(fields):
        name, field_shape = field.name, shape.fields[field.name]
        wire, arg = f"w{n}", f"a{n}"
        raw[name] = wire
        args.append(arg)
        default = _default(source, field)
        key = repr(name)
        test = source.ok(field_shape, wire)
        value = wire if field_shape.identity else (
            f"(None if {wire} is None else {source.bind(field_shape.decode, 'dec')}({wire}))")
        parse.append(f"    {wire} = v.get({key}, _ABSENT)")
        check.append(f"    {wire} = v.get({key}, _ABSENT)")
        if default is None:
            parse += [f"    if {wire} is _ABSENT or not ({test}):", "        return None"]
            check += [f"    if {wire} is _ABSENT or not ({test}):", "        return False"]
            parse.append(f"    {arg} = {value}")
            decode.append(f"    {wire} = v[{key}]")
            decode.append(f"    {arg} = {value}")
        else:
            parse += [f"    if {wire} is _ABSENT:", f"        {arg} = {default}",
                      f"    elif not ({test}):", "        return None",
                      "    else:", f"        {arg} = {value}"]
            check += [f"    if {wire} is not _ABSENT and not ({test}):",
                      "        return False"]
            decode += [f"    {wire} = v.get({key}, _ABSENT)",
                       f"    {arg} = {default} if {wire} is _ABSENT else {value}"]
        if name in shape.same_length:
            # Fields.ok compares the lengths of the lists present and not nil.
            for lines in (parse, check):
                lines.append(f"    {wire} = None if {wire} is _ABSENT else {wire}")
    if shape.same_length:
        present = [raw[name] for name in shape.same_length]
        for lines, fail in ((parse, "None"), (check, "False")):
            lines.append(f"    _n = {{_len(x) for x in ({', '.join(present)},) "
                         "if x is not None}")
            lines += ["    if _len(_n) > 1:", f"        return {fail}"]
    parse.append(f"    return {build}({', '.join(args)})")
    check.append("    return True")
    decode.append(f"    return {build}({', '.join(args)})")
    encode = ["def encode_into(m, out):"]
    # The generic encoder's order: plain fields first, converted ones after.
    plain = [f for f in fields if shape.fields[f.name].identity]
    converted = [f for f in fields if not shape.fields[f.name].identity]
    for field in plain:
        encode.append(f"    out[{field.name!r}] = m.{field.name}")
    for field in converted:
        enc = source.bind(shape.fields[field.name].encode, "enc")
        encode.append(f"    out[{field.name!r}] = {enc}(m.{field.name})")
    encode.append("    return out")
    source.helpers += ["\n".join(parse), "\n".join(check), "\n".join(decode),
                       "\n".join(encode)]
    env = source.run()
    return Compiled(env["parse"], env["decode"], env["encode_into"], env["check"])

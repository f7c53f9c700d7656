"""The backend registry: every backend by name, and its options, typed.

A backend is named in three ways:

- a built-in name (:data:`BUILTIN`);
- a name registered by a third-party distribution under the entry-point group
  ``kvstored.backends`` (``mybackend = "my_pkg.backend:MyBackend"``); one named like a
  built-in is ignored with a :class:`BackendNameClashWarning`, never shadows it;
- directly, as ``"module:Class"``.

A backend's options are the keyword-only parameters of its constructor (and of the
constructors it inherits). :func:`parse_options` turns the text of a command line
(``--option policy=lru``) into those options, each parsed by the *type* its parameter is
annotated with (``int`` sizes take units, enums take their values), so a backend author
declares an option once, in the signature.

This module is part of the SDK: it imports backends only by name, when asked for one,
and depends on nothing of the daemon.
"""

from __future__ import annotations

import enum
import importlib
import inspect
import os
import types
import typing
import warnings
from collections.abc import Mapping
from importlib.metadata import entry_points
from typing import Any

from kvstored.sdk.backend import OpenProgress, StorageBackend
from kvstored.sdk.errors import InvalidRequestError, ReadOnlyError, UnknownBackendError
from kvstored.sdk.types import OpenMode
from kvstored.sdk.units import parse_bool, parse_size

ENTRY_POINT_GROUP = "kvstored.backends"
#: Options a program passes (callables), which no configuration can set.
PROGRAM_HOOKS = frozenset({"on_evict", "progress"})

#: The backends that ship with kvstored: name -> "module:Class" (imported when used).
BUILTIN: dict[str, str] = {
    "file-per-key": "kvstored.backends.file_per_key.backend:FilePerKeyBackend",
    "offset": "kvstored.backends.offset.backend:OffsetBackend",
    "nvmeof": "kvstored.backends.nvmeof.backend:NvmeofBackend",
    "3fs": "kvstored.backends.threefs.backend:ThreeFsBackend",
    "bucket": "kvstored.backends.bucket.backend:BucketBackend",
}


class BackendNameClashWarning(UserWarning):
    """An installed entry point takes the name of a built-in backend: it is ignored."""


def _registered() -> dict[str, str]:
    """Built-in names plus installed entry points. An entry point named like a built-in
    is refused (the built-in keeps its name) with a :class:`BackendNameClashWarning`
    naming the distribution, so that installing a package never silently replaces the
    backend a configuration names."""
    found: dict[str, str] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in BUILTIN:
            if ep.value != BUILTIN[ep.name]:
                dist = getattr(ep.dist, "name", None) or "an installed distribution"
                warnings.warn(
                    f"{dist} registers a backend named {ep.name!r} ({ep.value}), the name "
                    f"of a built-in backend; it is ignored and {ep.name!r} stays "
                    f"{BUILTIN[ep.name]}. Rename its entry point in the "
                    f"{ENTRY_POINT_GROUP!r} group", BackendNameClashWarning, stacklevel=3)
            continue
        found[ep.name] = ep.value
    return {**found, **BUILTIN}


def known_backends() -> list[str]:
    return sorted(_registered())


def backend_class(name: str) -> type[StorageBackend]:
    """Resolve a backend name, or ``module:Class``, to its class.

    Raises:
        UnknownBackendError: no backend has that name, or it cannot be imported.
        InvalidRequestError: the name resolves to something that is not a backend.
    """
    target = _registered().get(name)
    if target is None and ":" in name:
        target = name
    if target is None:
        raise UnknownBackendError(name, known_backends())
    module_name, _, attribute = target.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise UnknownBackendError(f"{name} ({target}: {exc})", known_backends()) from exc
    if not (isinstance(cls, type) and issubclass(cls, StorageBackend)):
        raise InvalidRequestError(f"{target} is not a StorageBackend subclass")
    return cls


class Option(typing.NamedTuple):
    """One keyword option of a backend: its parameter, and the type it is annotated
    with (resolved, not its text)."""

    parameter: inspect.Parameter
    type: Any


def backend_options(cls: type[StorageBackend]) -> dict[str, Option]:
    """The keyword options ``cls`` accepts, its own and those it inherits."""
    options: dict[str, Option] = {}
    for klass in reversed(cls.__mro__):
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        try:
            hints = typing.get_type_hints(init)
        except Exception:  # an annotation that names what its module cannot see
            hints = {}
        for param in inspect.signature(init).parameters.values():
            if param.kind is inspect.Parameter.KEYWORD_ONLY:
                options[param.name] = Option(param, hints.get(param.name, Any))
    return options


def open_backend(name: str, path: str | os.PathLike, *,
                 progress: OpenProgress | None = None, **options: Any) -> StorageBackend:
    """Open the backend ``name`` on ``path``. ``progress`` (``progress(done, total,
    unit)``, from the opening thread) is told how far the open-time recovery has got, by
    a backend whose constructor takes ``progress``; others open without saying.

    Raises:
        UnknownBackendError: an unknown name (the error lists the known ones).
        InvalidRequestError: an unknown option (the error lists the valid ones).
        ReadOnlyError: a ``mode`` the backend does not list in ``open_modes``, before
            anything is opened. ``mode`` reaches the backend only when it is not
            read-write, so backends that know no other mode need not accept it.
        BackendError: whatever the backend's own open raises.
    """
    cls = backend_class(name)
    if progress is not None and "progress" in inspect.signature(cls.__init__).parameters:
        options["progress"] = progress
    valid = backend_options(cls)
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise InvalidRequestError(
            f"unknown option(s) {', '.join(unknown)} for the {name!r} backend; "
            f"valid options: {', '.join(sorted(valid))}", path=path)
    mode = OpenMode(options.pop("mode", OpenMode.READ_WRITE))
    if mode not in cls.open_modes:
        raise ReadOnlyError(
            f"the {name!r} backend cannot be opened {mode.value} (it supports "
            f"{', '.join(sorted(m.value for m in cls.open_modes))})", path=path)
    if mode is not OpenMode.READ_WRITE:
        options["mode"] = mode
    return cls.open(path, **options)


def parse_options(cls: type[StorageBackend], raw: Mapping[str, Any]) -> dict[str, Any]:
    """Turn ``{"capacity": "4GiB", "policy": "lru"}`` (a command line's text, or values
    a configuration file already typed) into the options of ``cls``, each by the type
    of its constructor parameter.

    Raises:
        InvalidRequestError: an unknown option (listing the valid ones), or a value its
            type does not accept (naming the option and what it takes).
    """
    # The hooks (on_evict, progress) are the program's to pass, never a user's option.
    valid = {name: option for name, option in backend_options(cls).items()
             if name not in PROGRAM_HOOKS}
    typed: dict[str, Any] = {}
    for key, value in raw.items():
        option = valid.get(key)
        if option is None:
            raise InvalidRequestError(f"unknown option {key!r} for {cls.name or cls.__name__}; "
                                      f"valid options: {', '.join(sorted(valid))}")
        try:
            typed[key] = parse_value(option.type, value)
        except ValueError as exc:
            raise InvalidRequestError(f"option {key}={value!r}: {exc}") from None
    return typed


def parse_value(kind: Any, value: Any) -> Any:
    """``value`` as an instance of the type ``kind``: text is parsed (``bool`` from
    true/false, ``int`` as a size with units, ``float``, an enum from its value or
    name, ``None`` from ``none`` or nothing where the type allows it); a value already
    of the type is kept. Raises ValueError saying what is accepted."""
    choices = typing.get_args(kind) if _is_union(kind) else (kind,)
    optional = type(None) in choices
    if optional and (value is None or (isinstance(value, str)
                                       and value.strip().lower() in ("", "none"))):
        return None
    if value is None:
        raise ValueError("a value is required")
    errors: list[str] = []
    for choice in (c for c in choices if c is not type(None)):
        try:
            return _parse_one(choice, value)
        except ValueError as exc:
            errors.append(str(exc))
    raise ValueError("; ".join(errors) or "no type to parse it as")


def _is_union(kind: Any) -> bool:
    return typing.get_origin(kind) in (typing.Union, types.UnionType)


def _parse_one(kind: Any, value: Any) -> Any:
    if kind is Any or kind is str:
        return value if kind is Any or isinstance(value, str) else str(value)
    if kind is bool:
        return parse_bool(value)
    if kind is int:
        if isinstance(value, bool):
            raise ValueError(f"{value!r} is not a number")
        return parse_size(value)
    if kind is float:
        if isinstance(value, bool):
            raise ValueError(f"{value!r} is not a number")
        return float(value)
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return _parse_enum(kind, value)
    if isinstance(kind, type) and isinstance(value, kind):
        return value
    raise ValueError(f"takes a {getattr(kind, '__name__', kind)}, which has no text form")


def _parse_enum(kind: type[enum.Enum], value: Any) -> enum.Enum:
    if isinstance(value, kind):
        return value
    for member in kind:
        text = str(value).strip().lower()
        if text in (str(member.value).lower(), member.name.lower()):
            return member
    raise ValueError(f"one of {', '.join(str(m.value) for m in kind)}")

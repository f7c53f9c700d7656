"""The built-in storage backends, and the registry that opens any backend by name.

A backend is named in three ways:

- a built-in name (:data:`BUILTIN`);
- a name registered by a third-party distribution under the entry-point group
  ``kvstored.backends`` (``mybackend = "my_pkg.backend:MyBackend"``); one named like a
  built-in is ignored with a :class:`BackendNameClashWarning`, never shadows it;
- directly, as ``"module:Class"``.
"""

from __future__ import annotations

import enum
import importlib
import inspect
import os
import types
import typing
import warnings
from importlib.metadata import entry_points
from typing import Any

from kvstored.sdk.backend import OpenProgress, StorageBackend
from kvstored.sdk.errors import InvalidRequestError, ReadOnlyError, UnknownBackendError
from kvstored.sdk.types import OpenMode

ENTRY_POINT_GROUP = "kvstored.backends"
#: Options a program passes (callables), which no configuration can set.
PROGRAM_HOOKS = frozenset({"on_evict", "progress"})
DEFAULT_BACKEND = "bucket"

#: Built-in backends: name -> "module:Class".
BUILTIN: dict[str, str] = {
    "file-per-key": "kvstored.backends.file_per_key:FilePerKeyBackend",
    "offset": "kvstored.backends.offset:OffsetBackend",
    "nvmeof": "kvstored.backends.nvmeof:NvmeofBackend",
    "3fs": "kvstored.backends.threefs:ThreeFsBackend",
    "bucket": "kvstored.backends.bucket:BucketBackend",
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
    """Resolve a backend name, or ``module:Class``, to its class."""
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


def backend_options(cls: type[StorageBackend]) -> dict[str, inspect.Parameter]:
    """The keyword options ``cls`` accepts, its own and the common ones."""
    options: dict[str, inspect.Parameter] = {}
    for klass in reversed(cls.__mro__):
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        for param in inspect.signature(init).parameters.values():
            if param.kind is inspect.Parameter.KEYWORD_ONLY:
                options[param.name] = param
    return options


def open_backend(name: str, path: str | os.PathLike, *,
                 progress: OpenProgress | None = None, **options: Any) -> StorageBackend:
    """Open the backend ``name`` on ``path``.

    Unknown names raise :class:`UnknownBackendError`, which lists the known ones;
    unknown options raise :class:`InvalidRequestError`, which lists the valid ones. A
    ``mode`` the backend does not list in ``open_modes`` raises :class:`ReadOnlyError`
    before anything is opened; ``mode`` reaches the backend only when it is not
    read-write, so backends that know no other mode need not accept it. ``progress``
    (``progress(done, total, unit)``, from the opening thread) is told how far the
    open-time recovery has got, by a backend whose constructor takes ``progress``;
    others open without saying.
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


def option_types(cls: type[StorageBackend]) -> dict[str, Any]:
    """The declared type of each keyword option of ``cls`` (its own and the common ones),
    resolved from the constructors' annotations (not from their text)."""
    types: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        try:
            hints = typing.get_type_hints(init)
        except (NameError, TypeError):  # an annotation that does not resolve: no type
            hints = {}
        for param in inspect.signature(init).parameters.values():
            if param.kind is inspect.Parameter.KEYWORD_ONLY:
                types[param.name] = hints.get(param.name, Any)
    return types


def _coerce(kind: Any, text: str) -> Any:
    """``text`` parsed as ``kind`` (``X | None`` accepts "none" and "")."""
    from kvstored.units import parse_bool, parse_size

    members = typing.get_args(kind) if typing.get_origin(kind) in (
        typing.Union, types.UnionType) else (kind,)
    if type(None) in members and text.lower() in ("none", ""):
        return None
    concrete = [m for m in members if m is not type(None)]
    kind = concrete[0] if len(concrete) == 1 else Any
    if kind is bool:
        return parse_bool(text)
    if kind is int:
        return parse_size(text)
    if kind is float:
        return float(text)
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return kind(text)
    return text


def coerce_options(cls: type[StorageBackend], raw: dict[str, str]) -> dict[str, Any]:
    """Turn ``{"capacity": "4GiB", "policy": "lru"}`` from a command line into typed
    options, by the types of ``cls``'s constructor parameters: ``bool`` (yes/no, on/off),
    ``int`` (sizes such as 4GiB), ``float``, enums (by value), ``X | None`` ("none"), and
    text for anything else."""
    # The hooks (on_evict, progress) are the program's to pass, never a user's option.
    valid = {name: kind for name, kind in option_types(cls).items()
             if name not in PROGRAM_HOOKS}
    typed: dict[str, Any] = {}
    for key, text in raw.items():
        if key not in valid:
            raise InvalidRequestError(f"unknown option {key!r} for {cls.name or cls.__name__}; "
                                      f"valid options: {', '.join(sorted(valid))}")
        try:
            typed[key] = _coerce(valid[key], text)
        except ValueError as exc:
            raise InvalidRequestError(f"option {key}={text!r}: {exc}") from None
    return typed

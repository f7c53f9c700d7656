"""The built-in storage backends, and the registry that opens any backend by name.

A backend is named in three ways:

- a built-in name (:data:`BUILTIN`);
- a name registered by a third-party distribution under the entry-point group
  ``kvstored.backends`` (``mybackend = "my_pkg.backend:MyBackend"``);
- directly, as ``"module:Class"``.
"""

from __future__ import annotations

import importlib
import inspect
import os
from importlib.metadata import entry_points
from typing import Any

from kvstored.sdk.backend import StorageBackend
from kvstored.sdk.errors import InvalidRequestError, ReadOnlyError, UnknownBackendError
from kvstored.sdk.types import OpenMode

ENTRY_POINT_GROUP = "kvstored.backends"
DEFAULT_BACKEND = "bucket"

#: Built-in backends: name -> "module:Class".
BUILTIN: dict[str, str] = {
    "file-per-key": "kvstored.backends.file_per_key.backend:FilePerKeyBackend",
    "offset": "kvstored.backends.offset.backend:OffsetBackend",
    "nvmeof": "kvstored.backends.nvmeof.backend:NvmeofBackend",
    "3fs": "kvstored.backends.threefs.backend:ThreeFsBackend",
    "bucket": "kvstored.backends.bucket.backend:BucketBackend",
}


def _registered() -> dict[str, str]:
    """Built-in names plus installed entry points; built-ins win a name clash."""
    found = {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}
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


def open_backend(name: str, path: str | os.PathLike, **options: Any) -> StorageBackend:
    """Open the backend ``name`` on ``path``.

    Unknown names raise :class:`UnknownBackendError`, which lists the known ones;
    unknown options raise :class:`InvalidRequestError`, which lists the valid ones. A
    ``mode`` the backend does not list in ``open_modes`` raises :class:`ReadOnlyError`
    before anything is opened; ``mode`` reaches the backend only when it is not
    read-write, so backends that know no other mode need not accept it.
    """
    cls = backend_class(name)
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


def coerce_options(cls: type[StorageBackend], raw: dict[str, str]) -> dict[str, Any]:
    """Turn ``{"capacity": "4GiB", "policy": "lru"}`` from a command line into typed
    options, using the annotations of ``cls``'s constructor."""
    from kvstored.units import parse_bool, parse_size

    valid = backend_options(cls)
    typed: dict[str, Any] = {}
    for key, text in raw.items():
        param = valid.get(key)
        if param is None:
            raise InvalidRequestError(f"unknown option {key!r} for {cls.name or cls.__name__}; "
                                      f"valid options: {', '.join(sorted(valid))}")
        annotation = str(param.annotation)
        try:
            if "bool" in annotation:
                typed[key] = parse_bool(text)
            elif "int" in annotation:
                typed[key] = None if text.lower() in ("none", "") else parse_size(text)
            elif "float" in annotation:
                typed[key] = float(text)
            else:
                typed[key] = text
        except ValueError as exc:
            raise InvalidRequestError(f"option {key}={text!r}: {exc}") from None
    return typed

"""The built-in storage backends, one subpackage each (``bucket``, ``offset``,
``nvmeof``, ``3fs`` as ``threefs``, ``file-per-key`` as ``file_per_key``), and what they
share beyond the SDK: their base class and capabilities (:mod:`.builtin`), the directory
stamp (:mod:`.stamp`) and the offline open of a directory (:mod:`.offline`).

The registry that opens any backend by name is the SDK's, :mod:`kvstored.sdk.registry`;
its entry points are also importable from here, as they were before it moved there.
"""

from kvstored.sdk.registry import (
    BUILTIN,
    BackendNameClashWarning,
    backend_class,
    known_backends,
    open_backend,
)

__all__ = ["BUILTIN", "BackendNameClashWarning", "backend_class", "known_backends", "open_backend"]

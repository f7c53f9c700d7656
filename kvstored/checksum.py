"""CRC-32C on the data path: the fastest implementation this machine has.

Every object's bytes are checked against their CRC-32C on every read. ``crc32c`` is the
folding CRC of ``kvstored._copy`` (native/copy.c: AVX-512 VPCLMULQDQ, about
50 GB/s from cache on the dev machine against the crc32c package's 26, and 21 against
8-14 GB/s from memory) where the CPU has the instructions, else the crc32c package;
``copy_crc32c`` copies a buffer and returns the CRC of the bytes stored in one pass
(about a plain copy's speed), or copies and then checks where the module was not built.
Both give the crc32c package's results (tests/test_checksum.py).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from crc32c import crc32c as package_crc32c

# In kvstored itself, not kvstored.native: a client must not load the io engine for it.
try:  # by name: the module exists only once built (setup.py, optional)
    _copy = importlib.import_module("kvstored._copy")
except ImportError:
    _copy = None

#: Whether ``crc32c`` is the native folding CRC.
FOLDING = _copy is not None and _copy.crc32c(b"") == 0

#: ``crc32c(data, value=0)``: the CRC-32C of ``data``, continuing the finished CRC
#: ``value`` (as the crc32c package's).
crc32c: Callable[..., int] = (_copy.crc32c if _copy is not None and FOLDING
                              else package_crc32c)


def _copy_then_check(dst: Any, src: Any, value: int = 0) -> int:
    source = memoryview(src).cast("B")
    target = memoryview(dst).cast("B")
    if source.nbytes > target.nbytes:
        raise ValueError(f"copy_crc32c: the destination holds {target.nbytes} bytes, the "
                         f"source {source.nbytes}")
    target[:source.nbytes] = source
    return crc32c(target[:source.nbytes], value)


#: ``copy_crc32c(dst, src, value=0)``: copy all of ``src`` into the start of ``dst`` (not
#: overlapping it) and return the CRC-32C of the bytes copied, continuing ``value``.
copy_crc32c: Callable[..., int] = _copy.copy_crc32c if _copy is not None else _copy_then_check

"""The compact binary event file (``.kvtrace``): event arrays as they sit in memory.

Written by ``kvstore trace convert --to binary``; read by ``kvstore sim`` and the replay
tool without parsing. Little-endian throughout; docs/simulator.md has the layout::

    header (64 bytes)
      0  magic        8 bytes  b"KVTRACE\\0"
      8  version      u32      1
     12  flags        u32      0 (reserved)
     16  block_size   u32
     20  header_size  u32      64
     24  requests     u64
     32  events       u64
     40  meta_size    u64      bytes of the metadata JSON
     48  crc32c       u32      over every byte after the header
     52  reserved     12 bytes zero
    sections, each starting on an 8-byte boundary (zero padding between):
      metadata       JSON, UTF-8: format, sources, skipped, idNames
      offsets        int64   [requests + 1]
      timestamps     float64 [requests]   seconds
      input_lengths  int64   [requests]
      output_lengths int64   [requests]
      ids            int64   [events]     block keys (see kvstored.tools.ids)
      tokens         uint32  [events]     token weight of each block
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

from kvstored.tools.errors import TraceError, TraceNotFoundError
from kvstored.tools.events import EventTrace

MAGIC = b"KVTRACE\0"
VERSION = 1
HEADER = struct.Struct("<8sIIIIQQQI12x")
assert HEADER.size == 64

_SECTIONS = [  # (attribute, dtype, length: "requests+1" | "requests" | "events")
    ("offsets", "<i8", "requests+1"),
    ("timestamps", "<f8", "requests"),
    ("input_lengths", "<i8", "requests"),
    ("output_lengths", "<i8", "requests"),
    ("ids", "<i8", "events"),
    ("tokens", "<u4", "events"),
]


def _pad(size: int) -> int:
    return -size % 8


def is_binary(path: Path) -> bool:
    """Whether the file starts with the binary event file's magic."""
    try:
        with path.open("rb") as handle:
            return handle.read(len(MAGIC)) == MAGIC
    except OSError:
        return False


def write(trace: EventTrace, path: Path) -> int:
    """Write the trace; returns the bytes written. Written to a temporary name first,
    so a crash never leaves a half file under the final name."""
    meta = json.dumps({"format": trace.format, "sources": trace.sources,
                       "skipped": trace.skipped, "idNames": list(trace.id_names)}).encode()
    arrays = [np.ascontiguousarray(getattr(trace, name), dtype=dtype)
              for name, dtype, _ in _SECTIONS]
    import crc32c  # here, not at the top: a JSON trace's run never loads it

    crc = crc32c.crc32c(meta)
    crc = crc32c.crc32c(b"\0" * _pad(len(meta)), crc)
    for array in arrays:
        crc = crc32c.crc32c(memoryview(array).cast("B"), crc)
    header = HEADER.pack(MAGIC, VERSION, 0, trace.block_size, HEADER.size, trace.requests,
                         trace.events, len(meta), crc)
    partial = path.with_name(path.name + ".partial")
    with partial.open("wb") as handle:
        handle.write(header)
        handle.write(meta + b"\0" * _pad(len(meta)))
        for array in arrays:
            array.tofile(handle)
    partial.replace(path)
    return path.stat().st_size


def read(path: Path, *, verify: bool = True) -> EventTrace:
    """Read a binary event file; a damaged or foreign file raises TraceError."""
    if not path.exists():
        raise TraceNotFoundError(f"{path}: no such file")
    size = path.stat().st_size
    with path.open("rb") as handle:
        raw = handle.read(HEADER.size)
        if len(raw) < HEADER.size:
            raise TraceError(path, "is too short for a binary event file")
        magic, version, _flags, block_size, header_size, requests, events, meta_size, crc = \
            HEADER.unpack(raw)
        if magic != MAGIC:
            raise TraceError(path, "is not a binary event file (bad magic)")
        if version > VERSION:
            raise TraceError(path, f"is binary event format version {version}; this kvstore "
                                   f"reads version {VERSION}: upgrade kvstore")
        lengths = {"requests+1": requests + 1, "requests": requests, "events": events}
        expected = header_size + meta_size + _pad(meta_size) + sum(
            np.dtype(dtype).itemsize * lengths[n] for _, dtype, n in _SECTIONS)
        if size != expected:
            raise TraceError(path, f"is {size} bytes but its header describes {expected}: "
                                   "truncated or damaged; convert the trace again")
        handle.seek(header_size)
        meta_bytes = handle.read(meta_size + _pad(meta_size))
        import crc32c

        check = crc32c.crc32c(meta_bytes)
        arrays = {}
        for name, dtype, n in _SECTIONS:
            array = np.fromfile(handle, dtype=dtype, count=lengths[n])
            check = crc32c.crc32c(memoryview(array).cast("B"), check)
            arrays[name] = array.astype(dtype[1:], copy=False)
    if verify and check != crc:
        raise TraceError(path, "fails its checksum: the file is damaged; convert the trace "
                               "again")
    try:
        meta = json.loads(meta_bytes[:meta_size])
    except ValueError:
        raise TraceError(path, "has unreadable metadata") from None
    offsets = arrays["offsets"]
    if offsets[0] != 0 or offsets[-1] != events or np.any(np.diff(offsets) < 0):
        raise TraceError(path, "has inconsistent request offsets")
    return EventTrace(block_size=block_size, format=meta.get("format", "binary"),
                      sources=meta.get("sources", [str(path)]),
                      skipped=int(meta.get("skipped", 0)),
                      id_names=list(meta.get("idNames", [])), **arrays)

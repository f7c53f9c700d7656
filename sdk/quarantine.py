"""The quarantine: where a backend puts what it will not use, instead of deleting it.

A record that fails its checks, a file nobody owns, a damaged index or stamp: repair
takes them out of the store, but the bytes are evidence an operator may need, so they go
to a quarantine folder, never simply away. Every built-in backend uses this one
:class:`Quarantine`, so names, atomicity and notes are the same everywhere:

- ``<UTC time>-<stem>`` names (``20261129T120000Z-00000000000000a3.idx``), numbered
  ``.2``, ``.3``… on a clash, so the folder lists in the order things happened;
- :meth:`Quarantine.move_aside` renames a whole file in (both directories fsync'd);
- :meth:`Quarantine.copy_out` writes bytes (a record copied out of a larger file) as
  ``<name>.kvr`` with a ``<name>.json`` note saying where they came from and why, each
  written to a temporary name, fsync'd and renamed, so a crash never leaves half a copy
  under a final name; :meth:`Quarantine.copy_range` copies a byte range of a file or
  device that way (a record out of a bucket, a volume or a shard), named
  ``<time>-<file>-<offset in hex>``, in chunks, so a large extent needs little memory;
- the folder and its files are private (0700, 0600) and the folder is created only when
  something is first put in it, so a read-only open never creates it.

The folder is not counted in a backend's usage: it is the operator's to empty. What a
repair put there is reported as :attr:`~kvstored.sdk.RepairAction.QUARANTINED`, with the
path these methods return as the problem's ``action_detail``.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from kvstored.sdk.files import fsync_dir, make_private_dirs, write_atomically

log = logging.getLogger("kvstored.sdk.quarantine")

#: Bytes read at a time by :meth:`Quarantine.copy_range`.
COPY_CHUNK = 16 << 20


class Quarantine:
    """The quarantine folder of one store."""

    def __init__(self, folder: str | os.PathLike) -> None:
        self.folder = Path(folder)

    def __str__(self) -> str:
        return str(self.folder)

    def _free_name(self, stem: str, suffix: str = "") -> Path:
        """A path in the folder named ``<time>-<stem><suffix>`` that does not exist yet
        (nor its note, :func:`note_path`)."""
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        candidate = self.folder / f"{stamp}-{stem}{suffix}"
        n = 1
        while os.path.lexists(candidate) or os.path.lexists(note_path(candidate, suffix)):
            n += 1
            candidate = self.folder / f"{stamp}-{stem}.{n}{suffix}"
        return candidate

    def move_aside(self, path: str | os.PathLike, why: str) -> str:
        """Move ``path`` into the folder durably; returns its new path."""
        make_private_dirs(self.folder)
        source = Path(path)
        target = self._free_name(source.name.lstrip("."))
        os.replace(source, target)
        fsync_dir(self.folder)
        fsync_dir(source.parent)
        log.warning("quarantined %s to %s: %s", source, target, why)
        return str(target)

    def copy_out(self, stem: str, data: bytes | memoryview | Iterable[bytes],
                 note: dict[str, Any], *, suffix: str = ".kvr") -> str:
        """Write ``data`` (bytes, or an iterable of chunks for a large extent) to
        ``<time>-<stem><suffix>`` and ``note`` (plus the time) beside it as
        ``<time>-<stem>.json``; both durable. Returns the data's path."""
        make_private_dirs(self.folder)
        target = self._free_name(stem, suffix)
        copied = write_atomically(target, data, sync_dir=False)
        document = {**note, "bytes_copied": copied,
                    "quarantined": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        write_atomically(note_path(target, suffix),
                         json.dumps(document, indent=1, default=str).encode() + b"\n",
                         sync_dir=False)
        fsync_dir(self.folder)
        log.warning("copied %s to %s: %s", note.get("key") or stem, target,
                    note.get("reason", ""))
        return str(target)


    def copy_range(self, source: str | os.PathLike, offset: int, length: int | None, *,
                   reason: str, key: str | None = None, stem: str | None = None,
                   suffix: str = ".kvr", **facts: Any) -> str | None:
        """Copy ``length`` bytes (None: to the end) of the file or device ``source`` at
        ``offset`` out with :meth:`copy_out`, named ``<source name>-<offset in hex>``
        unless ``stem`` is given. The note records ``source``, ``offset``, the ``key``,
        the ``reason`` and any ``facts`` (sequence number, CRC…). Returns the copy's path,
        or None when there was nothing to copy (the file ends before ``offset``)."""
        source = os.fspath(source)
        fd = os.open(source, os.O_RDONLY | os.O_CLOEXEC)
        try:
            first = os.pread(fd, min(COPY_CHUNK, length if length is not None else
                                     COPY_CHUNK), offset)
            if not first:
                return None

            def chunks() -> Iterator[bytes]:
                yield first
                done = len(first)
                while length is None or done < length:
                    want = COPY_CHUNK if length is None else min(COPY_CHUNK, length - done)
                    chunk = os.pread(fd, want, offset + done)
                    if not chunk:
                        return  # the file ends early: keep what there is
                    yield chunk
                    done += len(chunk)

            note = {"key": key, "source": source, "offset": offset, "length": length,
                    "reason": reason, **facts}
            return self.copy_out(stem or f"{Path(source).name}-{offset:x}", chunks(), note,
                                 suffix=suffix)
        finally:
            os.close(fd)


def note_path(target: Path, suffix: str) -> Path:
    """Where the JSON note of a copy ``target`` (ending in ``suffix``) goes."""
    stem = target.name[:-len(suffix)] if suffix else target.name
    return target.with_name(f"{stem}.json")

"""Open-time recovery of a ``file-per-key`` store: load every record file's header, and
remove the writes a crash interrupted.

The rules, in order:

1. Files in ``tmp/`` are writes that were never acknowledged (a write is renamed into
   ``objects/`` before it is): removed. Read-only, they stay, and ``check`` reports them.
2. Every file under ``objects/`` whose header checks, sits at the name its key hashes
   to, and is as long as its header says, is indexed. Anything else is left out of the
   index and left in place, for ``check(repair=True)`` to quarantine.

Values are not read at open: a read checks them anyway, and ``check`` reads them all.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from kvstored.backends.file_per_key.layout import object_name
from kvstored.sdk.errors import CorruptionError
from kvstored.sdk.files import fsync_dir
from kvstored.sdk.record import VALUE_OFFSET, decode_header

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Entry:
    """One indexed object: its file, and what its record must say."""

    path: str
    size: int
    checksum: int
    seq: int
    write_ns: int
    #: Bytes the file occupies on disk (``st_blocks``).
    physical: int


def leftovers(tmp_dir: Path) -> list[Path]:
    """Files in ``tmp/``: writes that never finished (or, while open, in flight)."""
    try:
        return sorted(tmp_dir.iterdir())
    except FileNotFoundError:
        return []


def record_files(objects_dir: Path) -> Iterator[Path]:
    """Every file under ``objects/``, shard by shard."""
    if not objects_dir.is_dir():
        return  # a read-only open of a store that never stored anything
    for shard in sorted(os.scandir(objects_dir), key=lambda e: e.name):
        if not shard.is_dir():
            yield Path(shard.path)
            continue
        for sub in sorted(os.scandir(shard.path), key=lambda e: e.name):
            if not sub.is_dir():
                yield Path(sub.path)
                continue
            for item in os.scandir(sub.path):
                yield Path(item.path)


def read_entry(path: Path) -> tuple[str, Entry]:
    """Parse one record file's header and check that it belongs where it is."""
    with open(path, "rb", buffering=0) as f:
        st = os.fstat(f.fileno())
        head = f.read(VALUE_OFFSET)
    header = decode_header(head, path=str(path))
    expected = object_name(header.key.encode())
    if path.name != expected[2] or path.parent.name != expected[1]:
        raise CorruptionError("record is in the wrong file for its key", key=header.key,
                              path=path)
    if st.st_size != VALUE_OFFSET + header.value_len:
        raise CorruptionError(
            f"file is {st.st_size} bytes, the record says {VALUE_OFFSET + header.value_len}",
            key=header.key, path=path)
    return header.key, Entry(str(path), header.value_len, header.value_crc, header.seq,
                             header.write_ns, st.st_blocks * 512)


def recover(objects_dir: Path, tmp_dir: Path, *, read_only: bool) -> list[tuple[str, Entry]]:
    """Apply the rules above; return the indexed objects, oldest write first."""
    dropped = 0
    for leftover in leftovers(tmp_dir):
        if read_only:
            continue  # reported by check(); the next read-write open removes it
        # A write in flight when the process died: never acknowledged, so dropping it is
        # the correct outcome, not a loss.
        leftover.unlink()
        dropped += 1
    if dropped:
        fsync_dir(tmp_dir)
        log.info("file-per-key: removed %d unfinished write(s) from %s", dropped, tmp_dir)
    loaded: list[tuple[str, Entry]] = []
    for path in record_files(objects_dir):
        try:
            loaded.append(read_entry(path))
        except (CorruptionError, OSError) as exc:
            log.warning("file-per-key: leaving out %s: %s (run check to repair)", path, exc)
    loaded.sort(key=lambda item: item[1].seq)
    return loaded

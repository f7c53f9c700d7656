"""The stamp file that says which backend, and which layout version, owns a directory.

Opening a directory with the wrong backend must fail with a message that names the
right one, not misread its files. The stamp is ``KVSTORED-BACKEND.json``::

    {"backend": "bucket", "layout": 1, "created": "2026-11-29T12:00:00Z"}
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from kvstored.sdk.errors import CorruptionError, InvalidRequestError

STAMP_NAME = "KVSTORED-BACKEND.json"


def claim_directory(root: Path, backend: str, layout: int) -> None:
    """Create ``root`` if needed and check (or write) its stamp."""
    root.mkdir(parents=True, exist_ok=True)
    stamp = root / STAMP_NAME
    try:
        raw = stamp.read_text()
    except FileNotFoundError:
        if any(p.name != STAMP_NAME for p in root.iterdir()):
            raise InvalidRequestError(
                f"{root} is not empty and holds no {STAMP_NAME}; point the {backend!r} "
                "backend at an empty or kvstored-owned directory", path=root) from None
        write_atomically(stamp, json.dumps({
            "backend": backend, "layout": layout,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}).encode() + b"\n")
        return
    try:
        info = json.loads(raw)
        owner, owner_layout = info["backend"], int(info["layout"])
    except (ValueError, KeyError, TypeError):
        raise CorruptionError(f"{STAMP_NAME} is unreadable; restore it or move the directory "
                              "aside", path=stamp) from None
    if owner != backend:
        raise InvalidRequestError(
            f"{root} belongs to the {owner!r} backend; open it with --backend {owner}",
            path=root)
    if owner_layout != layout:
        raise InvalidRequestError(
            f"{root} has {backend} layout version {owner_layout}; this kvstored handles "
            f"version {layout}", path=root)


def fsync_dir(path: Path | str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that a crash leaves the old file or the new one:
    temporary file, fsync, rename, directory fsync."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)

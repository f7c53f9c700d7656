"""Putting evidence aside: bad records and broken buckets go to ``quarantine/``, never
simply deleted, so that an operator can look at what went wrong.

- :func:`move_aside` renames a whole file into the folder (a broken bucket at open).
- :func:`copy_out` writes one record's bytes there with a small JSON note saying where
  they came from and why (a bad record found by ``check(repair=True)``; the bucket's
  data file keeps its copy until the bucket goes).

Names start with a UTC timestamp, so the folder lists in the order things happened.
The folder is not counted in the backend's usage: it is the operator's to empty.
"""

from __future__ import annotations

import json
import logging
import os
import time

from kvstored.backends.stamp import fsync_dir

log = logging.getLogger("kvstored.backends.bucket")


def _free_name(folder: str, stem: str, suffix: str = "") -> str:
    """A path in ``folder`` named ``<timestamp>-<stem><suffix>`` that does not exist yet."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    candidate = os.path.join(folder, f"{stamp}-{stem}{suffix}")
    n = 1
    while os.path.exists(candidate):
        n += 1
        candidate = os.path.join(folder, f"{stamp}-{stem}.{n}{suffix}")
    return candidate


def move_aside(path: str, folder: str, why: str) -> str:
    """Move ``path`` into ``folder`` durably; returns the new path."""
    target = _free_name(folder, os.path.basename(path).lstrip("."))
    os.replace(path, target)
    fsync_dir(folder)
    fsync_dir(os.path.dirname(path))
    log.warning("bucket: moved %s to %s: %s", path, target, why)
    return target


def copy_out(folder: str, stem: str, record: bytes, note: dict) -> str:
    """Write ``record`` to ``<folder>/<timestamp>-<stem>.kvr`` and ``note`` next to it as
    ``.json``, both fsync'd; returns the record's path."""
    target = _free_name(folder, stem, ".kvr")
    for path, data in ((target, record),
                       (target[:-4] + ".json", json.dumps(note, indent=1).encode() + b"\n")):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
    fsync_dir(folder)
    log.warning("bucket: copied the record of key %r to %s: %s", note.get("key"), target,
                note.get("reason"))
    return target

"""A file-per-key backend that fails on command, for fault tests of a real daemon.

Start a node with ``--backend tests.faults.faulty_backend:FaultyBackend`` (with the
repository on ``PYTHONPATH``) and ``KVSTORED_TEST_FAULTS`` naming a JSON file. The file
maps a fault name to how many calls should still fail; each failing call decrements it
and raises :class:`~kvstored.sdk.BackendIOError` (EIO), as a dying disk would. The file
is re-read on every call, so a test arms faults while the daemon runs (write it with
:func:`arm`) and sees them used up (:func:`remaining`).

Fault names are the method names, plus ``batch_read_into_dram``: a ``batch_read`` whose
buffers are in the node's DRAM segment (an mmap), which only promotion does; a plain
``batch_read`` fault hits the data server's reads too.
"""

from __future__ import annotations

import errno
import json
import mmap
import os
import threading
from pathlib import Path

from kvstored.backends.file_per_key import FilePerKeyBackend
from kvstored.sdk import BackendIOError

ENV = "KVSTORED_TEST_FAULTS"
_lock = threading.Lock()


def arm(path: Path, **faults: int) -> None:
    """Make the next ``n`` calls of each named fault fail (atomically replaced)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(faults))
    os.replace(tmp, path)


def remaining(path: Path) -> dict[str, int]:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def _fail(name: str) -> None:
    path = os.environ.get(ENV)
    if not path:
        return
    with _lock:
        faults = remaining(Path(path))
        if faults.get(name, 0) <= 0:
            return
        faults[name] -= 1
        arm(Path(path), **faults)
    raise BackendIOError(f"injected fault in {name}", errno=errno.EIO, path=path)


class FaultyBackend(FilePerKeyBackend):
    """file-per-key (its on-disk layout and name) with injectable failures."""

    def batch_write(self, items):
        _fail("batch_write")
        return super().batch_write(items)

    def batch_read(self, keys, buffers):
        if any(isinstance(b.obj, mmap.mmap) for b in buffers if isinstance(b, memoryview)):
            _fail("batch_read_into_dram")
        _fail("batch_read")
        return super().batch_read(keys, buffers)

    def batch_delete(self, keys):
        _fail("batch_delete")
        return super().batch_delete(keys)

    def check(self, repair: bool = False):
        _fail("check")
        return super().check(repair)

    def scan(self, *, verify: bool = False):
        _fail("scan")
        return super().scan(verify=verify)

    def usage(self):
        _fail("usage")
        return super().usage()

"""The stamp file that says which backend, and which layout version, owns a directory;
and claiming a directory when a backend opens it.

Opening a directory with the wrong backend must fail with a message that names the
right one, not misread its files. The stamp is ``KVSTORED-BACKEND.json``, UTF-8 JSON::

    {"backend": "bucket", "layout": 1, "created": "2026-11-29T12:00:00Z"}

:func:`claim_directory` is what every built-in backend calls first. By open mode:

- read-write: create the directory (0700) if needed, take its exclusive lock
  (:class:`~kvstored.sdk.lock.StoreLock`), then check the stamp, or write it into an
  empty directory;
- read-only: write nothing; a missing directory or stamp is :class:`MissingStoreError`
  naming the stamp looked for, and the lock is taken shared;
- repair: as read-write, but a stamp that is unreadable, or missing from a directory that
  holds this backend's files, is set aside (quarantine) and written anew.

A stamp that cannot be read (not UTF-8, not JSON, truncated, fields missing) is a
:class:`CorruptionError`; a stamp that is missing from a directory holding a store's files
is one too. Neither is ever taken for an empty directory, and neither is overwritten
outside repair mode.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from kvstored.sdk.errors import CorruptionError, InvalidRequestError, MissingStoreError
from kvstored.sdk.files import is_temporary, make_private, make_private_dirs, write_atomically
from kvstored.sdk.lock import LOCK_NAME, StoreLock
from kvstored.sdk.quarantine import Quarantine
from kvstored.sdk.types import OpenMode, Problem, ProblemKind, RepairAction

log = logging.getLogger(__name__)

STAMP_NAME = "KVSTORED-BACKEND.json"
#: Seconds a read-write open waits for the lock of a store whose holder is exiting.
LOCK_WAIT = 5.0
#: Names a directory may hold and still count as empty: the stamp, the lock.
_HOUSEKEEPING = frozenset({STAMP_NAME, LOCK_NAME})

@dataclass(frozen=True, slots=True)
class Stamp:
    backend: str
    layout: int
    created: str | None = None


def repair_hint(root: Path) -> str:
    return (f"restore it from a backup, or run `kvstore recover --offline {root} --repair` "
            "to rebuild it from the records")


def read_stamp(root: str | os.PathLike) -> Stamp | None:
    """The stamp of ``root``, or None when it has none. Raises :class:`CorruptionError`
    (naming the file, what is wrong and what to do) when it exists but cannot be read."""
    root = Path(root)
    path = root / STAMP_NAME
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        raise CorruptionError(f"{STAMP_NAME} is a directory, not the stamp file; "
                              f"{repair_hint(root)}", path=path) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise CorruptionError(f"{STAMP_NAME} is unreadable: not UTF-8 text; "
                              f"{repair_hint(root)}", path=path) from None
    try:
        info = json.loads(text)
    except ValueError:
        what = "it is empty" if not text.strip() else "not valid JSON (truncated or damaged?)"
        raise CorruptionError(f"{STAMP_NAME} is unreadable: {what}; {repair_hint(root)}",
                              path=path) from None
    backend = info.get("backend") if isinstance(info, dict) else None
    layout = info.get("layout") if isinstance(info, dict) else None
    if (not isinstance(backend, str) or not backend or isinstance(layout, bool)
            or not isinstance(layout, int)):
        raise CorruptionError(f"{STAMP_NAME} is unreadable: it lacks a backend name or a "
                              f"layout version; {repair_hint(root)}", path=path)
    created = info.get("created")
    return Stamp(backend, layout, created if isinstance(created, str) else None)


def write_stamp(root: Path, backend: str, layout: int) -> None:
    document = {"backend": backend, "layout": layout,
                "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    write_atomically(root / STAMP_NAME, json.dumps(document).encode() + b"\n")


def store_files(root: Path) -> list[str]:
    """The names in ``root`` other than the stamp (or one being written) and the lock."""
    try:
        return sorted(n for n in os.listdir(root)
                      if n not in _HOUSEKEEPING and not is_temporary(n, STAMP_NAME))
    except FileNotFoundError:
        return []


def claim_directory(root: Path, backend: str, layout: int, *,
                    mode: OpenMode = OpenMode.READ_WRITE, markers: Collection[str] = (),
                    lock: bool = True, report: list[Problem] | None = None
                    ) -> StoreLock | None:
    """Claim ``root`` for ``backend`` (layout version ``layout``) in ``mode``; see the
    module docstring. ``markers`` are names this backend keeps in its directory, all of
    which a store whose stamp is lost still holds: by them it is recognised. Returns the
    directory's lock (None with ``lock=False``, for a directory several writers share);
    the caller releases it. A stamp rebuilt in repair mode is added to ``report`` (for
    the backend's next ``check()`` to show).
    """
    root = Path(root)
    read_only = mode is OpenMode.READ_ONLY
    if read_only:
        if not root.is_dir():
            raise MissingStoreError(
                f"no {backend} store here: the directory does not exist (looked for "
                f"{root / STAMP_NAME})", path=root)
    elif not make_private_dirs(root) and make_private(root):
        log.warning("%s: made the store directory private (0700); it was readable by "
                    "other users", root)
    held = StoreLock.acquire(root / LOCK_NAME, shared=read_only,
                             what=f"{backend} store", wait=0 if read_only else LOCK_WAIT) \
        if lock else None
    try:
        rebuilt = _check_stamp(root, backend, layout, mode, markers)
    except BaseException:
        if held is not None:
            held.release()
        raise
    if rebuilt is not None and report is not None:
        report.append(rebuilt)
    return held


def _check_stamp(root: Path, backend: str, layout: int, mode: OpenMode,
                 markers: Collection[str]) -> Problem | None:
    """Check (or write) the stamp; return what repair mode did about a damaged one."""
    stamp_path = root / STAMP_NAME
    try:
        stamp = read_stamp(root)
    except CorruptionError as exc:
        if mode is not OpenMode.REPAIR:
            raise
        moved = Quarantine(root / "quarantine").move_aside(stamp_path, exc.message)
        write_stamp(root, backend, layout)
        log.warning("%s: the stamp was unreadable; moved it to %s and wrote a new one for "
                    "the %s backend", root, moved, backend)
        return Problem(ProblemKind.CORRUPT_RECORD, exc.message, path=str(stamp_path),
                       action=RepairAction.REBUILT,
                       action_detail=f"a new stamp for the {backend} backend; the damaged "
                       f"one is in {moved}")
    if stamp is None:
        present = store_files(root)
        ours = sorted(markers) if markers and set(markers) <= set(present) else []
        if ours:
            if mode is OpenMode.REPAIR:
                write_stamp(root, backend, layout)
                log.warning("%s: holds %s files (%s) but no stamp; wrote a new stamp",
                            root, backend, ", ".join(ours))
                files = ", ".join(ours)
                return Problem(ProblemKind.INDEX_MISMATCH,
                               f"the stamp was missing beside the store's files ({files})",
                               path=str(stamp_path), action=RepairAction.REBUILT,
                               action_detail=f"a new stamp for the {backend} backend")
            raise CorruptionError(
                f"the directory holds the files of a {backend} store ({', '.join(ours)}) "
                f"but its stamp {STAMP_NAME} is missing; {repair_hint(root)}",
                path=stamp_path)
        if mode is OpenMode.READ_ONLY:
            raise MissingStoreError(
                f"no kvstored store here: {STAMP_NAME} (the stamp every backend writes) is "
                f"missing{' and the directory is empty' if not present else ''}",
                path=stamp_path)
        if present:
            raise InvalidRequestError(
                f"{root} is not empty ({', '.join(present[:3])}{'…' if len(present) > 3 else ''}) "
                f"and holds no {STAMP_NAME}; point the {backend!r} backend at an empty or "
                "kvstored-owned directory", path=root)
        write_stamp(root, backend, layout)
        return None
    if stamp.backend != backend:
        raise InvalidRequestError(
            f"{root} belongs to the {stamp.backend!r} backend; open it with --backend "
            f"{stamp.backend}", path=root)
    if stamp.layout != layout:
        raise InvalidRequestError(
            f"{root} has {backend} layout version {stamp.layout}; this kvstored handles "
            f"version {layout}", path=root)
    return None

"""Opening a backend directory without a daemon: what the offline tools
(``kvstore recover --offline``, ``kvstore mount --offline``) look at, and how.

:func:`identify` finds out which backend owns a directory, from its stamp, or, when the
stamp is lost, from the files a built-in backend keeps (``buckets/``, ``volume.kvo``…).
It says precisely what is wrong when the answer is "none": the path does not exist, it
is empty, it holds something else, or it is a node's ``--data`` directory, whose SSD tier
is the ``ssd`` folder inside. :func:`open_offline` then opens it read-only (nothing is
written, and a directory that a live node holds is refused), or in repair mode.

This module only decides and opens; exit codes are the command line's business.
"""

from __future__ import annotations

import os
from pathlib import Path

from kvstored.backends.stamp import STAMP_NAME, read_stamp, repair_hint, store_files
from kvstored.sdk.backend import StorageBackend
from kvstored.sdk.errors import CorruptionError, MissingStoreError, UnknownBackendError
from kvstored.sdk.registry import BUILTIN, backend_class, open_backend
from kvstored.sdk.types import OpenMode

#: The folder of a node's ``--data`` directory that holds its SSD tier.
NODE_SSD_DIR = "ssd"


def _markers() -> dict[str, tuple[str, ...]]:
    """Each built-in backend's layout markers (the names it keeps in its directory)."""
    found = {}
    for name in BUILTIN:
        try:
            found[name] = tuple(getattr(backend_class(name), "layout_markers", ()))
        except UnknownBackendError:
            continue
    return found


def recognise(directory: Path) -> str | None:
    """The built-in backend whose files ``directory`` holds (all of its markers), or
    None. Needs no stamp."""
    present = set(store_files(directory))
    for name, markers in _markers().items():
        if markers and set(markers) <= present:
            return name
    return None


def _holds_store(directory: Path) -> bool:
    try:
        return read_stamp(directory) is not None or recognise(directory) is not None
    except CorruptionError:
        return True


def _threefs_root(directory: Path) -> bool:
    """Whether ``directory`` is a 3fs mount point: cluster folders stamped ``3fs``."""
    try:
        children = [c for c in directory.iterdir() if c.is_dir()]
    except OSError:
        return False
    for child in children:
        try:
            stamp = read_stamp(child)
        except CorruptionError:
            continue
        if stamp is not None and stamp.backend == "3fs":
            return True
    return False


def identify(directory: str | os.PathLike, backend: str | None = None, *,
             repair: bool = False) -> str:
    """The name of the backend that owns ``directory`` (``backend`` wins when given).

    Raises :class:`MissingStoreError` (naming what was looked for, and the ``ssd``
    folder when ``directory`` is a node's data directory) when it holds no store, and
    :class:`CorruptionError` when its stamp is unreadable, or missing beside a store's
    files, unless ``repair`` (which rebuilds the stamp, so it only needs the name).
    """
    directory = Path(directory)
    stamp_path = directory / STAMP_NAME
    if not directory.exists():
        raise MissingStoreError(f"{directory} does not exist (check the path: a node's SSD "
                                f"tier is <data>/{NODE_SSD_DIR})", path=directory)
    if not directory.is_dir():
        raise MissingStoreError(f"{directory} is not a directory; pass a node's SSD "
                                f"directory (<data>/{NODE_SSD_DIR})", path=directory)
    try:
        stamp = read_stamp(directory)
    except CorruptionError as exc:
        if repair and (backend or recognise(directory)):
            return backend or recognise(directory)  # type: ignore[return-value]
        if repair:
            raise CorruptionError(f"{exc.message}. Its files do not say which backend "
                                  "wrote them: name it with --backend", path=stamp_path) \
                from None
        raise
    if backend is not None:
        return backend
    if stamp is not None:
        return stamp.backend
    found = recognise(directory)
    if found is not None:
        if repair:
            return found
        raise CorruptionError(
            f"{directory} holds the files of a {found} store but its stamp {STAMP_NAME} is "
            f"missing; {repair_hint(directory)}", path=stamp_path)
    if _threefs_root(directory):
        return "3fs"
    ssd = directory / NODE_SSD_DIR
    if ssd.is_dir() and _holds_store(ssd):
        raise MissingStoreError(
            f"{directory} is a node's data directory (--data), not its SSD tier: pass "
            f"{ssd}", path=stamp_path)
    contents = store_files(directory)
    raise MissingStoreError(
        f"no kvstored store in {directory}: it has no {STAMP_NAME} (the stamp every "
        "backend writes)" + (" and is empty" if not contents else "")
        + f"; pass a stopped node's SSD directory (<data>/{NODE_SSD_DIR})", path=stamp_path)


def open_offline(directory: str | os.PathLike, backend: str | None = None, *,
                 repair: bool = False, **options) -> StorageBackend:
    """Open ``directory`` without a daemon: read-only (writes nothing, refuses a directory
    a live node holds) or, with ``repair``, in repair mode (recovery may write, damaged
    metadata is rebuilt)."""
    name = identify(directory, backend, repair=repair)
    mode = OpenMode.REPAIR if repair else OpenMode.READ_ONLY
    return open_backend(name, directory, mode=mode, **options)

"""Conformance checks: Opening: one writer per store, read-only opens that write nothing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from kvstored.sdk.errors import (
    BackendBusyError,
    InvalidRequestError,
    MissingStoreError,
    ReadOnlyError,
)
from kvstored.sdk.testing import _holder, _writer
from kvstored.sdk.testing.checks._common import (
    Clause,
    check,
    child_env,
    child_target,
    describe,
    kill_writer_midway,
    spec_options,
)
from kvstored.sdk.testing.kit import Kit, Requirement, payload, size_for
from kvstored.sdk.types import OpenMode

# -- opening -----------------------------------------------------------------------------


def _supports_read_only(kit: Kit) -> bool:
    return OpenMode.READ_ONLY in kit.backend_type().open_modes


def _tree(root: Path) -> dict[str, tuple]:
    """Every entry under ``root`` with what a write would change: type, size, mode,
    inode, mtime and ctime (a read changes none of them; atime is left out)."""
    found: dict[str, tuple] = {}
    if not root.exists():
        return found
    for folder, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            path = os.path.join(folder, name)
            st = os.lstat(path)
            found[os.path.relpath(path, root)] = (st.st_mode, st.st_size, st.st_ino,
                                                  st.st_mtime_ns, st.st_ctime_ns)
    st = os.lstat(root)
    found["."] = (st.st_mode, st.st_ino, st.st_mtime_ns, st.st_ctime_ns)
    return found


def _changes(before: dict[str, tuple], after: dict[str, tuple]) -> list[str]:
    return sorted({*before, *after} - {k for k in before if before[k] == after.get(k)})


@check(Clause.OPENING, Requirement.PERSISTENT, Requirement.CHILD_PROCESS)
def second_open_is_refused(kit: Kit) -> None:
    """While another process has the store open, opening it again (read-write or
    read-only) raises BackendBusyError; once that process closes it, it opens at once."""
    holder = subprocess.Popen(
        [sys.executable, "-m", _holder.__name__, child_target(kit), spec_options(kit),
         str(kit.path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env=child_env())
    assert holder.stdin and holder.stdout and holder.stderr  # all three piped
    try:
        line = holder.stdout.readline().strip()
        assert line == "OPEN", f"the holding process could not open the store: " \
                               f"{line or holder.stderr.read()[-2000:]}"
        modes = [OpenMode.READ_WRITE]
        if _supports_read_only(kit):
            modes.append(OpenMode.READ_ONLY)
        for mode in modes:
            try:
                backend = kit.open(mode=mode)
            except BackendBusyError:
                continue
            kit.abandon(backend)
            backend.close()
            raise AssertionError(f"a {mode.value} open succeeded while another process "
                                 "had the store open read-write (two writers corrupt a "
                                 "store; take an exclusive lock: kvstored.sdk.lock)")
    finally:
        holder.stdin.close()
        holder.wait(60)
    assert holder.returncode == 0, holder.stderr.read()[-2000:]
    kit.open()  # the holder's close released it


@check(Clause.OPENING, Requirement.PERSISTENT, Requirement.CHILD_PROCESS)
def read_only_open_writes_nothing(kit: Kit) -> None:
    """After a writer is killed mid-batch, a read-only open reads every acknowledged
    object yet creates, changes and removes nothing (no recovery writes), and every
    changing call raises ReadOnlyError. A backend without read-only opens must refuse
    mode=read-only with ReadOnlyError."""
    if not _supports_read_only(kit):
        try:
            kit.open(mode=OpenMode.READ_ONLY)
        except ReadOnlyError:
            return
        raise AssertionError("the backend does not list OpenMode.READ_ONLY in open_modes "
                             "but opened read-only anyway")
    # A crash leaves something for recovery to tidy only if it lands inside a write:
    # try a few crashes until a read-write open afterwards does change the directory.
    for attempt in range(CRASH_ATTEMPTS):
        if attempt:
            shutil.rmtree(kit.path)
        acked = kill_writer_midway(kit)
        before = _tree(kit.workspace)
        _read_only_session(kit, acked)
        changed = _changes(before, _tree(kit.workspace))
        assert not changed, f"a read-only open changed the directory: {changed[:8]}"
        kit.open().close()  # a read-write open after it: did the crash leave it work?
        if _changes(before, _tree(kit.workspace)):
            return  # it did, and the read-only open left that work alone


#: Crashes tried by read_only_open_writes_nothing before settling for one that left
#: nothing for recovery to do.
CRASH_ATTEMPTS = 5


def _read_only_session(kit: Kit, acked: int) -> None:
    """Open read-only, read every acknowledged object, use every reading call, try every
    changing one, and close."""
    backend = kit.open(mode=OpenMode.READ_ONLY)
    assert backend.capabilities.read_only_open, "capabilities.read_only_open is False"
    for n in range(acked + 1):
        for key in _writer.batch_keys(n):
            got = kit.read(backend, key)
            value = payload(key, size_for(key, _writer.SIZE_LIMIT))
            assert got == value, f"acknowledged {key!r} read back as {describe(got)}"
    list(backend.scan(verify=True))
    backend.usage()
    backend.check()
    for name, call in (("batch_write", lambda: backend.batch_write([("ro-new", b"x")])),
                       ("batch_delete", lambda: backend.batch_delete(["torn/0/0"])),
                       ("evict", lambda: backend.evict(1)),
                       ("check(repair=True)", lambda: backend.check(repair=True))):
        try:
            call()
        except ReadOnlyError:
            continue
        raise AssertionError(f"{name} on a backend opened read-only did not raise "
                             "ReadOnlyError")
    second = kit.open(mode=OpenMode.READ_ONLY)  # readers share the store
    second.close()
    backend.close()


@check(Clause.OPENING)
def read_only_open_of_nothing_is_refused(kit: Kit) -> None:
    """A read-only open of a path that holds no store (absent, or an empty directory)
    raises MissingStoreError (or, for a backend whose path is a file or device, refuses
    the directory as the wrong kind of path) and creates nothing. A backend without
    read-only opens refuses the mode there too, creating nothing."""
    refusals: tuple[type[Exception], ...] = (MissingStoreError, InvalidRequestError)
    if not _supports_read_only(kit):
        refusals = (ReadOnlyError,)
    for prepare in ("absent", "empty"):
        if prepare == "empty":
            kit.path.mkdir()
        try:
            backend = kit.open(mode=OpenMode.READ_ONLY)
        except refusals as exc:
            if prepare == "absent" and _supports_read_only(kit):
                assert isinstance(exc, MissingStoreError), \
                    f"a read-only open of an absent path raised {exc!r}, not MissingStoreError"
        else:
            backend.close()
            raise AssertionError(f"a read-only open of an {prepare} path succeeded")
        left = sorted(os.listdir(kit.path)) if kit.path.exists() else None
        assert left == (None if prepare == "absent" else []), \
            f"a refused read-only open of an {prepare} path left {left}"

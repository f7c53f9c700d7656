"""The kit's side of power-loss testing: mount :mod:`~kvstored.sdk.testing.powerfs`, cut
the power, bring it back; or make chosen operations fail with EIO or ENOSPC a while.

:class:`PowerLossMount` runs the file system in a process of its own (so that the kit,
and a backend it opens in-process, never wait on a FUSE server that needs their GIL) and
talks to it over a pipe. A power cut is, in this order: the file system stops answering
(every operation fails with EIO, so nothing more becomes durable) and drops what was not
durable; the kit kills the process that was using the store; the power comes back.

Where FUSE cannot be used the checks are not applicable, and :func:`fuse_unavailable`
says why, unless ``KVSTORED_REQUIRE`` names ``fuse``: then that is a failure. This module
is not the file system's model (see powerfs) and not the checks (see checks/power.py).
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

from kvstored.sdk.testing import powerfs

#: How long the file system may take to mount, and to unmount at the end.
MOUNT_TIMEOUT = 30.0


class PowerFsError(RuntimeError):
    """The power-loss file system could not be mounted or stopped answering."""


def fuse_unavailable() -> str | None:
    """Why this machine cannot run the power-loss file system, or None if it can."""
    try:
        fd = os.open("/dev/fuse", os.O_RDWR)
    except OSError as exc:
        return f"/dev/fuse cannot be opened ({exc.strerror})"
    os.close(fd)
    try:
        import pyfuse3  # noqa: F401
        import trio  # noqa: F401
    except ImportError as exc:
        return f"pyfuse3 does not import ({exc}); pip install 'kvstored[fuse]'"
    return None


def fuse_required() -> bool:
    """Whether ``KVSTORED_REQUIRE`` (what CI sets) says FUSE must be present."""
    names = os.environ.get("KVSTORED_REQUIRE", "")
    return "fuse" in {part.strip() for part in names.split(",")}


class PowerLossMount:
    """The power-loss file system mounted on ``mountpoint`` while the context is open.

    ``stderr_path`` collects the file system's own error output, quoted when it fails.
    """

    def __init__(self, mountpoint: Path, stderr_path: Path) -> None:
        self.mountpoint = mountpoint
        self._stderr_path = stderr_path
        self._process: subprocess.Popen | None = None

    def __enter__(self) -> PowerLossMount:
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        with open(self._stderr_path, "wb") as errors:
            self._process = subprocess.Popen(
                [sys.executable, "-m", powerfs.__name__, str(self.mountpoint)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors, text=True,
                env=env)
        try:
            self._answer(MOUNT_TIMEOUT)
        except PowerFsError:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        assert process.stdin is not None
        try:
            process.stdin.close()  # end of input: the file system unmounts and exits
            process.wait(MOUNT_TIMEOUT)
        except (OSError, subprocess.TimeoutExpired):
            process.kill()
            process.wait()
            subprocess.run(["fusermount3", "-uz", str(self.mountpoint)], capture_output=True,
                           timeout=MOUNT_TIMEOUT, check=False)

    def cut(self, survival: float, seed: int) -> dict[str, int]:
        """Cut the power: from now every operation fails with EIO, and the files are
        what the disk holds (each unsynced page and entry change kept with probability
        ``survival``, drawn from ``seed``). Returns the file system's counters."""
        return self._command(f"cut {survival} {seed}")

    def arm(self, mutations: int, survival: float, seed: int) -> dict[str, int]:
        """Make the same cut happen by itself, in place of the ``mutations``-th
        operation from now that would change something (a write, a sync, a create, …)."""
        return self._command(f"arm {mutations} {survival} {seed}")

    def fail(self, operations: Iterable[str], code: int, count: int = 0) -> dict[str, int]:
        """Inject a fault: the next ``count`` operations named in ``operations`` (FUSE
        names, :data:`~kvstored.sdk.testing.powerfs.FAULTABLE`), or every one until
        :meth:`heal` when ``count`` is 0, fail with errno ``code`` and change nothing."""
        return self._command(f"fail {','.join(sorted(operations))} {code} {count}")

    def heal(self) -> dict[str, int]:
        """Stop failing what :meth:`fail` made fail."""
        return self._command("heal")

    def power_on(self) -> dict[str, int]:
        return self._command("on")

    def stats(self) -> dict[str, int]:
        return self._command("stats")

    def _command(self, line: str) -> dict:
        if self._process is None or self._process.stdin is None:
            raise PowerFsError("the power-loss file system is not mounted")
        try:
            self._process.stdin.write(line + "\n")
            self._process.stdin.flush()
        except OSError as exc:
            raise PowerFsError(f"the power-loss file system is gone ({exc}); "
                               f"{self._errors()}") from None
        return self._answer(MOUNT_TIMEOUT)

    def _answer(self, timeout: float) -> dict:
        assert self._process is not None and self._process.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self._process.stdout], [], [],
                                        max(deadline - time.monotonic(), 0))
            if not ready:
                break
            line = self._process.stdout.readline()
            if not line:
                raise PowerFsError(f"the power-loss file system exited: {self._errors()}")
            answer = json.loads(line)
            if "error" in answer:
                raise PowerFsError(answer["error"])
            return answer
        raise PowerFsError(f"the power-loss file system did not answer in {timeout:.0f} s: "
                           f"{self._errors()}")

    def _errors(self) -> str:
        try:
            text = self._stderr_path.read_text(errors="replace").strip()
        except OSError:
            text = ""
        return text[-1500:] or "(no error output)"

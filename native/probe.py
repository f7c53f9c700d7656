"""Whether io_uring works for this process, and if not, why, in words an operator can use.

The answer comes from trying: the probe creates a small ring and checks that the kernel
knows every operation the engine uses. The sysctl and the build flags only explain a
refusal; they never stand in for the attempt (root may use io_uring under
``io_uring_disabled=1``, a seccomp filter shows in no file).
"""

from __future__ import annotations

import errno
import importlib
from pathlib import Path
from typing import Any

#: ``kernel.io_uring_disabled`` (Linux 6.6+): 0 on, 1 only for ``kernel.io_uring_group``
#: and CAP_SYS_ADMIN, 2 off for everyone.
IO_URING_DISABLED = "/proc/sys/kernel/io_uring_disabled"


def read_io_uring_disabled(path: str | Path = IO_URING_DISABLED) -> int | None:
    """The sysctl's value, or None where the kernel has no such knob (before 6.6)."""
    try:
        return int(Path(path).read_text().strip())
    except (OSError, ValueError):
        return None


def _load_native() -> Any:
    # The compiled module exists only once built (make engines): no static import.
    return importlib.import_module("kvstored.native._io").lib


def probe_uring(*, sysctl_path: str | Path = IO_URING_DISABLED,
                lib: Any = None) -> tuple[bool, str]:
    """``(available, reason)`` for the io_uring engine in this process.

    ``sysctl_path`` and ``lib`` (the compiled module's ``lib``) are there so that tests can
    point the probe at another sysctl file or another build.
    """
    if lib is None:
        try:
            lib = _load_native()
        except ImportError as exc:
            return False, (f"the native module kvstored.native._io is not built ({exc}); "
                           f"reinstall kvstored with a C compiler present")
    if not lib.kv_built_with_uring():
        return False, ("kvstored.native._io was built without liburing; install liburing "
                       "(Debian: apt install liburing-dev) and reinstall kvstored")
    disabled = read_io_uring_disabled(sysctl_path)
    if disabled == 2:
        return False, "io_uring is switched off by the sysctl kernel.io_uring_disabled=2"
    rc = lib.kv_uring_probe()
    if rc == 0:
        return True, "io_uring available"
    return False, _explain(-rc, disabled)


#: Why io_uring_setup failed, by its errno, in words an operator can act on.
_SETUP_FAILURES = {
    errno.EPERM: "io_uring_setup was refused (EPERM): a seccomp filter (such as a container "
                 "runtime's default profile) or a security module blocks io_uring",
    errno.ENOSYS: "io_uring_setup does not exist (ENOSYS): the kernel predates 5.1 or lacks "
                  "CONFIG_IO_URING, or a seccomp filter hides it",
    errno.EOPNOTSUPP: "the kernel's io_uring lacks operations the engine needs (READ, WRITE, "
                      "FSYNC, READ_FIXED, WRITE_FIXED, READV, WRITEV): Linux 5.6 or later is "
                      "needed",
    errno.ENOMEM: "io_uring_setup ran out of memory (ENOMEM): before Linux 5.12 rings count "
                  "against RLIMIT_MEMLOCK; raise it (ulimit -l)",
}


def _explain(code: int, disabled: int | None) -> str:
    if code == errno.EPERM and disabled == 1:  # the sysctl, not a filter, said no
        return ("io_uring_setup was refused (EPERM): kernel.io_uring_disabled=1 allows it "
                "only to members of kernel.io_uring_group and to CAP_SYS_ADMIN")
    name = errno.errorcode.get(code, str(code))
    return _SETUP_FAILURES.get(code, f"io_uring_setup failed: {name} ({code})")

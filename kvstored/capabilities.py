"""What this machine can do, detected rather than assumed.

Each probe returns ``(available, reason)``; the reason is what an operator needs to
read when the answer is no. ``KVSTORED_REQUIRE`` names capabilities that must be
present (CI sets ``fuse,uring``): tests fail instead of skipping without them.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
from collections.abc import Mapping

from kvstored.native import uring_status

KNOWN = ("fuse", "uring", "rdma", "engines", "fio")


def required_capabilities(environ: Mapping[str, str]) -> set[str]:
    """The capabilities ``KVSTORED_REQUIRE`` lists; unknown names are an error."""
    raw = environ.get("KVSTORED_REQUIRE", "")
    names = {part.strip() for part in raw.split(",") if part.strip()}
    unknown = names - set(KNOWN)
    if unknown:
        raise ValueError(f"KVSTORED_REQUIRE names unknown capabilities {sorted(unknown)}; "
                         f"known: {', '.join(KNOWN)}")
    return names


def probe_fuse() -> tuple[bool, str]:
    """FUSE works when /dev/fuse opens, fusermount3 exists and pyfuse3 imports."""
    try:
        fd = os.open("/dev/fuse", os.O_RDWR)
    except OSError as exc:
        return False, f"/dev/fuse cannot be opened ({exc.strerror})"
    os.close(fd)
    if shutil.which("fusermount3") is None:
        return False, "fusermount3 is not installed (Debian package fuse3)"
    try:
        import pyfuse3  # noqa: F401
    except ImportError as exc:
        return False, f"pyfuse3 does not import ({exc}); pip install 'kvstored[fuse]'"
    return True, "FUSE available"


def probe_uring() -> tuple[bool, str]:
    """io_uring works when the native engine was built against liburing and the kernel
    lets this process set up a ring (see kvstored.native.probe)."""
    return uring_status()


def probe_rdma() -> tuple[bool, str]:
    """RDMA needs an InfiniBand/RoCE device under /sys/class/infiniband and pyverbs."""
    devices = "/sys/class/infiniband"
    if not os.path.isdir(devices) or not os.listdir(devices):
        return False, f"no RDMA device in {devices}"
    try:
        import pyverbs  # noqa: F401
    except ImportError:
        return False, "RDMA devices exist but pyverbs is not installed (rdma-core)"
    return True, "RDMA available"


def probe_fio() -> tuple[bool, str]:
    """fio, which the io-engine and backend benchmarks measure themselves against."""
    path = shutil.which("fio")
    if path is None:
        return False, "fio is not installed (Debian package fio; .ci/sysdeps installs it)"
    return True, f"fio at {path}"


def probe_engine(name: str) -> tuple[bool, str]:
    """An inference engine (sglang, vllm, lmcache) whose storage path the integration
    tests drive is installed; ``.ci/engines`` installs all three on a CPU machine."""
    try:
        version = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return False, f"{name} is not installed; run .ci/engines"
    return True, f"{name} {version} installed"

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


def probe_idle_halts(root: str = "/") -> tuple[bool, str]:
    """Whether an idle vCPU halts at once: a virtual machine (the ``hypervisor`` CPU
    flag) whose idle loop does not poll first (no cpuidle ``haltpoll`` driver, or its
    ``guest_halt_poll_ns`` is 0). Waking such a vCPU is a trip through the hypervisor,
    dearer than a loopback round trip, so a client that waits for a short reply polls
    for it rather than block (kvstored.client.connection). ``root`` is for tests."""
    def read(path: str) -> str:
        try:
            with open(os.path.join(root, path)) as file:
                return file.read()
        except OSError:
            return ""

    flags = next((line for line in read("proc/cpuinfo").splitlines()
                  if line.startswith("flags")), "")
    if "hypervisor" not in flags.split():
        return False, "not a virtual machine (no hypervisor CPU flag)"
    driver = read("sys/devices/system/cpu/cpuidle/current_driver").strip()
    if driver != "haltpoll":
        return True, f"a virtual machine whose idle driver is {driver or 'unknown'}, " \
                     "not haltpoll: an idle vCPU halts at once"
    poll = read("sys/module/haltpoll/parameters/guest_halt_poll_ns").strip()
    if poll == "0":
        return True, "a virtual machine with guest_halt_poll_ns 0: an idle vCPU halts at once"
    return False, f"a virtual machine whose idle loop polls {poll or '?'} ns before it halts"


def probe_engine(name: str) -> tuple[bool, str]:
    """An inference engine (sglang, vllm, lmcache) whose storage path the integration
    tests drive is installed; ``.ci/engines`` installs all three on a CPU machine."""
    try:
        version = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return False, f"{name} is not installed; run .ci/engines"
    return True, f"{name} {version} installed"

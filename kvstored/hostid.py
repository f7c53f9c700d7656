"""A stable identity for this machine and boot, to tell same-host peers apart.

Clients and nodes compare host ids to decide whether the shared-memory path can work;
the client still proves it by attaching the segment (and checking its token), so a
false match only costs a failed attach.
"""

from __future__ import annotations

import functools
import socket


@functools.cache
def host_id() -> str:
    parts = []
    for path in ("/etc/machine-id", "/var/lib/dbus/machine-id",
                 "/proc/sys/kernel/random/boot_id"):
        try:
            with open(path) as f:
                parts.append(f.read().strip())
        except OSError:
            continue
    if not parts:
        parts.append(socket.gethostname())
    return "-".join(parts)

"""Network addresses as people write them: ``host:port``.

Below everything that takes an address (the configuration, the clients, the daemon).
"""

from __future__ import annotations

import ipaddress
import re

_HOSTNAME = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)(\.(?!-)[A-Za-z0-9-]{1,63}(?<!-))*$")


def split_address(text: str, default_host: str = "127.0.0.1") -> tuple[str, int]:
    """``"host:port"`` -> ``(host, port)``; ``":7700"`` uses ``default_host``; IPv6
    hosts are bracketed (``"[::1]:7700"``) and come back without brackets. Raises
    ValueError saying what to write."""
    hint = "write HOST:PORT, e.g. 127.0.0.1:7700, :7700 or [::1]:7700"
    host, sep, port_text = text.strip().rpartition(":")
    if not sep or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError(f"{text!r} is not an address; {hint} (port 0-65535)")
    if host.startswith("[") and host.endswith("]"):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise ValueError(f"{text!r} has an invalid IPv6 host; {hint}") from None
        host = host[1:-1]
    elif host == "":
        host = default_host
    elif not _HOSTNAME.match(host):
        raise ValueError(f"{text!r} has an invalid host {host!r}; {hint}")
    return host, int(port_text)

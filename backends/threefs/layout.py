"""Where one cluster of the ``3fs`` backend keeps its files, and how they are named.

Layout under the directory given (a 3FS mount point, or a folder on it)::

    <cluster>/KVSTORED-BACKEND.json          the stamp (backend "3fs", layout 1)
    <cluster>/<node-id>/journal.kvj          the node's index (journal.py has its bytes)
    <cluster>/<node-id>/shard-NNNNNNNN.dat   records (the SDK's record format), appended
    <cluster>/<node-id>/KVSTORED-LOCK        flock'd while a process has this node open
    <cluster>/<node-id>/quarantine/          what check(repair=True) moved or copied aside

Each node writes only under its own directory, so no two nodes ever write one file. Names
are made from the cluster and node names (checked against a portable alphabet) and
numbers: no key ever becomes part of a path.
"""

from __future__ import annotations

import re
import socket
from pathlib import Path

from kvstored.sdk.errors import InvalidRequestError

LAYOUT_VERSION = 1
SHARD_PREFIX = "shard-"
SHARD_SUFFIX = ".dat"
#: Node and cluster names become directory names: keep them to a portable alphabet.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def check_name(kind: str, name: str) -> str:
    """Return ``name`` if it is a usable cluster or node name, else raise a clear error."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise InvalidRequestError(
            f"{kind} {name!r} is not a valid name: use 1 to 128 letters, digits, '.', '_' "
            f"or '-', starting with a letter or digit (it becomes a directory name)")
    return name


def default_node_id() -> str:
    """The host name, which is unique per machine in any sane cluster."""
    name = socket.gethostname() or "localhost"
    try:
        return check_name("node_id", name)
    except InvalidRequestError:
        raise InvalidRequestError(
            f"the host name {name!r} cannot serve as the node id; pass node_id=…") from None


def shard_name(number: int) -> str:
    return f"{SHARD_PREFIX}{number:08d}{SHARD_SUFFIX}"


def shard_number(name: str) -> int | None:
    """The number in a shard file name, or None if ``name`` is not one."""
    if not (name.startswith(SHARD_PREFIX) and name.endswith(SHARD_SUFFIX)):
        return None
    digits = name[len(SHARD_PREFIX):-len(SHARD_SUFFIX)]
    return int(digits) if digits.isdigit() else None


def shard_path(node_dir: Path, number: int) -> Path:
    return node_dir / shard_name(number)

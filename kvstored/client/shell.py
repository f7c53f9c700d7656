"""What the blocking and the trio shells share around the sans-IO :class:`ClientCore`:
finding the token, building the core, and the views of it both expose.

Not the I/O itself: each shell performs the core's effects its own way.
"""

from __future__ import annotations

from typing import Any

from kvstored.client.core import ClientCore
from kvstored.client.memory import HostMemory
from kvstored.client.read import ReadStats
from kvstored.client.segments import Segments
from kvstored.errors import BadRequestError, ConfigError
from kvstored.protocol.master_api import NodeContact
from kvstored.security import find_client_token


class CoreShell:
    """Base of :class:`kvstored.Client` and :class:`kvstored.aio.AsyncClient`."""

    core: ClientCore

    def _start_core(self, master: str, transport: str, token: str | None,
                    token_file: str | None, **core_options: Any) -> None:
        try:
            found = find_client_token(token, token_file)
        except ConfigError as exc:
            raise BadRequestError(str(exc)) from None
        self.core = ClientCore(master, transport=transport, token=found, **core_options)

    @property
    def segments(self) -> Segments:
        return self.core.segments

    def register_memory(self, buffer: Any, fd: int) -> None:
        """Register ``buffer``, this process's mapping (from its start) of the
        shared-memory file open as ``fd`` (a ``/dev/shm`` file or a memfd: an engine's
        host KV pool). Puts and gets of pieces inside it, with nodes on this host, are
        then moved by the node itself between the file and its DRAM segment, with no
        copy by this client; a node that cannot (another host, another user) is
        remembered and the client copies as before (``memory.stats``, docs/client.md).
        Keep ``fd`` open while the client is in use. BadRequestError for something that
        is not a writable mapping and a regular file at least as long."""
        self.core.register_memory(buffer, fd)

    @property
    def memory(self) -> HostMemory:
        """The registered buffers, each node's region or refusal, and their counts."""
        return self.core.memory

    @property
    def stats(self) -> ReadStats:
        """What reads ran into: checksum failures, nodes that could not serve."""
        return self.core.stats

    @property
    def nodes(self) -> dict[str, NodeContact]:
        """The nodes this client has heard of, and how it reaches each."""
        return dict(self.core.nodes)

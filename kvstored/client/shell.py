"""What the blocking and the trio shells share around the sans-IO :class:`ClientCore`:
finding the token, building the core, and the views of it both expose.

Not the I/O itself: each shell performs the core's effects its own way.
"""

from __future__ import annotations

from typing import Any

from kvstored.client.core import ClientCore
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

    @property
    def stats(self) -> ReadStats:
        """What reads ran into: checksum failures, nodes that could not serve."""
        return self.core.stats

    @property
    def nodes(self) -> dict[str, NodeContact]:
        """The nodes this client has heard of, and how it reaches each."""
        return dict(self.core.nodes)

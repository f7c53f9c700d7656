"""Running the roles: the master, a node, or both in one process (``kvstored up``).

Each runs in one trio nursery until SIGINT or SIGTERM, then shuts down cleanly. A node
first *leaves* (:meth:`kvstored.node.service.Node.leave`): it stops taking puts, writes
its DRAM-only objects to SSD within ``node.shutdown_flush_timeout`` and unregisters, so
the master drops its replicas at once; then it closes its backend and unlinks its DRAM
segment. A second signal stops at once.
"""

from __future__ import annotations

import logging
import resource
import signal
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import trio
from prometheus_client import CollectorRegistry

from kvstored.address import split_address
from kvstored.config import Config
from kvstored.errors import ConfigError
from kvstored.master.service import Master
from kvstored.metrics import MasterMetrics, NodeMetrics, serve_metrics
from kvstored.node.service import Node, NodeConfig, open_node
from kvstored.rpc import ServerLimits, serve
from kvstored.sdk.registry import backend_class, backend_options, parse_options
from kvstored.security import Credentials, create_token_file, read_token_file

log = logging.getLogger(__name__)


def _open_files_for(cfg: Config, servers: int) -> None:
    """Raise this process's open-files limit so that ``servers`` servers can each hold
    security.max_connections connections (plus files and a margin); say so if the hard
    limit does not allow it, since accept() would then fail with EMFILE first."""
    limit = cfg.security.max_connections
    need = servers * limit + 512
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= need:
        return
    target = need if hard == resource.RLIM_INFINITY else min(need, hard)
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    if target < need:
        log.warning("the open-files limit is %d, too low for security.max_connections = %d "
                    "on %d server(s); lower the setting or raise the limit (ulimit -Hn)",
                    target, limit, servers)


def server_limits(cfg: Config) -> ServerLimits:
    security = cfg.security
    return ServerLimits(hello_timeout=security.hello_timeout,
                        preauth_header_limit=security.preauth_header_limit,
                        max_connections=security.max_connections,
                        max_unauthenticated_per_peer=security.max_unauthenticated_per_peer)


def _token(cfg: Config, key: str, what: str, *, create: bool) -> str:
    """The token in the file ``key`` names. At its default path a missing file is
    created when ``create`` (the master's first start); anywhere else it must exist."""
    path = cfg[key]
    if create and cfg.source(key) == "default" and not path.exists():
        return create_token_file(path)
    try:
        return read_token_file(path, what)
    except ConfigError as exc:
        if cfg.source(key) == "default" and not create:
            raise ConfigError(f"{exc}; start the master on this host first (it creates "
                                   f"the file), or copy the master's {what} here, or name "
                                   f"one with {key}") from None
        raise ConfigError(f"{exc} ({key} from {cfg.source(key)})") from None


def master_credentials(cfg: Config) -> Credentials:
    """The master checks the client token and the node token (creating both at their
    default paths at first start)."""
    if cfg.security.auth == "none":
        log.warning("security.auth = none: every peer that can reach this master may read, "
                    "write and act as a node; see docs/security.md")
        return Credentials.open()
    return Credentials(required=True,
                       client=_token(cfg, "security.token_file", "client token file",
                                     create=True),
                       node=_token(cfg, "security.node_token_file", "node token file",
                                   create=True))


def node_credentials(cfg: Config) -> Credentials:
    """A node presents the node token; its clients' token comes from the master."""
    if cfg.security.auth == "none":
        return Credentials.open()
    return Credentials(required=True, node=_token(cfg, "security.node_token_file",
                                                  "node token file", create=False))


def build_master(cfg: Config, registry: CollectorRegistry | None = None) -> Master:
    return Master(policy=cfg.policy, settings=cfg.master,
                  credentials=master_credentials(cfg), limits=server_limits(cfg),
                  metrics=MasterMetrics(registry))


def node_config(cfg: Config, master: tuple[str, int] | None = None,
                **extra: Any) -> NodeConfig:
    """The node's settings, its backend's options typed for the backend."""
    settings = cfg.node
    backend = settings.backend
    cls = backend_class(backend)
    raw = settings.backend_options
    options = parse_options(cls, raw)
    # io.engine / io.direct reach every backend that does its I/O through the engine. A
    # node reads SSD objects with O_DIRECT by default: its DRAM tier is the cache, and
    # the page cache would hold the same bytes again at the cost of one more copy (4 MiB
    # SSD-only batched gets read about twice as fast without it, docs/benchmarks.md).
    accepted = backend_options(cls)
    if "engine" in accepted:
        options.setdefault("engine", cfg.io.engine)
    if "direct" in accepted:
        options.setdefault("direct", cfg.io.direct)
    return NodeConfig(data_dir=settings.data, dram=settings.dram, ssd=settings.ssd,
                      backend=backend, backend_options=options,
                      master=master or split_address(settings.master),
                      listen=split_address(settings.listen), name=settings.name,
                      max_read_staging=cfg.security.max_read_staging,
                      put_timeout=cfg.master.put_timeout,
                      shutdown_flush_timeout=settings.shutdown_flush_timeout, **extra)


def open_configured_node(cfg: Config, master: tuple[str, int] | None = None,
                         registry: CollectorRegistry | None = None
                         ) -> AbstractAsyncContextManager[Node]:
    return open_node(node_config(cfg, master), credentials=node_credentials(cfg),
                     limits=server_limits(cfg), metrics=NodeMetrics(registry))


async def _until_signalled(stop: trio.CancelScope,
                           leave: Callable[[], Awaitable[None]] | None = None) -> None:
    """Wait for SIGINT or SIGTERM, run ``leave`` (a node's orderly exit), then cancel
    ``stop``. A second signal while ``leave`` runs cancels at once."""
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            log.info("received %s: shutting down", signal.Signals(signum).name)
            break
        if leave is not None:
            async with trio.open_nursery() as nursery:
                async def impatient() -> None:
                    async for signum in signals:
                        log.warning("received %s again: stopping now",
                                    signal.Signals(signum).name)
                        stop.cancel()
                        return

                nursery.start_soon(impatient)
                await leave()
                nursery.cancel_scope.cancel()
        stop.cancel()


async def run_master(cfg: Config, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    _open_files_for(cfg, servers=1)
    registry = CollectorRegistry()
    master = build_master(cfg, registry)
    if cfg.master.metrics:
        serve_metrics(split_address(cfg.master.metrics), registry)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_until_signalled, nursery.cancel_scope)
        bound = await nursery.start(serve, master.service, *split_address(cfg.master.listen))
        nursery.start_soon(master.run_housekeeping)
        task_status.started(bound)


async def run_node(cfg: Config, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    _open_files_for(cfg, servers=1)
    registry = CollectorRegistry()
    if cfg.node.metrics:
        serve_metrics(split_address(cfg.node.metrics), registry)
    async with open_configured_node(cfg, registry=registry) as node, \
            trio.open_nursery() as nursery:
        nursery.start_soon(_until_signalled, nursery.cancel_scope, node.leave)
        bound = await nursery.start(node.run)
        task_status.started(bound)


async def run_embedded(cfg: Config, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """The master and one node in this process; the node reaches the master over
    loopback like any other node, so the embedded store behaves like a cluster."""
    _open_files_for(cfg, servers=2)
    registry = CollectorRegistry()
    master = build_master(cfg, registry)
    metrics = cfg.master.metrics or cfg.node.metrics
    if metrics:
        serve_metrics(split_address(metrics), registry)
    async with trio.open_nursery() as nursery:
        bound = await nursery.start(serve, master.service, *split_address(cfg.master.listen))
        nursery.start_soon(master.run_housekeeping)
        async with open_configured_node(cfg, bound, registry) as node, \
                trio.open_nursery() as node_nursery:
            node_nursery.start_soon(_until_signalled, nursery.cancel_scope, node.leave)
            node_address = await node_nursery.start(node.run)
            await node.registered.wait()
            task_status.started({"master": bound, "node": node_address,
                                 "node_name": node.name})

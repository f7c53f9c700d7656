"""Running the roles: the master, a node, or both in one process (``kvstored up``).

Each runs in one trio nursery until SIGINT or SIGTERM, then shuts down cleanly. A node
first *leaves* (:meth:`kvstored.node.service.Node.leave`): it stops taking puts, writes
its DRAM-only objects to SSD within ``node.shutdown_flush_timeout`` and unregisters, so
the master drops its replicas at once; then it closes its backend and unlinks its DRAM
segment. A second signal stops at once.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio
from prometheus_client import CollectorRegistry

from kvstored.config import Config, split_address
from kvstored.master.policy import PolicyConfig
from kvstored.master.service import Master
from kvstored.metrics import MasterMetrics, NodeMetrics, serve_metrics
from kvstored.node.service import Node
from kvstored.rpc import serve

log = logging.getLogger(__name__)


def read_token(cfg: Config) -> str | None:
    path = cfg["security.token_file"]
    if not path:
        return None
    token = Path(path).read_text().strip()
    if not token:
        raise ValueError(f"the token file {path} is empty")
    return token


def build_master(cfg: Config, registry: CollectorRegistry | None = None) -> Master:
    return Master(policy=PolicyConfig.from_section(cfg.section("policy")),
                  lease_ttl=cfg["master.lease_ttl"], put_timeout=cfg["master.put_timeout"],
                  node_ttl=cfg["master.node_ttl"],
                  heartbeat_interval=cfg["master.heartbeat_interval"], token=read_token(cfg),
                  metrics=MasterMetrics(registry))


def build_node(cfg: Config, master: tuple[str, int] | None = None,
               registry: CollectorRegistry | None = None, **extra: Any) -> Node:
    from kvstored.backends import backend_class, backend_options, coerce_options

    backend = cfg["node.backend"]
    cls = backend_class(backend)
    raw = cfg["node.backend_options"]
    options = coerce_options(cls, {k: str(v) for k, v in raw.items()})
    # io.engine / io.direct reach every backend that does its I/O through the engine.
    accepted = backend_options(cls)
    if "engine" in accepted:
        options.setdefault("engine", cfg["io.engine"])
    if "direct" in accepted and cfg.source("io.direct") != "default":
        options.setdefault("direct", cfg["io.direct"])  # else the backend's own default
    return Node(data_dir=cfg["node.data"], dram=cfg["node.dram"], ssd=cfg["node.ssd"],
                backend=backend, backend_options=options,
                master=master or split_address(cfg["node.master"]),
                listen=split_address(cfg["node.listen"]), name=cfg["node.name"],
                token=read_token(cfg), put_timeout=cfg["master.put_timeout"],
                shutdown_flush_timeout=cfg["node.shutdown_flush_timeout"],
                metrics=NodeMetrics(registry), **extra)


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
    registry = CollectorRegistry()
    master = build_master(cfg, registry)
    if cfg["master.metrics"]:
        serve_metrics(split_address(cfg["master.metrics"]), registry)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_until_signalled, nursery.cancel_scope)
        bound = await nursery.start(serve, master.service, *split_address(cfg["master.listen"]))
        nursery.start_soon(master.run_housekeeping)
        task_status.started(bound)


async def run_node(cfg: Config, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    registry = CollectorRegistry()
    node = build_node(cfg, registry=registry)
    if cfg["node.metrics"]:
        serve_metrics(split_address(cfg["node.metrics"]), registry)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_until_signalled, nursery.cancel_scope, node.leave)
        bound = await nursery.start(node.run)
        task_status.started(bound)


async def run_embedded(cfg: Config, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """The master and one node in this process; the node reaches the master over
    loopback like any other node, so the embedded store behaves like a cluster."""
    registry = CollectorRegistry()
    master = build_master(cfg, registry)
    metrics = cfg["master.metrics"] or cfg["node.metrics"]
    if metrics:
        serve_metrics(split_address(metrics), registry)
    async with trio.open_nursery() as nursery:
        bound = await nursery.start(serve, master.service, *split_address(cfg["master.listen"]))
        nursery.start_soon(master.run_housekeeping)
        node = build_node(cfg, master=bound, registry=registry)
        nursery.start_soon(_until_signalled, nursery.cancel_scope, node.leave)
        node_address = await nursery.start(node.run)
        await node.registered.wait()
        task_status.started({"master": bound, "node": node_address, "node_name": node.name})

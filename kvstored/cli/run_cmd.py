"""``kvstored up``, ``kvstored master`` and ``kvstored node``: run the roles."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import click
import trio

from kvstored.backends import BUILTIN
from kvstored.cli.errors import QuietError, leaves
from kvstored.cli.exitcodes import ExitCode
from kvstored.cli.program import debug_option
from kvstored.cli.settings import setting_option, shown_default
from kvstored.config import Config, choices_of, load_config

config_option = click.option("--config", "config_file", type=click.Path(dir_okay=False),
                             help="A TOML configuration file (default: $KVSTORED_CONFIG).")
token_option = setting_option(
    "--token-file", key="security.token_file", type=click.Path(dir_okay=False),
    help="The client token clients must present (created at first start).")
node_token_option = setting_option(
    "--node-token-file", key="security.node_token_file", type=click.Path(dir_okay=False),
    help="The node token nodes present (created at first start).")
verbose_option = click.option("-v", "--verbose", is_flag=True, help="Log debug detail.")


def _run(main: Callable, cfg: Config, banner: Callable[[Any], None]) -> None:
    """Run a role until it is signalled; its errors go to the programs' one handler."""
    from kvstored.sdk.errors import BackendBusyError
    from kvstored.shm import SegmentExistsError

    async def wrapper() -> None:
        async with trio.open_nursery() as nursery:
            started = await nursery.start(main, cfg)
            banner(started)

    try:
        trio.run(wrapper)
    except BaseException as exc:
        held = next((e for e in leaves(exc)
                     if isinstance(e, SegmentExistsError | BackendBusyError)), None)
        if held is None:
            raise
        # The DRAM segment is named after the data directory, and the SSD tier's lock is
        # in it: either way another node runs on it.
        pid = held.pid if isinstance(held, BackendBusyError) else held.holder
        holder = f" (process {pid})" if pid else ""
        raise QuietError(f"data directory {cfg.node.data} is in use by another kvstored "
                         f"node{holder}; stop that node, or give this one another --data",
                         ExitCode.IN_USE) from exc
    click.echo("kvstored: stopped cleanly", err=True)


def _logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


@click.command(help=f"""Run the embedded single-host store: the master and one node, in the
foreground.

Stop it with Ctrl-C or SIGTERM: it first writes its DRAM-only objects to SSD (for at
most node.shutdown_flush_timeout, {shown_default("node.shutdown_flush_timeout")} by
default), so that a restart has them; a second Ctrl-C stops at once.
""")
@setting_option("--data", key="node.data", type=click.Path(file_okay=False),
                help="Data directory (the SSD tier is DATA/ssd).")
@setting_option("--listen", key="master.listen", metavar="HOST:PORT",
                help="Address the master serves on.")
@setting_option("--dram", key="node.dram", metavar="SIZE", help="DRAM segment size, e.g. 4GiB.")
@setting_option("--ssd", key="node.ssd", metavar="SIZE", help="SSD tier capacity, e.g. 1T.")
@setting_option("--backend", key="node.backend", metavar="NAME",
                help=f"SSD backend ({', '.join(BUILTIN)}, or an installed one).")
@setting_option("--offload", key="policy.offload", type=click.Choice(choices_of("policy.offload")),
                help="When objects go to SSD.")
@setting_option("--metrics", key="master.metrics", metavar="HOST:PORT",
                help="Serve Prometheus metrics here.")
@config_option
@token_option
@node_token_option
@verbose_option
@debug_option
def up(data, listen, dram, ssd, backend, offload, metrics, config_file, token_file,
       node_token_file, verbose) -> None:
    from kvstored.server import run_embedded

    _logging(verbose)
    cfg = load_config(config_file, overrides={
        "node.data": data, "master.listen": listen, "node.dram": dram, "node.ssd": ssd,
        "node.backend": backend, "policy.offload": offload, "master.metrics": metrics,
        "security.token_file": token_file, "security.node_token_file": node_token_file},
        flag_names={"master.listen": "--listen", "master.metrics": "--metrics",
                    "security.token_file": "--token-file",
                    "security.node_token_file": "--node-token-file"})

    def banner(started) -> None:
        host, port = started["master"]
        click.echo(f"kvstored up: listening on {host}:{port} (node {started['node_name']}, "
                   f"data server {started['node'][0]}:{started['node'][1]})")
        click.echo(f"kvstored up: data directory {cfg.node.data}, backend "
                   f"{cfg.node.backend}, DRAM {cfg.node.dram} bytes, SSD "
                   f"{cfg.node.ssd} bytes")

    _run(run_embedded, cfg, banner)


@click.command()
@setting_option("--listen", key="master.listen", metavar="HOST:PORT",
                help="Address to serve clients and nodes on.")
@setting_option("--metrics", key="master.metrics", metavar="HOST:PORT",
                help="Serve Prometheus metrics here.")
@config_option
@token_option
@node_token_option
@verbose_option
@debug_option
def master(listen, metrics, config_file, token_file, node_token_file, verbose) -> None:
    """Run the cluster's master (metadata only; data never passes through it)."""
    from kvstored.server import run_master

    _logging(verbose)
    cfg = load_config(config_file,
                      overrides={"master.listen": listen, "master.metrics": metrics,
                                 "security.token_file": token_file,
                                 "security.node_token_file": node_token_file},
                      flag_names={"master.listen": "--listen", "master.metrics": "--metrics",
                                  "security.token_file": "--token-file",
                                  "security.node_token_file": "--node-token-file"})
    _run(run_master, cfg, lambda bound: click.echo(
        f"kvstored master: listening on {bound[0]}:{bound[1]}"))


@click.command()
@setting_option("--master", "master_address", key="node.master", metavar="HOST:PORT",
                help="The master's address.")
@setting_option("--listen", key="node.listen", metavar="HOST:PORT",
                help="Address of the data server (port 0 picks a free one).")
@setting_option("--data", key="node.data", type=click.Path(file_okay=False),
                help="Data directory (the SSD tier is DATA/ssd).")
@setting_option("--dram", key="node.dram", metavar="SIZE", help="DRAM segment size.")
@setting_option("--ssd", key="node.ssd", metavar="SIZE", help="SSD tier capacity.")
@setting_option("--backend", key="node.backend", metavar="NAME",
                help=f"SSD backend ({', '.join(BUILTIN)}, or an installed one).")
@setting_option("--name", key="node.name",
                help="Node name in status and metrics; empty means HOSTNAME:PORT.")
@setting_option("--metrics", key="node.metrics", metavar="HOST:PORT",
                help="Serve Prometheus metrics here.")
@config_option
@node_token_option
@verbose_option
@debug_option
def node(master_address, listen, data, dram, ssd, backend, name, metrics, config_file,
         node_token_file, verbose) -> None:
    """Run a storage node: a DRAM segment plus an SSD backend, serving data."""
    from kvstored.server import run_node

    _logging(verbose)
    cfg = load_config(config_file, overrides={
        "node.master": master_address, "node.listen": listen, "node.data": data,
        "node.dram": dram, "node.ssd": ssd, "node.backend": backend, "node.name": name,
        "node.metrics": metrics, "security.node_token_file": node_token_file},
        flag_names={"node.master": "--master", "node.listen": "--listen",
                    "node.metrics": "--metrics",
                    "security.node_token_file": "--node-token-file"})
    _run(run_node, cfg, lambda bound: click.echo(
        f"kvstored node: data server on {bound[0]}:{bound[1]}, data {cfg.node.data}"))

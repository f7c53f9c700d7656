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
from kvstored.cli.settings import SettingOption, setting_option, shown_default
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

# The options the roles share. --listen and --metrics set the master's key under `up` and
# `master`, the node's under `node`: the role decides.
data_option = setting_option("--data", key="node.data", type=click.Path(file_okay=False),
                             help="Data directory (the SSD tier is DATA/ssd).")
dram_option = setting_option("--dram", key="node.dram", metavar="SIZE",
                             help="DRAM segment size, e.g. 4GiB.")
ssd_option = setting_option("--ssd", key="node.ssd", metavar="SIZE",
                            help="SSD tier capacity, e.g. 1T.")
backend_option = setting_option("--backend", key="node.backend", metavar="NAME",
                                help=f"SSD backend ({', '.join(BUILTIN)}, or an installed one).")


def _metrics_option(key: str) -> Callable:
    return setting_option("--metrics", key=key, metavar="HOST:PORT",
                          help="Serve Prometheus metrics here.")


def _role_options(*options: Callable) -> Callable[[Callable], Callable]:
    """Apply ``options`` in the order given (the order --help lists them), then
    ``--verbose`` and ``--debug``, which every role takes."""
    def apply(function: Callable) -> Callable:
        for option in reversed((*options, verbose_option, debug_option)):
            function = option(function)
        return function
    return apply


def _configure(config_file: str | None, verbose: bool) -> Config:
    """Start logging, and load the configuration with the running command's setting
    options applied (each reported under its own flag when its value is wrong)."""
    _logging(verbose)
    ctx = click.get_current_context()
    given = [param for param in ctx.command.params if isinstance(param, SettingOption)]
    return load_config(
        config_file,
        overrides={param.setting_key: ctx.params[param.name] for param in given},
        flag_names={param.setting_key: next(o for o in param.opts if o.startswith("--"))
                    for param in given})


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
@_role_options(
    data_option,
    setting_option("--listen", key="master.listen", metavar="HOST:PORT",
                   help="Address the master serves on."),
    dram_option, ssd_option, backend_option,
    setting_option("--offload", key="policy.offload",
                   type=click.Choice(choices_of("policy.offload")),
                   help="When objects go to SSD."),
    _metrics_option("master.metrics"), config_option, token_option, node_token_option)
def up(config_file: str | None, verbose: bool, **_settings: Any) -> None:
    from kvstored.server import run_embedded

    cfg = _configure(config_file, verbose)

    def banner(started) -> None:
        host, port = started["master"]
        click.echo(f"kvstored up: listening on {host}:{port} (node {started['node_name']}, "
                   f"data server {started['node'][0]}:{started['node'][1]})")
        click.echo(f"kvstored up: data directory {cfg.node.data}, backend "
                   f"{cfg.node.backend}, DRAM {cfg.node.dram} bytes, SSD "
                   f"{cfg.node.ssd} bytes")

    _run(run_embedded, cfg, banner)


@click.command()
@_role_options(
    setting_option("--listen", key="master.listen", metavar="HOST:PORT",
                   help="Address to serve clients and nodes on."),
    _metrics_option("master.metrics"), config_option, token_option, node_token_option)
def master(config_file: str | None, verbose: bool, **_settings: Any) -> None:
    """Run the cluster's master (metadata only; data never passes through it)."""
    from kvstored.server import run_master

    cfg = _configure(config_file, verbose)
    _run(run_master, cfg, lambda bound: click.echo(
        f"kvstored master: listening on {bound[0]}:{bound[1]}"))


@click.command()
@_role_options(
    setting_option("--master", "master_address", key="node.master", metavar="HOST:PORT",
                   help="The master's address."),
    setting_option("--listen", key="node.listen", metavar="HOST:PORT",
                   help="Address of the data server (port 0 picks a free one)."),
    data_option, dram_option, ssd_option, backend_option,
    setting_option("--name", key="node.name",
                   help="Node name in status and metrics; empty means HOSTNAME:PORT."),
    _metrics_option("node.metrics"), config_option, node_token_option)
def node(config_file: str | None, verbose: bool, **_settings: Any) -> None:
    """Run a storage node: a DRAM segment plus an SSD backend, serving data."""
    from kvstored.server import run_node

    cfg = _configure(config_file, verbose)
    _run(run_node, cfg, lambda bound: click.echo(
        f"kvstored node: data server on {bound[0]}:{bound[1]}, data {cfg.node.data}"))

"""How ``kvstore`` finds and reaches the cluster: its options, its configuration, its
timeouts.

The commands read the configuration the way the daemon does
(:func:`kvstored.config.load_config`: defaults < TOML file < ``KVSTORED_*`` environment <
flags), so ``client.master``, ``client.timeout``, ``client.connect_timeout``,
``client.wait_timeout``, ``client.transport`` and ``security.token_file`` apply to them.
Connecting and the hello are bounded by ``client.connect_timeout`` (a port that serves
something else fails in seconds, exit 4, naming the address); a request by
``client.timeout``; ``flush --wait`` and ``recover``, which wait on the nodes, by
``client.wait_timeout`` on top.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

import kvstored
from kvstored.cli.errors import QuietError
from kvstored.cli.exitcodes import ExitCode
from kvstored.cli.program import CliState, debug_option, state
from kvstored.cli.settings import setting_option
from kvstored.client import Client
from kvstored.config import ClientSettings, load_config
from kvstored.params import ExistingDirectory

#: The flag that sets each configuration key, for the messages of a bad value.
FLAGS = {"client.master": "--master", "client.timeout": "--timeout",
         "client.wait_timeout": "--wait-timeout", "security.token_file": "--token-file"}


@dataclass(frozen=True)
class Reach:
    """How ``kvstore`` reaches the cluster: the client settings (where it is, how long to
    wait for it) and the token to present."""

    settings: ClientSettings
    token: str | None

    @property
    def master(self) -> str:
        return self.settings.master


def _remember(name: str) -> Callable[[click.Context, click.Parameter, Any], None]:
    def callback(ctx: click.Context, _param: click.Parameter, value: Any) -> None:
        if value is not None:
            setattr(state(ctx), name, value)
    return callback


def client_options(function: Callable) -> Callable:
    """``--master``, ``--token-file``, ``--timeout``, ``--config`` and ``--debug``: on the
    ``kvstore`` group and on each command that talks to a cluster, the command's winning."""
    for option in reversed((
        setting_option("--master", key="client.master", metavar="HOST:PORT",
                       expose_value=False, callback=_remember("master"),
                       help="The master's address (also $KVSTORE_MASTER)."),
        setting_option("--token-file", key="security.token_file",
                       type=click.Path(dir_okay=False), expose_value=False,
                       callback=_remember("token_file"),
                       help="The cluster's client token, which its master created."),
        setting_option("--timeout", key="client.timeout", metavar="DURATION",
                       expose_value=False, callback=_remember("timeout"),
                       help="Bound of one request, e.g. 10s."),
        click.option("--config", "config_file", type=click.Path(dir_okay=False),
                     expose_value=False, callback=_remember("config_file"),
                     help="A TOML configuration file [default: $KVSTORED_CONFIG]."),
        debug_option,
    )):
        function = option(function)
    return function


def offline_options(offline_help: str) -> Callable[[Callable], Callable]:
    """``--offline DIR``, a stopped node's SSD directory read without a daemon (what the
    command does with it is ``offline_help``), and ``--backend``, the directory's."""
    offline = click.option(
        "--offline", "offline_dir",
        type=ExistingDirectory(missing_hint="a node's SSD tier is <data>/ssd"),
        help=offline_help)
    backend = click.option(
        "--backend", default=None,
        help="With --offline: the directory's backend (default: read from its stamp).")
    return lambda function: offline(backend(function))


def _json_wanted(ctx: click.Context, _param: click.Parameter, value: bool) -> bool:
    return value or state(ctx).json


#: ``--json`` on a command; the group's ``--json`` turns it on as well.
json_option = click.option("--json", "as_json", is_flag=True, callback=_json_wanted,
                           help="Print one JSON document on stdout.")


def reach(run: CliState, *, wait_timeout: str | None = None) -> Reach:
    """What the options, the environment and the configuration file give."""
    cfg = load_config(run.config_file, overrides={
        "client.master": run.master, "client.timeout": run.timeout,
        "client.wait_timeout": wait_timeout, "security.token_file": run.token_file},
        flag_names=FLAGS)
    security = cfg.security
    token = None if security.auth == "none" else read_token(
        security.token_file, cfg.source("security.token_file"))
    return Reach(cfg.client, token)


def read_token(path: Path | None, source: str) -> str | None:
    """The client token in ``path`` (``None``: no token); errors name the file. The
    default file is absent until a master of this user first started (docs/security.md):
    then the server says whether it needs a token."""
    if not path or (source == "default" and not Path(path).exists()):
        return None
    try:
        token = Path(path).read_text().strip()
    except OSError as exc:
        # A file that is not there was named wrong (3); one that is there but cannot be
        # read (another user's) is a token that cannot be used (2, docs/security.md).
        code = ExitCode.NOT_FOUND if isinstance(exc, FileNotFoundError) else ExitCode.USAGE
        raise QuietError(f"cannot read the token file {path} ({source}): {exc.strerror}",
                         code) from exc
    if not token:
        raise QuietError(f"the token file {path} ({source}) is empty", ExitCode.USAGE)
    return token


def open_client(target: Reach, *, waits: bool = False) -> Client:
    """A connected client; ``waits`` for a request that waits on the nodes."""
    settings = target.settings
    timeout = settings.timeout + (settings.wait_timeout if waits else 0.0)
    return kvstored.connect(settings.master, transport=settings.transport,
                            token=target.token, timeout=timeout,
                            connect_timeout=settings.connect_timeout)


def store_command(function: Callable) -> Callable:
    """Add the client options, and call ``function`` with a connected client first."""

    @client_options
    @functools.wraps(function)
    def wrapper(**kwargs: Any) -> None:
        with open_client(reach(state())) as client:
            function(client, **kwargs)

    return wrapper

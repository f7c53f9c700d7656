"""``kvstore``: the user and admin tool."""

from __future__ import annotations

import click

from kvstored.cli.connection import client_options
from kvstored.cli.program import program, state

# Each subcommand lives beside the code it runs; adding one is a line here.
COMMANDS: dict[str, str] = {
    **{name: f"kvstored.cli.store_cmds:{name}" for name in (
        "status", "put", "get", "ls", "stat", "rm", "flush", "evict", "recover")},
    "bench": "kvstored.cli.bench_cmd:bench",
    "mount": "kvstored.cli.mount_cmd:mount",
    "replay": "kvstored.cli.replay_cmd:replay",
    "sim": "kvstored.tools.cli_sim:sim",
    "trace": "kvstored.tools.cli_trace:trace",
}


def _set_json(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value:
        state(ctx).json = True


@program("kvstore", COMMANDS)
@client_options
@click.option("--json", is_flag=True, expose_value=False, callback=_set_json,
              help="The commands that talk to a cluster print one JSON document.")
def main() -> None:
    """kvstore: use and administer a kvstored cache, and plan its capacity.

    Options given here apply to every command; the commands that talk to a cluster
    also take them after their name.

    \b
    Exit codes (docs/cli.md):
      0 ok   1 failure   2 bad usage   3 not found   4 unreachable
      5 corrupt   6 no space   7 capability unavailable   8 in use   130 interrupted
    """

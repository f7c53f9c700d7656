"""``kvstored``: the daemon (the embedded store, and the master and node roles)."""

from __future__ import annotations

from kvstored.cli.program import debug_option, program

# Each subcommand lives beside the code it runs; adding one is a line here.
COMMANDS: dict[str, str] = {
    "config": "kvstored.cli.config_cmd:config",
    "up": "kvstored.cli.run_cmd:up",
    "master": "kvstored.cli.run_cmd:master",
    "node": "kvstored.cli.run_cmd:node",
}


@program("kvstored", COMMANDS)
@debug_option
def main() -> None:
    """kvstored: a tiered DRAM + SSD KV-cache object store for LLM serving.

    \b
    Roles:
      up       the embedded single-host store (master and one node) in one process
      master   the cluster's metadata service
      node     a storage node: a DRAM segment plus an SSD backend
    \b
    The user and admin tool is `kvstore`; run `kvstore --help`.
    """

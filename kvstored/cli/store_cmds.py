"""``kvstore`` commands that talk to a running store: status, put, get, ls, stat, rm,
flush, evict and recover (which also checks a backend directory offline).

Each command either finishes or raises: a :class:`~kvstored.cli.errors.QuietError` when
it knows what went wrong, or the library's own error; the program's top level turns
either into one line and the exit code docs/cli.md gives for the command.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from kvstored.cli.connection import (
    Reach,
    client_options,
    json_option,
    offline_options,
    open_client,
    reach,
    store_command,
)
from kvstored.cli.errors import QuietError
from kvstored.cli.exitcodes import ExitCode
from kvstored.cli.program import state
from kvstored.cli.settings import setting_option
from kvstored.errors import NotFoundError
from kvstored.params import ExistingFile
from kvstored.progress import progress_bar, wait_showing
from kvstored.sdk.units import format_size, parse_size

console = Console()

wait_timeout_option = setting_option(
    "--wait-timeout", key="client.wait_timeout", metavar="DURATION",
    help="How long to wait for the nodes.")


def _print_json(document: Any) -> None:
    click.echo(json.dumps(document, indent=1, sort_keys=True))


def _some(keys: list[str]) -> str:
    """``'a'``, or ``'a' (and 2 more)``."""
    return f"{keys[0]!r}" + (f" (and {len(keys) - 1} more)" if len(keys) > 1 else "")


@click.command()
@json_option
@store_command
def status(client, as_json: bool) -> None:
    """Nodes, and per tier the used and capacity bytes, object counts and hit rates."""
    reply = client.call("status")
    reply.pop("ok", None)
    if as_json:
        _print_json(reply)
        return
    from kvstored.cli.status_view import render_status

    render_status(console, reply)


@click.command()
@click.argument("key")
@click.argument("source", type=ExistingFile(allow_dash=True))
@store_command
def put(client, key: str, source: str) -> None:
    """Store the contents of SOURCE (a file, or - for stdin) under KEY.

    A SOURCE that does not exist exits 3; objects are written once, so an existing KEY
    is kept (exit 0, with a note).
    """
    data = sys.stdin.buffer.read() if source == "-" else Path(source).read_bytes()
    if client.put(key, data):
        click.echo(f"stored {key!r} ({format_size(len(data))})", err=True)
    else:
        click.echo(f"{key!r} already exists; objects are written once", err=True)


@click.command()
@click.argument("key")
@click.option("-o", "--output", type=click.Path(dir_okay=False, allow_dash=True), default="-",
              show_default=True,
              help="Write here instead of stdout (-) (created only once the value is read).")
@store_command
def get(client, key: str, output: str) -> None:
    """Write the value of KEY to stdout or a file."""
    value = client.get(key)
    if value is None:
        raise QuietError(f"no object {key!r}", ExitCode.NOT_FOUND)
    if output == "-":
        sys.stdout.buffer.write(value)
        sys.stdout.buffer.flush()
    else:
        Path(output).write_bytes(value)


@click.command(name="ls")
@click.argument("prefix", default="")
@json_option
@store_command
def ls(client, prefix: str, as_json: bool) -> None:
    """List keys (starting with PREFIX), with sizes and tiers; streams page by page."""
    after = None
    listed: list[Any] = []
    while True:
        reply = client.call("list", prefix=prefix, after=after, limit=1000)
        for key, size, tiers in zip(reply["keys"], reply["sizes"], reply["tiers"]):
            if as_json:
                listed.append({"key": key, "size": size, "tiers": tiers})
            else:
                click.echo(f"{size:>12}  {','.join(tiers):<8}  {key}")
        if not reply["more"] or not reply["keys"]:
            break
        after = reply["keys"][-1]
    if as_json:
        _print_json({"prefix": prefix, "objects": listed})


@click.command()
@click.argument("key")
@json_option
@store_command
def stat(client, key: str, as_json: bool) -> None:
    """Size, checksum and replicas (node, tier, state) of KEY."""
    try:
        obj = client.call("stat", key=key)["object"]
    except NotFoundError:
        raise QuietError(f"no object {key!r}", ExitCode.NOT_FOUND) from None
    if as_json:
        _print_json(obj)
        return
    click.echo(f"key       {obj['key']}\nsize      {obj['size']} ({format_size(obj['size'])})\n"
               f"crc32c    {obj['checksum']:08x}\nreads     {obj['reads']}")
    for r in obj["replicas"]:
        click.echo(f"replica   {r['node']}  {r['tier']}  {r['state']}")


@click.command()
@click.argument("keys", nargs=-1)
@click.option("--prefix", help="Every key starting with this (not empty), instead of KEYS.")
@click.option("--dry-run", is_flag=True, help="With --prefix: count what would go; remove "
                                              "nothing.")
@store_command
def rm(client, keys: tuple[str, ...], prefix: str | None, dry_run: bool) -> None:
    """Remove KEYS, or with --prefix every object under a prefix (and cancel the puts
    under it in flight). Exits 3 if a key (or, with --prefix, every key) did not exist.
    """
    if prefix is None:
        if not keys or dry_run:
            raise click.UsageError("give KEYS, or --prefix P (with --dry-run to count first)")
        removed = client.batch_remove(list(keys))
        missing = [k for k, ok in zip(keys, removed) if not ok]
        if missing:
            raise QuietError(f"no object {_some(missing)}", ExitCode.NOT_FOUND)
        return
    if keys:
        raise click.UsageError("give KEYS or --prefix, not both")
    if not prefix:
        # An empty prefix is every object of the store: too easy to type by mistake.
        raise click.BadParameter("must not be empty (it would remove every object)",
                                 param_hint="--prefix")
    reply = client.call("remove_prefix", prefix=prefix, dry_run=dry_run)
    verb = "would remove" if dry_run else "removed"
    click.echo(f"{verb} {reply['removed']:,} object{'s' * (reply['removed'] != 1)} "
               f"({format_size(reply['bytes'])}) under {prefix!r}"
               + (f"; {reply['cancelled']:,} puts in flight cancelled"
                  if reply["cancelled"] else ""), err=True)
    if not reply["removed"]:
        raise QuietError(f"no object under {prefix!r}", ExitCode.NOT_FOUND)


@click.command()
@click.option("--node", help="Only this node (exit 3 if no live node has that name).")
@click.option("--wait", is_flag=True, help="Return once every copy is durable on SSD.")
@wait_timeout_option
@json_option
@client_options
def flush(node: str | None, wait: bool, wait_timeout: str | None, as_json: bool) -> None:
    """Offload every DRAM-only object to SSD now (fsync'd before it counts).

    With --wait, exits 1 if an offload failed or the nodes did not finish in time.
    """
    target = reach(state(), wait_timeout=wait_timeout)
    waited = target.settings.wait_timeout
    with open_client(target, waits=wait) as client, _StatusPoller(target) as status:
        def left() -> tuple[float, float, str]:
            remaining = sum(n.get("queued_offloads", 0) for n in status.nodes(node))
            status.most = max(status.most, remaining)
            return (status.most - remaining, status.most,
                    f"flush: {remaining:,} objects still to write to SSD")

        reply = wait_showing(
            lambda: client.call("flush", node=node, wait=wait, timeout=waited),
            left, enabled=wait and not as_json)
    reply.pop("ok", None)
    if as_json:
        _print_json(reply)
    else:
        state_word = "done" if reply["done"] else ("queued" if not wait else "incomplete")
        click.echo(f"flush {state_word}: {reply['queued']} objects offloaded"
                   + (f", {len(reply['failed'])} failed" if reply["failed"] else ""))
    if wait and reply["failed"]:
        # The node's reason names the key and what to do (a full disk, a bad record).
        failed = len(reply["failed"])
        raise QuietError(f"{failed:,} objects could not be offloaded: "
                         f"{reply['failed'][0]['reason']}"
                         + ("; --json lists each with its reason" if failed > 1 else ""),
                         ExitCode.FAILURE)
    if wait and not reply["done"]:
        raise QuietError(f"{reply.get('remaining', '?')} objects were not durable after "
                         f"{waited:g} s; wait longer (--wait-timeout) or see "
                         "the node logs", ExitCode.FAILURE)


@click.command()
@click.option("--tier", type=click.Choice(["dram", "ssd"]), required=True)
@click.option("--all", "everything", is_flag=True, help="Every object in the tier.")
@click.option("--bytes", "nbytes", metavar="SIZE", help="Least recently used first, this much.")
@click.option("--key", "keys", multiple=True,
              help="This key (repeatable); exit 3 if one does not exist.")
@click.option("--prefix", help="Keys starting with this.")
@click.option("--dry-run", is_flag=True, help="Say what would go; change nothing.")
@click.option("--drop", is_flag=True, help="Also drop last copies (data is lost).")
@json_option
@client_options
def evict(tier, everything, nbytes, keys, prefix, dry_run, drop, as_json) -> None:
    """Evict objects from a tier. A last copy is never lost without --drop: from DRAM it
    is offloaded to SSD first; on SSD it is skipped."""
    chosen = sum(bool(x) for x in (everything, nbytes, keys, prefix))
    if chosen != 1:
        raise click.UsageError("give exactly one of --all, --bytes, --key, --prefix")
    try:
        budget = parse_size(nbytes) if nbytes else None
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--bytes") from None
    with open_client(reach(state())) as client:
        reply = client.call("evict", tier=tier, keys=list(keys) or None, prefix=prefix,
                            bytes=budget, dry_run=dry_run, drop=drop)
        # A named key the master did not consider either does not exist or has no copy
        # in that tier; only the first is an error, as for rm and get.
        considered = {*reply["evicted"], *reply["offloading"], *reply["skipped_last_copy"]}
        unseen = [k for k in dict.fromkeys(keys) if k not in considered]
        missing = [k for k, there in zip(unseen, client.batch_exists(unseen)) if not there] \
            if unseen else []
    reply.pop("ok", None)
    if as_json:
        _print_json({**reply, "missing": missing})
    else:
        verb = "would evict" if dry_run else "evicted"
        click.echo(f"{verb} {len(reply['evicted'])} from {tier} "
                   f"({format_size(reply['bytes'])})")
        if reply["offloading"]:
            click.echo(f"{len(reply['offloading'])} DRAM-only objects go to SSD first")
        if reply["skipped_last_copy"]:
            click.echo(f"{len(reply['skipped_last_copy'])} skipped: last copy (use --drop)")
    if missing:
        raise QuietError(f"no object {_some(missing)}", ExitCode.NOT_FOUND)


@click.command()
@click.option("--node", help="Only this node (exit 3 if no live node has that name).")
@click.option("--repair", is_flag=True, help="Quarantine what is bad and fix the index.")
@offline_options("Check a stopped node's SSD directory (<data>/ssd) without a daemon; "
                 "read-only unless --repair.")
@wait_timeout_option
@json_option
@client_options
def recover(node, repair, offline_dir, backend, wait_timeout, as_json) -> None:
    """Rescan the SSD tier, verify every record, re-register, and quarantine.

    Exits 0 when nothing is wrong (or everything found was repaired), 5 when problems
    remain, 1 when a node did not report back in time. With --offline DIR nothing is
    written unless --repair is given; a directory that holds no store exits 3, a damaged
    stamp or volume 5, one a running node holds 8.
    """
    if offline_dir:
        _recover_offline(offline_dir, backend, repair, as_json)
        return
    if backend:
        raise click.UsageError("--backend only applies with --offline DIR")
    target = reach(state(), wait_timeout=wait_timeout)
    waited = target.settings.wait_timeout
    with open_client(target, waits=True) as client, _StatusPoller(target) as status:
        def checking() -> tuple[float, float, str]:
            if status.most == 0:  # the nodes it waits for: counted once
                status.most = len(status.nodes(node))
            nodes = f"{status.most} node{'s' * (status.most != 1)}"
            return 0, 0, f"recover: {nodes} reading back and checking every SSD record"

        reply = wait_showing(
            lambda: client.call("recover", node=node, repair=repair, timeout=waited),
            checking, enabled=not as_json)
    reports = reply["reports"]
    if as_json:
        _print_json({"reports": reports, "missing": reply["missing"]})
    else:
        for name, report in reports.items():
            _print_problems(name, report["problems"], report["records_checked"])
    _fail_on_problems([p for r in reports.values() for p in r["problems"]])
    if reply["missing"]:
        raise QuietError(f"node {_some(reply['missing'])} did not report back within "
                         f"{waited:g} s; wait longer (--wait-timeout) or see "
                         "its log", ExitCode.FAILURE)


class _StatusPoller:
    """The master's status over a connection of its own (the command's connection is
    busy waiting), opened at the first poll: what a progress bar shows while a flush or
    a recover waits on the nodes."""

    def __init__(self, target: Reach) -> None:
        self.target = target
        self.client: Any = None
        #: The largest count seen so far: the bar's whole.
        self.most = 0

    def nodes(self, only: str | None) -> list[dict[str, Any]]:
        """The live nodes (only the one named ``only``, if given)."""
        if self.client is None:
            self.client = open_client(self.target)
        return [n for n in self.client.call("status")["nodes"]
                if n["alive"] and only in (None, n["node"])]

    def __enter__(self) -> _StatusPoller:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.client is not None:
            self.client.close()


def _fail_on_problems(problems: list[dict[str, Any]]) -> None:
    left = [p for p in problems if not p["action"]]
    if left:
        raise QuietError(f"{len(left)} problems left as they are; --repair quarantines or "
                         "fixes them", ExitCode.CORRUPT)


def _recover_offline(directory: str, backend: str | None, repair: bool, as_json: bool) -> None:
    """Check (read-only) or repair a backend directory without a daemon."""
    from kvstored.backends.offline import identify, open_offline

    # A backend error (no store there, a damaged stamp, a running node holding it...) is
    # mapped to its exit code by kvstored.cli.errors.
    name = identify(directory, backend, repair=repair)
    with open_offline(directory, name, repair=repair) as store, \
            progress_bar(enabled=not as_json) as progress:
        if progress:
            progress(0, 0, f"recover: checking {directory}")
        report = store.check(repair=repair)
        total = store.usage().objects
        records = 0
        for _ in store.scan(verify=True):
            records += 1
            if progress and records % 256 == 0:
                progress(records, total, f"recover: {records:,} of {total:,} records "
                                         "read back and verified")
    problems = [p.as_dict() for p in report.problems]
    if as_json:
        _print_json({"directory": directory, "backend": name, "objects": records,
                     "mode": "repair" if repair else "read-only",
                     "records_checked": report.records_checked, "problems": problems})
    else:
        _print_problems(f"{directory} ({name})", problems, report.records_checked)
        click.echo(f"{records} objects read back and verified")
    _fail_on_problems(problems)


def _print_problems(name: str, problems: list[dict[str, Any]], checked: int) -> None:
    if not problems:
        click.echo(f"{name}: {checked} records checked, no problems")
        return
    click.echo(f"{name}: {checked} records checked, {len(problems)} problems")
    for p in problems:
        what = p["key"] if p["key"] is not None else p["path"]
        click.echo(f"  {p['kind']}: {what}: {p['detail']}"
                   + (f" -> {p['action']}" if p["action"] else "")
                   + (f": {p['action_detail']}" if p.get("action_detail") else ""))

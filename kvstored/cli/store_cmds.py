"""``kvstore`` commands that talk to a running store: status, put, get, ls, stat, rm,
flush, evict and recover."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from kvstored.cli.exitcodes import ExitCode
from kvstored.errors import StoreError
from kvstored.units import format_size, parse_size

console = Console()


def _fail(message: str, code: int) -> None:
    click.echo(f"kvstore: {message}", err=True)
    sys.exit(code)


def master_options(function: Callable) -> Callable:
    function = click.option("--token-file", type=click.Path(dir_okay=False, exists=True),
                            help="The cluster's shared secret.")(function)
    return click.option("--master", envvar="KVSTORE_MASTER", default="127.0.0.1:7700",
                        show_default=True,
                        help="The master's address (env KVSTORE_MASTER).")(function)


@contextmanager
def session(master: str, token_file: str | None) -> Iterator[Any]:
    """A connected client; store errors end the command with their exit code."""
    import kvstored

    token = Path(token_file).read_text().strip() if token_file else None
    try:
        with kvstored.connect(master, token=token, timeout=3600) as client:
            yield client
    except StoreError as exc:
        _fail(str(exc), exc.exit_code)


def store_command(function: Callable) -> Callable:
    """Add --master/--token-file and pass a connected client as the first argument."""

    @master_options
    @functools.wraps(function)
    def wrapper(master: str, token_file: str | None, **kwargs: Any) -> None:
        with session(master, token_file) as client:
            function(client, **kwargs)

    return wrapper


def _print_json(document: Any) -> None:
    click.echo(json.dumps(document, indent=1, sort_keys=True))


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@store_command
def status(client, as_json: bool) -> None:
    """Nodes, and per tier the used and capacity bytes, object counts and hit rates."""
    reply = client.call("status")
    reply.pop("ok", None)
    if as_json:
        _print_json(reply)
        return
    tiers = Table("tier", "objects", "logical", "used", "capacity", "use",
                  title=f"{reply['objects']} objects")
    for tier, t in reply["tiers"].items():
        use = t["used_bytes"] / t["capacity_bytes"] if t["capacity_bytes"] else 0
        tiers.add_row(tier, str(t["objects"]), format_size(t["logical_bytes"]),
                      format_size(t["used_bytes"]), format_size(t["capacity_bytes"]),
                      f"{use:.1%}")
    console.print(tiers)
    nodes = Table("node", "address", "alive", "backend", "DRAM used", "SSD used",
                  "SSD objects", "checksum failures", "quarantined")
    for n in reply["nodes"]:
        nodes.add_row(n["node"], n["address"], "yes" if n["alive"] else "[red]no[/]",
                      n["backend"], format_size(n["dram"]["used"]),
                      format_size(n["ssd"]["used"]), str(n["ssd"]["objects"]),
                      str(n["corrupt_reads"]), str(n["quarantined"]))
    console.print(nodes)
    hits = reply["hit_rate"]
    console.print(f"hit rate: {hits['total']:.1%} (DRAM {hits['dram']:.1%}, "
                  f"SSD {hits['ssd']:.1%}) over {sum(reply['lookups'].values())} lookups")


@click.command()
@click.argument("key")
@click.argument("source", type=click.File("rb"))
@store_command
def put(client, key: str, source) -> None:
    """Store the contents of SOURCE (a file, or - for stdin) under KEY."""
    data = source.read()
    if client.put(key, data):
        click.echo(f"stored {key!r} ({format_size(len(data))})", err=True)
    else:
        click.echo(f"{key!r} already exists; objects are written once", err=True)


@click.command()
@click.argument("key")
@click.option("-o", "--output", type=click.File("wb"), default="-",
              help="Write here instead of stdout.")
@store_command
def get(client, key: str, output) -> None:
    """Write the value of KEY to stdout or a file."""
    value = client.get(key)
    if value is None:
        _fail(f"no object {key!r}", ExitCode.NOT_FOUND)
    output.write(value)


@click.command(name="ls")
@click.argument("prefix", default="")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@store_command
def ls(client, prefix: str, as_json: bool) -> None:
    """List keys (starting with PREFIX), with sizes and tiers; streams page by page."""
    after = None
    listed: list[Any] = []
    while True:
        reply = client.call("list", prefix=prefix, after=after, limit=1000)
        for key, size, tiers in reply["objects"]:
            if as_json:
                listed.append({"key": key, "size": size, "tiers": tiers})
            else:
                click.echo(f"{size:>12}  {','.join(tiers):<8}  {key}")
        if not reply["more"] or not reply["objects"]:
            break
        after = reply["objects"][-1][0]
    if as_json:
        _print_json({"prefix": prefix, "objects": listed})


@click.command()
@click.argument("key")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@store_command
def stat(client, key: str, as_json: bool) -> None:
    """Size, checksum and replicas (node, tier, state) of KEY."""
    try:
        obj = client.call("stat", key=key)["object"]
    except StoreError as exc:
        if exc.code == "not_found":
            _fail(f"no object {key!r}", ExitCode.NOT_FOUND)
        raise
    if as_json:
        _print_json(obj)
        return
    click.echo(f"key       {obj['key']}\nsize      {obj['size']} ({format_size(obj['size'])})\n"
               f"crc32c    {obj['checksum']:08x}\nreads     {obj['reads']}")
    for r in obj["replicas"]:
        click.echo(f"replica   {r['node']}  {r['tier']}  {r['state']}")


@click.command()
@click.argument("keys", nargs=-1, required=True)
@store_command
def rm(client, keys: tuple[str, ...]) -> None:
    """Remove KEYS. Exits 3 if any of them did not exist."""
    removed = client.batch_remove(list(keys))
    missing = [k for k, ok in zip(keys, removed) if not ok]
    if missing:
        _fail(f"no object {missing[0]!r}" + (f" (and {len(missing) - 1} more)"
                                            if len(missing) > 1 else ""), ExitCode.NOT_FOUND)


@click.command()
@click.option("--node", help="Only this node.")
@click.option("--wait", is_flag=True, help="Return once every copy is durable on SSD.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@store_command
def flush(client, node: str | None, wait: bool, as_json: bool) -> None:
    """Offload every DRAM-only object to SSD now (fsync'd before it counts)."""
    reply = client.call("flush", node=node, wait=wait)
    reply.pop("ok", None)
    if as_json:
        _print_json(reply)
    else:
        state = "done" if reply["done"] else ("queued" if not wait else "incomplete")
        click.echo(f"flush {state}: {reply['queued']} objects offloaded"
                   + (f", {len(reply['failed'])} failed" if reply["failed"] else ""))
    if wait and (reply["failed"] or not reply["done"]):
        sys.exit(ExitCode.FAILURE)


@click.command()
@click.option("--tier", type=click.Choice(["dram", "ssd"]), required=True)
@click.option("--all", "everything", is_flag=True, help="Every object in the tier.")
@click.option("--bytes", "nbytes", metavar="SIZE", help="Least recently used first, this much.")
@click.option("--key", "keys", multiple=True, help="This key (repeatable).")
@click.option("--prefix", help="Keys starting with this.")
@click.option("--dry-run", is_flag=True, help="Say what would go; change nothing.")
@click.option("--drop", is_flag=True, help="Also drop last copies (data is lost).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@store_command
def evict(client, tier, everything, nbytes, keys, prefix, dry_run, drop, as_json) -> None:
    """Evict objects from a tier. A last copy is never lost without --drop: from DRAM it
    is offloaded to SSD first; on SSD it is skipped."""
    chosen = sum(bool(x) for x in (everything, nbytes, keys, prefix))
    if chosen != 1:
        raise click.UsageError("give exactly one of --all, --bytes, --key, --prefix")
    try:
        budget = parse_size(nbytes) if nbytes else None
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--bytes") from None
    reply = client.call("evict", tier=tier, keys=list(keys) or None, prefix=prefix,
                        bytes=budget, dry_run=dry_run, drop=drop)
    reply.pop("ok", None)
    if as_json:
        _print_json(reply)
        return
    verb = "would evict" if dry_run else "evicted"
    click.echo(f"{verb} {len(reply['evicted'])} from {tier} ({format_size(reply['bytes'])})")
    if reply["offloading"]:
        click.echo(f"{len(reply['offloading'])} DRAM-only objects go to SSD first")
    if reply["skipped_last_copy"]:
        click.echo(f"{len(reply['skipped_last_copy'])} skipped: last copy (use --drop)")


@click.command()
@click.option("--node", help="Only this node.")
@click.option("--repair", is_flag=True, help="Quarantine what is bad and fix the index.")
@click.option("--offline", "offline_dir", type=click.Path(file_okay=False),
              help="Check a stopped node's SSD directory (<data>/ssd) without a daemon; "
                   "read-only unless --repair.")
@click.option("--backend", default=None,
              help="With --offline: the directory's backend (default: read from its stamp).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@master_options
def recover(node, repair, offline_dir, backend, as_json, master, token_file) -> None:
    """Rescan the SSD tier, verify every record, re-register, and quarantine.

    Exits 0 when nothing is wrong (or everything found was repaired), 5 when problems
    remain, 1 when a node did not report back. With --offline DIR nothing is written
    unless --repair is given; a directory that holds no store exits 3, one a running
    node holds exits 2.
    """
    if offline_dir:
        _recover_offline(offline_dir, backend, repair, as_json)
        return
    with session(master, token_file) as client:
        reply = client.call("recover", node=node, repair=repair)
    reports = reply["reports"]
    if as_json:
        _print_json({"reports": reports, "missing": reply["missing"]})
    else:
        for name, report in reports.items():
            _print_problems(name, report["problems"], report["records_checked"])
        for name in reply["missing"]:
            click.echo(f"node {name}: no report (timed out)", err=True)
    bad = [p for r in reports.values() for p in r["problems"] if not p["action"]]
    if bad or reply["missing"]:
        sys.exit(ExitCode.CORRUPT if bad else ExitCode.FAILURE)


def _recover_offline(directory: str, backend: str | None, repair: bool, as_json: bool) -> None:
    """Check (read-only) or repair a backend directory without a daemon."""
    from kvstored.backends.offline import identify, open_offline
    from kvstored.sdk import BackendError

    try:
        name = identify(directory, backend, repair=repair)
        with open_offline(directory, name, repair=repair) as store:
            report = store.check(repair=repair)
            records = sum(1 for _ in store.scan(verify=True))
    except BackendError as exc:
        _fail(str(exc), offline_error_code(exc))
    problems = [{"kind": p.kind.value, "detail": p.detail, "key": p.key, "path": p.path,
                 "action": p.action} for p in report.problems]
    unsolved = any(not p["action"] for p in problems)
    if as_json:
        _print_json({"directory": directory, "backend": name, "objects": records,
                     "mode": "repair" if repair else "read-only",
                     "records_checked": report.records_checked, "problems": problems})
    else:
        _print_problems(f"{directory} ({name})", problems, report.records_checked)
        click.echo(f"{records} objects read back and verified")
        if unsolved and not repair:
            click.echo("nothing was changed (read-only); --repair quarantines what is bad "
                       "and rebuilds what can be rebuilt")
    if unsolved:
        sys.exit(ExitCode.CORRUPT)


def offline_error_code(exc: Exception) -> ExitCode:
    """The exit code of an offline tool (recover, mount) that could not open a backend
    directory: no store there 3, damaged metadata 5, held by a running node or otherwise
    the wrong directory 2, no room 6."""
    from kvstored.sdk.errors import (
        BackendBusyError,
        CapacityError,
        CorruptionError,
        InvalidRequestError,
        MissingStoreError,
        UnknownBackendError,
    )

    for kind, code in ((MissingStoreError, ExitCode.NOT_FOUND),
                       (CorruptionError, ExitCode.CORRUPT),
                       (BackendBusyError, ExitCode.USAGE),
                       (InvalidRequestError, ExitCode.USAGE),
                       (UnknownBackendError, ExitCode.USAGE),
                       (CapacityError, ExitCode.NO_SPACE)):
        if isinstance(exc, kind):
            return code
    return ExitCode.FAILURE


def _print_problems(name: str, problems: list[dict[str, Any]], checked: int) -> None:
    if not problems:
        click.echo(f"{name}: {checked} records checked, no problems")
        return
    click.echo(f"{name}: {checked} records checked, {len(problems)} problems")
    for p in problems:
        what = p["key"] if p["key"] is not None else p["path"]
        click.echo(f"  {p['kind']}: {what}: {p['detail']}"
                   + (f" -> {p['action']}" if p["action"] else ""))

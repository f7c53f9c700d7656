"""``python -m kvstored.sdk.testing NAME_OR_MODULE:CLASS [--option k=v] [--dir DIR]``

Runs the conformance kit, prints a table of passed and failed checks, and exits 0 only
if every check passed (1 if any failed, 2 on bad usage).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from kvstored.sdk.errors import BackendError


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("backend")
@click.option("--option", "-o", "raw_options", multiple=True, metavar="KEY=VALUE",
              help="A backend option, e.g. policy=lru or capacity=1GiB (repeatable).")
@click.option("--dir", "directory", type=click.Path(file_okay=False, path_type=Path),
              help="Where to make the check folders (default: the system temp dir).")
@click.option("--select", "-k", help="Run only the checks whose name contains this.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document instead.")
def main(backend: str, raw_options: tuple[str, ...], directory: Path | None,
         select: str | None, as_json: bool) -> None:
    """Run the storage-backend conformance kit against BACKEND.

    BACKEND is a registered backend name (file-per-key, bucket, …) or module:Class.
    """
    from kvstored.sdk.registry import backend_class, parse_options
    from kvstored.sdk.testing import CHECKS, run_kit

    raw = {}
    for item in raw_options:
        key, sep, value = item.partition("=")
        if not sep:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="--option")
        raw[key] = value
    try:
        options = parse_options(backend_class(backend), raw)
    except BackendError as exc:
        raise click.UsageError(str(exc)) from None
    if directory is not None:
        directory.mkdir(parents=True, exist_ok=True)
    if select and not any(select in c.name for c in CHECKS):
        raise click.UsageError(f"no check matches {select!r}")

    console = Console(stderr=as_json)

    def progress(outcome) -> None:
        if not as_json:
            mark = ("[yellow]-[/]" if outcome.not_applicable else
                    "[green]✓[/]" if outcome.passed else "[red]✗[/]")
            console.print(f" {mark} {outcome.name}", highlight=False)

    console.print(f"[bold]kvstored conformance kit[/]: {backend} {options or ''}")
    from kvstored.sdk.testing.kit import BackendSpec, run_checks

    checks = [c for c in CHECKS if select is None or select in c.name]
    outcomes = run_checks(BackendSpec(backend, options), checks, directory, progress)
    del run_kit
    failed = [o for o in outcomes if not o.passed]
    if as_json:
        print(json.dumps({"backend": backend, "options": raw, "passed": not failed,
                          "checks": [o.__dict__ for o in outcomes]}, indent=1))
    else:
        skipped = sum(1 for o in outcomes if o.not_applicable)
        title = f"{backend}: {len(outcomes) - len(failed) - skipped}/{len(outcomes)} passed"
        table = Table(title=title + (f", {skipped} not applicable" if skipped else ""))
        table.add_column("check")
        table.add_column("result")
        table.add_column("s", justify="right")
        table.add_column("proves / failure")
        for o in outcomes:
            if o.not_applicable:
                table.add_row(o.name, "[yellow]n/a[/]", f"{o.seconds:.2f}",
                              f"[yellow]not applicable: {o.not_applicable}[/]")
                continue
            table.add_row(o.name, "[green]pass[/]" if o.passed else "[red]FAIL[/]",
                          f"{o.seconds:.2f}", o.doc if o.passed else f"[red]{o.error}[/]")
        console.print(table)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

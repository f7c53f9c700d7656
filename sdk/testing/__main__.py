"""``python -m kvstored.sdk.testing NAME_OR_MODULE:CLASS [--option k=v] [--dir DIR]``

Runs the conformance kit (:func:`kvstored.sdk.testing.check_backend`), prints a table of
passed, failed and not-applicable checks, and exits 0 only if no check failed (1 if any
failed, 2 on bad usage). A check that does not apply (a capability the backend does not
claim) is listed as "n/a" with the reason and does not fail the run.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from kvstored.sdk.errors import BackendError
from kvstored.sdk.registry import backend_class, parse_options
from kvstored.sdk.testing import CHECKS, check_backend
from kvstored.sdk.testing.kit import CheckStatus


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

    marks = {CheckStatus.PASSED: "[green]✓[/]", CheckStatus.FAILED: "[red]✗[/]",
             CheckStatus.NOT_APPLICABLE: "[yellow]-[/]"}
    results = {CheckStatus.PASSED: "[green]pass[/]", CheckStatus.FAILED: "[red]FAIL[/]",
               CheckStatus.NOT_APPLICABLE: "[yellow]n/a[/]"}

    def progress(outcome) -> None:
        if not as_json:
            console.print(f" {marks[outcome.status]} {outcome.name}", highlight=False)

    console.print(f"[bold]kvstored conformance kit[/]: {backend} {options or ''}")
    report = check_backend(backend, options, directory=directory, select=select,
                           progress=progress)
    outcomes = report.outcomes
    failed = report.failures
    if as_json:
        print(json.dumps({"backend": backend, "options": raw, "passed": report.ok,
                          "checks": [o.as_json() for o in outcomes]}, indent=1))
    else:
        passed = sum(1 for o in outcomes if o.status is CheckStatus.PASSED)
        not_applicable = sum(1 for o in outcomes if o.status is CheckStatus.NOT_APPLICABLE)
        table = Table(title=f"{backend}: {passed}/{len(outcomes)} passed, "
                            f"{len(failed)} failed, {not_applicable} not applicable")
        table.add_column("check")
        table.add_column("clause")
        table.add_column("result")
        table.add_column("s", justify="right")
        table.add_column("proves / failure / why not applicable")
        for o in outcomes:
            detail = {CheckStatus.PASSED: o.doc, CheckStatus.FAILED: f"[red]{o.error}[/]",
                      CheckStatus.NOT_APPLICABLE: f"[yellow]{o.error}[/]"}[o.status]
            table.add_row(o.name, o.clause, results[o.status], f"{o.seconds:.2f}", detail)
        console.print(table)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

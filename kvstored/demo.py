"""``make demo``: the main job on the embedded default, end to end.

It grows with the product. Today it opens the default SSD backend in a scratch
directory, round-trips KV blocks through it, closes and reopens it to show they
survived, damages one record on disk to show it is reported and never returned, and
repairs the store.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from kvstored.backends import DEFAULT_BACKEND, open_backend
from kvstored.sdk import ReadStatus
from kvstored.sdk.testing import flip_byte, payload
from kvstored.units import format_size

console = Console()


def main() -> int:
    root = Path(tempfile.mkdtemp(prefix="kvstored-demo-"))
    store = root / "ssd"
    console.rule(f"[bold]kvstored demo[/]: backend {DEFAULT_BACKEND!r} in {store}")
    keys = [f"model=glm-5.1/layer-{i // 8}/block-{i:04d}" for i in range(64)]
    blocks = {k: payload(k, 256 * 1024 + i * 4096) for i, k in enumerate(keys)}

    with open_backend(DEFAULT_BACKEND, store) as backend:
        results = backend.batch_write(list(blocks.items()))
        console.print(f"wrote {sum(r.ok for r in results)} KV blocks, "
                      f"{format_size(sum(map(len, blocks.values())))}")
        _show_usage(backend)

    with open_backend(DEFAULT_BACKEND, store) as backend:
        bufs = [memoryview(bytearray(len(blocks[k]))) for k in keys]
        got = backend.batch_read(keys, bufs)
        intact = sum(1 for k, n, b in zip(keys, got, bufs) if n >= 0 and b[:n] == blocks[k])
        console.print(f"reopened: {intact}/{len(keys)} blocks read back byte for byte")
        victim = keys[7]
        where = backend.locate(victim)
        console.print(f"flipping one byte of {victim!r} at {where}")
        flip_byte(where.path, where.offset + 1000)
        status = backend.batch_read([victim], [bufs[7]])[0]
        console.print(f"read of the damaged block: [bold]{ReadStatus(status).name}[/] "
                      "(a miss, never bad bytes)")
        report = backend.check(repair=True)
        for problem in report.problems:
            console.print(f"check: {problem.kind.value}: {problem.detail}; {problem.action}")
        console.print(f"after repair: check finds {len(backend.check().problems)} problems")
        _show_usage(backend)
        if intact != len(keys) or status != ReadStatus.CORRUPT:
            console.print("[red]demo failed[/]")
            return 1
    console.print(f"[green]demo ok[/] (data left in {root}; remove it with rm -r)")
    return 0


def _show_usage(backend) -> None:
    usage = backend.usage()
    table = Table("objects", "logical", "physical", "capacity")
    table.add_row(str(usage.objects), format_size(usage.logical_bytes),
                  format_size(usage.physical_bytes),
                  format_size(usage.capacity_bytes) if usage.capacity_bytes else "file system")
    console.print(table)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())

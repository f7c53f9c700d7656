"""Reopening an offset volume: a crash replay rebuilds exactly what a clean close keeps.

``python -m tests.backends.test_offset_reopen`` is the reopen benchmark (JSON on
stdout): it fills a volume with N objects (default 100 000) and times
three reopens (batches of 200, the backend's write_batch_hint):

- ``clean``: after close (checkpoint current, journal empty);
- ``crash``: after a kill at the end (the default checkpoint policy: whatever the last
  automatic checkpoint did not cover is replayed);
- ``crash_full_replay``: after a kill with no checkpoint since the volume was created, so
  every record is found through the journal and its header and value CRC are verified
  (the worst case, which ``checkpoint_bytes`` normally bounds).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from kvstored.backends.offset.layout import journal_blocks
from kvstored.sdk.record import record_size
from kvstored.sdk.registry import open_backend
from kvstored.sdk.types import WriteOutcome
from tests.backends.test_offset_recovery import crash

BATCH = 200


def fill(backend, objects: int, value_size: int) -> None:
    value = bytes(range(256)) * (value_size // 256) + bytes(value_size % 256)
    for start in range(0, objects, BATCH):
        keys = [f"bench/{i:08d}/layer-0" for i in range(start, min(start + BATCH, objects))]
        results = backend.batch_write([(k, value) for k in keys])
        assert all(r.outcome is WriteOutcome.WRITTEN for r in results)


def snapshot(backend) -> dict:
    return {r.key: (r.location.record_offset, r.size, r.seq, r.checksum)
            for r in backend.scan()}


def test_crash_replay_rebuilds_what_close_keeps(tmp_path):
    options = {"capacity": 64 << 20, "engine": "posix", "checkpoint_bytes": 1 << 40}
    backend = open_backend("offset", tmp_path / "a", **options)
    fill(backend, 2000, 3000)
    backend.batch_delete([f"bench/{i:08d}/layer-0" for i in range(0, 2000, 7)])
    expected = snapshot(backend)
    usage = backend.usage()
    crash(backend)
    backend = open_backend("offset", tmp_path / "a", **options)
    assert snapshot(backend) == expected
    assert backend.usage() == usage
    backend.close()
    backend = open_backend("offset", tmp_path / "a", **options)
    assert snapshot(backend) == expected
    backend.close()


def _timed_open(path: Path, options: dict) -> tuple[float, object]:
    started = time.perf_counter()
    backend = open_backend("offset", path, **options)
    return time.perf_counter() - started, backend


def run_benchmark(objects: int, value_size: int, engine: str, direct: bool,
                  directory: str | None) -> dict:
    key_bytes = len(f"bench/{0:08d}/layer-0")
    data = objects * record_size(value_size)
    options = {"engine": engine, "direct": direct,
               "capacity": int(data * 1.25) + (256 << 20),
               "index_bytes": int(objects * (38 + key_bytes) * 1.25) + 4096}
    base = Path(tempfile.mkdtemp(prefix="kvstored-reopen-", dir=directory))
    results: dict = {"objects": objects, "value_size": value_size, "engine": engine,
                     "direct": direct, "volume_bytes": options["capacity"], "reopen": {}}
    try:
        # The full replay needs a journal (1/1024 of the volume) holding every batch.
        journal = (-(-objects // BATCH) * journal_blocks(BATCH, []) + 16) * 4096
        full = {"checkpoint_bytes": 1 << 50,
                "capacity": max(options["capacity"], journal * 1024)}
        for scenario, extra in (("clean", {}), ("crash", {}), ("crash_full_replay", full)):
            path = base / scenario
            backend = open_backend("offset", path, **{**options, **extra})
            started = time.perf_counter()
            fill(backend, objects, value_size)
            fill_seconds = time.perf_counter() - started
            if scenario == "clean":
                backend.close()
            else:
                crash(backend)
            seconds, backend = _timed_open(path, {**options, **extra})
            assert backend.usage().objects == objects
            results["reopen"][scenario] = {"seconds": round(seconds, 3),
                                           "fill_seconds": round(fill_seconds, 2),
                                           "replayed_records":
                                               backend.last_recovery["replayed_records"]}
            backend.close()
            shutil.rmtree(path)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--objects", type=int, default=100_000)
    parser.add_argument("--value-size", type=int, default=4096)
    parser.add_argument("--engine", default="auto")
    parser.add_argument("--direct", action="store_true", help="O_DIRECT (bypass the page "
                        "cache, so reopen reads come from the disk)")
    parser.add_argument("--dir", help="where to put the volumes (default: the temp dir)")
    args = parser.parse_args(argv)
    print(json.dumps(run_benchmark(args.objects, args.value_size, args.engine, args.direct,
                                   args.dir), indent=1))


if __name__ == "__main__":
    sys.exit(main())

"""How long the bucket backend takes to reopen a store of many objects.

Run it as a script (it is not a test: performance is measured, not asserted)::

    .venv/bin/python -m tests.backends.bucket_reopen_timing [--objects 100000]
        [--bucket-keys 500] [--value-size 4096] [--engine posix] [--dir /tmp]

It writes ``--objects`` values in batches of ``--bucket-keys`` (one bucket per batch, as
the node's offloader does with the backend's write hint), closes the store, then opens it
``--repeat`` times and prints each open's wall time and the median, as JSON. The page
cache is warm; ``--drop-caches`` (root only) empties it before each open, for a cold
figure. ``--bucket-keys 10`` shows a store built by a trickle of small batches.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time

from kvstored.sdk.registry import open_backend


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--objects", type=int, default=100_000)
    parser.add_argument("--bucket-keys", type=int, default=500)
    parser.add_argument("--value-size", type=int, default=4096)
    parser.add_argument("--engine", default="posix")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--dir", default=None)
    parser.add_argument("--drop-caches", action="store_true")
    args = parser.parse_args()

    root = tempfile.mkdtemp(prefix="kvstored-reopen-", dir=args.dir)
    path = os.path.join(root, "store")
    options = {"engine": args.engine, "bucket_keys": args.bucket_keys}
    try:
        value = os.urandom(args.value_size)
        started = time.perf_counter()
        with open_backend("bucket", path, **options) as backend:
            for first in range(0, args.objects, args.bucket_keys):
                batch = [(f"model=m/layer-{n % 61}/block-{n:08d}", value)
                         for n in range(first, min(first + args.bucket_keys, args.objects))]
                results = backend.batch_write(batch)
                assert all(r.ok for r in results), results[:3]
            usage = backend.usage()
        write_seconds = time.perf_counter() - started
        opens = []
        for _ in range(args.repeat):
            if args.drop_caches:
                os.sync()
                with open("/proc/sys/vm/drop_caches", "w") as f:
                    f.write("3\n")
            started = time.perf_counter()
            backend = open_backend("bucket", path, **options)
            opens.append(time.perf_counter() - started)
            assert backend.usage() == usage, (backend.usage(), usage)
            backend.close()
        print(json.dumps({
            "objects": args.objects, "bucket_keys": args.bucket_keys,
            "buckets": -(-args.objects // args.bucket_keys), "value_size": args.value_size,
            "engine": args.engine, "drop_caches": args.drop_caches,
            "write_seconds": round(write_seconds, 3),
            "open_seconds": [round(s, 3) for s in opens],
            "open_median_seconds": round(statistics.median(opens), 3),
        }, indent=1))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

"""Child process of the torn-write check: writes batches until it is killed.

It prints ``ACK n`` after batch ``n``'s batch_write returned, so the parent knows which
objects were acknowledged. Keys and values are derived from the batch number, so the
parent can check every object without being told what was written.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from kvstored.sdk.testing.kit import BackendSpec, payload, size_for

BATCH = 4
SIZE_LIMIT = 300_000


def batch_keys(n: int) -> list[str]:
    return [f"torn/{n}/{i}" for i in range(BATCH)]


def main() -> None:
    target, options, path = sys.argv[1], json.loads(sys.argv[2]), Path(sys.argv[3])
    backend = BackendSpec(target, options).open(path)
    n = 0
    while True:
        keys = batch_keys(n)
        results = backend.batch_write([(k, payload(k, size_for(k, SIZE_LIMIT))) for k in keys])
        if all(r.ok for r in results):
            print(f"ACK {n}", flush=True)
        n += 1


if __name__ == "__main__":
    main()

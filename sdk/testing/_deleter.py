"""Child process of the delete-durability check: writes objects, deletes and evicts some,
says so, and waits to be killed.

It prints ``DONE <json>`` once ``batch_delete`` and ``evict`` have returned, with the
keys they removed; the parent kills it with SIGKILL at once, so anything a backend makes
durable lazily (at close, on a timer, on the next write) is lost.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from kvstored.sdk.testing.kit import BackendSpec, payload

COUNT = 24


def keys() -> list[str]:
    return [f"gone/{i}" for i in range(COUNT)]


def main() -> None:
    target, options, path = sys.argv[1], json.loads(sys.argv[2]), Path(sys.argv[3])
    backend = BackendSpec(target, options).open(path)
    items = [(k, payload(k, 3000 + 97 * i)) for i, k in enumerate(keys())]
    results = backend.batch_write(items)
    if not all(r.ok for r in results):
        print(f"FAILED {results}", flush=True)
        return
    deleted = keys()[::3]
    assert all(backend.batch_delete(deleted))
    evicted = backend.evict(1)
    print("DONE " + json.dumps({"deleted": deleted, "evicted": evicted}), flush=True)
    sys.stdin.read()  # killed here


if __name__ == "__main__":
    main()

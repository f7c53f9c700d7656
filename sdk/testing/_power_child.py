"""Child process of the kit's power-loss checks: uses a store until the power goes.

``python -m kvstored.sdk.testing._power_child TARGET OPTIONS_JSON PATH PROGRAM``

First it opens the backend and prints ``OPEN persistent`` or ``OPEN volatile`` (or
``FAILED <error>``). Then it runs ``PROGRAM``:

``hold``
    nothing more: it waits for its standard input to close.
``churn``
    writes batch 0 (:func:`batch_keys`) and prints ``ACK 0``, deletes its
    :func:`deleted_keys` and prints ``DELETED`` once ``batch_delete`` returned, then
    writes batch 1, 2, … printing ``ACK n`` after each batch that returned with every
    item written, until it is killed.

Keys and values are derived from the batch number, so the parent checks every object
without being told what was written.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from kvstored.sdk.errors import BackendError
from kvstored.sdk.testing.kit import BackendSpec, payload, size_for

BATCH = 4
SIZE_LIMIT = 200_000


def batch_keys(n: int) -> list[str]:
    return [f"power/{n}/{i}" for i in range(BATCH)]


def deleted_keys() -> list[str]:
    """The keys of batch 0 that ``churn`` deletes."""
    return batch_keys(0)[::2]


def value_of(key: str) -> bytes:
    return payload(key, size_for(key, SIZE_LIMIT))


def write_batch(backend, n: int) -> bool:
    results = backend.batch_write([(k, value_of(k)) for k in batch_keys(n)])
    return all(r.ok for r in results)


def main() -> None:
    target, options, path, program = (sys.argv[1], json.loads(sys.argv[2]),
                                      Path(sys.argv[3]), sys.argv[4])
    try:
        backend = BackendSpec(target, options).open(path)
    except BackendError as exc:
        print(f"FAILED {type(exc).__name__}: {exc}", flush=True)
        return
    print("OPEN " + ("persistent" if backend.capabilities.persistent else "volatile"),
          flush=True)
    if program == "hold":
        sys.stdin.read()
        return
    if not write_batch(backend, 0):
        print("FAILED the first batch was not written", flush=True)
        return
    print("ACK 0", flush=True)
    backend.batch_delete(deleted_keys())
    print("DELETED", flush=True)
    n = 1
    while True:
        if write_batch(backend, n):
            print(f"ACK {n}", flush=True)
        n += 1


if __name__ == "__main__":
    main()

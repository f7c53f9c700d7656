"""Child process of the kit's power-loss checks: uses a store until the power goes.

``python -m kvstored.sdk.testing._power_child TARGET OPTIONS_JSON PATH PROGRAM``

First it opens the backend and prints ``OPEN persistent`` or ``OPEN volatile`` (or
``FAILED <error>``). Then it runs ``PROGRAM``:

``hold``
    nothing more: it waits for its standard input to close.
``delete-last``
    writes batches 0 to ``WRITTEN_BEFORE_DELETE - 1`` (:func:`batch_keys`), printing
    ``ACK n`` after each batch that returned with every item written, then deletes
    :func:`deleted_keys` and prints ``DELETED`` once ``batch_delete`` returned, and
    waits for its standard input to close (so that a delete is the last thing it did).
``churn``
    writes batch 0 and prints ``ACK 0``, deletes :func:`deleted_keys` and prints
    ``DELETED``, then writes batch 1, 2, … printing ``ACK n`` after each, until it is
    killed.

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
WRITTEN_BEFORE_DELETE = 3


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
    before_delete = WRITTEN_BEFORE_DELETE if program == "delete-last" else 1
    for n in range(before_delete):
        if not write_batch(backend, n):
            print(f"FAILED batch {n} was not written", flush=True)
            return
        print(f"ACK {n}", flush=True)
    backend.batch_delete(deleted_keys())
    print("DELETED", flush=True)
    if program == "delete-last":
        sys.stdin.read()
        return
    n = before_delete
    while True:
        if write_batch(backend, n):
            print(f"ACK {n}", flush=True)
        n += 1


if __name__ == "__main__":
    main()

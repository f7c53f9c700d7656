"""Child process of the kit's opening checks: opens the backend, says so, and holds it
open until its standard input closes (then closes it and exits 0).

It prints ``OPEN`` once the backend is open, or ``FAILED <error>`` if it could not open.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from kvstored.sdk.errors import BackendError
from kvstored.sdk.testing.kit import BackendSpec


def main() -> None:
    target, options, path = sys.argv[1], json.loads(sys.argv[2]), Path(sys.argv[3])
    try:
        backend = BackendSpec(target, options).open(path)
    except BackendError as exc:
        print(f"FAILED {type(exc).__name__}: {exc}", flush=True)
        return
    print("OPEN", flush=True)
    sys.stdin.read()
    backend.close()


if __name__ == "__main__":
    main()

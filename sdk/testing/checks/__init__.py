"""The conformance checks. Each proves one clause of the StorageBackend contract; its
docstring's first paragraph says which, and is what the kit's table prints.

The kit runs them in the order of :data:`MODULES`: cheap round trips first, crashes and
concurrency last.
"""

from kvstored.sdk.testing.checks import (  # noqa: F401  (imported to register their checks)
    capacity,
    concurrency,
    corruption,
    faults,
    inspection,
    opening,
    persistence,
    power,
    requests,
    roundtrip,
    streams,
)
from kvstored.sdk.testing.checks._common import REGISTERED

MODULES = ("roundtrip", "requests", "streams", "persistence", "corruption", "inspection",
           "capacity", "opening", "concurrency", "power", "faults")
CHECKS = [c for module in MODULES for c in REGISTERED[module]]

__all__ = ["CHECKS", "MODULES"]

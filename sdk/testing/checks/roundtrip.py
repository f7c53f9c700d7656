"""Conformance checks: Round trips at the size edges, and random sizes."""

from __future__ import annotations

import typing

from kvstored.sdk.errors import (
    ValueTooLargeError,
)
from kvstored.sdk.testing.checks._common import (
    KiB,
    MiB,
    check,
    roundtrip_of_size,
    write_all,
)
from kvstored.sdk.testing.kit import Kit, payload

# -- round trips -------------------------------------------------------------------------


@check
def roundtrip_empty(kit: Kit) -> None:
    """A zero-byte value round-trips and is told apart from a missing key."""
    roundtrip_of_size(kit, 0)


@check
def roundtrip_one_byte(kit: Kit) -> None:
    """A one-byte value round-trips."""
    roundtrip_of_size(kit, 1)


@check
def roundtrip_4095(kit: Kit) -> None:
    """A value one byte short of 4 KiB round-trips (alignment edge)."""
    roundtrip_of_size(kit, 4095)


@check
def roundtrip_4096(kit: Kit) -> None:
    """A value of exactly 4 KiB round-trips (alignment edge)."""
    roundtrip_of_size(kit, 4096)


@check
def roundtrip_4097(kit: Kit) -> None:
    """A value one byte over 4 KiB round-trips (alignment edge)."""
    roundtrip_of_size(kit, 4097)


@check
def roundtrip_1mib(kit: Kit) -> None:
    """A 1 MiB value round-trips."""
    roundtrip_of_size(kit, MiB)


@check
def roundtrip_max_size(kit: Kit) -> None:
    """A value of exactly max_value_size round-trips; one byte more is refused cleanly."""
    backend = kit.open()
    limit = backend.capabilities.max_value_size
    key = "max"
    value = payload(key, limit)
    write_all(backend, [(key, value)])
    kit.assert_value(backend, key, value)
    try:
        backend.batch_write([("too-big", bytes(limit + 1))])
    except ValueTooLargeError as exc:
        assert exc.key == "too-big", "ValueTooLargeError must name the key"
    else:
        raise AssertionError("a value over max_value_size was accepted")
    assert not backend.contains("too-big"), "a refused value became visible"


@check
def roundtrip_random_sizes(kit: Kit) -> None:
    """Values of random sizes (hypothesis) round-trip, in batches, before and after reopen."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    backend = kit.open()
    written: dict[str, bytes] = {}
    counter = iter(range(10**9))

    @settings(max_examples=40, deadline=None, database=None,
              suppress_health_check=typing.cast("list[HealthCheck]", list(HealthCheck)))
    @given(st.lists(st.one_of(st.integers(0, 3 * 4096 + 7), st.integers(0, 600 * KiB)),
                    min_size=1, max_size=6))
    def roundtrip_batch(sizes: list[int]) -> None:
        items = [(f"h/{next(counter)}", b"") for _ in sizes]
        items = [(k, payload(k, n)) for (k, _), n in zip(items, sizes)]
        write_all(backend, items)
        for key, value in items:
            kit.assert_value(backend, key, value)
        written.update(items)

    roundtrip_batch()
    backend = kit.reopen(backend)
    for key, value in written.items():
        kit.assert_value(backend, key, value)



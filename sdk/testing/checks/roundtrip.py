"""Conformance checks: Round trips at the size edges, and random sizes."""

from __future__ import annotations

import random

from kvstored.sdk.errors import ValueTooLargeError
from kvstored.sdk.testing.checks._common import (
    Clause,
    KiB,
    MiB,
    check,
    roundtrip_of_size,
    write_all,
)
from kvstored.sdk.testing.kit import Kit, Requirement, payload

# -- round trips -------------------------------------------------------------------------


#: The sizes at the edges, one check each: its name, the size, and what it proves.
EDGE_SIZES = (
    ("roundtrip_empty", 0,
     "A zero-byte value round-trips and is told apart from a missing key."),
    ("roundtrip_one_byte", 1, "A one-byte value round-trips."),
    ("roundtrip_4095", 4095, "A value one byte short of 4 KiB round-trips (alignment edge)."),
    ("roundtrip_4096", 4096, "A value of exactly 4 KiB round-trips (alignment edge)."),
    ("roundtrip_4097", 4097, "A value one byte over 4 KiB round-trips (alignment edge)."),
    ("roundtrip_1mib", MiB, "A 1 MiB value round-trips."),
)


def _edge_check(name: str, size: int, doc: str) -> None:
    def edge(kit: Kit) -> None:
        roundtrip_of_size(kit, size)

    edge.__name__ = edge.__qualname__ = name
    edge.__doc__ = doc
    check(Clause.INTEGRITY)(edge)


for _name, _size, _doc in EDGE_SIZES:
    _edge_check(_name, _size, _doc)


@check(Clause.ERRORS)
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


@check(Clause.INTEGRITY, Requirement.PERSISTENT)
def roundtrip_random_sizes(kit: Kit) -> None:
    """Values of random sizes (seeded, biased to the 4 KiB edges) round-trip, in batches,
    before and after reopen."""
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    backend = kit.open()
    written: dict[str, bytes] = {}
    for batch in range(40):
        sizes = [_adversarial_size(rng) for _ in range(rng.randint(1, 6))]
        items = [(f"h/{batch}/{i}", payload(f"h/{batch}/{i}", n)) for i, n in enumerate(sizes)]
        write_all(backend, items)
        for key, value in items:
            kit.assert_value(backend, key, value)
        written.update(items)
    backend = kit.reopen(backend)
    for key, value in written.items():
        try:
            kit.assert_value(backend, key, value)
        except AssertionError as exc:
            raise AssertionError(f"{exc} (after reopen; sizes drawn with seed {seed})") from None


def _adversarial_size(rng: random.Random) -> int:
    """A size near a 4 KiB multiple (one short, exact, one over), or anywhere to 600 KiB."""
    if rng.random() < 0.5:
        return max(0, 4096 * rng.randint(0, 3) + rng.choice((-1, 0, 1, 7)))
    return rng.randint(0, 600 * KiB)

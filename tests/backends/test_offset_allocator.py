"""OffsetAllocator.reserve_many, the bulk rebuild the offset backends open with: it must
leave exactly the state one reserve() per extent leaves."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstored.allocator import OffsetAllocator


@st.composite
def layouts(draw):
    alignment = draw(st.sampled_from([1, 512, 4096]))
    granules = draw(st.integers(0, 400))
    extents, position = [], 0
    for gap, length in draw(st.lists(st.tuples(st.integers(0, 5), st.integers(1, 9)))):
        start = position + gap
        if start + length > granules:
            break
        nbytes = draw(st.integers((length - 1) * alignment + 1, length * alignment))
        extents.append((start * alignment, nbytes))
        position = start + length
    return alignment, granules * alignment + draw(st.integers(0, alignment - 1)), extents


@settings(max_examples=300, deadline=None)
@given(layouts())
def test_reserve_many_equals_reserves(layout):
    alignment, size, extents = layout
    one_by_one = OffsetAllocator(size, alignment)
    for offset, nbytes in extents:
        one_by_one.reserve(offset, nbytes)
    bulk = OffsetAllocator(size, alignment)
    bulk.reserve_many(extents)
    bulk.check()
    assert list(bulk.allocations()) == list(one_by_one.allocations())
    assert list(bulk.free_extents()) == list(one_by_one.free_extents())
    assert bulk.used_bytes == one_by_one.used_bytes
    assert bulk.largest_free() == one_by_one.largest_free()
    for offset, _ in extents:  # and it behaves the same afterwards
        assert bulk.free(offset) == one_by_one.free(offset)
    bulk.check()
    assert list(bulk.free_extents()) == list(one_by_one.free_extents())


@pytest.mark.parametrize("extents", [
    [(4096, 10), (0, 10)],          # out of order
    [(0, 8192), (4096, 1)],         # overlapping
    [(100, 1)],                     # misaligned
    [(0, 1 << 30)],                 # out of range
])
def test_reserve_many_refuses_bad_input_and_changes_nothing(extents):
    allocator = OffsetAllocator(1 << 20, 4096)
    with pytest.raises(ValueError):
        allocator.reserve_many(extents)
    allocator.check()
    assert allocator.used_bytes == 0 and list(allocator.free_extents()) == [(0, 1 << 20)]


def test_reserve_many_needs_an_empty_allocator():
    allocator = OffsetAllocator(1 << 20, 4096)
    allocator.allocate(1)
    with pytest.raises(ValueError, match="without allocations"):
        allocator.reserve_many([(8192, 1)])

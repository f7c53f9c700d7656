"""OffsetAllocator against a byte-map model, plus its edge cases.

The model is a bytearray with one cell per granule (1 = allocated) and a dict of live
allocations. After every step the allocator's view must equal the model's: the same
allocations, free extents equal to the model's maximal free runs (which proves
coalescing), the same largest run, and ``check()`` must pass.

``python -m tests.test_allocator`` runs the micro benchmark (:func:`run_benchmark`).
"""

from __future__ import annotations

import json
import random
import sys
import time

import pytest
from hypothesis import HealthCheck, assume, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    precondition,
    rule,
)

from kvstored.allocator import SCAN_LIMIT, OffsetAllocator


def free_runs(cells: bytearray) -> list[tuple[int, int]]:
    """Maximal runs of free cells as (start, length)."""
    runs, start = [], None
    for i, cell in enumerate(cells):
        if not cell and start is None:
            start = i
        elif cell and start is not None:
            runs.append((start, i - start))
            start = None
    if start is not None:
        runs.append((start, len(cells) - start))
    return runs


class AllocatorModel(RuleBasedStateMachine):
    """Random allocate / free / reserve sequences, checked against a granule map."""

    offsets = Bundle("offsets")

    @initialize(granules=st.integers(0, 600), alignment=st.sampled_from([1, 8, 512, 4096]),
                tail=st.integers(0, 4095))
    def create(self, granules, alignment, tail):
        # Sizes that are not a multiple of the alignment leave an unusable tail.
        self.alignment = alignment
        self.granules = granules
        self.allocator = OffsetAllocator(granules * alignment + tail % alignment, alignment)
        self.cells = bytearray(granules)
        self.live: dict[int, int] = {}          # start granule -> length
        self.freed: list[int] = []              # offsets freed at some point

    def _granules_for(self, nbytes: int) -> int:
        return max(1, -(-nbytes // self.alignment))

    def _mark(self, start: int, length: int, value: int) -> None:
        self.cells[start:start + length] = bytes([value]) * length

    @rule(target=offsets, nbytes=st.one_of(st.integers(0, 70), st.integers(0, 700)),
          scale=st.sampled_from([1, 1, 3]))
    def allocate(self, nbytes, scale):
        nbytes = nbytes * scale * self.alignment // 4 + (nbytes % 3)
        need = self._granules_for(nbytes)
        fits = any(length >= need for _, length in free_runs(self.cells))
        offset = self.allocator.allocate(nbytes)
        if not fits:
            assert offset is None, f"allocate({nbytes}) returned {offset} with no fitting run"
            return None
        assert offset is not None, f"allocate({nbytes}) returned None but a run fits"
        assert offset % self.alignment == 0
        start = offset // self.alignment
        assert start + need <= self.granules
        assert not any(self.cells[start:start + need]), "allocated over live space"
        self._mark(start, need, 1)
        self.live[start] = need
        return offset

    @rule(offset=consumes(offsets))
    def free(self, offset):
        if offset is None or offset // self.alignment not in self.live:
            return
        start = offset // self.alignment
        length = self.live.pop(start)
        assert self.allocator.free(offset) == length * self.alignment
        self._mark(start, length, 0)
        self.freed.append(offset)

    @precondition(lambda self: getattr(self, "freed", None))
    @rule(data=st.data())
    def double_free_is_rejected(self, data):
        offset = data.draw(st.sampled_from(self.freed))
        if offset // self.alignment in self.live:     # reallocated since: not a double free
            return
        with pytest.raises(ValueError, match=str(offset)):
            self.allocator.free(offset)

    @rule(granule=st.integers(0, 700), delta=st.integers(0, 4095))
    def bogus_free_is_rejected(self, granule, delta):
        offset = granule * self.alignment + delta % self.alignment
        assume(not (offset % self.alignment == 0 and granule in self.live))
        with pytest.raises(ValueError, match=str(offset)):
            self.allocator.free(offset)

    @rule(target=offsets, granule=st.integers(0, 620), length=st.integers(0, 80),
          misalign=st.booleans())
    def reserve(self, granule, length, misalign):
        offset = granule * self.alignment + (1 if misalign and self.alignment > 1 else 0)
        nbytes = length * self.alignment
        need = self._granules_for(nbytes)
        ok = (offset % self.alignment == 0 and granule + need <= self.granules
              and not any(self.cells[granule:granule + need]))
        if not ok:
            with pytest.raises(ValueError, match=str(offset)):
                self.allocator.reserve(offset, nbytes)
            return None
        self.allocator.reserve(offset, nbytes)
        self._mark(granule, need, 1)
        self.live[granule] = need
        return offset

    @invariant()
    def matches_model(self):
        if not hasattr(self, "allocator"):
            return
        a, align = self.allocator, self.alignment
        a.check()
        used = sum(self.live.values())
        assert a.capacity == self.granules * align
        assert a.used_bytes == used * align
        assert a.free_bytes == (self.granules - used) * align
        assert len(a) == len(self.live)
        assert list(a.allocations()) == [(s * align, n * align)
                                         for s, n in sorted(self.live.items())]
        runs = free_runs(self.cells)
        assert list(a.free_extents()) == [(s * align, n * align) for s, n in runs]
        assert a.largest_free() == max((n for _, n in runs), default=0) * align
        for start, length in self.live.items():
            assert start * align in a
            assert a.allocation_size(start * align) == length * align


TestAllocatorModel = AllocatorModel.TestCase
TestAllocatorModel.settings = settings(
    max_examples=150, stateful_step_count=60, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


# -- edge cases -------------------------------------------------------------------------------


def test_size_not_a_multiple_of_alignment_leaves_an_unusable_tail():
    a = OffsetAllocator(10_000, 4096)
    assert (a.size, a.capacity, a.free_bytes) == (10_000, 8192, 8192)
    assert a.allocate(8193) is None
    assert a.allocate(8192) == 0
    assert a.allocate(1) is None
    with pytest.raises(ValueError, match="outside"):
        a.reserve(8192, 1)
    a.check()


def test_zero_byte_allocation_takes_one_granule():
    a = OffsetAllocator(1 << 20)
    first, second = a.allocate(0), a.allocate(0)
    assert first != second
    assert a.allocation_size(first) == 4096
    assert a.used_bytes == 8192


def test_exhausting_space_then_freeing_everything_leaves_one_extent():
    a = OffsetAllocator(64 * 4096 + 100)
    rng = random.Random(7)
    offsets = []
    while (offset := a.allocate(rng.randrange(0, 5 * 4096))) is not None:
        offsets.append(offset)
    # The refused request was larger than what remains; single granules fill the rest.
    while a.free_bytes:
        assert a.allocate(0) is not None
    assert a.allocate(0) is None
    assert a.free_bytes == 0 and a.largest_free() == 0
    assert a.used_bytes == a.capacity
    rng.shuffle(offsets)
    for offset in offsets:
        a.free(offset)
    for offset, _ in list(a.allocations()):
        a.free(offset)
    assert list(a.free_extents()) == [(0, 64 * 4096)]
    assert a.largest_free() == a.capacity
    a.check()


def test_empty_allocator_never_allocates():
    a = OffsetAllocator(4095)
    assert a.capacity == 0 and a.allocate(0) is None and a.largest_free() == 0
    a.check()


def test_double_free_and_unknown_offsets_name_the_offset():
    a = OffsetAllocator(1 << 20)
    offset = a.allocate(10_000)
    assert a.free(offset) == 12_288
    with pytest.raises(ValueError, match=r"free\(0\).*offset 0"):
        a.free(offset)
    kept = a.allocate(3 * 4096)
    for bogus in (kept + 4096, kept + 1, -4096, 1 << 30):
        with pytest.raises(ValueError, match=str(bogus)):
            a.free(bogus)
    with pytest.raises(ValueError, match="12288"):
        a.allocation_size(12_288)
    assert kept in a and kept + 4096 not in a and "0" not in a
    a.check()


def test_reserve_rejects_overlaps_and_names_the_conflict():
    a = OffsetAllocator(1 << 20)
    a.reserve(8192, 8192)                       # granules 2..3
    with pytest.raises(ValueError, match="overlaps the allocation at offset 8192"):
        a.reserve(4096, 8192)                   # runs into it from the left
    with pytest.raises(ValueError, match="overlaps allocated space at offset 12288"):
        a.reserve(12_288, 1)                    # starts inside it
    with pytest.raises(ValueError, match="not a multiple"):
        a.reserve(100, 1)
    with pytest.raises(ValueError, match="outside"):
        a.reserve((1 << 20) - 4096, 8192)
    with pytest.raises(ValueError, match="outside"):
        a.reserve(-4096, 1)
    assert list(a.allocations()) == [(8192, 8192)]
    a.reserve(0, 0)
    a.reserve(16_384, 100)
    assert a.free(8192) == 8192
    assert list(a.free_extents()) == [(4096, 12_288), (20_480, (1 << 20) - 20_480)]
    a.check()


def test_reserve_after_allocate_and_free_rebuilds_its_index():
    a = OffsetAllocator(100 * 4096)
    x = a.allocate(4096 * 10)
    a.reserve(50 * 4096, 4096)
    a.free(x)
    a.reserve(0, 4096)                          # the index must see the freed extent
    y = a.allocate(4096)
    a.reserve(60 * 4096, 4096)
    assert y not in (0, 50 * 4096, 60 * 4096)
    a.check()


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="alignment"):
        OffsetAllocator(4096, 0)
    with pytest.raises(ValueError, match="size"):
        OffsetAllocator(-1)
    with pytest.raises(TypeError):
        OffsetAllocator(4096.0)
    a = OffsetAllocator(1 << 20)
    with pytest.raises(ValueError, match="-1"):
        a.allocate(-1)
    with pytest.raises(TypeError):
        a.allocate(1.5)
    with pytest.raises(TypeError):
        a.free("0")


def test_a_freed_hole_of_the_right_size_is_reused_before_the_free_tail():
    # Good fit: a hole in the request's own size class wins over splitting the big tail,
    # both for exact classes (small) and for ranged ones (large).
    for granules in (16, 1000):
        a = OffsetAllocator(1 << 30)
        first = a.allocate(granules * 4096)
        a.allocate(4096)                        # keeps the hole from merging with the tail
        a.free(first)
        assert a.allocate(granules * 4096) == first
        a.check()


def test_own_class_beyond_the_scan_limit_is_still_found_when_nothing_larger_is_free():
    # Class [128, 130) granules (alignment 1). One 129-long extent sits first, then more
    # than SCAN_LIMIT 128-long ones, each fenced by a 1-granule allocation; nothing else is
    # free. allocate(129) must find the 129 extent: "None" only when nothing fits.
    count = SCAN_LIMIT + 4
    a = OffsetAllocator(129 + 1 + count * (128 + 1), alignment=1)
    position = 129
    for _ in range(count):
        a.reserve(position, 1)
        position += 129
    a.reserve(position, 1)
    assert [n for _, n in a.free_extents()] == [129] + [128] * count
    assert a.allocate(129) == 0
    assert a.allocate(129) is None
    a.check()


def test_large_address_space():
    a = OffsetAllocator(1 << 41)                # 2 TiB, as for an SSD file
    big = a.allocate(1 << 40)
    rest = a.allocate((1 << 40) - 4096)
    assert (big, a.largest_free()) == (0, 4096)
    assert a.allocate(8192) is None
    a.free(big)
    assert a.largest_free() == 1 << 40
    a.free(rest)
    assert list(a.free_extents()) == [(0, 1 << 41)]
    a.check()


# -- micro benchmark (run by hand; not a test) ------------------------------------------------


def run_benchmark(pairs: int = 1_000_000, capacity: int = 64 << 30, fill: float = 0.8,
                  seed: int = 0) -> dict:
    """Time ``pairs`` allocate+free pairs at steady state; report rates and fragmentation.

    Sizes mix the common KV block sizes (64 KiB, 1 MiB, 4 MiB) with uniform 4 KiB-4 MiB
    requests. The allocator is first filled to ``fill`` of ``capacity``; each step then
    allocates one request and frees one random live allocation (when an allocation fails,
    random allocations are freed until it fits, as a cache would evict, and that counts as
    a failure). Random numbers are drawn before timing starts.
    """
    rng = random.Random(seed)
    fixed = (64 << 10, 1 << 20, 4 << 20)
    sizes = [rng.choice(fixed) if rng.random() < 0.5 else rng.randrange(4096, 4 << 20)
             for _ in range(pairs)]
    picks = [rng.random() for _ in range(pairs)]
    a = OffsetAllocator(capacity)
    live: list[int] = []
    i = 0
    while a.used_bytes < fill * capacity:
        live.append(a.allocate(sizes[i % pairs]))
        i += 1
    failures = 0
    allocate, free = a.allocate, a.free
    started = time.perf_counter()
    for size, pick in zip(sizes, picks):
        offset = allocate(size)
        while offset is None:
            failures += 1
            victim = int(pick * len(live))
            free(live[victim])
            live[victim] = live[-1]
            live.pop()
            offset = allocate(size)
        victim = int(pick * len(live))
        free(live[victim])
        live[victim] = offset
    elapsed = time.perf_counter() - started
    a.check()
    return {
        "pairs": pairs,
        "seconds": round(elapsed, 3),
        "pairs_per_second": round(pairs / elapsed),
        "microseconds_per_pair": round(elapsed / pairs * 1e6, 3),
        "allocation_failures": failures,
        "live_allocations": len(live),
        "used_fraction": round(a.used_bytes / a.capacity, 4),
        "free_extents": sum(1 for _ in a.free_extents()),
        "largest_free_over_free": round(a.largest_free() / max(1, a.free_bytes), 4),
    }


if __name__ == "__main__":
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    print(json.dumps(run_benchmark(count), indent=2))

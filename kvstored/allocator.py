"""An offset allocator: aligned extents of one address range, with good-fit placement.

:class:`OffsetAllocator` hands out offsets in ``[0, size)``; it never touches memory or
files. It backs the node's DRAM segment (offsets into shared memory) and the ``offset``
SSD backend (offsets into one preallocated file), so it favours low fragmentation over
the simplicity of a buddy allocator: a buddy allocator wastes up to half of every block,
which a cache of same-sized KV blocks cannot afford.

How it works (a two-level segregated-fit allocator in the style of TLSF):

- Space is counted in *granules* of ``alignment`` bytes. A request takes
  ``round_up(max(nbytes, 1), alignment)`` bytes, so offsets stay aligned and no byte
  between two allocations is ever wasted.
- Free extents sit in size classes: one class per exact length below 64 granules, then 64
  classes per power of two (a class spans at most 1/64 of its lower bound). A bitmap per
  power of two, plus one bitmap of powers, finds the smallest non-empty class at or above
  a given one in O(1).
- ``allocate`` first looks in the request's own class (for the small exact classes every
  extent fits exactly; otherwise it tries up to :data:`SCAN_LIMIT` extents for one that is
  large enough, wasting under 1/64), then takes any extent from the smallest class above,
  where every extent fits. This is "good fit": within 1/64 of best fit, in O(1).
- Free extents are kept coalesced: ``free`` merges with both neighbours through two
  dictionaries keyed by extent start and end (boundary tags), in O(1).
- Within a class the most recently freed extent is used first, so hot memory is reused.

Only ``reserve`` needs offset order; it keeps a sorted list of free-extent starts, built
lazily (O(f log f) for f free extents, once after any ``allocate`` or ``free``) and then
updated in place, so a run of reserves in ascending offset order, as a rebuild from a
checkpoint or a scan does, costs O(log f) each.

Not thread-safe: callers that share an allocator between threads hold their own lock
around every call (the allocator never blocks and never does I/O, so a plain
``threading.Lock`` held for the call is cheap).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Iterator
from operator import index as _as_int

#: log2 of the number of classes per power of two (64): a class spans at most 1/64 of its
#: lower bound, and lengths below 64 granules each have a class of their own.
SL_LOG2 = 6
_SL_COUNT = 1 << SL_LOG2
_SL_MASK = _SL_COUNT - 1

#: How many extents of the request's own size class ``allocate`` examines before it moves
#: up a class. Bounds the common path; a full scan of that class happens only when no
#: larger class has a free extent (the allocator is nearly full).
SCAN_LIMIT = 16


def _class_of(length: int) -> int:
    """The size class of a free extent of ``length`` granules (length >= 1).

    The index is ``fl << SL_LOG2 | sl``: ``fl`` 0 holds the exact lengths 1..63; ``fl``
    k >= 1 holds lengths in ``[2**(k+5), 2**(k+6))``, split into 64 equal classes.
    """
    if length < _SL_COUNT:
        return length
    shift = length.bit_length() - SL_LOG2 - 1
    return ((shift + 1) << SL_LOG2) | ((length >> shift) - _SL_COUNT)


def _class_floor(cls: int) -> int:
    """The smallest length, in granules, that falls in class ``cls``."""
    fl = cls >> SL_LOG2
    if fl == 0:
        return cls
    return (_SL_COUNT + (cls & _SL_MASK)) << (fl - 1)


def _lowest_bit(mask: int) -> int:
    return (mask & -mask).bit_length() - 1


class OffsetAllocator:
    """Allocates aligned extents of ``[0, size)``; frees coalesce with free neighbours.

    ``size`` is the managed range in bytes; ``alignment`` (any positive integer, normally
    a power of two such as the 4096-byte page) is both the offset alignment and the
    allocation granule. When ``size`` is not a multiple of ``alignment`` the tail beyond
    the last whole granule can never be allocated: :attr:`capacity` is ``size`` rounded
    down to the alignment, and ``used_bytes + free_bytes == capacity`` always.

    All methods run in O(1) except where their docstrings say otherwise; none blocks or
    does I/O. Not thread-safe: hold a lock around every call when threads share it.

    Raises ValueError for a negative ``size`` or a non-positive ``alignment``, and
    TypeError for non-integers.
    """

    __slots__ = (
        "_alignment", "_buckets", "_fl_bitmap", "_free", "_free_end", "_free_starts",
        "_granules", "_size", "_sl_bitmaps", "_used", "_used_granules",
    )

    def __init__(self, size: int, alignment: int = 4096) -> None:
        size = _as_int(size)
        alignment = _as_int(alignment)
        if size < 0:
            raise ValueError(f"OffsetAllocator size must be >= 0 bytes, got {size}")
        if alignment <= 0:
            raise ValueError(f"OffsetAllocator alignment must be >= 1 byte, got {alignment}")
        self._size = size
        self._alignment = alignment
        self._granules = size // alignment
        # Free extents, in granules: start -> length and end -> start (boundary tags).
        self._free: dict[int, int] = {}
        self._free_end: dict[int, int] = {}
        # Live allocations, in granules: start -> length.
        self._used: dict[int, int] = {}
        self._used_granules = 0
        # One insertion-ordered dict (used as an ordered set) of free starts per class,
        # and the bitmaps of non-empty classes: bit sl of _sl_bitmaps[fl], bit fl of
        # _fl_bitmap.
        levels = max(1, self._granules.bit_length() - SL_LOG2 + 1)
        self._buckets: list[dict[int, None]] = [{} for _ in range(levels << SL_LOG2)]
        self._sl_bitmaps = [0] * levels
        self._fl_bitmap = 0
        # Sorted free starts for reserve(); None until needed, and after allocate/free.
        self._free_starts: list[int] | None = None
        if self._granules:
            self._insert_free(0, self._granules)

    # -- size-class bookkeeping ------------------------------------------------------------

    def _insert_free(self, start: int, length: int) -> None:
        self._free[start] = length
        self._free_end[start + length] = start
        cls = _class_of(length)
        bucket = self._buckets[cls]
        if not bucket:
            fl = cls >> SL_LOG2
            self._sl_bitmaps[fl] |= 1 << (cls & _SL_MASK)
            self._fl_bitmap |= 1 << fl
        bucket[start] = None

    def _remove_free(self, start: int, length: int) -> None:
        del self._free[start]
        del self._free_end[start + length]
        cls = _class_of(length)
        bucket = self._buckets[cls]
        del bucket[start]
        if not bucket:
            fl = cls >> SL_LOG2
            remaining = self._sl_bitmaps[fl] & ~(1 << (cls & _SL_MASK))
            self._sl_bitmaps[fl] = remaining
            if not remaining:
                self._fl_bitmap &= ~(1 << fl)

    def _first_class_from(self, cls: int) -> int:
        """The smallest non-empty class >= ``cls``, or -1."""
        fl = cls >> SL_LOG2
        if fl >= len(self._sl_bitmaps):
            return -1
        mask = self._sl_bitmaps[fl] >> (cls & _SL_MASK)
        if mask:
            return cls + _lowest_bit(mask)
        mask = self._fl_bitmap >> (fl + 1)
        if not mask:
            return -1
        fl += 1 + _lowest_bit(mask)
        return (fl << SL_LOG2) | _lowest_bit(self._sl_bitmaps[fl])

    # -- the public API --------------------------------------------------------------------

    def allocate(self, nbytes: int) -> int | None:
        """Reserve ``round_up(max(nbytes, 1), alignment)`` bytes; return their offset.

        The offset is a multiple of :attr:`alignment`. Returns None, and changes nothing,
        when no free extent is large enough (full or too fragmented); never raises for
        that. O(1); a request whose only fitting extents lie in its own size class behind
        more than :data:`SCAN_LIMIT` smaller ones costs a scan of that one class.

        Raises ValueError for a negative ``nbytes``, TypeError for a non-integer.
        """
        nbytes = _as_int(nbytes)
        if nbytes < 0:
            raise ValueError(f"allocate({nbytes}): the size must be >= 0 bytes")
        alignment = self._alignment
        need = -(-nbytes // alignment) or 1
        if need > self._granules - self._used_granules:
            return None
        free = self._free
        cls = _class_of(need)
        bucket = self._buckets[cls]
        start = -1
        truncated = False
        if bucket:
            if cls < _SL_COUNT or need == _class_floor(cls):
                start = next(reversed(bucket))      # every extent of this class fits
            else:
                for scanned, candidate in enumerate(reversed(bucket)):
                    if free[candidate] >= need:
                        start = candidate
                        break
                    if scanned + 1 == SCAN_LIMIT:
                        truncated = True
                        break
        if start < 0:
            above = self._first_class_from(cls + 1)
            if above >= 0:
                start = next(reversed(self._buckets[above]))
            elif truncated:
                start = next((s for s in bucket if free[s] >= need), -1)
            if start < 0:
                return None
        length = free[start]
        self._remove_free(start, length)
        if length > need:
            self._insert_free(start + need, length - need)
        self._used[start] = need
        self._used_granules += need
        self._free_starts = None
        return start * alignment

    def free(self, offset: int) -> int:
        """Release the allocation that starts at ``offset``; return the bytes it held.

        The extent merges with free neighbours on both sides. O(1).

        Raises ValueError naming ``offset`` when no live allocation starts there (a double
        free, an offset inside an allocation, or one never allocated); nothing changes
        then. TypeError for a non-integer.
        """
        offset = _as_int(offset)
        start, misalignment = divmod(offset, self._alignment)
        length = None if misalignment else self._used.pop(start, None)
        if length is None:
            raise ValueError(f"free({offset}): no allocation starts at offset {offset} "
                             "(already freed, never allocated, or not its first byte)")
        self._used_granules -= length
        end = start + length
        right = self._free.get(end)
        if right is not None:
            self._remove_free(end, right)
            end += right
        left = self._free_end.get(start)
        if left is not None:
            self._remove_free(left, start - left)
            start = left
        self._insert_free(start, end - start)
        self._free_starts = None
        return length * self._alignment

    def reserve(self, offset: int, nbytes: int) -> None:
        """Mark ``round_up(max(nbytes, 1), alignment)`` bytes at ``offset`` as allocated.

        For rebuilding state from a checkpoint or a scan; afterwards the extent behaves
        exactly like one returned by :meth:`allocate` (``free(offset)`` releases it).
        O(log f) for f free extents plus a list insertion, which is cheap when reserves
        come in ascending offset order; the first reserve after an ``allocate`` or
        ``free`` also sorts the free starts, O(f log f). Sort a bulk rebuild by offset.

        Raises ValueError, changing nothing, when ``offset`` is not a multiple of the
        alignment, the extent leaves ``[0, capacity)``, or it overlaps allocated space.
        TypeError for non-integers.
        """
        offset = _as_int(offset)
        nbytes = _as_int(nbytes)
        alignment = self._alignment
        if nbytes < 0:
            raise ValueError(f"reserve({offset}, {nbytes}): the size must be >= 0 bytes")
        if offset % alignment:
            raise ValueError(f"reserve({offset}, {nbytes}): offset {offset} is not a "
                             f"multiple of the alignment {alignment}")
        start = offset // alignment
        end = start + (-(-nbytes // alignment) or 1)
        if start < 0 or end > self._granules:
            raise ValueError(f"reserve({offset}, {nbytes}): [{offset}, {end * alignment}) "
                             f"is outside the allocator's range [0, {self.capacity})")
        starts = self._free_starts
        if starts is None:
            starts = self._free_starts = sorted(self._free)
        i = bisect_right(starts, start) - 1
        extent_start = starts[i] if i >= 0 else -1
        extent_end = extent_start + self._free[extent_start] if i >= 0 else -1
        if end > extent_end:
            where = (f"the allocation at offset {extent_end * alignment}"
                     if start < extent_end else f"allocated space at offset {offset}")
            raise ValueError(f"reserve({offset}, {nbytes}): [{offset}, {end * alignment}) "
                             f"overlaps {where}")
        self._remove_free(extent_start, extent_end - extent_start)
        if extent_start < start:
            self._insert_free(extent_start, start - extent_start)
            if end < extent_end:
                starts.insert(i + 1, end)
        elif end < extent_end:
            starts[i] = end
        else:
            del starts[i]
        if end < extent_end:
            self._insert_free(end, extent_end - end)
        self._used[start] = end - start
        self._used_granules += end - start

    def reserve_many(self, extents: Iterable[tuple[int, int]]) -> None:
        """Mark many ``(offset, nbytes)`` extents allocated at once, exactly as a
        :meth:`reserve` of each would, on an allocator that has no allocations yet.

        For rebuilding a large state (a checkpoint of 100k records) in O(n) with a small
        constant, where n reserves would cost far more. ``extents`` must come in
        ascending offset order. Raises ValueError, changing nothing, when the allocator
        already has allocations, or an extent is misaligned, outside ``[0, capacity)``,
        out of order or overlapping the one before. TypeError for non-integers.
        """
        if self._used:
            raise ValueError("reserve_many() needs an allocator without allocations")
        alignment, granules = self._alignment, self._granules
        used: dict[int, int] = {}
        gaps: list[tuple[int, int]] = []
        position = 0
        for offset, nbytes in extents:
            offset, nbytes = _as_int(offset), _as_int(nbytes)
            start, misalignment = divmod(offset, alignment)
            if nbytes < 0 or misalignment or offset < 0:
                raise ValueError(f"reserve_many: extent ({offset}, {nbytes}) is misaligned "
                                 "or negative")
            length = -(-nbytes // alignment) or 1
            if start < position:
                raise ValueError(f"reserve_many: extent at offset {offset} overlaps the one "
                                 "before or is out of order")
            if start + length > granules:
                raise ValueError(f"reserve_many: extent ({offset}, {nbytes}) is outside the "
                                 f"allocator's range [0, {self.capacity})")
            if start > position:
                gaps.append((position, start - position))
            used[start] = length
            position = start + length
        if position < granules:
            gaps.append((position, granules - position))
        # No allocations means the whole range is one coalesced free extent.
        if granules:
            self._remove_free(0, granules)
        for start, length in gaps:
            self._insert_free(start, length)
        self._used = used
        self._used_granules = sum(used.values())
        self._free_starts = None

    @property
    def size(self) -> int:
        """The ``size`` given at construction, in bytes."""
        return self._size

    @property
    def alignment(self) -> int:
        """The offset alignment and allocation granule, in bytes."""
        return self._alignment

    @property
    def capacity(self) -> int:
        """The allocatable bytes: ``size`` rounded down to a multiple of ``alignment``."""
        return self._granules * self._alignment

    @property
    def used_bytes(self) -> int:
        """Bytes held by live allocations (each rounded up to the alignment)."""
        return self._used_granules * self._alignment

    @property
    def free_bytes(self) -> int:
        """Allocatable bytes not held by any allocation: ``capacity - used_bytes``."""
        return (self._granules - self._used_granules) * self._alignment

    def largest_free(self) -> int:
        """The largest single free extent in bytes: the largest request that succeeds.

        O(k) in the number of free extents of the largest non-empty size class.
        """
        if not self._fl_bitmap:
            return 0
        fl = self._fl_bitmap.bit_length() - 1
        cls = (fl << SL_LOG2) | (self._sl_bitmaps[fl].bit_length() - 1)
        if fl == 0:
            return cls * self._alignment
        return max(self._free[s] for s in self._buckets[cls]) * self._alignment

    def allocation_size(self, offset: int) -> int:
        """The bytes held by the allocation at ``offset``.

        Raises ValueError naming ``offset`` when no live allocation starts there.
        """
        offset = _as_int(offset)
        start, misalignment = divmod(offset, self._alignment)
        length = None if misalignment else self._used.get(start)
        if length is None:
            raise ValueError(f"allocation_size({offset}): no allocation starts at "
                             f"offset {offset}")
        return length * self._alignment

    def __contains__(self, offset: object) -> bool:
        """True when a live allocation starts at ``offset``."""
        if not isinstance(offset, int):
            return False
        start, misalignment = divmod(offset, self._alignment)
        return not misalignment and start in self._used

    def __len__(self) -> int:
        """The number of live allocations."""
        return len(self._used)

    def allocations(self) -> Iterator[tuple[int, int]]:
        """``(offset, nbytes)`` of every live allocation, in offset order.

        A snapshot taken at the first ``next()``: changes made while iterating are not
        seen. O(n log n) for n allocations.
        """
        alignment = self._alignment
        for start, length in sorted(self._used.items()):
            yield start * alignment, length * alignment

    def free_extents(self) -> Iterator[tuple[int, int]]:
        """``(offset, nbytes)`` of every free extent, in offset order; a snapshot as in
        :meth:`allocations`. Free extents are maximal: no two are adjacent."""
        alignment = self._alignment
        for start, length in sorted(self._free.items()):
            yield start * alignment, length * alignment

    def check(self) -> None:
        """Verify every internal invariant; raise AssertionError describing the first
        broken one. O(n log n); for tests and debugging (kept under ``python -O``).

        Checked: free and used extents tile ``[0, capacity)`` without overlap; no two free
        extents touch (coalesced); the end index, the size classes and both bitmap levels
        agree with the free extents; the byte counts add up; the reserve index, when
        present, is the sorted list of free starts.
        """
        def fail(message: str) -> None:
            raise AssertionError(f"OffsetAllocator invariant broken: {message}")

        if self._used_granules != sum(self._used.values()):
            fail(f"used count {self._used_granules} != sum of allocations")
        if self._free_end != {s + n: s for s, n in self._free.items()}:
            fail("the end index does not match the free extents")
        extents = sorted([(s, n, False) for s, n in self._free.items()]
                         + [(s, n, True) for s, n in self._used.items()])
        position, previous_free = 0, False
        for start, length, used in extents:
            if length <= 0:
                fail(f"extent at granule {start} has length {length}")
            if start != position:
                fail(f"extent at granule {start} should start at {position} "
                     f"({'gap' if start > position else 'overlap'})")
            if not used and previous_free:
                fail(f"free extents touch at granule {start} (not coalesced)")
            position, previous_free = start + length, not used
        if position != self._granules:
            fail(f"extents end at granule {position}, capacity is {self._granules}")
        members = 0
        for cls, bucket in enumerate(self._buckets):
            fl, sl = cls >> SL_LOG2, cls & _SL_MASK
            if bool(bucket) != bool(self._sl_bitmaps[fl] >> sl & 1):
                fail(f"bitmap bit of class {cls} disagrees with its {len(bucket)} extents")
            for start in bucket:
                if start not in self._free or _class_of(self._free[start]) != cls:
                    fail(f"class {cls} lists granule {start}, which is not a free extent "
                         "of that class")
            members += len(bucket)
        if members != len(self._free):
            fail(f"classes hold {members} extents, there are {len(self._free)}")
        for fl, mask in enumerate(self._sl_bitmaps):
            if bool(mask) != bool(self._fl_bitmap >> fl & 1):
                fail(f"first-level bit {fl} disagrees with its second-level bitmap")
        if self._fl_bitmap >> len(self._sl_bitmaps):
            fail("first-level bitmap has bits beyond the last level")
        if self._free_starts is not None and self._free_starts != sorted(self._free):
            fail("the reserve index is not the sorted list of free starts")

    def __repr__(self) -> str:
        return (f"OffsetAllocator(size={self._size}, alignment={self._alignment}, "
                f"allocations={len(self._used)}, used_bytes={self.used_bytes}, "
                f"free_bytes={self.free_bytes}, free_extents={len(self._free)})")

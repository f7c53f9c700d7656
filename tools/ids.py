"""Block ids: from JSON values to the 64-bit keys the replay core compares.

Traces give ``hash_ids`` as integers or strings, compared by their decimal text, as the
reference does: the integer ``5`` and the string ``"5"`` name the same block, ``"05"``
another. Booleans, floats and anything else are malformed.

The key of an id is the integer itself when it lies in [-2**62, 2**62) (almost every
trace: the fast path is one numpy conversion); any other id is interned to
``2**62 + k``, its k-th distinct text, which no integer key can equal.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

import numpy as np

try:
    from kvstored.tools._simcore import ffi as _ffi
    from kvstored.tools._simcore import lib as _lib
except ImportError:  # pragma: no cover - the pure-Python fallback keeps a dict
    _ffi = _lib = None

INT_KEY_LIMIT = 1 << 62
_DECIMAL = re.compile(r"-?(0|[1-9][0-9]*)\Z")


class IdNames(Sequence):
    """The texts of the ids interned so far, read from the compiled interner's arena
    (a view: no Python string is kept per id)."""

    def __init__(self, owner: IdInterner):
        self._owner = owner

    def __len__(self) -> int:
        return self._owner.count

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        return self._owner.name(index)

    def __eq__(self, other) -> bool:
        return list(self) == list(other)


class IdInterner:
    """Maps ids that are not small integers to keys above the integer range.

    The texts live in the compiled core's interner (about 20 bytes per distinct text
    beyond its bytes); without the core, in a Python dict."""

    def __init__(self) -> None:
        self._native = _core_interner()
        self._keys: dict[str, int] = {}
        self._names: list[str] = []

    @property
    def count(self) -> int:
        if self._native is not None:
            return int(_lib.sim_interner_count(self._native))
        return len(self._names)

    @property
    def names(self) -> Sequence[str]:
        return IdNames(self) if self._native is not None else self._names

    def name(self, index: int) -> str:
        if self._native is None:
            return self._names[index]
        if not 0 <= index < self.count:
            raise IndexError(index)
        size = _lib.sim_interner_name(self._native, index, _ffi.NULL, 0)
        out = _ffi.new("char[]", max(1, size))
        _lib.sim_interner_name(self._native, index, out, size)
        return _ffi.unpack(out, size).decode("utf-8", "surrogatepass")

    def _texts(self, texts: list[str]) -> np.ndarray:
        """Keys of texts (decimal texts in range are their integers)."""
        keys = np.empty(len(texts), dtype=np.int64)
        if not texts:
            return keys
        joined = "".join(texts)
        if joined.isascii():
            data = joined.encode("ascii")
            ends = np.cumsum(np.fromiter(map(len, texts), dtype=np.int64, count=len(texts)))
        else:
            parts = [t.encode("utf-8", "surrogatepass") for t in texts]
            data = b"".join(parts)
            ends = np.cumsum(np.fromiter(map(len, parts), dtype=np.int64, count=len(parts)))
        rc = _lib.sim_intern(self._native, _ffi.from_buffer(data), _ffi.from_buffer(
            "int64_t[]", ends), len(texts), INT_KEY_LIMIT, _ffi.from_buffer("int64_t[]", keys))
        if rc < 0:
            raise MemoryError("interning the block ids: out of memory")
        return keys

    def key(self, value: object) -> int:
        """The key of one id; raises ValueError (with the reason) for a malformed one."""
        if isinstance(value, bool):
            raise ValueError("a hash id is a boolean; ids are integers or strings")
        if isinstance(value, int):
            if -INT_KEY_LIMIT <= value < INT_KEY_LIMIT:
                return value
            text = str(value)
        elif isinstance(value, str):
            text = value
        else:
            raise ValueError(
                f"a hash id is {type(value).__name__} {value!r}; ids are integers or strings")
        if self._native is not None:
            return int(self._texts([text])[0])
        if text.isascii() and _DECIMAL.match(text):
            number = int(text)
            if -INT_KEY_LIMIT <= number < INT_KEY_LIMIT:
                return number
        key = self._keys.get(text)
        if key is None:
            key = INT_KEY_LIMIT + len(self._names)
            self._keys[text] = key
            self._names.append(text)
        return key

    def keys(self, values: Iterable[object]) -> list[int]:
        return [self.key(value) for value in values]

    def batch(self, values: list) -> np.ndarray | None:
        """The keys of a batch of integer and string ids, or None when the batch holds
        anything else (the caller then checks record by record to name the bad one).
        Booleans must be screened out first (numpy and dicts take True for 1).

        With the compiled core the texts go to it in one call (joined, with their end
        offsets): no numpy string array and no Python object per distinct id."""
        if not values:
            return np.empty(0, dtype=np.int64)
        types = set(map(type, values))
        if not types <= {int, str}:
            return None
        if self._native is not None:
            if types == {int}:  # ints out of the key range: their decimal texts
                return self._texts(list(map(str, values)))
            texts = values if types == {str} else [
                v if type(v) is str else str(v) for v in values]
            return self._texts(texts)
        distinct = dict.fromkeys(values)
        for value in distinct:
            distinct[value] = self.key(value)
        return np.fromiter(map(distinct.__getitem__, values), dtype=np.int64,
                           count=len(values))


def _core_interner():
    """A compiled interner freed with its owner, or None without the core."""
    if _lib is None:
        return None
    native = _lib.sim_interner_new()
    if native == _ffi.NULL:
        raise MemoryError("cannot allocate the id interner")
    return _ffi.gc(native, _lib.sim_interner_free)


def fast_keys(values: list) -> np.ndarray | None:
    """The keys of a batch of ids when they are all integers in range, else None.

    numpy infers int64 only when every element is an int (bools upcast too, so callers
    screen records that mention ``true``/``false`` first)."""
    if not values:
        return np.empty(0, dtype=np.int64)
    try:
        array = np.array(values)
    except (OverflowError, ValueError):
        return None
    if array.dtype != np.int64 or array.ndim != 1:
        return None
    if array.min() < -INT_KEY_LIMIT or array.max() >= INT_KEY_LIMIT:
        return None
    return array

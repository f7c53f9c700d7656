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
from collections.abc import Iterable

import numpy as np

INT_KEY_LIMIT = 1 << 62
_DECIMAL = re.compile(r"-?(0|[1-9][0-9]*)\Z")


class IdInterner:
    """Maps ids that are not small integers to keys above the integer range."""

    def __init__(self) -> None:
        self._keys: dict[str, int] = {}
        self.names: list[str] = []

    def key(self, value: object) -> int:
        """The key of one id; raises ValueError (with the reason) for a malformed one."""
        if isinstance(value, bool):
            raise ValueError("a hash id is a boolean; ids are integers or strings")
        if isinstance(value, int):
            if -INT_KEY_LIMIT <= value < INT_KEY_LIMIT:
                return value
            text = str(value)
        elif isinstance(value, str):
            if value.isascii() and _DECIMAL.match(value):
                number = int(value)
                if -INT_KEY_LIMIT <= number < INT_KEY_LIMIT:
                    return number
            text = value
        else:
            raise ValueError(
                f"a hash id is {type(value).__name__} {value!r}; ids are integers or strings")
        key = self._keys.get(text)
        if key is None:
            key = INT_KEY_LIMIT + len(self.names)
            self._keys[text] = key
            self.names.append(text)
        return key

    def keys(self, values: Iterable[object]) -> list[int]:
        return [self.key(value) for value in values]


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

"""Read pins: the mechanism behind "eviction never removes an object being read".

A backend's read path pins the keys it reads for the length of the I/O; its eviction
skips pinned keys, and space freed by a delete of a pinned key is reused only once the
last pin is gone. Callers can hold pins longer through :meth:`StorageBackend.pin`.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager


class ReadPins:
    """A thread-safe multiset of pinned keys, with callbacks for deferred frees."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        self._on_release: dict[str, list[Callable[[], None]]] = {}

    def is_pinned(self, key: str) -> bool:
        return self._counts.get(key, 0) > 0

    def acquire(self, keys: Iterable[str]) -> list[str]:
        keys = list(keys)
        with self._lock:
            self._counts.update(keys)
        return keys

    def release(self, keys: Iterable[str]) -> None:
        due: list[Callable[[], None]] = []
        with self._lock:
            for key in keys:
                left = self._counts[key] - 1
                if left > 0:
                    self._counts[key] = left
                    continue
                self._counts.pop(key)  # Counter's own __delitem__ is Python: slower
                if self._on_release:
                    due.extend(self._on_release.pop(key, ()))
        for callback in due:
            callback()

    def when_released(self, key: str, callback: Callable[[], None]) -> None:
        """Run ``callback`` once ``key`` is no longer pinned: now, if it is not."""
        with self._lock:
            if self._counts.get(key, 0) > 0:
                self._on_release.setdefault(key, []).append(callback)
                return
        callback()

    @contextmanager
    def hold(self, keys: Iterable[str]) -> Iterator[None]:
        held = self.acquire(keys)
        try:
            yield
        finally:
            self.release(held)

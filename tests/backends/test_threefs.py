"""The ``3fs`` backend: the whole conformance kit on both io engines, and its own layout.

Here an ordinary directory stands in for the 3FS mount (docs/3fs.md says what that
does and does not prove). Targeted tests of recovery, the journal and the shared-reader
path are in test_threefs_recovery.py, test_threefs_journal.py, test_threefs_shared.py and
test_threefs_usrbio.py.
"""

from __future__ import annotations

import pytest

import kvstored.native
from kvstored.sdk.testing import BackendConformance
from tests.conftest import require


class TestThreeFsPosix(BackendConformance):
    backend = "3fs"
    options = {"engine": "posix"}


class TestThreeFsUring(BackendConformance):
    backend = "3fs"
    options = {"engine": "uring"}

    @pytest.fixture(autouse=True)
    def _needs_uring(self) -> None:
        require("uring", *kvstored.native.uring_status())


class TestThreeFsUringDirectLru(BackendConformance):
    """O_DIRECT and the LRU policy: the aligned-record path without the page cache."""

    backend = "3fs"
    options = {"engine": "uring", "direct": True, "policy": "lru"}

    @pytest.fixture(autouse=True)
    def _needs_uring(self) -> None:
        require("uring", *kvstored.native.uring_status())

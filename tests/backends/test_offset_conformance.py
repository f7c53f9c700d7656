"""offset passes the whole conformance kit on both io engines and both eviction policies.

Each check preallocates a volume of 1 GiB (the default when no capacity is given), so
the check's folder is removed as soon as it ends rather than left to pytest's retention
of the last three runs.
"""

import shutil

import pytest

import kvstored.native
from kvstored.sdk.testing import BackendConformance
from tests.conftest import require


class RemoveVolumes:
    """Delete each test's folder (and its preallocated volume) when the test ends."""

    @pytest.fixture(autouse=True)
    def _remove_volumes(self, tmp_path):
        yield
        shutil.rmtree(tmp_path, ignore_errors=True)


class NeedsUring(RemoveVolumes):
    @pytest.fixture(autouse=True)
    def _needs_uring(self):
        require("uring", *kvstored.native.uring_status())


class TestOffsetPosix(RemoveVolumes, BackendConformance):
    backend = "offset"
    options = {"engine": "posix"}


class TestOffsetPosixLru(RemoveVolumes, BackendConformance):
    backend = "offset"
    options = {"engine": "posix", "policy": "lru"}


class TestOffsetUring(NeedsUring, BackendConformance):
    backend = "offset"
    options = {"engine": "uring"}


class TestOffsetUringDirect(NeedsUring, BackendConformance):
    """O_DIRECT: record writes are whole blocks; reads into unaligned caller memory go
    through the engine's bounce buffers."""

    backend = "offset"
    options = {"engine": "uring", "direct": True}

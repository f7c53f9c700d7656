"""bucket passes the whole conformance kit: on both io engines, with O_DIRECT, under both
eviction policies, and with buckets so small that the kit's batches span several."""

import pytest

import kvstored.native
from kvstored.sdk.testing import BackendConformance
from tests.conftest import require


class NeedsUring:
    @pytest.fixture(autouse=True)
    def _needs_uring(self):
        require("uring", *kvstored.native.uring_status())


class TestBucketPosix(BackendConformance):
    backend = "bucket"
    options = {"engine": "posix"}


class TestBucketUring(NeedsUring, BackendConformance):
    backend = "bucket"
    options = {"engine": "uring"}


class TestBucketUringDirectLru(NeedsUring, BackendConformance):
    backend = "bucket"
    options = {"engine": "uring", "direct": True, "policy": "lru"}


class TestBucketPosixSmallBuckets(BackendConformance):
    """Three keys or 300 kB a bucket: batches are cut, and eviction frees part of one."""

    backend = "bucket"
    options = {"engine": "posix", "bucket_keys": 3, "bucket_bytes": 300_000}

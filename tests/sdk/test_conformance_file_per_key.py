"""file-per-key passes the whole conformance kit, under both eviction policies."""

from kvstored.sdk.testing import BackendConformance


class TestFilePerKeyFifo(BackendConformance):
    backend = "file-per-key"


class TestFilePerKeyLru(BackendConformance):
    backend = "file-per-key"
    options = {"policy": "lru"}

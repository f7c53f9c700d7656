"""Fixtures of the io engine suite: every engine test runs on both engines.

The uring half calls ``require("uring", ...)``: it skips where io_uring cannot work, and
fails instead when KVSTORED_REQUIRE names uring (CI).
"""

from __future__ import annotations

import pytest

from kvstored.native import probe_uring
from kvstored.native.posix import PosixEngine
from tests.conftest import require, scratch_fs

ENGINE_NAMES = ("posix", "uring")


def engine_class(name: str) -> type:
    if name == "uring":
        require("uring", *probe_uring())
        from kvstored.native.uring import UringEngine

        return UringEngine
    return PosixEngine


@pytest.fixture(params=ENGINE_NAMES)
def engine_name(request) -> str:
    engine_class(request.param)  # skips (or fails under KVSTORED_REQUIRE) early
    return request.param


@pytest.fixture
def make_engine(engine_name):
    """A fresh engine of the parametrized kind (not the process-wide cached one)."""
    return lambda **options: engine_class(engine_name)(**options)


@pytest.fixture
def engine(make_engine):
    # A shallow queue, so that ordinary batches already wrap around the ring.
    return make_engine(queue_depth=8)


@pytest.fixture(params=[False, True], ids=["buffered", "direct"])
def direct(request) -> bool:
    return request.param


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 1 MiB tmpfs, to run out of space for real."""
    with scratch_fs(tmp_path / "tmpfs", "1m") as where:
        yield where


@pytest.fixture
def ramfs(tmp_path):
    """A ramfs: a real file system that refuses O_DIRECT."""
    with scratch_fs(tmp_path / "ramfs", kind="ramfs") as where:
        yield where

"""A small DRAM tier on a real /dev/shm segment, for the node's in-process tests."""

from __future__ import annotations

import os
import uuid

import pytest

from kvstored.node.dram import DramTier
from kvstored.shm import DramSegment


@pytest.fixture
def dram():
    segment = DramSegment.create(f"kvstored-test-{os.getpid()}-{uuid.uuid4().hex[:10]}",
                                 16 << 20, populate=False)
    try:
        yield DramTier(segment)
    finally:
        segment.close()

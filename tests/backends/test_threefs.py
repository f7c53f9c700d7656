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


@pytest.mark.parametrize("engine,direct", [("posix", False), ("uring", True)])
def test_big_batches_are_pipelined_in_order(tmp_path, engine, direct):
    """Batches past two pipeline chunks (reads) or two staging pieces (writes) move
    through the I/O threads piece by piece; every value lands in its own place and every
    result is in its item's slot."""
    from kvstored.backends.threefs.files import PIPELINE_CHUNK
    from kvstored.backends.threefs.writer import PIECE_BYTES
    from kvstored.sdk.registry import open_backend
    from kvstored.sdk.testing import payload

    if engine == "uring":
        require("uring", *kvstored.native.uring_status())
    sizes = [1 << 20, 5, 300_000, 128 * 1024, 0, 4096, 777_777, 5 << 20] * 8
    items = [(f"big/{n}", payload(f"big/{n}", size)) for n, size in enumerate(sizes)]
    total = sum(len(v) for _, v in items)
    assert total > 2 * PIPELINE_CHUNK and total > 2 * PIECE_BYTES
    with open_backend("3fs", tmp_path, engine=engine, direct=direct) as backend:
        assert all(r.ok for r in backend.batch_write(items))
        buffers = [memoryview(bytearray(len(v) + 10)) for _, v in items]
        got = backend.batch_read([k for k, _ in items], buffers)
        assert got == [len(v) for _, v in items]
        assert all(bytes(b[:len(v)]) == v for b, (_, v) in zip(buffers, items))
        assert not backend.check().problems


def test_batches_naming_keys_in_opposite_orders_do_not_deadlock(tmp_path):
    """A batch never waits for a key another batch is writing while it holds claims of
    its own (with the GIL switching often, the orders interleave on every round)."""
    import sys
    import threading

    from kvstored.sdk.registry import open_backend
    from kvstored.sdk.types import WriteOutcome

    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    outcomes: list[WriteOutcome] = []
    try:
        with open_backend("3fs", tmp_path, engine="posix") as backend:
            def writer(reverse: bool) -> None:
                for n in range(30):
                    keys = [f"{n}/{i}" for i in range(100)]
                    if reverse:
                        keys.reverse()
                    outcomes.extend(r.outcome for r in backend.batch_write(
                        [(k, k.encode()) for k in keys]))

            threads = [threading.Thread(target=writer, args=(flag,), daemon=True)
                       for flag in (False, True)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=60)
            assert not any(t.is_alive() for t in threads), "two batches deadlocked"
            assert outcomes.count(WriteOutcome.WRITTEN) == 3000
            assert outcomes.count(WriteOutcome.EXISTS) == 3000
            assert backend.read("29/99") == b"29/99"
    finally:
        sys.setswitchinterval(previous)

"""kvstored's io engine: batched file I/O through io_uring, or POSIX calls where it is missing.

::

    from kvstored.native import get_engine
    engine = get_engine()                       # auto | uring | posix; see get_engine
    f = engine.open(path, os.O_RDWR | os.O_CREAT, direct=True)
    results = engine.read([(f, 0, buf_a), (f, 1 << 20, buf_b)])   # bytes or IoError each
    engine.write([(f, 0, data)]); engine.fsync([f]); f.close()

The contract (what blocks, what is per item, which errors) is on :class:`IoEngine`; the
design is in docs/io-engine.md.
"""

from kvstored.native.engine import (
    FinishedBatch,
    IoEngine,
    IoFile,
    LentBatch,
    PendingBatch,
    sync_written,
    write_synced,
)
from kvstored.native.errors import EngineUnavailableError, IoError
from kvstored.native.probe import probe_uring
from kvstored.native.scratch import ScratchLoan, ScratchMemory, ScratchPool
from kvstored.native.selection import ENGINES, get_engine, uring_status

__all__ = [
    "ENGINES",
    "EngineUnavailableError",
    "FinishedBatch",
    "IoEngine",
    "IoError",
    "IoFile",
    "LentBatch",
    "PendingBatch",
    "ScratchLoan",
    "ScratchMemory",
    "ScratchPool",
    "get_engine",
    "probe_uring",
    "sync_written",
    "uring_status",
    "write_synced",
]

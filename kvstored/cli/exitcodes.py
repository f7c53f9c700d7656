"""Exit codes shared by ``kvstored`` and ``kvstore``; docs/cli.md lists them.

They are distinct so that scripts can tell a missing object from a dead daemon
from corrupt data without parsing messages. Which error ends with which code is
decided in one place, :mod:`kvstored.cli.errors`; nothing below the CLI knows them.
"""

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    #: An unexpected failure, or a check that found problems it did not fix.
    FAILURE = 1
    #: Bad usage: an unknown flag, a malformed value, an unknown name (click uses 2 too).
    USAGE = 2
    #: The key, file, directory, node or trace named does not exist.
    NOT_FOUND = 3
    #: The master or node could not be reached.
    UNREACHABLE = 4
    #: Data failed its checksum or a record is malformed.
    CORRUPT = 5
    #: No space: the tier, the backend's capacity or the file system is full.
    NO_SPACE = 6
    #: A capability asked for is absent on this machine (io_uring, FUSE, RDMA).
    UNAVAILABLE = 7
    #: The address, data directory or mount point is held by another process.
    IN_USE = 8
    #: Interrupted by SIGINT.
    INTERRUPTED = 130

"""``kvstore bench``: side-by-side benchmarks that write their results as JSON.

Each benchmark runs kvstored and its peers (fio, a raw socket, memcpy, Mooncake, the
reference simulator) in one run, so that ratios, not drifting absolute times, are what
docs/benchmarks.md quotes. Each lives in its own module with its click command; the
``kvstore bench`` group that lists them is the CLI's (:mod:`kvstored.cli.bench_cmd`).

A benchmark fails with :class:`BenchError` when its subject misbehaves, and with the
error of what is missing otherwise (:class:`~kvstored.errors.UnavailableError`, an
``OSError`` with ``ENOSPC`` for a disk too small, a
:class:`~kvstored.errors.CorruptDataError` for bytes that read back wrong); the CLI's
table gives each its exit code.
"""

import errno


class BenchError(Exception):
    """A benchmark whose subject failed or gave results it must not (a write refused, an
    object missing after a reopen, two tools that disagree): the message says which."""


def no_space(message: str) -> OSError:
    """The error for a disk or backend too small for a run: ``ENOSPC``, which the CLI
    ends with NO_SPACE like any full disk."""
    return OSError(errno.ENOSPC, message)

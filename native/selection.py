"""Which engine a process uses: ``io.engine`` / ``KVSTORED_IO_ENGINE`` = auto|uring|posix.

Precedence: the ``kind`` argument (where the caller passes its ``io.engine`` setting), then
``KVSTORED_IO_ENGINE``, then ``auto``. ``auto`` probes io_uring once per process, logs which
engine it picked and why, and falls back to posix. Asking for ``uring`` where it cannot work
raises :class:`EngineUnavailableError` with the reason; it never falls back silently.
``KVSTORED_IO_DIRECT=1`` makes files open with O_DIRECT unless the caller says otherwise.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Mapping

from kvstored.native.engine import IoEngine
from kvstored.native.errors import EngineUnavailableError, log_once
from kvstored.native.posix import PosixEngine
from kvstored.native.probe import probe_uring
from kvstored.sdk.units import parse_bool

ENGINES = ("auto", "uring", "posix")
ENV_ENGINE = "KVSTORED_IO_ENGINE"
ENV_DIRECT = "KVSTORED_IO_DIRECT"

_engines: dict[tuple[str, bool, int], IoEngine] = {}
_engines_lock = threading.Lock()


@functools.cache
def uring_status() -> tuple[bool, str]:
    """:func:`probe_uring` for this process, probed once."""
    return probe_uring()


def get_engine(kind: str | None = None, *, direct: bool | None = None, queue_depth: int = 32,
               environ: Mapping[str, str] | None = None) -> IoEngine:
    """The process-wide engine for ``kind`` (``auto``, ``uring`` or ``posix``).

    ``direct`` sets whether :meth:`IoEngine.open` uses O_DIRECT by default (None: from
    ``KVSTORED_IO_DIRECT``). ``queue_depth`` is how many requests one thread keeps in
    flight. Calls with the same arguments share one engine (and its per-thread rings).

    Raises ``ValueError`` for an unknown engine name or a malformed KVSTORED_IO_DIRECT, and
    :class:`EngineUnavailableError` when ``uring`` is asked for and cannot work here.
    """
    environ = os.environ if environ is None else environ
    source = "the io.engine argument"
    if kind is None:
        kind, source = environ.get(ENV_ENGINE, ""), ENV_ENGINE
        if not kind.strip():
            kind, source = "auto", "the default"
    kind = kind.strip().lower()
    if kind not in ENGINES:
        raise ValueError(f"unknown io engine {kind!r} (from {source}); "
                         f"choose one of {', '.join(ENGINES)}")
    if direct is None:
        try:
            direct = parse_bool(environ.get(ENV_DIRECT, "0"))
        except ValueError as exc:
            raise ValueError(f"{ENV_DIRECT}: {exc}") from None
    if kind == "auto":
        available, reason = uring_status()
        kind = "uring" if available else "posix"
        log_once(("io-engine-auto", kind), logging.INFO if available else logging.WARNING,
                 "io engine auto: using %s (%s)", kind, reason)
    elif kind == "uring":
        available, reason = uring_status()
        if not available:
            raise EngineUnavailableError("uring", f"{reason} (asked for by {source})")
    key = (kind, direct, queue_depth)
    with _engines_lock:
        engine = _engines.get(key)
        if engine is None:
            engine = _engines[key] = _make(kind, direct, queue_depth)
        return engine


def _make(kind: str, direct: bool, queue_depth: int) -> IoEngine:
    if kind == "uring":
        from kvstored.native.uring import UringEngine

        return UringEngine(direct=direct, queue_depth=queue_depth)
    return PosixEngine(direct=direct, queue_depth=queue_depth)

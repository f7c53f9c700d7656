"""Shared fixtures, and the KVSTORED_REQUIRE rule.

``KVSTORED_REQUIRE=fuse,uring`` (set by .ci/run) turns a skip for a missing capability
into a failure: CI has both, so a test that skips there hides a broken feature.

``rng`` is every test's random source: its seed is logged, and ``KVSTORED_TEST_SEED``
replays a failure with the seed it logged.

Under ``make test`` (xdist, ``--dist loadscope``) the longest work goes out first: see
:func:`pytest_collection_modifyitems`.

The suite's interpreters share one bytecode cache: see :func:`share_bytecode_cache`.
"""

from __future__ import annotations

import logging
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from kvstored.capabilities import required_capabilities

SEED_ENV = "KVSTORED_TEST_SEED"

log = logging.getLogger(__name__)


def share_bytecode_cache(environ: dict[str, str] | os._Environ[str] = os.environ) -> None:
    """With ``PYTHONDONTWRITEBYTECODE`` set (as on the machines the suite runs on), every
    daemon, CLI and engine process a test starts would compile kvstored (and the engines
    it imports) from source again: about 0.3 s of CPU per ``kvstore`` process, on two
    vCPUs shared by three workers. Bytecode goes to one cache in the temporary directory
    instead (``PYTHONPYCACHEPREFIX``), so the source tree stays free of it as the setting
    asked, and each module is compiled once per run. An explicit prefix is kept."""
    if not environ.get("PYTHONDONTWRITEBYTECODE") or environ.get("PYTHONPYCACHEPREFIX"):
        return
    prefix = str(Path(tempfile.gettempdir()) / f"kvstored-tests-pycache-{os.getuid()}")
    environ.pop("PYTHONDONTWRITEBYTECODE")
    environ["PYTHONPYCACHEPREFIX"] = prefix
    if environ is os.environ:  # this interpreter too, for what it imports from now on
        sys.dont_write_bytecode = False
        sys.pycache_prefix = prefix


# At import, before xdist starts its workers, so that they and every child inherit it.
share_bytecode_cache()


def require(capability: str, available: bool, reason: str) -> None:
    """Skip when ``capability`` is absent, unless KVSTORED_REQUIRE names it: then fail.
    Works at a module's top level too (a test module that imports an engine)."""
    if available:
        return
    if capability in required_capabilities(os.environ):
        pytest.fail(f"{capability} is required (KVSTORED_REQUIRE) but unavailable: {reason}",
                    pytrace=False)
    pytest.skip(f"{capability} unavailable: {reason}", allow_module_level=True)


@contextmanager
def scratch_fs(where: Path, size: str | None = None, kind: str = "tmpfs") -> Iterator[Path]:
    """A real file system mounted at ``where`` for the ``with`` block: a tmpfs of ``size``
    (``"2m"``) is a disk that fills up on demand, a ramfs one that refuses O_DIRECT.
    Skips where the machine does not let the tests mount (not root, a container): a
    machine limit, not a failure."""
    where.mkdir(parents=True, exist_ok=True)
    options = ["-o", f"size={size}"] if size else []
    mounted = subprocess.run(["mount", "-t", kind, *options, f"kvstored-test-{kind}", str(where)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"this machine does not let the tests mount a {kind} "
                    f"({mounted.stderr.strip() or mounted.returncode}): a machine limit")
    try:
        yield where
    finally:
        # Lazy: a daemon or an engine may still hold files there until its fixture ends.
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def run_threads(calls: Iterable[Callable[[], object]], *,
                beside: Iterable[Callable[[], object]] = (),
                stop: threading.Event | None = None,
                timeout: float | None = None) -> list[Exception]:
    """Run each of ``calls`` in a thread of its own, all at once; return when all have
    finished, with the exceptions they raised (a thread's failed assertion is otherwise
    printed and lost, and the test passes). ``beside`` run in threads of their own until
    ``calls`` are done; then ``stop`` is set, and they are waited for as well.

    With ``timeout``, a thread still running that many seconds after the start fails the
    test (a deadlock or a hang), instead of hanging the run."""
    raised: list[Exception] = []

    def guarded(call: Callable[[], object]) -> Callable[[], None]:
        def run() -> None:
            try:
                call()
            except Exception as exc:  # returned to the test, which reports them all
                raised.append(exc)
        return run

    workers = [threading.Thread(target=guarded(call), daemon=True) for call in calls]
    others = [threading.Thread(target=guarded(call), daemon=True) for call in beside]
    deadline = None if timeout is None else time.monotonic() + timeout

    def join(threads: list[threading.Thread]) -> None:
        for thread in threads:
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        stuck = sum(thread.is_alive() for thread in threads)
        if stuck:
            raise AssertionError(f"{stuck} of {len(threads)} threads still running after "
                                 f"{timeout} s: a deadlock or a hang")

    for thread in workers + others:
        thread.start()
    join(workers)
    if stop is not None:
        stop.set()
    join(others)
    return raised


def xdist_scope(nodeid: str) -> str:
    """The unit ``--dist loadscope`` gives one worker: a test's class, else its module
    (pytest-xdist's own rule: the node id up to its last ``::``)."""
    return nodeid.rsplit("::", 1)[0]


#: The key under which the controller tells its xdist workers its ``--dist`` mode.
DIST_KEY = "kvstored_dist"


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """xdist sets ``--dist`` to ``no`` on its workers, and the workers collect: tell them
    the controller's mode, or :func:`pytest_collection_modifyitems` never reorders."""
    node.workerinput[DIST_KEY] = getattr(node.config.option, "dist", "no")


def dist_mode(config: pytest.Config) -> str:
    """The run's ``--dist`` mode, also on an xdist worker (see :func:`pytest_configure_node`)."""
    worker = getattr(config, "workerinput", None)
    if worker is not None:
        return worker.get(DIST_KEY, "no")
    return getattr(config.option, "dist", "no")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under ``--dist loadscope``, hand out the scopes holding a test marked ``slow``
    first, then the others by their number of tests, most first.

    xdist's own order (by number of tests; the Makefile turns it off with
    ``--no-loadscope-reorder``) sends a module of one or two long tests (a replay
    measured against its prediction, the documented commands, the SDK tutorial's kit
    run: a minute or more each) out last, and the run then waits on that one worker
    while the others are idle. Largest first leaves only short scopes for the end.
    The order inside a scope is kept, and is the same on every worker (xdist requires
    it)."""
    if dist_mode(config) != "loadscope":
        return
    scopes: dict[str, list[pytest.Item]] = {}
    for item in items:
        scopes.setdefault(xdist_scope(item.nodeid), []).append(item)
    ordered = sorted(scopes.values(), key=lambda group: (
        not any(item.get_closest_marker("slow") for item in group), -len(group)))
    items[:] = [item for group in ordered for item in group]


@pytest.fixture
def rng(request) -> random.Random:
    """A seeded random source; the seed is logged (and shown with a failure's log) so
    that ``KVSTORED_TEST_SEED`` can replay the failure."""
    seed = int(os.environ.get(SEED_ENV) or random.randrange(2**32))
    log.warning("%s: random seed %d (%s=%d replays it)", request.node.nodeid, seed,
                SEED_ENV, seed)
    return random.Random(seed)


@pytest.fixture(scope="session", autouse=True)
def _credentials_dir(tmp_path_factory):
    """The tokens the daemons under test generate, and their clients find, live in a
    scratch ``$XDG_CONFIG_HOME`` (their documented default place), not in ~/.config."""
    saved = os.environ.get("XDG_CONFIG_HOME")
    os.environ["XDG_CONFIG_HOME"] = str(tmp_path_factory.mktemp("xdg-config"))
    yield
    if saved is None:
        del os.environ["XDG_CONFIG_HOME"]
    else:
        os.environ["XDG_CONFIG_HOME"] = saved


@pytest.fixture(scope="session", autouse=True)
def _sweep_dram_segments():
    """Tests kill nodes with SIGKILL; free the shared memory they leave behind."""
    yield
    from kvstored.shm import sweep_stale

    sweep_stale()


@pytest.fixture
def store_dir(tmp_path):
    """A fresh directory for one backend or store."""
    path = tmp_path / "store"
    return path

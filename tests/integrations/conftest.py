"""Fixtures for the engine integrations: a real `kvstored up`, and the engines themselves.

Each test drives an engine's own code (SGLang's host pools and backend factory, LMCache's
storage manager, vLLM's tiering manager) against a kvstored subprocess. Without the
engines installed (``.ci/engines``) the tests skip, unless ``KVSTORED_REQUIRE`` names
``engines``: then they fail.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

import pytest

from kvstored.capabilities import probe_engine
from tests.conftest import require
from tests.daemon.harness import Daemon


def engine(name: str, *modules: str) -> tuple[ModuleType, ...]:
    """Import ``modules`` of engine ``name``, in order, or skip the test module (fail
    under KVSTORED_REQUIRE) when the engine is missing or one of them does not import."""
    available, reason = probe_engine(name)
    require("engines", available, reason)
    imported = []
    for module in modules:
        try:
            imported.append(importlib.import_module(module))
        except ImportError as exc:
            require("engines", False, f"{module} does not import: {exc}")
    return tuple(imported)


def start_store(directory: Path, *extra: str, dram: str = "256MiB") -> Daemon:
    daemon = Daemon(["up", "--listen", "127.0.0.1:0", "--data", str(directory / "data"),
                     "--dram", dram, "--ssd", "1GiB", "--backend", "file-per-key", *extra],
                    cwd=directory)
    daemon.wait_ready()
    return daemon


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One `kvstored up` per test module (tests keep apart by their keys)."""
    daemon = start_store(tmp_path_factory.mktemp("kvstored"))
    yield daemon
    daemon.stop()

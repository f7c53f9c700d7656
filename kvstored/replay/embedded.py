"""A fresh embedded store for an experiment: ``kvstored up`` as a child process on a
temporary data directory, stopped with SIGTERM and its directory removed afterwards.

The multi-round experiment runs on two of them, and ``make demo`` on three. The store
is the real daemon, reached like any other through its address and the client token
the daemon keeps in the default token file (docs/security.md); its settings are the
defaults, the given sizes and ``settings`` (``{"policy.dram_only": "true"}``), passed as
``KVSTORED_*`` variables so that the child sees exactly what this process does too
(``config``). Its log is kept in memory for the message of a failure.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from kvstored.config import ENV_PREFIX, Config, load_config
from kvstored.errors import StoreError
from kvstored.processes import stop_process

BANNER = re.compile(r"^kvstored up: listening on ([\d.]+:\d+)")
START_SECONDS = 120.0
STOP_SECONDS = 60.0


class EmbeddedStoreError(StoreError):
    """The embedded store did not start, or did not stop cleanly."""


def _tool(name: str) -> str:
    """The ``kvstored`` script installed beside this interpreter (or on the PATH)."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.exists() else name


def setting_variable(key: str) -> str:
    """``policy.dram_only`` -> ``KVSTORED_POLICY_DRAM_ONLY`` (kvstored.config's rule)."""
    return ENV_PREFIX + key.replace(".", "_").upper()


class EmbeddedStore:
    """``with EmbeddedStore(dram=..., ssd=...) as store:`` ``store.address`` is the
    master; leaving the block stops the daemon (an exit other than 0 is an error)."""

    def __init__(self, *, dram: int, ssd: int, settings: dict[str, str] | None = None,
                 label: str = "store") -> None:
        self.dram = dram
        self.ssd = ssd
        self.label = label
        self.settings = dict(settings or {})
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1",
                    **{setting_variable(k): str(v) for k, v in self.settings.items()}}
        self._address: str | None = None
        self.lines: list[str] = []
        self._home: Path | None = None
        self._proc: subprocess.Popen | None = None
        self._banner = threading.Event()

    def config(self) -> Config:
        """The configuration the daemon runs with, as this process loads it."""
        return load_config(env=self.env, overrides={"node.dram": self.dram,
                                                    "node.ssd": self.ssd})

    def __enter__(self) -> EmbeddedStore:
        self._home = Path(tempfile.mkdtemp(prefix=f"kvstored-{self.label}-"))
        self._proc = subprocess.Popen(
            [_tool("kvstored"), "up", "--listen", "127.0.0.1:0",
             "--data", str(self._home / "data"), "--dram", str(self.dram),
             "--ssd", str(self.ssd)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=self.env)
        threading.Thread(target=self._read, daemon=True).start()
        self._banner.wait(START_SECONDS)
        if self._address is None:
            self._stop()
            raise EmbeddedStoreError(f"kvstored up ({self.label}) did not start:\n{self.log}")
        return self

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            self.lines.append(line.rstrip())
            match = BANNER.match(line)
            if match and self._address is None:
                self._address = match.group(1)
                self._banner.set()
        self._banner.set()

    @property
    def address(self) -> str:
        """The master's HOST:PORT (once started)."""
        if self._address is None:
            raise EmbeddedStoreError(f"kvstored up ({self.label}) is not running")
        return self._address

    @property
    def log(self) -> str:
        return "\n".join(self.lines[-30:])

    def _stop(self) -> int | None:
        code = None
        if self._proc is not None and stop_process(self._proc, STOP_SECONDS):
            code = self._proc.returncode
        if self._home is not None:
            shutil.rmtree(self._home, ignore_errors=True)
        return code

    def __exit__(self, exc_type, exc, tb) -> None:
        code = self._stop()
        if exc_type is None and code != 0:
            raise EmbeddedStoreError(f"kvstored up ({self.label}) exited {code} when "
                                     f"stopped:\n{self.log}")

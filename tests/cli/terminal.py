"""Run a command on a real pseudo-terminal (80 x 24), as an operator's shell would: its
standard input, output and error are the terminal, so progress bars draw."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

BIN = Path(sys.executable).parent
_ESCAPES = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")

#: Runs ``kvstore`` with the progress bar shown at once instead of after half a second,
#: for work a test cannot make last (the threshold itself is tested in-process).
EAGER_KVSTORE = ("import sys; import kvstored.progress as p; p.SHOW_AFTER = 0; "
                 "from kvstored.cli.tool import main; sys.argv[0] = 'kvstore'; main()")


class Terminal:
    """One process on a pty; :attr:`output` is what it drew, escape codes and all."""

    def __init__(self, args: list[str], *, env: dict[str, str] | None = None,
                 cwd: Path | None = None) -> None:
        controller, child = pty.openpty()
        fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
        environment = {**os.environ, "TERM": "xterm-256color", **(env or {})}
        for name in ("COLUMNS", "LINES", "NO_COLOR"):
            environment.pop(name, None)
        self.proc = subprocess.Popen(args, stdin=child, stdout=child, stderr=child,
                                     env=environment, cwd=cwd, start_new_session=True)
        os.close(child)
        self._controller = controller
        self._raw = bytearray()
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self._controller, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            with self._lock:
                self._raw.extend(chunk)
        os.close(self._controller)

    @property
    def raw(self) -> bytes:
        with self._lock:
            return bytes(self._raw)

    @property
    def text(self) -> str:
        """The output without escape codes, with the terminal's CR LF as LF."""
        return _ESCAPES.sub(b"", self.raw).replace(b"\r\n", b"\n").decode(errors="replace")

    def wait_for(self, text: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.text:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                if text in self.text:
                    return
                raise AssertionError(f"{text!r} never appeared on the terminal:\n{self.text}")
            time.sleep(0.05)

    def finish(self, timeout: float = 120) -> int:
        code = self.proc.wait(timeout)
        self._reader.join(10)
        return code


def kvstore_on_terminal(*args: str, master: str | None = None, eager: bool = False,
                        cwd: Path | None = None) -> Terminal:
    """``kvstore ARGS`` on a terminal; ``eager`` shows progress at once."""
    command = [sys.executable, "-c", EAGER_KVSTORE] if eager else [str(BIN / "kvstore")]
    env = {"KVSTORE_MASTER": master} if master else {}
    return Terminal([*command, *args], env=env, cwd=cwd)
